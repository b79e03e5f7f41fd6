#!/usr/bin/env bash
# Makes test certificates for the vsocketd peering channel (TLS 1.3 with
# mutual certificate authentication, host-backend/peering/):
#
#   deploy/make-certs.sh [--ca-name NAME] [--days N] [--san NAMES] [--eku USAGES] DIR HOST [HOST...]
#   deploy/make-certs.sh --crl [--ca-name NAME] [--days N] DIR [HOST...]
#
#   DIR/NAME.crt, DIR/NAME.key   a self-signed test CA, made if absent
#                                (NAME defaults to "ca")
#   DIR/HOST.crt, DIR/HOST.key   for each HOST: a certificate with CN=HOST and
#                                subjectAltName DNS:HOST, signed by that CA,
#                                usable as TLS server and client certificate
#   DIR/NAME.crl                 with --crl: the CA's certificate revocation
#                                list (vsocketd's tls_crl), revoking each
#                                HOST's certificate and every one revoked
#                                before (DIR/NAME.revoked keeps the list)
#
# Keys are EC P-256; key files are mode 0600. Idempotent: existing files are
# kept (a HOST certificate that exists but was not issued by the chosen CA is
# an error rather than silently kept or overwritten). To test a certificate
# from an unrelated CA, use a second CA name, e.g.
#
#   deploy/make-certs.sh --ca-name rogue-ca DIR intruder
#
# These are test certificates: the CA key sits next to the certificates.
# Production deployments should issue certificates from their own PKI.
set -euo pipefail

usage() {
  cat >&2 <<'EOF'
usage: deploy/make-certs.sh [--ca-name NAME] [--days N] [--san NAMES] [--eku USAGES] DIR HOST [HOST...]
       deploy/make-certs.sh --crl [--ca-name NAME] [--days N] DIR [HOST...]

Creates DIR/NAME.crt and DIR/NAME.key (a test CA; NAME defaults to "ca") if
absent, and for each HOST a key and a certificate signed by that CA:
DIR/HOST.key (mode 0600) and DIR/HOST.crt with CN=HOST and
subjectAltName DNS:HOST. Existing files are kept.

  --ca-name NAME  sign with (and create if absent) the CA DIR/NAME.crt/.key;
                  use a second name to make certificates from an unrelated CA
  --days N        validity of newly issued certificates (default 825;
                  a new CA gets 10 years)
  --san NAMES     comma-separated DNS names for the subjectAltName of the
                  certificates made now, instead of DNS:HOST (tests of the
                  identity rule: a peer is its DNS names, its CN only when it
                  has none)
  --eku USAGES    extended key usages of the certificates made now (default
                  serverAuth,clientAuth, which vsocketd requires of every
                  peer host; "none" leaves the extension out: for tests)
  --crl           instead of certificates: (re)write DIR/NAME.crl, the CA's
                  revocation list (vsocketd's tls_crl), valid for --days
                  (default 30 here), revoking DIR/HOST.crt of each HOST
                  given and every certificate revoked by an earlier --crl
EOF
  exit 2
}

die() {
  echo "make-certs.sh: $*" >&2
  exit 1
}

ca_name=ca
days=""
san=""
eku=serverAuth,clientAuth
crl=0
while [ $# -gt 0 ]; do
  case "$1" in
    --ca-name)
      [ $# -ge 2 ] || usage
      ca_name=$2
      shift 2
      ;;
    --days)
      [ $# -ge 2 ] || usage
      days=$2
      shift 2
      ;;
    --san)
      [ $# -ge 2 ] || usage
      [[ "$2" =~ ^[A-Za-z0-9.-]+(,[A-Za-z0-9.-]+)*$ ]] || die "--san wants DNS names separated by commas"
      san=$2
      shift 2
      ;;
    --eku)
      [ $# -ge 2 ] || usage
      [[ "$2" =~ ^(none|[A-Za-z]+(,[A-Za-z]+)*)$ ]] || die "--eku wants usages separated by commas, or none"
      eku=$2
      shift 2
      ;;
    --crl)
      crl=1
      shift
      ;;
    -h | --help) usage ;;
    --) shift; break ;;
    -*) echo "make-certs.sh: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
