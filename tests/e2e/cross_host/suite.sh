# The cross-host suite (tests/e2e/run.sh cross_host): real applications in
# VMs on different hypervisors, each attached to its own vsocketd, the two
# backends linked by the tcp fabric over TLS-authenticated peering
# (deploy/testbed2.sh). Every case checks the bytes (xfer's stream checks,
# sha256, redis values) and proves with libvsocket's per-connection report
# and both daemons' fabric counters that the data crossed the fabric link,
# not kernel TCP.
#
# VSOCKET_TESTBED2_LOCATOR=etcd runs every case with the etcd directory as
# the locator (tests/run_all.sh runs the suite both ways): the bed has no
# locator file, and every fabric transfer (fabric_xfer) also proves by the
# directory's counters that its pairings were placed by the directory.
#
# This file: the bed's setup and teardown, and the helpers that cases of
# several groups use. The cases: the NN_*.sh files next to it, run in name
# order (tests/e2e/suite_lib.sh says how).

TB=deploy/testbed2.sh
WORK_PREFIX=vsocket-e2e2
SUITE_VMS=(vmA1 vmA2 vmB1 vmB2)

suite_prepare() {
  export VSOCKETD=$BIN/host-backend/vsocketd VSOCKETCTL=$BIN/host-backend/vsocketctl
  export VSOCKET_TESTBED2_DIR=${VSOCKET_TESTBED2_DIR:-/run/vsocket-testbed2}
  # Two data links per host pair (links_per_peer): connections spread over
  # them; the link-loss cases lose both.
  export VSOCKET_TESTBED2_LINKS=${VSOCKET_TESTBED2_LINKS:-2}
  REQUIRED=("$LIB" "$XFER" "$VSOCKETD" "$VSOCKETCTL")
}

suite_setup() {
  echo "== two-host test bed up"
  if ! bash $TB up >"$WORK/up.log" 2>&1; then
    cat "$WORK/up.log"
    fail testbed2 "deploy/testbed2.sh up failed"
    return 1
  fi
  A1=$(bash $TB addr vmA1)
  A2=$(bash $TB addr vmA2)
  B1=$(bash $TB addr vmB1)
  B2=$(bash $TB addr vmB2)
  if [ "${VSOCKET_TESTBED2_LOCATOR:-file}" = etcd ]; then
    # The whole suite through the directory: no file to fall back on, both
    # hosts following etcd and published.
    local h ok=1 why=
    [ ! -e "$VSOCKET_TESTBED2_DIR/locator" ] || { ok=0; why="a locator file exists"; }
    for h in hostA hostB; do
      [ "$(counter $h directory_enabled)" = 1 ] && [ "$(counter $h directory_published)" = 1 ] || {
        ok=0
        why+=" $h: directory enabled $(counter $h directory_enabled), published $(counter $h directory_published);"
      }
    done
    [ $ok = 1 ] || { fail testbed2 "etcd mode: $why"; return 1; }
    echo "== locator = etcd: no locator file, both hosts follow and publish in the directory"
  fi
}

# bed_is_etcd: the bed runs with the etcd directory as its locator.
bed_is_etcd() { grep -q '^locator = etcds\?://' "$VSOCKET_TESTBED2_DIR/hostA/vsocketd.conf" 2>/dev/null; }
# placements: both hosts' directory_placements (lookups the directory
# answered with a host), summed.
placements() { echo $(($(counter hostA directory_placements) + $(counter hostB directory_placements))); }

suite_finish() {
  local h
  if [ "$failed" -gt 0 ]; then
    # For the CI log: what the daemons said last.
    for h in hostA hostB; do
      echo "== $h: vsocketd.log, warnings and errors (last 20)"
      grep -E "^[WE] " "$VSOCKET_TESTBED2_DIR/$h/vsocketd.log" 2>/dev/null | tail -20
      # (E2E_KEEP=1: the whole log stays with the scratch directory.)
      [ -z "${E2E_KEEP:-}" ] || cp "$VSOCKET_TESTBED2_DIR/$h/vsocketd.log" "$WORK/$h.vsocketd.log" 2>/dev/null
    done
  fi
}

suite_cleanup() { :; }

# addr_of VM: the VM's address (set by suite_setup).
addr_of() {
  case $1 in
    vmA1) echo "$A1" ;;
    vmA2) echo "$A2" ;;
    vmB1) echo "$B1" ;;
    vmB2) echo "$B2" ;;
  esac
}

