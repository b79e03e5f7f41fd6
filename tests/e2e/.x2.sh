#!/usr/bin/env bash
# End-to-end tests between two hosts (deploy/testbed2.sh): real applications
# in VMs on different hypervisors, each attached to its own vsocketd, the two
# backends linked by the tcp fabric over TLS-authenticated peering.
# Every case checks the bytes (xfer's stream checks, sha256, redis values)
# and proves with libvsocket's per-connection report and both daemons'
# fabric counters that the data crossed the fabric link, not kernel TCP.
#
#   tests/e2e/cross_host.sh [BIN_DIR]     BIN_DIR: Bazel output (default bazel-out/k8-opt/bin)
#
# Prints PASS/FAIL per case and ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=$(realpath "${1:-bazel-out/k8-opt/bin}")
LIB=$BIN/guest/libvsocket.so
XFER=$BIN/tests/e2e/xfer
CHECK=tests/e2e/check_report.py
TB=deploy/testbed2.sh
export VSOCKETD=$BIN/host-backend/vsocketd VSOCKETCTL=$BIN/host-backend/vsocketctl
export VSOCKET_TESTBED2_DIR=${VSOCKET_TESTBED2_DIR:-/run/vsocket-testbed2}
# Two data links per host pair (links_per_peer): connections spread over
# them; the link-loss cases lose both.
export VSOCKET_TESTBED2_LINKS=${VSOCKET_TESTBED2_LINKS:-2}
WORK=$(mktemp -d /tmp/vsocket-e2e2-XXXXXX)
passed=0
failed=0
PIDS=()

for f in "$LIB" "$XFER" "$VSOCKETD" "$VSOCKETCTL"; do
  [ -e "$f" ] || { echo "missing $f (build first)"; echo "0 passed, 1 failed"; exit 1; }
done

trap e2e_cleanup EXIT  # tests/e2e/lib.sh, sourced below

. tests/e2e/lib.sh  # pass, fail, vm_run, vm_bg

counter() { # counter HOST NAME: one value of `vsocketctl counters`
  bash $TB ctl "$1" counters 2>/dev/null | awk -v n="$2" '$1 == n {print $2}'
}
link_field() { # link_field HOST FIELD: from `vsocketctl --json stats` links[0]
  bash $TB ctl "$1" --json stats 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['links'][0]['$2'])"
}

echo "== two-host test bed up"
if ! bash $TB up >"$WORK/up.log" 2>&1; then
  cat "$WORK/up.log"
  fail testbed2 "deploy/testbed2.sh up failed"
  echo "$passed passed, $failed failed"
  exit 1
fi
A1=$(bash $TB addr vmA1)
A2=$(bash $TB addr vmA2)
B1=$(bash $TB addr vmB1)
B2=$(bash $TB addr vmB2)
pass "testbed2_link_up (hostA <-> hostB: TLS 1.3 mutual auth, $VSOCKET_TESTBED2_LINKS tcp fabric link(s) keyed by the TLS exporter)"

# ---- link loss and re-establishment ------------------------------------------------

# The fabric link is cut in the middle of transfers (both hosts' kernels
# answer the link's packets with RST for a second): every connection on it
# goes back to kernel TCP through RESYNC without losing or duplicating a
# byte (xfer checks every byte and the EOF after it), both daemons count the
# downgrades, the link comes back with backoff, and new connections
# accelerate again.
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
  E2E_MSG="client rc $crc: $(tail -2 "$WORK/$1.cli" | tr '\n' ' ') server rc $src: $(tail -2 "$WORK/$1.srv" | tr '\n' ' ')"
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


# A client writes half its stream accelerated, then the other half and
# shuts down its write side while hostB silently drops the link (those
# bytes are in flight, never to arrive), then the link dies (RST). The
# server has read nothing yet. The library kept its kernel FIN back (the
# peer had not consumed the bytes), so RESYNC resends the unconsumed bytes
# on kernel TCP and only then sends the FIN: the server reads every byte,
# then EOF (not ECONNRESET), and answers.
# With "close" the client closes right after its last write instead (no
# shutdown, one-way) and stays alive (a long-lived process): its library
# lingers on a dup of the socket, resends after the loss, then sends the
# FIN, although the application has no socket any more.
# reports_with REPORT FIELD: how many report lines have FIELD true.
reports_with() {
  python3 -c "import json,sys; print(sum(1 for l in open(sys.argv[1]) if l.strip() and json.loads(l).get(sys.argv[2])))" "$1" "$2"
}
case_link_loss_after_end() {
  local how=$1 name=cross_link_loss_after_$1 port=$2 conns=2 bytes=131072
  local rep=$WORK/$name.jsonl i out extra=() go=$WORK/$name.go
  rm -f "$go"
  [ "$how" = close ] && extra=(--one-way --close-after-write --exit-delay-ms 8000)
  wait_link_up  # after the previous cut
  # An idle link would outlive the cut (no segment meets the RST): a
  # request/response pair from vmA2 keeps it busy meanwhile.
  XFER_CVM=vmA2 xfer_bg $name.load $((port + 1)) 1 19660800 --rounds 300 --gap-ms 10
  local lsrv=$XSRV lcli=$XCLI
  xfer_bg $name $port $conns $bytes --pause-ms 800 --split-wait-file "$go" --stall-ms 7000 "${extra[@]}"
  # Once the first halves crossed the fabric (and the FENCEs were
  # acknowledged): drop, and only then let the clients write the second
  # halves and shut down (a fixed pause raced a slow poll of the counters).
  local moved=0
  for i in $(seq 160); do
    moved=$(bash $TB ctl hostA --json stats 2>/dev/null | python3 -c "
import json, sys
print(sum(c['accel_bytes_out'] for c in json.load(sys.stdin)['connections'] if c['peer'].endswith(':$port')))" 2>/dev/null || echo 0)
    [ "$moved" -ge $((conns * bytes / 2)) ] && break
    sleep 0.05
  done
  sleep 0.3
  stall_link 1.5 4 "$go"
  xfer_wait $name || { fail $name "$E2E_MSG"; return; }
  XSRV=$lsrv XCLI=$lcli
  xfer_wait $name.load || { fail $name "the background pair failed: $E2E_MSG"; return; }
  if ! out=$(python3 $CHECK "$rep" --port $port --expect-conns $((2 * conns)) --resynced); then
    fail $name "$out"
    return
  fi
  local deferred lingered
  deferred=$(reports_with "$rep" fin_deferred)
  lingered=$(reports_with "$rep" lingered)
  [ "$deferred" -ge "$conns" ] || { fail $name "only $deferred of $conns clients kept their FIN back"; return; }
  if [ "$how" = close ]; then
    [ "$lingered" -ge "$conns" ] || { fail $name "only $lingered of $conns clients lingered after close()"; return; }
    pass "$name ($conns clients: half of $bytes B accelerated, the rest written and the socket closed while the link dropped it; $lingered lingered on a dup, resent after the loss, FIN after; server got every byte then EOF; $out)"
  else
    pass "$name ($conns clients: half of $bytes B accelerated, the rest and the shutdown lost in flight with the link; FIN kept back by $deferred, resent, server got every byte then EOF; $out)"
  fi
}
case_link_loss_after_end shutdown 7110
case_link_loss_after_end close 7112
case_link_loss_after_end shutdown 7114
case_link_loss_after_end close 7116
case_link_loss_after_end shutdown 7118
case_link_loss_after_end close 7120
echo "$passed passed, $failed failed"