if [ "$crl" = 1 ]; then [ $# -ge 1 ] || usage; else [ $# -ge 2 ] || usage; fi
dir=$1
shift

command -v openssl >/dev/null || die "the openssl command is not installed (Debian: apt-get install openssl)"
[ -n "$days" ] || { if [ "$crl" = 1 ]; then days=30; else days=825; fi; }
[[ "$days" =~ ^[1-9][0-9]*$ ]] || die "--days wants a positive number, got '$days'"

# Names become file names and DNS names: letters, digits, dots, dashes only.
valid_name() { [[ "$1" =~ ^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$ ]]; }
valid_name "$ca_name" || die "invalid CA name '$ca_name' (letters, digits, '.', '-')"
for host in "$@"; do
  valid_name "$host" || die "invalid host name '$host' (letters, digits, '.', '-')"
  # A host named like the CA would overwrite (or be mistaken for) the CA.
  [ "$host" != "$ca_name" ] || die "host name '$host' is the CA name; choose another"
done

mkdir -p "$dir"
ca_crt=$dir/$ca_name.crt
ca_key=$dir/$ca_name.key

work=$(mktemp -d "$dir/.make-certs.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Writes a new P-256 private key to $1 with mode 0600 from the start (umask),
# so the key is never readable by others, not even briefly.
new_key() {
  (umask 077 && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 \
    -out "$1" 2>"$work/err") || die "openssl genpkey failed: $(cat "$work/err")"
  chmod 600 "$1"
}

# Random 128-bit serials: no serial file to keep consistent between runs.
serial() { echo "0x$(openssl rand -hex 16)"; }

if [ "$crl" = 1 ]; then
  [ -f "$ca_crt" ] && [ -f "$ca_key" ] || die "no CA $ca_crt with its key to sign a CRL"
  revoked=$dir/$ca_name.revoked
  touch "$revoked"
  # The revoked list: one openssl "ca" index line per certificate
  # (R, expiry, revocation time, serial, file, subject).
  for host in "$@"; do
    crt=$dir/$host.crt
    [ -f "$crt" ] || die "no certificate $crt to revoke"
    openssl verify -CAfile "$ca_crt" "$crt" >/dev/null 2>&1 || die "$crt was not issued by $ca_crt"
    sn=$(openssl x509 -in "$crt" -noout -serial | cut -d= -f2)
    if grep -q "	$sn	" "$revoked"; then
      echo "already revoked: $crt"
      continue
    fi
    end=$(date -u -d "$(openssl x509 -in "$crt" -noout -enddate | cut -d= -f2)" +%y%m%d%H%M%SZ)
    subj=$(openssl x509 -in "$crt" -noout -subject -nameopt compat | sed 's/^subject=//')
    printf 'R\t%s\t%s\t%s\tunknown\t%s\n' "$end" "$(date -u +%y%m%d%H%M%SZ)" "$sn" "$subj" >>"$revoked"
    echo "revoked $crt (serial $sn)"
  done
  cp "$revoked" "$work/index.txt"
  cat >"$work/ca.cnf" <<EOF
[ca]
default_ca = test_ca
[test_ca]
database = $work/index.txt
crlnumber = $work/crlnumber
default_md = sha256
default_crl_days = $days
EOF
  openssl rand -hex 8 >"$work/crlnumber"
  openssl ca -batch -config "$work/ca.cnf" -gencrl -keyfile "$ca_key" -cert "$ca_crt" \
    -out "$work/ca.crl" 2>"$work/err" || die "openssl ca -gencrl failed: $(cat "$work/err")"
  mv "$work/ca.crl" "$dir/$ca_name.crl"
  chmod 644 "$dir/$ca_name.crl"
  echo "made $dir/$ca_name.crl ($(grep -c . "$revoked") revoked, valid $days days)"
  exit 0
fi

if [ -e "$ca_crt" ] || [ -e "$ca_key" ]; then
  [ -f "$ca_crt" ] || die "$ca_key exists but $ca_crt does not; remove $ca_key to make a new CA"
  [ -f "$ca_key" ] || die "$ca_crt exists but $ca_key does not; cannot sign without the CA key"
else
  new_key "$work/ca.key"
  openssl req -new -x509 -key "$work/ca.key" -out "$work/ca.crt" \
    -days 3650 -set_serial "$(serial)" -subj "/CN=vSocket test CA $ca_name" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -addext "subjectKeyIdentifier=hash" 2>"$work/err" ||
    die "openssl req (CA) failed: $(cat "$work/err")"
  # Certificate first, key last: a run interrupted in between leaves a state
  # the checks above report instead of a CA key without its certificate.
  mv "$work/ca.crt" "$ca_crt"
  chmod 644 "$ca_crt"
  mv "$work/ca.key" "$ca_key"
  echo "made CA $ca_crt"
fi

for host in "$@"; do
  crt=$dir/$host.crt
  key=$dir/$host.key
  if [ -f "$crt" ]; then
    [ -f "$key" ] || die "$crt exists but $key does not; remove $crt to reissue"
    openssl verify -CAfile "$ca_crt" "$crt" >/dev/null 2>&1 ||
      die "$crt exists but was not issued by $ca_crt; remove $crt and $key to reissue"
    echo "kept $crt"
    continue
  fi
  # Reuse an existing key (it may be deployed already); otherwise make one.
  if [ ! -f "$key" ]; then
    new_key "$work/host.key"
    mv "$work/host.key" "$key"
  fi
  cat >"$work/ext.cnf" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
$(if [ "$eku" != none ]; then echo "extendedKeyUsage=$eku"; fi)
subjectAltName=$(if [ -n "$san" ]; then echo "DNS:${san//,/,DNS:}"; else echo "DNS:$host"; fi)
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
EOF
  openssl req -new -key "$key" -subj "/CN=$host" -out "$work/host.csr" 2>"$work/err" ||
    die "openssl req ($host) failed: $(cat "$work/err")"
  openssl x509 -req -in "$work/host.csr" -CA "$ca_crt" -CAkey "$ca_key" \
    -set_serial "$(serial)" -days "$days" -extfile "$work/ext.cnf" \
    -out "$work/host.crt" 2>"$work/err" ||
    die "openssl x509 ($host) failed: $(cat "$work/err")"
  mv "$work/host.crt" "$crt"
  chmod 644 "$crt"
  echo "made $crt (CA $ca_name)"
done
