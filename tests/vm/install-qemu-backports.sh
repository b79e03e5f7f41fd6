#!/usr/bin/env bash
# Unpacks QEMU 10.0.2 from Debian's bookworm-backports suite (the archive
# the machine's own apt sources name) into /opt/vsocket-qemu, beside the
# system's QEMU 7.2, without changing apt's sources or the installed
# packages, and prints the directory to put first in PATH:
#
#   PATH=$(tests/vm/install-qemu-backports.sh):$PATH tests/vm/migrate_hosts.sh
#
# Why: the two-host bed's live migrations under QEMU 7.2 (TCG) lost guest
# pages now and then, with or without vSocket (docs/live-migration.md); the
# same cases under 10.0.2 are being soaked before they run in CI.
# Idempotent; the system's QEMU (tests/rdma/install-deps.sh) supplies the
# shared libraries and the iPXE ROMs. As root.
set -euo pipefail

DEST=${VSOCKET_QEMU_DIR:-/opt/vsocket-qemu}
VERSION=1:10.0.2+ds-2+deb13u1~bpo12+1
if [ -x "$DEST/bin/qemu-system-x86_64" ] && "$DEST/bin/qemu-system-x86_64" --version 2>/dev/null | grep -q "version 10\."; then
  echo "$DEST/bin"
  exit 0
fi
bash "$(dirname "$0")/../rdma/install-deps.sh" >&2

# The archive of the machine's own bookworm lines (deb822 or one-line).
uri=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -1 || true)
[ -n "$uri" ] || uri=$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
[ -n "$uri" ] || { echo "install-qemu-backports: no bookworm archive in apt's sources" >&2; exit 1; }

work=$(mktemp -d /tmp/vsocket-qemu-apt-XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/debs"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri bookworm-backports main" >"$work/sources.list"
APT=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
     -o "Dir::State::Lists=$work/lists" -o "APT::Sandbox::User=root")
apt-get "${APT[@]}" -qq update >&2
(cd "$work/debs" &&
  apt-get "${APT[@]}" -qq download "qemu-system-x86=$VERSION" "qemu-system-common=$VERSION" \
    "qemu-system-data=$VERSION" seabios/bookworm-backports >&2)
rm -rf "$DEST.new"
mkdir -p "$DEST.new/bin"
for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$DEST.new/root"; done
# Its firmware directories (Debian's QEMU looks in /usr/share/qemu and
# /usr/share/seabios): this copy's own, then the system's iPXE ROMs.
cat >"$DEST.new/bin/qemu-system-x86_64" <<EOF
#!/bin/sh
exec $DEST/root/usr/bin/qemu-system-x86_64 -L $DEST/root/usr/share/qemu -L $DEST/root/usr/share/seabios -L /usr/lib/ipxe/qemu "\$@"
EOF
chmod +x "$DEST.new/bin/qemu-system-x86_64"
rm -rf "$DEST"
mv "$DEST.new" "$DEST"
"$DEST/bin/qemu-system-x86_64" --version | head -1 >&2
echo "$DEST/bin"
