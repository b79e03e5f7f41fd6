#!/usr/bin/env bash
# The demo's VM step (deploy/demo.sh runs it; alone: deploy/demo_vm.sh BIN):
# two QEMU guests on one host, each with its vSocket function attached to
# one vsocketd (VM mode: docs/vm-mode.md), their ordinary NICs on a bridge
# of the demo's own. In each guest vsocket-guestd owns the device and
# proves its processes' sockets; redis-server runs in guest B and
# redis-benchmark in guest A, first plain (kernel TCP between the guests),
# then both under vsocket-run. Then what the operator sees: vsocketctl vms,
# the two VMs' accelerated bytes. The guests run under QEMU's TCG (no KVM
# on these machines): absolute rates mean nothing here, the path does.
# BIN is bazel-bin (vsocketd, vsocketctl, vsocket-guestd, libvsocket.so
# built). Root only; removes everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:?usage: deploy/demo_vm.sh BAZEL_BIN}
bash tests/rdma/install-deps.sh
bash tests/vm/prepare.sh
. tests/vm/lib.sh
VM_NET_DEVICE=${VM_NET_DEVICE/status=off/status=on}

NS=vsdemo-$$
A=203.0.113.21 B=203.0.113.22
WORK=$(mktemp -d /tmp/vsocket-demo-vm-XXXXXX)
D_PID=""
cleanup() {
  vm_kill_all
  [ -z "$D_PID" ] || { kill "$D_PID" 2>/dev/null; wait "$D_PID" 2>/dev/null; }
  vm_net_down "$NS"
  rm -rf "$WORK"
}
trap cleanup EXIT
ctl() { "$BIN/host-backend/vsocketctl" --socket "$WORK/ctl.sock" "$@"; }

echo "== vsocketd with two QEMU VMs' ports: vma ($A) and vmb ($B), tenant 1, sockets proved by each VM's agent"
VSOCKET_VM_VMA_PROVE_SOCKETS=agent VSOCKET_VM_VMB_PROVE_SOCKETS=agent \
  "$BIN/host-backend/vsocketd" --ctl "$WORK/ctl.sock" \
  --port "$WORK/vma.sock,vma,1,$A" --port "$WORK/vmb.sock,vmb,1,$B" >"$WORK/vsocketd.log" 2>&1 &
D_PID=$!
for _ in $(seq 100); do ctl counters >/dev/null 2>&1 && break; sleep 0.1; done
vm_net_up "$NS" tapa tapb

for g in a b; do
  mkdir -p "$WORK/$g"
  cp "$BIN/guest/agent/vsocket-guestd" "$BIN/guest/libvsocket.so" guest/vsocket-run "$WORK/$g/"
done
# Guest B: the agent, redis-server under vsocket-run on 6379 and a plain one
# on 6380, until the host says stop.
cat >"$WORK/b/job.sh" <<JOB
cd /run/vsocket-vm
./vsocket-guestd --serve --proofs > agent.out 2>&1 &
for _ in \$(seq 300); do [ -S /run/vsocket/agent.sock ] && break; sleep 0.1; done
./vsocket-run --upgrade always redis-server --bind $B --port 6379 --save '' --appendonly no --protected-mode no \\
  > redis.out 2>&1 &
redis-server --bind $B --port 6380 --save '' --appendonly no --protected-mode no > redis-plain.out 2>&1 &
for p in 6379 6380; do for _ in \$(seq 300); do ss -Hltn "sport = :\$p" | grep -q . && break; sleep 0.1; done; done
echo ready > ready
for _ in \$(seq 1800); do [ -f stop ] && break; sleep 0.1; done
JOB
# Guest A: the agent, then the two benchmarks once B serves.
BENCH="redis-benchmark -h $B -n 4000 -c 8 -t set,get -q"
cat >"$WORK/a/job.sh" <<JOB
cd /run/vsocket-vm
./vsocket-guestd --serve --proofs > agent.out 2>&1 &
for _ in \$(seq 300); do [ -S /run/vsocket/agent.sock ] && break; sleep 0.1; done
for _ in \$(seq 1800); do [ -f go ] && break; sleep 0.1; done
$BENCH -p 6380 2>&1 | tr '\r' '\n' | grep -E '^(SET|GET): [0-9]' > redis-kernel.out
VSOCKET_REPORT=/run/vsocket-vm/report.jsonl ./vsocket-run --upgrade always $BENCH -p 6379 2>&1 |
  tr '\r' '\n' | grep -E '^(SET|GET): [0-9]' > redis-vsocket.out
JOB

echo "== booting guests A and B (QEMU TCG, one vSocket function each plus the agent's)"
VM_FUNCTIONS=1 VM_AGENT_FUNCTION=1 VM_NIC=$NS,tapb,52:54:00:00:52:12 \
  vm_boot "$WORK/b" "$WORK/vmb.sock" 240 vsocket.hugepages=17 vsocket.nic=$B/24
PB=$VM_PID
VM_FUNCTIONS=1 VM_AGENT_FUNCTION=1 VM_NIC=$NS,tapa,52:54:00:00:52:11 \
  vm_boot "$WORK/a" "$WORK/vma.sock" 240 vsocket.hugepages=17 vsocket.nic=$A/24
PA=$VM_PID
for _ in $(seq 900); do [ -e "$WORK/b/ready" ] || ! kill -0 "$PB" 2>/dev/null && break; sleep 0.2; done
[ -e "$WORK/b/ready" ] || { echo "demo: guest B did not start redis: $(tail -3 "$WORK/b/console.log" 2>/dev/null)" >&2; exit 1; }
touch "$WORK/a/go"
rc=0
vm_wait_for "$PA" "$WORK/a" 200 || rc=$?
touch "$WORK/b/stop"
vm_wait_for "$PB" "$WORK/b" 60 || true
[ "$rc" = 0 ] || { echo "demo: guest A's job failed ($rc)" >&2; exit 1; }
echo "== redis-benchmark in guest A -> redis-server in guest B, kernel TCP between the guests"
sed 's/^/   /' "$WORK/a/redis-kernel.out"
echo "== the same, both under vsocket-run (every connection accelerated through vsocketd)"
sed 's/^/   /' "$WORK/a/redis-vsocket.out"
echo "== vsocketctl vms (operator view: the VMs' accelerated bytes)"
ctl vms | sed 's/^/   /'
python3 - "$WORK/a/report.jsonl" <<'PY'
import collections, json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ends = [l for l in lines if l.get("event") in ("close", "exit")] or lines
modes = collections.Counter((l["mode"], l["reason"]) for l in ends)
print("== guest A's report: " + ", ".join(f"{n} connections {m}/{r}" for (m, r), n in modes.items()))
PY
[ "$(ctl --json vms | python3 -c 'import json,sys; print(min(v["accel_bytes_out"] for v in json.load(sys.stdin)))')" -gt 0 ] ||
  { echo "demo: vsocketd accelerated nothing between the VMs" >&2; exit 1; }
