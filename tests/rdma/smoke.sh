#!/usr/bin/env bash
# Smoke test of the Soft-RoCE QEMU harness: boots one guest and checks that
# real verbs work there: ibv_devices lists rxe0, ibv_devinfo shows the port
# ACTIVE, an RC ping-pong over loopback (ibv_rc_pingpong, RoCEv2 GID of the
# eth0 address), an RDMA WRITE latency run (ib_write_lat) and an rdma_cm
# exchange (rping). Prints PASS or FAIL (and exits 0 or 1).
#
# Usage: tests/rdma/smoke.sh [--timeout SECS] [-v]
#   Installs the harness' packages and prepares the kernel cache first
#   (both no-ops once done). About 15-30 s of wall time per run.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"  # qemu_args
qemu_args 240 "$@"

"$HERE/install-deps.sh"
"$HERE/prepare.sh"

# Runs inside the guest (host's bash, chroot of the host root). Every step is
# bounded with timeout(1); servers start first and clients retry, because a
# client that comes up before its server fails (rdma_cm: REJECTED).
read -r -d '' GUEST <<'GUEST_EOF' || true
set -u
DEV=$VSOCKET_RDMA_DEV GID=$VSOCKET_RDMA_GID_INDEX IP=$VSOCKET_RDMA_IP
fail=0
step() { echo "== $*"; }
check() { if [ "$1" = 0 ]; then echo "ok: $2"; else echo "FAILED ($1): $2"; fail=1; fi; }

# Client side of a server/client pair: retries until the server is listening.
retry_client() {
  local i
  for i in 1 2 3 4 5 6 7 8 9 10; do
    "$@" && return 0
    sleep 1
  done
  return 1
}

step ibv_devices
out=$(timeout 20 ibv_devices); rc=$?
echo "$out"
echo "$out" | grep -qw "$DEV" || rc=1
check $rc "ibv_devices lists $DEV"

step "ibv_devinfo -d $DEV"
out=$(timeout 20 ibv_devinfo -d "$DEV"); rc=$?
echo "$out"
echo "$out" | grep -q 'state:.*PORT_ACTIVE' || rc=1
check $rc "ibv_devinfo: $DEV port ACTIVE"
echo "GID table:"; grep -v '0000:0000:0000:0000:0000:0000:0000:0000' \
  /sys/class/infiniband/$DEV/ports/1/gids/* 2>/dev/null | sed 's|.*/gids/|  |'

step "ibv_rc_pingpong -d $DEV -g $GID (loopback via $IP)"
timeout 30 ibv_rc_pingpong -d "$DEV" -g "$GID" -n 1000 > /tmp/pp-server.log 2>&1 &
spid=$!
sleep 1
retry_client timeout 30 ibv_rc_pingpong -d "$DEV" -g "$GID" -n 1000 "$IP"; rc=$?
wait $spid; src=$?
echo "server:"; cat /tmp/pp-server.log
[ $rc = 0 ] && rc=$src
check $rc "ibv_rc_pingpong RC 1000 iterations"

step "ib_write_lat -d $DEV -x $GID (loopback)"
timeout 60 ib_write_lat -d "$DEV" -x "$GID" -n 2000 -F > /tmp/lat-server.log 2>&1 &
spid=$!
sleep 1
retry_client timeout 60 ib_write_lat -d "$DEV" -x "$GID" -n 2000 -F "$IP"; rc=$?
wait $spid; src=$?
[ $rc = 0 ] && rc=$src
check $rc "ib_write_lat"

step "rping (rdma_cm) via $IP"
timeout 30 rping -s -a "$IP" -C 10 > /tmp/rping-server.log 2>&1 &
spid=$!
sleep 1
retry_client timeout 30 rping -c -a "$IP" -C 10 -v -S 64 | tail -2; rc=${PIPESTATUS[0]}
wait $spid; src=$?
[ $rc = 0 ] && rc=$src
check $rc "rping 10 exchanges over rdma_cm"

exit $fail
GUEST_EOF

start=$(date +%s)
rc=0
"$HERE/run-in-qemu.sh" --timeout "$TIMEOUT" ${ARGS[@]+"${ARGS[@]}"} -- bash -c "$GUEST" || rc=$?
echo "smoke.sh: $(( $(date +%s) - start ))s wall"
if [ "$rc" = 0 ]; then
  echo PASS
else
  echo "FAIL (exit $rc)"
  exit 1
fi
