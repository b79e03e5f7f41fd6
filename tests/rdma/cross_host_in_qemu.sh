#!/usr/bin/env bash
# End to end over the rdma fabric, on Soft-RoCE: boots the QEMU guest of
# tests/rdma/run-in-qemu.sh and runs tests/rdma/cross_host_guest.sh in it:
# deploy/testbed2.sh with fabric = rdma (two vsocketd with TLS peering,
# four "VMs"), checksummed xfer transfers between VMs on the two hosts
# (1 and 64 connections, both directions) under LD_PRELOAD, checked against
# the libraries' VSOCKET_REPORT lines and the daemons' counters.
#
# Usage: tests/rdma/cross_host_in_qemu.sh [--no-build] [--timeout SECS] [-v]
#   --no-build      use the binaries already in bazel-out/k8-opt/bin
#   --timeout SECS  bound on the guest run, boot included (default 900)
#   -v              show the guest console
# Prints the guest's PASS/FAIL lines, then PASS or FAIL (exit 0 or 1), and
# keeps the whole output in tests/rdma/results/cross-host-<UTC date>.log.
# Takes 2 to 5 minutes of wall time once built (QEMU TCG is slow): not
# run by CI; run it after changing the rdma link, peering or the
# cross-host data path.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
. "$HERE/lib.sh"  # qemu_args, qemu_build
qemu_args 900 "$@"

cd "$ROOT"
qemu_build //guest:libvsocket.so //tests/e2e:xfer //host-backend:vsocketd //host-backend:vsocketctl

mkdir -p "$HERE/results"
LOG="$HERE/results/cross-host-$(date -u +%Y-%m-%d).log"
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
start=$(date +%s)
{
  echo "# tests/rdma/cross_host_in_qemu.sh, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)$(git diff --quiet HEAD -- host-backend proto tests/rdma deploy 2>/dev/null || echo ' (+ uncommitted changes)')"
  echo "# host: $(nproc) CPUs; guest: QEMU TCG, 2 vCPUs, 2048 MB"
} | tee "$OUT"
set +e
# The guest needs more memory than the default: two daemons (EAL heaps),
# four preloaded processes at a time, registered rings.
"$HERE/run-in-qemu.sh" --timeout "$TIMEOUT" --mem 2048 ${ARGS[@]+"${ARGS[@]}"} -- \
  bash tests/rdma/cross_host_guest.sh 2>&1 | tee -a "$OUT"
rc=${PIPESTATUS[0]}
set -e
echo "== guest run: exit $rc after $(( $(date +%s) - start )) s (boot included)" | tee -a "$OUT"

fail=0
summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$OUT" | tail -1 || true)
if [ "$rc" = 0 ] && [ -n "$summary" ] && ! grep -q '^FAIL ' "$OUT" && [ "$(grep -c '^PASS ' "$OUT")" -ge 12 ]; then
  echo PASS | tee -a "$OUT"
else
  echo "FAIL${summary:+ ($summary)}" | tee -a "$OUT"
  fail=1
fi
cp "$OUT" "$LOG"
echo "cross_host_in_qemu.sh: output saved in ${LOG#"$ROOT"/}" >&2
exit "$fail"