counter() { # counter HOST NAME: one value of `vsocketctl counters`
  bash $TB ctl "$1" counters 2>/dev/null | awk -v n="$2" '$1 == n {print $2}'
}
link_field() { # link_field HOST FIELD: from `vsocketctl --json stats` links[0]
  bash $TB ctl "$1" --json stats 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['links'][0]['$2'])"
}

# conn_rows HOST PORT: HOST's connections to or from PORT (a client's or a
# server's) as "mode/reason via VIA: N B out" (one per line);
# conns_accelerated HOST PORT N: until N of them are accelerated (bounded: 15 s).
conn_rows() {
  bash $TB ctl "$1" --json stats 2>/dev/null | python3 -c "
import json, sys
for c in json.load(sys.stdin)['connections']:
    if c['peer'].endswith(':$2') or c['local'].endswith(':$2'): print(f\"{c['mode']}/{c['reason']} via {c['via'] or '-'}: {c['accel_bytes_out']} B out\")" 2>/dev/null
}
conns_accelerated() {
  local _
  for _ in $(seq 60); do
    [ "$(conn_rows "$1" "$2" | grep -c '^accelerated/')" -ge "$3" ] && return 0
    sleep 0.25
  done
  return 1
}

# run_xfer NAME CLIENT-VM SERVER-VM SERVER-ADDR CONNS BYTES PORT [xfer args]:
# a checksummed transfer each way, every connection accelerated and exact
# (from the libraries' reports). Returns 0/1 with the summary or the reason
# in XFER_MSG; counts nothing itself.
# XFER_GATE=HOST: the clients (on HOST) send their streams only once HOST
# shows every connection accelerated (xfer --start-wait-file; bounded: 15 s,
# then they go anyway and the check below says what their ends were).
run_xfer() {
  local name=$1 cvm=$2 svm=$3 saddr=$4 conns=$5 bytes=$6 port=$7
  shift 7
  local rep=$WORK/$name.jsonl start=$WORK/$name.start gate=() rows=
  vm_bg "$svm" preload "$rep" "$WORK/$name.srv" "$XFER" server "$saddr" "$port" --conns "$conns" "$@"
  local srv=$BG
  [ -n "${XFER_GATE:-}" ] && gate=(--start-wait-file "$start")
  vm_bg "$cvm" preload "$rep" "$WORK/$name.cli" "$XFER" client "$saddr" "$port" --conns "$conns" --bytes "$bytes" \
    "${gate[@]}" "$@"
  local cli=$BG
  if [ -n "${XFER_GATE:-}" ]; then
    conns_accelerated "$XFER_GATE" "$port" "$conns" ||
      rows="; after 15 s $XFER_GATE showed: $(conn_rows "$XFER_GATE" "$port" | sort | uniq -c | tr -s ' \n' ' ')"
    touch "$start"
  fi
  if ! wait "$cli"; then
    XFER_MSG="client: $(tail -2 "$WORK/$name.cli" | tr '\n' ' ')$rows"
    kill "$srv" 2>/dev/null
    return 1
  fi
  if ! wait "$srv"; then
    XFER_MSG="server: $(tail -2 "$WORK/$name.srv" | tr '\n' ' ')"
    return 1
  fi
  # XFER_CHECK: how strictly to judge acceleration (default: every end).
  # Each end counts every byte once, both ways (across a RESYNC too): the
  # stream and its 16 B header, and the answer unless --one-way.
  local sum=$((2 * bytes + 16))
  [[ " $* " == *" --one-way "* ]] && sum=$((bytes + 16))
  # shellcheck disable=SC2086
  if ! XFER_MSG=$(python3 $CHECK "$rep" --port "$port" --expect-conns $((2 * conns)) \
      ${XFER_CHECK:---mode accelerated --reason accelerated --accel-min 1} --exact-total $((bytes + 16)) \
      --exact-sum $sum); then
    XFER_MSG="$XFER_MSG$rows"
    return 1
  fi
  XFER_MSG="$conns conns x $bytes B each way, byte-checked; $XFER_MSG"
}

# fabric_xfer: run_xfer across hosts, plus: every byte the libraries sent
# accelerated crossed the fabric, and most of the stream did (the rest went
# on kernel TCP before the upgrade). With the etcd directory: each
# connection's pairing asked it twice at least (the requester where the peer
# runs, the acceptor whether the requester runs its address).
fabric_xfer() {
  local name=$1 conns=$5 bytes=$6
  local a0 b0 da db accel p0= dp=
  a0=$(counter hostA fabric_bytes_out)
  b0=$(counter hostB fabric_bytes_out)
  bed_is_etcd && p0=$(placements)
  run_xfer "$@" || return 1
  if [ -n "$p0" ]; then
    dp=$(($(placements) - p0))
    [ "$dp" -ge $((2 * conns)) ] || { XFER_MSG="the directory placed $dp lookup(s) for $conns pairing(s)"; return 1; }
  fi
  da=$(($(counter hostA fabric_bytes_out) - a0))
  db=$(($(counter hostB fabric_bytes_out) - b0))
  accel=$(python3 -c "import json,sys; print(sum(json.loads(l)['accel_tx'] for l in open(sys.argv[1]) if l.strip()))" "$WORK/$name.jsonl")
  if [ $((da + db)) -ne "$accel" ] || [ "$accel" -lt "$conns" ] || [ $((2 * accel)) -lt $((2 * conns * bytes)) ]; then
    XFER_MSG="fabric carried $da B A->B + $db B B->A, libraries sent $accel B accelerated of $((2 * conns * bytes))"
    return 1
  fi
  XFER_MSG="$XFER_MSG; fabric A->B $da B, B->A $db B${dp:+; directory placements +$dp}"
}

# xfer_bg NAME PORT CONNS BYTES [xfer args for both sides]: an xfer server in
# vmB1 and its client in vmA1 (or XFER_CVM), in the background (PIDs in
# XSRV, XCLI).
# xfer_wait NAME: both verified every byte (else 1, the reason in E2E_MSG).
# wait_link_up: until hostA reports its link to hostB up (bounded: 15 s).
xfer_bg() {
  local name=$1 port=$2 conns=$3 bytes=$4 rep=$WORK/$1.jsonl
  shift 4
  vm_bg vmB1 preload "$rep" "$WORK/$name.srv" "$XFER" server "$B1" "$port" --conns "$conns" "$@"
  XSRV=$BG
  sleep 0.2
  vm_bg "${XFER_CVM:-vmA1}" preload "$rep" "$WORK/$name.cli" "$XFER" client "$B1" "$port" --conns "$conns" \
    --bytes "$bytes" "$@"
  XCLI=$BG
}
xfer_wait() {
  local crc=0 src=0
  wait "$XCLI" || crc=$?
  wait "$XSRV" || src=$?
  [ $crc -eq 0 ] && [ $src -eq 0 ] && return 0
  E2E_MSG="client rc $crc: $(tail -6 "$WORK/$1.cli" | tr '\n' ' ') server rc $src: $(tail -6 "$WORK/$1.srv" | tr '\n' ' ')"
  return 1
}
wait_link_up() {
  local _
  for _ in $(seq 150); do
    bash $TB ctl hostA links 2>/dev/null | grep -q " up " && return 0
    sleep 0.1
  done
  return 1
}

# bulk_and_rr NAME PORT CONNS: a 1 GiB one-way stream (PORT) and CONNS
# request/response connections (PORT+1) from vmA1 to vmB1 in the
# background (PIDs in BSRV BCLI, RSRV RCLI), then 0.5-0.9 s (random) for
# them to get going. bulk_and_rr_wait NAME: both verified every byte (else
# 1, the reason in E2E_MSG); bulk_and_rr_kill: stops all four.
bulk_and_rr() {
  xfer_bg $1.bulk $2 1 1073741824 --one-way
  BSRV=$XSRV BCLI=$XCLI
  xfer_bg $1.rr $(($2 + 1)) $3 6144000 --rounds 600 --gap-ms 20
  RSRV=$XSRV RCLI=$XCLI
  sleep "0.$((5 + RANDOM % 5))"
}
bulk_and_rr_wait() {
  XSRV=$BSRV XCLI=$BCLI
  xfer_wait $1.bulk || { E2E_MSG="bulk: $E2E_MSG"; kill $RSRV $RCLI 2>/dev/null; return 1; }
  XSRV=$RSRV XCLI=$RCLI
  xfer_wait $1.rr || { E2E_MSG="request/response: $E2E_MSG"; return 1; }
}
bulk_and_rr_kill() { kill $BSRV $BCLI $RSRV $RCLI 2>/dev/null; }
