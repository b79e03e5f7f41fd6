#!/usr/bin/env bash
# The vSocket demo: two "VMs" (network namespaces) on one host, unmodified
# programs in them, first over kernel TCP, then with libvsocket.so preloaded
# (vsocket-run, its default policy: what a user gets) — then what the
# operator sees (vsocketctl) and what the tenant's report says. Then the same
# between two "hypervisors" (deploy/testbed2.sh): each runs its own
# vsocketd, and the two backends carry the VMs' bytes over one
# TLS-authenticated fabric link. Two workloads each time: redis-benchmark
# with 50 clients (on one host the two VMs' processes get a ring pair of
# their own, direct pairs; across hosts, on a machine of fewer than 4 CPUs
# that vsocketd shares, the policy keeps request/response on kernel TCP,
# where it is faster there: docs/decisions/, 51, 83 and 102), and a stream of
# 16-byte messages (sockperf throughput: accelerated through shared memory,
# and across hosts over the fabric). Last, two QEMU VMs on one host, each
# with the in-guest agent, redis between them accelerated through vsocketd
# (deploy/demo_vm.sh).
# VSOCKET_TESTBED2_LOCATOR=etcd: the two hypervisors find each other's VMs
# in an etcd cluster directory (docs/multi-host.md), no locator file.
# Installs dependencies, builds, and removes everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
echo "== building"
bazel build //host-backend:vsocketd //host-backend:vsocketctl //guest:libvsocket.so //guest/agent:vsocket-guestd 2>&1 | tail -1
BIN=$(bazel info bazel-bin 2>/dev/null)
WORK=$(mktemp -d /tmp/vsocket-demo-XXXXXX)
SERVER_PID=""
cleanup() {
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
  bash deploy/testbed.sh down >/dev/null 2>&1 || true
  bash deploy/testbed2.sh down >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== test bed: vsocketd + vm1 and vm2 (tenant 1), vm3 (tenant 2)"
VSOCKETD=$BIN/host-backend/vsocketd bash deploy/testbed.sh up | sed 's/^/   /'
A2=$(bash deploy/testbed.sh addr vm2)
RUN="guest/vsocket-run --lib $BIN/guest/libvsocket.so"

# start_server TB VM LOG PRELOAD(yes|no) CMD...: CMD in VM, in the background.
start_server() {
  local tb=$1 vm=$2 log=$3 pre=()
  [ "$4" = yes ] && pre=($RUN -r "$WORK/report.jsonl" --)
  shift 4
  bash "$tb" exec "$vm" "${pre[@]}" "$@" >"$log" 2>&1 &
  SERVER_PID=$!
}
stop_server() {
  kill "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
}

bench() {  # bench LABEL PRELOAD(yes|no) [TESTBED CLIENT-VM SERVER-VM SERVER-ADDR]
  local pre=() tb=${3:-deploy/testbed.sh} cvm=${4:-vm1} svm=${5:-vm2} addr=${6:-$A2}
  [ "$2" = yes ] && pre=($RUN -r "$WORK/report.jsonl" --)
  start_server "$tb" "$svm" "$WORK/redis.log" "$2" redis-server --bind "$addr" --port 6379 --save '' \
    --appendonly no --protected-mode no
  for _ in $(seq 50); do grep -q "Ready to accept" "$WORK/redis.log" && break; sleep 0.1; done
  echo "== redis-benchmark -c 50 $cvm -> redis-server $svm, $1"
  bash "$tb" exec "$cvm" "${pre[@]}" redis-benchmark -h "$addr" -t set,get -n 100000 -c 50 -q 2>&1 |
    tr '\r' '\n' | grep -E "^(SET|GET): [0-9]" | sed 's/^/   /'
  stop_server
  echo "== sockperf throughput, 16 B messages, $cvm -> $svm, $1"
  start_server "$tb" "$svm" "$WORK/sockperf.log" "$2" sockperf sr --tcp -i "$addr" -p 11111
  sleep 0.5
  bash "$tb" exec "$cvm" "${pre[@]}" sockperf tp --tcp -i "$addr" -p 11111 -m 16 -t 2 2>&1 |
    grep -E "Summary: Message Rate" | sed 's/.*Summary: /   /'
  stop_server
}

# report: the tenant's report (VSOCKET_REPORT) of the vSocket steps so far.
report() {
  echo "== tenant report (VSOCKET_REPORT): connections by mode"
  python3 - "$WORK/report.jsonl" <<'PY'
import collections, json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
modes = collections.Counter((l["mode"], l["reason"]) for l in lines)
for (mode, reason), n in modes.items():
    print(f"   {n:4d} connections  mode={mode}  reason={reason}")
acc = sum(l["accel_tx"] + l["accel_rx"] for l in lines)
ker = sum(l["kernel_tx_after_upgrade"] + l["kernel_rx_after_upgrade"] for l in lines)
print(f"   {acc} bytes went through shared memory; {ker} bytes on kernel TCP after the upgrade")
PY
  rm -f "$WORK/report.jsonl"
}

bench "kernel TCP" no
bench "vSocket (vsocket-run on both ends)" yes

echo "== vsocketctl vms (operator view)"
"$BIN/host-backend/vsocketctl" -s /run/vsocket-testbed/ctl.sock vms | sed 's/^/   /'
report
bash deploy/testbed.sh down >/dev/null 2>&1

echo "== two hypervisors: hostA (vmA1) and hostB (vmB1), one vsocketd each, tcp fabric over TLS 1.3"
export VSOCKETD=$BIN/host-backend/vsocketd VSOCKETCTL=$BIN/host-backend/vsocketctl
bash deploy/testbed2.sh up 2>&1 | sed 's/^/   /'
B1=$(bash deploy/testbed2.sh addr vmB1)
bench "across hosts, kernel TCP" no deploy/testbed2.sh vmA1 vmB1 "$B1"
bench "across hosts, vSocket" yes deploy/testbed2.sh vmA1 vmB1 "$B1"
report
echo "== vsocketctl links on hostA (the shared fabric link to hostB)"
bash deploy/testbed2.sh ctl hostA links | sed 's/^/   /'
echo "== hostA counters"
bash deploy/testbed2.sh ctl hostA counters | grep -E "remote_upgrades|fabric_bytes|fabric_downgrades" | sed 's/^/   /'
if [ "${VSOCKET_TESTBED2_LOCATOR:-file}" = etcd ]; then
  echo "== vsocketctl locator on hostA (the etcd directory: where each VM of its tenants runs)"
  bash deploy/testbed2.sh ctl hostA locator | sed 's/^/   /'
  bash deploy/testbed2.sh ctl hostA counters | grep -E "directory_(connected|placements|watch_events)" | sed 's/^/   /'
fi
bash deploy/testbed2.sh down >/dev/null 2>&1

echo "== two QEMU VMs on one host (VM mode: docs/vm-mode.md)"
bash deploy/demo_vm.sh "$BIN"
echo "== done (test beds removed)"
