#!/usr/bin/env bash
# Live migration of a QEMU (TCG) guest between the two hosts of the
# two-host bed (deploy/testbed2.sh: hostA and hostB as network namespaces,
# each with its vsocketd, linked by the tcp fabric over TLS), with a peer
# that stays behind (issue 36): the process-mode VM vmA2 on hostA.
#
# The guest (vmq, tenant 1, 198.51.100.5, on hostA's bridge through a tap;
# the two hosts' bridges joined, as a cloud's overlay stretches a VM's L2
# segment) is configured on both hosts (`vsocketctl vm add`, prove_sockets
# false). Its agent owns two vSocket functions; two xfer clients (one
# process each, under libvsocket-vm.so) talk to two xfer servers in vmA2
# (under libvsocket.so), every byte of both directions checked by xfer:
#   stream    1 GiB each way in 256 rounds of 4 MiB, 250 ms apart (bulk)
#   rr        6,000 request/response rounds of 4,000 bytes, 10 ms apart
# The locator is the bed's file locator; the test plays the operator's
# migration hook: once QEMU says `completed` (the destination paused,
# -S), `vsocketctl locator set 1 198.51.100.5 HOST` on both hosts, then
# `cont` (docs/operator-guide.md "Live migration").
#
#   migrate_hosts_there_and_back  vmq moves hostA -> hostB -> hostA. Each
#                   connection is accelerated before (same-host through
#                   vsocketd A: `vsocketctl connections` via same-host), on
#                   kernel TCP while copied (vsocketd of the source drains
#                   it: drains asked), accelerated after (on hostB, across
#                   the fabric: via hostA, hostB's fabric_bytes_out grows),
#                   and same-host again after the move back; both xfer
#                   clients and both servers exit 0, every byte verified;
#                   the 4 connection ends' reports: 2 downgrades (cause
#                   migration), 2 re-upgrades, accelerated at their close,
#                   nothing resent.
#   migrate_hosts_drain_unfinished  The same guest, vsocketd A without the
#                   migration's drain (VSOCKET_DEBUG_NO_MIGRATION_DRAIN=1):
#                   both connections are on the rings at the switchover, with
#                   their peer ends in vmA2, which stays on hostA. vmA2's ends
#                   must finish on kernel TCP through RESYNC, byte-exact
#                   (decision 110), not hear "peer closed"; the guest's ends
#                   resync at hostB (decision 094) and both pairs are
#                   accelerated again across the fabric. Then back to hostA
#                   (vsocketd B without the drain too): the pairs are across
#                   the fabric at the switchover, vmA2's ends hear it from
#                   vsocketd B (PAIR_CANCEL, fabric-down) and resync too,
#                   then pair same-host again.
#   migrate_hosts_while_paused  vmq paused (QMP stop, `virsh suspend`:
#                   vsocketd A keeps its two devices, decision 123), then
#                   migrated hostA -> hostB while paused (`virsh migrate` of
#                   a suspended domain: QEMU turns no dirty log on for
#                   stopped devices, so vsocketd A drains nothing and sees
#                   only the stop, then the source QEMU's socket closing)
#                   and continued on hostB. vmA2's ends must finish on
#                   kernel TCP through RESYNC (not an end of stream), the
#                   guest's ends resync at hostB and both pairs are
#                   accelerated again across the fabric; every byte.
#   vm_across_hosts  no migration: VM <-> VM across the two hosts (issue 35).
#                   vmq (its two functions on hostA's port) runs the two
#                   xfer clients, a second guest vmr (198.51.100.6, its two
#                   functions on hostB's port) the two xfer servers: both
#                   connections accelerated across the tcp fabric (hostA's
#                   `vsocketctl connections`: vmq's 2 ends via hostB, vmr's
#                   2 on hostB via hostA; fabric bytes at least the
#                   stream's), every byte verified at both ends, the 4
#                   reports accelerated with no downgrade. tests/run_all.sh
#                   runs this case always, the migrations (under QEMU
#                   10, decision 137) unless VSOCKET_VM_MIGRATE_HOSTS=0.
#   bench_migration  (not run by default: bench/migration_bench.sh) the same
#                   VM with and without its vSocket functions, the same load,
#                   BENCH_MOVES migrations each: QMP's figures per migration.
#
# Usage: tests/vm/migrate_hosts.sh [--no-build] [CASE...]   (as root)
# VSOCKET_MIG_BIN=DIR takes every binary from DIR (bazel-bin's layout).
# Prints "PASS CASE (Ns)" / "FAIL CASE: why" and ends with "N passed, N
# failed". Every wait is bounded; QEMUs and the bed (its own namespace
# prefix vsm, state in /run/vsocket-mighosts) go on exit. Run it under
# `flock /tmp/vsocket-e2e.lock` on shared machines.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/vm/lib.sh

vm_script_args migrate_hosts_there_and_back migrate_hosts_drain_unfinished migrate_hosts_while_paused -- "$@"

die() { echo "migrate_hosts.sh: $*" >&2; echo "0 passed, 1 failed"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root"
bash tests/rdma/install-deps.sh || die "installing QEMU and busybox failed"
bash tests/vm/prepare.sh || die "preparing the guest kernel and initramfs failed"
TARGETS=(//host-backend:vsocketd //host-backend:vsocketctl //guest/agent:vsocket-guestd //guest/agent:libvsocket-vm.so
         //guest:libvsocket.so //tests/e2e:xfer)
if [ "$BUILD" = 1 ]; then
  flock -o /tmp/vsocket-bazel.lock bazel build "${TARGETS[@]}" >/dev/null 2>&1 || die "bazel build failed"
fi
BIN=${VSOCKET_MIG_BIN:-$(bazel info bazel-bin 2>/dev/null)} || die "bazel info failed"
for t in host-backend/vsocketd host-backend/vsocketctl guest/agent/vsocket-guestd guest/agent/libvsocket-vm.so \
         guest/libvsocket.so tests/e2e/xfer; do
  [ -e "$BIN/$t" ] || die "$t not built"
done
command -v qemu-system-x86_64 >/dev/null || die "no qemu-system-x86_64"

WORK=$(mktemp -d /tmp/vsocket-mighosts-XXXXXX)
export VSOCKETD=$BIN/host-backend/vsocketd VSOCKETCTL=$BIN/host-backend/vsocketctl
export VSOCKET_TESTBED2_DIR=/run/vsocket-mighosts VSOCKET_TESTBED2_NS_PREFIX=vsm VSOCKET_TESTBED2_LOCATOR=file
TB="bash deploy/testbed2.sh"
# (Huge pages: each process holds 8 per grant; a lost session's go back once its
# connections resynced, so a move needs at most 2 processes x 2 grants = 32 at
# once, however many moves. Before, each kept its old grants' until it exited:
# the fourth grant of bench_migration's third move did not fit in 60.)
RAM_MB=384 HUGEPAGES=60
VM=vmq VM_ADDR=198.51.100.5 VM_MAC=52:54:00:5e:00:05
PEER=vmA2 PEER_ADDR=198.51.100.3
underlay() { case $1 in hostA) echo 203.0.113.1 ;; hostB) echo 203.0.113.2 ;; esac; }
# The guest's load (mig.load: STREAM_BYTES,STREAM_ROUNDS,RR_BYTES,RR_ROUNDS).
STREAM_BYTES=1073741824 STREAM_ROUNDS=256 RR_BYTES=24000000 RR_ROUNDS=6000
QEMU_PIDS=() SERVER_PIDS=()
stop_pid() {
  local pid=$1 i
  [ -n "$pid" ] || return 0
  kill "$pid" 2>/dev/null || return 0
  for i in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.3; done
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
stop_all() {
  local p
  for p in "${QEMU_PIDS[@]}" "${SERVER_PIDS[@]}"; do stop_pid "$p"; done
  QEMU_PIDS=() SERVER_PIDS=()
  $TB down >/dev/null 2>&1
}
cleanup() { stop_all; rm -rf "$WORK" "$WORK.case"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

qmp() { timeout 40 python3 tests/vm/qmp.py "$@"; }
ctl() { $TB ctl "$@"; }
# stat HOST KEY: a counter of HOST's vsocketd
stat() {
  ctl "$1" stats 2>/dev/null | python3 -c "
import json, sys
s = json.load(sys.stdin)
print(next((g[sys.argv[1]] for g in s.values() if isinstance(g, dict) and sys.argv[1] in g), -1))" "$2"
}
# via_count HOST VIA: vmq's connection ends on HOST accelerated via VIA
# (same-host, or the peer's host)
via_count() {
  ctl "$1" --json connections 2>/dev/null | python3 -c '
import json, sys
vm, via = sys.argv[1:3]
print(sum(c["vm"] == vm and c["via"] == via for c in json.load(sys.stdin)))' "$VM" "$2"
}
vias_are() { [ "$(via_count "$1" "$2")" -ge "$3" ]; }
# steady HOST: both of vmq's ends accelerated same-host there and more than
# 16 MB (two of the stream's rounds each way) through that vsocketd: the connections
# stream on the rings when the migration begins, not just upgraded.
steady() { vias_are "$1" same-host 2 && [ "$(stat "$1" accel_bytes)" -gt 16000000 ]; }
wait_for() {
  local deadline=$(( $(date +%s) + $1 ))
  shift
  while ! "$@"; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.5
  done
}
console_has() { grep -q "$2" "$WORK/$1.console" 2>/dev/null; }
status_is() { qmp "$WORK/$1.qmp" query-status 2>/dev/null | grep -q "\"status\": \"$2\""; }
migration_done() {
  MIG=$(qmp "$WORK/$1.qmp" query-migrate 2>/dev/null) || return 1
  MIG_STATUS=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get("status", "none"))' "$MIG")
  case "$MIG_STATUS" in completed|failed|cancelled) return 0 ;; *) return 1 ;; esac
}

passed=0 failed=0
pass() { echo "PASS $1 ($2s)"; passed=$((passed + 1)); }
fail() {
  echo "FAIL $1: $2"
  failed=$((failed + 1))
  local f
  mkdir -p /tmp/vsocket-mighosts-last && cp "$WORK"/*.console "$WORK"/*.log "$WORK"/*.out /tmp/vsocket-mighosts-last/ 2>/dev/null
  for f in hostA hostB; do cp "$VSOCKET_TESTBED2_DIR/$f/vsocketd.log" "/tmp/vsocket-mighosts-last/$f.vsocketd.log" 2>/dev/null; done
  for f in "$WORK"/*.console "$WORK"/*.qemu.log "$WORK"/*.out; do
    [ -s "$f" ] && { echo "--- ${f##*/} (tail)"; grep -v "mig: tick" "$f" | tail -6; }
  done
}

# The guest's initramfs: prepare.sh's with migrate-init.sh as /init and a
# job of two xfer clients to the peer.
make_initrd() {
  local stage=$WORK/stage f
  rm -rf "$stage"
  mkdir -p "$stage/stage"
  cp tests/vm/migrate-init.sh "$stage/init"
  chmod 755 "$stage/init"
  cp "$BIN/guest/agent/vsocket-guestd" "$BIN/guest/agent/libvsocket-vm.so" "$BIN/tests/e2e/xfer" "$stage/stage/"
  for f in $(ldd "$BIN/guest/agent/vsocket-guestd" "$BIN/guest/agent/libvsocket-vm.so" "$BIN/tests/e2e/xfer" |
             awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// && $2 ~ /^\(/ { print $1 }' | sort -u); do
    mkdir -p "$stage$(dirname "$f")"
    cp -L "$f" "$stage$f"
  done
  cat > "$stage/stage/job.sh" <<'JOB'
export LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu
( i=0; while :; do echo "mig: tick $i"; i=$((i + 1)); sleep 1; done ) &
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^mig\.$1=//p"; }
PEER=$(arg peer)
ROLE=$(arg role)
ME=$(arg nic)
ME=${ME%/*}
IFS=, read -r SB SR RB RR <<EOF
$(arg load)
EOF
# mig.novs=1: a VM without vSocket (bench/migration_bench.sh): plain kernel TCP.
PRE=/stage/libvsocket-vm.so
if [ "$(arg novs)" = 1 ]; then
  PRE="" && touch /tmp/agent.out /tmp/report.jsonl
else
  ./vsocket-guestd --serve /run/agent.sock > /tmp/agent.out 2>&1 &
  for _ in $(seq 300); do [ -S /run/agent.sock ] && break; sleep 0.1; done
fi
# (always: the request/response loop too, which the default policy holds on kernel TCP)
export VSOCKET_SOCKET=/run/agent.sock VSOCKET_REPORT=/tmp/report.jsonl VSOCKET_LOG_LEVEL=info VSOCKET_UPGRADE=always
if [ "$ROLE" = server ]; then
  # mig.role=server: the two xfer servers the other guest's clients call.
  LD_PRELOAD=$PRE ./xfer server "$ME" 5301 --conns 1 --rounds "$SR" --gap-ms 250 > /tmp/stream.out 2>&1 &
  S=$!
  LD_PRELOAD=$PRE ./xfer server "$ME" 5302 --conns 1 --rounds "$RR" --gap-ms 10 > /tmp/rr.out 2>&1 &
  R=$!
  echo "mig: servers started"
  wait $S
  echo "mig: server stream exit $?"
  wait $R
  echo "mig: server rr exit $?"
  sed 's/^/mig: stream: /' /tmp/stream.out
  sed 's/^/mig: rr: /' /tmp/rr.out
  sed 's/^/mig: agent: /' /tmp/agent.out
  sed 's/^/mig: report: /' /tmp/report.jsonl
  echo "mig: job done"
  exit 0
fi
for _ in $(seq 100); do ping -c 1 -W 1 "$PEER" >/dev/null 2>&1 && break; done
LD_PRELOAD=$PRE ./xfer client "$PEER" 5301 --conns 1 --bytes "$SB" --rounds "$SR" --gap-ms 250 \
  --pause-ms 500 > /tmp/stream.out 2>&1 &
S=$!
LD_PRELOAD=$PRE ./xfer client "$PEER" 5302 --conns 1 --bytes "$RB" --rounds "$RR" --gap-ms 10 \
  --pause-ms 500 > /tmp/rr.out 2>&1 &
R=$!
echo "mig: load started"
wait $S
echo "mig: stream exit $?"
wait $R
echo "mig: rr exit $?"
sed 's/^/mig: stream: /' /tmp/stream.out
sed 's/^/mig: rr: /' /tmp/rr.out
sed 's/^/mig: agent: /' /tmp/agent.out
sed 's/^/mig: report: /' /tmp/report.jsonl
echo "mig: job done"
JOB
  (cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) | gzip -1 > "$WORK/extra.cpio.gz"
  cat "$VM_CACHE/initramfs.cpio.gz" "$WORK/extra.cpio.gz" > "$WORK/initrd"
}

# start_qemu NAME HOST TAP [QEMU ARGS...]: the guest in HOST's namespace,
# its two vSocket functions on HOST's port for $VM (vmq), its NIC on tap TAP
# (made here, on HOST's bridge), QMP on $WORK/NAME.qmp; pid in QEMU_PID.
start_qemu() {
  local name=$1 host=$2 tap=$3 i
  shift 3
  ip -n "vsm$host" tuntap add dev "$tap" mode tap || return 1
  ip -n "vsm$host" link set "$tap" master br0 up || return 1
  local vs=() novs=""
  # NOVS=1: the same VM without its vSocket functions (bench/migration_bench.sh).
  [ "${NOVS:-0}" = 1 ] && novs=" mig.novs=1"
  for i in 0 1; do
    [ -z "$novs" ] || break
    vs+=(-chardev "socket,id=vs$i,path=$VSOCKET_TESTBED2_DIR/$host/$VM.sock" -netdev "vhost-user,id=vsn$i,chardev=vs$i"
         -device "$VM_NET_DEVICE,netdev=vsn$i")
  done
  ip netns exec "vsm$host" qemu-system-x86_64 \
    -accel tcg,thread=multi -cpu max -smp 1 -m "$RAM_MB" \
    -object "memory-backend-memfd,id=mem0,size=${RAM_MB}M,share=on" -machine memory-backend=mem0 \
    -display none -vga none -monitor none -no-reboot -nodefaults \
    -chardev "file,id=con0,path=$WORK/$name.console" -serial chardev:con0 \
    -qmp "unix:$WORK/$name.qmp,server=on,wait=off" \
    -kernel "$VM_CACHE/vmlinuz" -initrd "$WORK/initrd" \
    -append "console=ttyS0 quiet loglevel=3 panic=-1 vsocket.timeout=280 vsocket.hugepages=$HUGEPAGES mig.nic=$VM_ADDR/28 mig.peer=$PEER_ADDR mig.load=$STREAM_BYTES,$STREAM_ROUNDS,$RR_BYTES,$RR_ROUNDS$novs${MIG_ROLE:+ mig.role=$MIG_ROLE}" \
    "${vs[@]}" -netdev "tap,id=nic0,ifname=$tap,script=no,downscript=no" \
    -device "virtio-net-pci,netdev=nic0,mac=$VM_MAC,romfile=,vectors=0" \
    "$@" </dev/null >"$WORK/$name.qemu.log" 2>&1 &
  QEMU_PID=$!
  QEMU_PIDS+=("$QEMU_PID")
}

# bed_up [ENV...]: the bed (its daemons with ENV), the bridges joined, vmq
# added on both hosts and placed on hostA, vmA2's two xfer servers.
bed_up() {
  local out h
  out=$(env "$@" $TB up 2>&1) || { echo "testbed2 up: $(echo "$out" | tail -3)"; return 1; }
  ip link add vsmsta netns vsmhostA type veth peer name vsmstb netns vsmhostB &&
    ip -n vsmhostA link set vsmsta master br0 up && ip -n vsmhostB link set vsmstb master br0 up ||
    { echo "could not join the two bridges"; return 1; }
  for h in hostA hostB; do
    out=$(ctl "$h" vm add "$VM" --socket "$VSOCKET_TESTBED2_DIR/$h/$VM.sock" --tenant 1 --addresses "$VM_ADDR" \
          --prove-sockets false --direct off 2>&1) || { echo "$h: vm add: $out"; return 1; }
    out=$(ctl "$h" locator set 1 "$VM_ADDR" hostA 2>&1) || { echo "$h: locator set: $out"; return 1; }
  done
  local port
  [ "${NO_PEER_SERVERS:-0}" = 1 ] && return 0
  # The servers' bound covers the guest's boot, its 12 s of ticks, two
  # moves and the job (about 180 s here): 420 s. At 250 s it killed the
  # stream's server mid-stream on a loaded machine (the guest's client then
  # read an early EOF: two CPU hogs beside the case, 2026-11-30).
  for port in 5301 5302; do
    VSOCKET_UPGRADE=always VSOCKET_REPORT=$WORK/peer.jsonl LD_PRELOAD=$([ "${NOVS:-0}" = 1 ] || echo "$BIN/guest/libvsocket.so") $TB exec "$PEER" timeout 420 \
      "$BIN/tests/e2e/xfer" server "$PEER_ADDR" "$port" --conns 1 \
      $([ "$port" = 5301 ] && echo "--rounds $STREAM_ROUNDS --gap-ms 250" || echo "--rounds $RR_ROUNDS --gap-ms 10") \
      > "$WORK/server$port.out" 2>&1 &
    SERVER_PIDS+=($!)
  done
}

# migrate CASE FROM-QEMU TO-QEMU TO-HOST TO-TAP: a destination QEMU on
# TO-HOST (-incoming on its underlay address, -S), QMP migrate, completed;
# the hook's locator update on both hosts; cont. MIG_FIGURES says how long.
migrate() {
  local case=$1 from=$2 to=$3 host=$4 tap=$5 port h out
  port=$((4400 + RANDOM % 500))
  start_qemu "$to" "$host" "$tap" -incoming "tcp:$(underlay "$host"):$port" -S || { fail "$case" "no tap on $host"; return 1; }
  wait_for 30 status_is "$to" inmigrate || { fail "$case" "the destination QEMU on $host did not come up"; return 1; }
  qmp "$WORK/$from.qmp" migrate-set-parameters '{"max-bandwidth": 1073741824, "downtime-limit": 300}' >/dev/null
  out=$(qmp "$WORK/$from.qmp" migrate "{\"uri\": \"tcp:$(underlay "$host"):$port\"}" 2>&1) ||
    { fail "$case" "QEMU refused the migration: $out"; return 1; }
  MIG_STATUS=none
  wait_for 120 migration_done "$from" || { fail "$case" "the migration to $host did not end within 120 s ($MIG_STATUS)"; return 1; }
  [ "$MIG_STATUS" = completed ] || { fail "$case" "migration to $host $MIG_STATUS: $MIG"; return 1; }
  wait_for 30 status_is "$to" paused || { fail "$case" "the destination is not paused after the migration"; return 1; }
  MIG_FIGURES=$(python3 -c '
import json, sys
m = json.loads(sys.argv[1])
print("total %s ms, downtime %s ms" % (m.get("total-time"), m.get("downtime")))' "$MIG")
  # Both stopped: the whole RAM of the source and of the destination,
  # page by page, printed. Not a verdict here: this bed's QEMU loses pages
  # on its own, with no vSocket function attached (bench_migration's kernel
  # mode: 21 of 98,304, then a kernel panic at the destination), which
  # tests/vm/migrate.sh's guest without a NIC never shows; see
  # docs/live-migration.md. tests/vm/migrate.sh is the dirty-log check.
  wait_for 30 status_is "$from" postmigrate || { fail "$case" "the source is not stopped after the migration"; return 1; }
  qmp "$WORK/$from.qmp" pmemsave "{\"val\": 0, \"size\": $((RAM_MB << 20)), \"filename\": \"$WORK/from.ram\"}" >/dev/null &&
    qmp "$WORK/$to.qmp" pmemsave "{\"val\": 0, \"size\": $((RAM_MB << 20)), \"filename\": \"$WORK/to.ram\"}" >/dev/null ||
    { fail "$case" "pmemsave failed"; return 1; }
  # (What differs in the first three pages goes to stderr: the case's output.)
  local ndiff first
  read -r _ ndiff first < <(python3 tests/vm/compare_ram.py "$WORK/from.ram" "$WORK/to.ram")
  DIFF_PAGES="${ndiff:-?}"
  [ "${ndiff:-0}" = 0 ] || DIFF_PAGES+=" ($first)"
  rm -f "$WORK/from.ram" "$WORK/to.ram"
  MIG_FIGURES="$MIG_FIGURES, guest pages different: $DIFF_PAGES"
  # The operator's hook: where the VM runs now, on every host.
  for h in hostA hostB; do
    out=$(ctl "$h" locator set 1 "$VM_ADDR" "$host" 2>&1) || { fail "$case" "$h: locator set: $out"; return 1; }
  done
  qmp "$WORK/$to.qmp" cont >/dev/null || { fail "$case" "cont on $host failed"; return 1; }
  # The source QEMU (postmigrate) goes: its tap with it.
  local i
  for i in "${!QEMU_PIDS[@]}"; do
    [ "${QEMU_PIDS[$i]}" = "$FROM_PID" ] && { stop_pid "$FROM_PID"; unset "QEMU_PIDS[$i]"; }
  done
  QEMU_PIDS=("${QEMU_PIDS[@]}")
  return 0
}

# job_checks CASE NAME [CHECK_REPORT ARGS...]: the guest's job (on QEMU
# NAME) and vmA2's servers end, every byte of both connections verified
# both ways; the 4 ends' reports checked (CHECK_REPORT ARGS).
job_checks() {
  local case=$1 name=$2 out p
  shift 2
  wait_for 200 console_has "$name" "^mig: job done" ||
    { fail "$case" "the guest's job did not end within 200 s: $(grep "^mig: " "$WORK/$name.console" | grep -v tick | tail -3 | tr '\n' ';')"; return 1; }
  for p in "${SERVER_PIDS[@]}"; do wait "$p" || { fail "$case" "an xfer server in $PEER exited $?: $(cat "$WORK"/server*.out | tr '\n' ';')"; return 1; }; done
  SERVER_PIDS=()
  grep -q "^mig: stream exit 0" "$WORK/$name.console" && grep -q "^mig: rr exit 0" "$WORK/$name.console" &&
    [ "$(grep -c "^mig: .*: xfer client: 1/1 connections verified" "$WORK/$name.console")" = 2 ] ||
    { fail "$case" "an xfer client failed: $(grep -E "^mig: (stream|rr) exit|^mig: (stream|rr): .*(xfer|rror|ailed|ismatch|refused|reset|W )" "$WORK/$name.console" | head -12 | tr '\n' ';')"; return 1; }
  grep -q "1/1 connections verified" "$WORK/server5301.out" && grep -q "1/1 connections verified" "$WORK/server5302.out" ||
    { fail "$case" "an xfer server did not verify its connection: $(cat "$WORK"/server*.out | tr '\n' ';')"; return 1; }
  grep "^mig: report: " "$WORK/$name.console" | sed 's/^mig: report: //' | tr -d '\r' > "$WORK/report.jsonl"
  cat "$WORK/peer.jsonl" >> "$WORK/report.jsonl"
  out=$(python3 tests/e2e/check_report.py "$WORK/report.jsonl" --expect-conns 4 "$@" 2>&1) || { fail "$case" "reports: $out"; return 1; }
  echo "  reports: $out"
  echo "  ends: $(python3 -c '
import collections, json, sys
c = collections.Counter()
for l in open(sys.argv[1]):
    j = json.loads(l)
    if "local" in j:
        c["%s %s, %s x%d, %d re-upgrade(s), %d B resent, %s ms on kernel TCP after its last downgrade" % ("guest" if j["local"].startswith("198.51.100.5") else "vmA2", j.get("mode"), j.get("last_downgrade"), j.get("downgrades", 0), j.get("reupgrades", 0), j.get("resent_bytes", 0), j.get("kernel_ms_after_downgrade"))] += 1
print("; ".join("%d: %s" % (n, k) for k, n in c.items()))' "$WORK/report.jsonl")"
}

# boot CASE [ENV for the daemons...]: the bed and the guest on hostA, its
# two connections accelerated same-host through vsocketd A.
boot() {
  local case=$1 out
  shift
  stop_all
  rm -f "$WORK"/*.console "$WORK"/*.qmp "$WORK"/*.qemu.log "$WORK"/*.out "$WORK"/*.jsonl
  out=$(bed_up "$@") || { fail "$case" "$out"; return 1; }
  start_qemu src hostA vsmtq0 || { fail "$case" "no tap on hostA"; return 1; }
  wait_for 120 console_has src "mig: load started" || { fail "$case" "the guest never started its load"; return 1; }
  # (Not in the guest's first seconds: most destinations that panicked, and
  # the migrations whose pages differed, were started 6-8 s into the
  # guest's life, with or without vSocket; one 36 s in. See
  # docs/live-migration.md.)
  wait_for 60 console_has src "mig: tick 12" || { fail "$case" "the guest does not tick"; return 1; }
  wait_for 60 steady hostA ||
    { fail "$case" "hostA: $(via_count hostA same-host) of vmq's connection ends accelerated same-host (want 2), accel_bytes $(stat hostA accel_bytes)"; return 1; }
  echo "  hostA before: $(via_count hostA same-host) of vmq's ends same-host through vsocketd A (accel_bytes $(stat hostA accel_bytes))"
}

case_migrate_hosts_there_and_back() {
  local t0=$SECONDS case=migrate_hosts_there_and_back f0 f1 d0
  boot $case || return
  # hostA -> hostB
  FROM_PID=${QEMU_PIDS[0]}
  d0=$(stat hostA drains_asked)
  migrate $case src dst hostB vsmtq1 || return
  local to_b=$MIG_FIGURES
  FROM_PID=${QEMU_PIDS[-1]}
  echo "  hostA -> hostB: $to_b; vsocketd A drained $(( $(stat hostA drains_asked) - d0 )) ends for the migration"
  wait_for 30 vias_are hostB hostA 2 ||
    { fail $case "hostB: $(via_count hostB hostA) of vmq's ends accelerated across the fabric (via hostA), want 2"; return; }
  f0=$(stat hostB fabric_bytes_out)
  sleep 1
  f1=$(stat hostB fabric_bytes_out)
  echo "  hostB after: $(via_count hostB hostA) of vmq's ends via hostA (the fabric); hostB fabric_bytes_out +$((f1 - f0)) in 1 s; arrivals $(stat hostB migration_arrivals), told $(stat hostB migration_sessions_told)"
  [ "$f1" -gt "$f0" ] || { fail $case "hostB's fabric carried nothing in 1 s"; return; }
  [ "$(( $(stat hostA drains_asked) - d0 ))" -ge 2 ] || { fail $case "vsocketd A drained $(( $(stat hostA drains_asked) - d0 )) ends, want 2"; return; }
  # hostB -> hostA
  d0=$(stat hostB drains_asked)
  migrate $case dst back hostA vsmtq2 || return
  echo "  hostB -> hostA: $MIG_FIGURES; vsocketd B drained $(( $(stat hostB drains_asked) - d0 )) ends for the migration"
  wait_for 30 vias_are hostA same-host 2 ||
    { fail $case "hostA after the move back: $(via_count hostA same-host) of vmq's ends same-host, want 2"; return; }
  echo "  hostA after the move back: $(via_count hostA same-host) of vmq's ends same-host"
  [ "$(( $(stat hostB drains_asked) - d0 ))" -ge 2 ] || { fail $case "vsocketd B drained $(( $(stat hostB drains_asked) - d0 )) ends, want 2"; return; }
  job_checks $case back --moves 2 --mode accelerated --downgrade-cause migration --no-resend || return
  stop_all
  pass $case $((SECONDS - t0))
}

case_migrate_hosts_drain_unfinished() {
  local t0=$SECONDS case=migrate_hosts_drain_unfinished
  boot $case VSOCKET_DEBUG_NO_MIGRATION_DRAIN=1 || return
  # hostA -> hostB: two same-host pairs on the rings at the switchover.
  FROM_PID=${QEMU_PIDS[0]}
  migrate $case src dst hostB vsmtq1 || return
  grep -q "VSOCKET_DEBUG_NO_MIGRATION_DRAIN=1" "$VSOCKET_TESTBED2_DIR/hostA/vsocketd.log" ||
    { fail $case "vsocketd A did not take VSOCKET_DEBUG_NO_MIGRATION_DRAIN=1"; return; }
  FROM_PID=${QEMU_PIDS[-1]}
  echo "  hostA -> hostB: $MIG_FIGURES; vsocketd A: drains asked $(stat hostA drains_asked), migration_leaves $(stat hostA migration_leaves), migration_peers_resynced $(stat hostA migration_peers_resynced)"
  [ "$(stat hostA drains_asked)" = 0 ] || { fail $case "vsocketd A drained anyway"; return; }
  [ "$(stat hostA migration_peers_resynced)" = 2 ] ||
    { fail $case "vsocketd A told $(stat hostA migration_peers_resynced) of vmA2's ends to resync, want 2"; return; }
  wait_for 30 vias_are hostB hostA 2 ||
    { fail $case "hostB: $(via_count hostB hostA) of vmq's ends accelerated across the fabric (via hostA), want 2"; return; }
  echo "  hostB after: $(via_count hostB hostA) of vmq's ends via hostA (the fabric)"
  # hostB -> hostA: two pairs across the fabric on the rings at the
  # switchover (vsocketd B has the same switch): hostA's ends are told by
  # a PAIR_CANCEL (fabric-down).
  migrate $case dst back hostA vsmtq2 || return
  echo "  hostB -> hostA: $MIG_FIGURES; vsocketd B: drains asked $(stat hostB drains_asked), migration_leaves $(stat hostB migration_leaves), migration_peers_resynced $(stat hostB migration_peers_resynced); hostA fabric_downgrades $(stat hostA fabric_downgrades)"
  [ "$(stat hostB migration_peers_resynced)" = 2 ] ||
    { fail $case "vsocketd B told $(stat hostB migration_peers_resynced) of vmA2's ends (on hostA) to resync, want 2"; return; }
  wait_for 30 vias_are hostA same-host 2 ||
    { fail $case "hostA after the move back: $(via_count hostA same-host) of vmq's ends same-host, want 2"; return; }
  echo "  hostA after the move back: $(via_count hostA same-host) of vmq's ends same-host"
  job_checks $case back --moves 2 --mode accelerated --resynced || return
  stop_all
  pass $case $((SECONDS - t0))
}

case_migrate_hosts_while_paused() {
  local t0=$SECONDS case=migrate_hosts_while_paused k0 d0 a0
  # Half the stream and the rounds of the two-move cases (one move here):
  # still streaming well past the move, 30 s less in the suite.
  local STREAM_BYTES=268435456 STREAM_ROUNDS=128 RR_BYTES=12000000 RR_ROUNDS=3000
  boot $case || return
  FROM_PID=${QEMU_PIDS[0]}
  k0=$(stat hostA devices_kept) d0=$(stat hostA drains_asked)
  qmp "$WORK/src.qmp" stop >/dev/null || { fail $case "stop on hostA failed"; return; }
  wait_for 30 status_is src paused || { fail $case "the guest is not paused after stop"; return; }
  kept() { [ "$(stat hostA devices_kept)" -ge $((k0 + 2)) ]; }
  wait_for 10 kept || { fail $case "vsocketd A kept $(( $(stat hostA devices_kept) - k0 )) of the paused guest's devices, want 2"; return; }
  # Paused for a moment: vmA2's writes wait for credit, as for a paused
  # VM's kernel TCP peer; nothing moves through vsocketd A.
  a0=$(stat hostA accel_bytes)
  sleep 2
  echo "  paused: vsocketd A kept $(( $(stat hostA devices_kept) - k0 )) devices; moved $(( $(stat hostA accel_bytes) - a0 )) B in 2 s"
  migrate $case src dst hostB vsmtq1 || return
  echo "  hostA -> hostB while paused: $MIG_FIGURES; vsocketd A: drains asked $(( $(stat hostA drains_asked) - d0 )), migration_leaves $(stat hostA migration_leaves), migration_peers_resynced $(stat hostA migration_peers_resynced)"
  [ "$(( $(stat hostA drains_asked) - d0 ))" = 0 ] ||
    { fail $case "vsocketd A drained $(( $(stat hostA drains_asked) - d0 )) ends of a paused guest (its dirty log went on?)"; return; }
  resynced() { [ "$(stat hostA migration_peers_resynced)" -ge 2 ]; }
  wait_for 30 resynced ||
    { fail $case "vsocketd A told $(stat hostA migration_peers_resynced) of vmA2's ends to resync once the source QEMU went, want 2"; return; }
  wait_for 30 vias_are hostB hostA 2 ||
    { fail $case "hostB: $(via_count hostB hostA) of vmq's ends accelerated across the fabric (via hostA), want 2"; return; }
  echo "  hostB after: $(via_count hostB hostA) of vmq's ends via hostA (the fabric); arrivals $(stat hostB migration_arrivals), told $(stat hostB migration_sessions_told)"
  job_checks $case dst --moves 1 --mode accelerated --resynced || return
  stop_all
  pass $case $((SECONDS - t0))
}

case_vm_across_hosts() {
  local t0=$SECONDS case=vm_across_hosts out h vr=vmr vr_addr=198.51.100.6
  local STREAM_BYTES=268435456 STREAM_ROUNDS=32 RR_BYTES=2000000 RR_ROUNDS=500
  stop_all
  rm -f "$WORK"/*.console "$WORK"/*.qmp "$WORK"/*.qemu.log "$WORK"/*.out "$WORK"/*.jsonl
  out=$(NO_PEER_SERVERS=1 bed_up) || { fail $case "$out"; return; }
  # The second VM: configured on hostB only, placed there on both hosts.
  out=$(ctl hostB vm add "$vr" --socket "$VSOCKET_TESTBED2_DIR/hostB/$vr.sock" --tenant 1 --addresses "$vr_addr" \
        --prove-sockets false --direct off 2>&1) || { fail $case "hostB: vm add $vr: $out"; return; }
  for h in hostA hostB; do
    out=$(ctl "$h" locator set 1 "$vr_addr" hostB 2>&1) || { fail $case "$h: locator set: $out"; return; }
  done
  local f0
  f0=$(stat hostA fabric_bytes_out)
  VM=$vr VM_ADDR=$vr_addr VM_MAC=52:54:00:5e:00:06 MIG_ROLE=server start_qemu srv hostB vsmtr0 ||
    { fail $case "no tap on hostB"; return; }
  wait_for 120 console_has srv "mig: servers started" || { fail $case "the server guest never started its servers"; return; }
  PEER_ADDR=$vr_addr start_qemu cli hostA vsmtq0 || { fail $case "no tap on hostA"; return; }
  wait_for 120 console_has cli "mig: load started" || { fail $case "the client guest never started its load"; return; }
  # Both connections on the fabric: vmq's ends on hostA via hostB.
  wait_for 60 vias_are hostA hostB 2 ||
    { fail $case "hostA: $(via_count hostA hostB) of vmq's ends accelerated via hostB (want 2)"; return; }
  local vias
  vias=$(ctl hostB --json connections 2>/dev/null | python3 -c '
import json, sys
print(sum(c["vm"] == "vmr" and c["via"] == "hostA" for c in json.load(sys.stdin)))')
  echo "  across the fabric: hostA has $(via_count hostA hostB) of vmq's ends via hostB, hostB $vias of vmr's via hostA"
  [ "$vias" -ge 2 ] || { fail $case "hostB: $vias of vmr's ends via hostA (want 2)"; return; }
  local name p
  for name in cli srv; do
    wait_for 200 console_has "$name" "^mig: job done" ||
      { fail $case "the $name guest's job did not end within 200 s: $(grep "^mig: " "$WORK/$name.console" | grep -v tick | tail -3 | tr '\n' ';')"; return; }
  done
  grep -q "^mig: stream exit 0" "$WORK/cli.console" && grep -q "^mig: rr exit 0" "$WORK/cli.console" &&
    [ "$(grep -c "^mig: .*: xfer client: 1/1 connections verified" "$WORK/cli.console")" = 2 ] ||
    { fail $case "an xfer client failed: $(grep -E "^mig: (stream|rr)" "$WORK/cli.console" | head -6 | tr '\n' ';')"; return; }
  grep -q "^mig: server stream exit 0" "$WORK/srv.console" && grep -q "^mig: server rr exit 0" "$WORK/srv.console" &&
    [ "$(grep -c "^mig: .*connections verified" "$WORK/srv.console")" = 2 ] ||
    { fail $case "an xfer server failed: $(grep -E "^mig: (server|stream|rr)" "$WORK/srv.console" | head -6 | tr '\n' ';')"; return; }
  for name in cli srv; do grep "^mig: report: " "$WORK/$name.console" | sed 's/^mig: report: //' | tr -d '\r'; done > "$WORK/report.jsonl"
  out=$(python3 tests/e2e/check_report.py "$WORK/report.jsonl" --expect-conns 4 --mode accelerated --reason accelerated \
        --accel-min 1 2>&1) || { fail $case "reports: $out"; return; }
  local fab=$(( $(stat hostA fabric_bytes_out) - f0 ))
  echo "  reports: $out; hostA fabric_bytes_out +$fab"
  [ "$fab" -ge "$STREAM_BYTES" ] || { fail $case "hostA's fabric carried $fab B, less than the stream's $STREAM_BYTES"; return; }
  stop_all
  pass $case $((SECONDS - t0))
}

# bench_migration (not run by default; bench/migration_bench.sh runs it):
# what vSocket adds to a migration. The same VM, with and without its two
# vSocket functions (NOVS=1: the job runs xfer on plain kernel TCP, vmA2's
# servers without the library), under the same load, migrated BENCH_MOVES
# times between the hosts (A, B, A, ...); per migration QMP's query-migrate
# (total time, downtime, setup time, MiB transferred) and, with vSocket, how
# long after `cont` both connection ends were accelerated again where the
# VM runs now. Every byte still checked by xfer. Results (JSON) in
# BENCH_OUT.
case_bench_migration() {
  local t0=$SECONDS case=bench_migration mode i from to host tap t1 ready out
  # The same 60 huge pages as the two-move cases, for any number of moves:
  # a lost session's grant goes back once its connections resynced (before,
  # each move cost each process 8 more, and the third ran out on 2026-11-30).
  : > "$WORK/bench.jsonl"
  for mode in ${BENCH_MODES:-vsocket kernel}; do
    export NOVS=0
    [ "$mode" = kernel ] && NOVS=1
    stop_all
    rm -f "$WORK"/*.console "$WORK"/*.qmp "$WORK"/*.qemu.log "$WORK"/*.out "$WORK"/*.jsonl.tmp "$WORK/peer.jsonl"
    out=$(bed_up) || { fail $case "$mode: $out"; return; }
    start_qemu m0 hostA vsmtq0 || { fail $case "no tap on hostA"; return; }
    wait_for 120 console_has m0 "mig: load started" || { fail $case "$mode: the guest never started its load"; return; }
    wait_for 60 console_has m0 "mig: tick 12" || { fail $case "$mode: the guest does not tick"; return; }
    if [ "$mode" = vsocket ]; then
      wait_for 60 steady hostA || { fail $case "not accelerated on hostA"; return; }
    else
      sleep 3
    fi
    from=m0
    for ((i = 1; i <= ${BENCH_MOVES:-4}; i++)); do
      if [ $((i % 2)) = 1 ]; then host=hostB; else host=hostA; fi
      to=m$i tap=vsmtq$i
      FROM_PID=${QEMU_PIDS[-1]}
      migrate $case "$from" "$to" "$host" "$tap" || return
      t1=$(date +%s.%N)
      ready=null
      if [ "$mode" = vsocket ]; then
        local via=same-host
        [ "$host" = hostB ] && via=hostA
        wait_for 30 vias_are "$host" "$via" 2 || { fail $case "move $i: not accelerated again on $host"; return; }
        ready=$(python3 -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 2))" "$t1")
        sleep 2  # (running on the rings again before the next move)
      else
        sleep 3
      fi
      python3 -c '
import json, sys
m = json.loads(sys.argv[1]); r = m.get("ram", {})
print(json.dumps({"mode": sys.argv[2], "move": int(sys.argv[3]), "to": sys.argv[4], "total_ms": m.get("total-time"),
  "downtime_ms": m.get("downtime"), "setup_ms": m.get("setup-time"), "transferred_mib": round(r.get("transferred", 0) / 2**20, 1),
  "dirty_sync_rounds": r.get("dirty-sync-count"), "accelerated_again_s": json.loads(sys.argv[5])}))' \
        "$MIG" "$mode" "$i" "$host" "$ready" >> "$WORK/bench.jsonl"
      echo "  $mode move $i to $host: $MIG_FIGURES${ready:+, accelerated again $ready s after cont}"
      from=$to
    done
    local xfers=2
    [ "$mode" = vsocket ] || xfers=2
    job_checks_bench "$case" "$from" || return
  done
  python3 - "$WORK/bench.jsonl" "${BENCH_OUT:-$WORK/bench.json}" "$RAM_MB" "${BENCH_MOVES:-4}" <<'PY' || { fail $case "no result"; return; }
import json, statistics, sys, time
rows = [json.loads(l) for l in open(sys.argv[1])]
def med(mode, k):
    v = [r[k] for r in rows if r["mode"] == mode and r[k] is not None]
    return {"median": statistics.median(v), "min": min(v), "max": max(v)} if v else None
modes = [m for m in ("vsocket", "kernel") if any(r["mode"] == m for r in rows)]  # (BENCH_MODES may name one)
out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "ram_mib": int(sys.argv[3]), "moves": int(sys.argv[4]),
       "rows": rows,
       "summary": {m: {k: med(m, k) for k in ("total_ms", "downtime_ms", "setup_ms", "transferred_mib", "accelerated_again_s")}
                   for m in modes}}
if not modes:
    sys.exit("no migration measured")
json.dump(out, open(sys.argv[2], "w"), indent=1)
for m in modes:
    s = out["summary"][m]
    print("  %s: total %s ms, downtime %s ms, setup %s ms, %s MiB (medians of %d)" % (m, s["total_ms"]["median"], s["downtime_ms"]["median"], s["setup_ms"]["median"], s["transferred_mib"]["median"], out["moves"]))
PY
  stop_all
  pass $case $((SECONDS - t0))
}
# job_checks_bench CASE NAME: the job ends and every byte was verified at
# both ends (the reports of a VM without vSocket are empty).
job_checks_bench() {
  local case=$1 name=$2 p
  wait_for 200 console_has "$name" "^mig: job done" || { fail "$case" "the guest's job did not end within 200 s"; return 1; }
  for p in "${SERVER_PIDS[@]}"; do wait "$p" || { fail "$case" "an xfer server in $PEER failed"; return 1; }; done
  SERVER_PIDS=()
  [ "$(grep -c "^mig: .*: xfer client: 1/1 connections verified" "$WORK/$name.console")" = 2 ] &&
    grep -q "1/1 connections verified" "$WORK/server5301.out" && grep -q "1/1 connections verified" "$WORK/server5302.out" ||
    { fail "$case" "a transfer failed: $(grep -E "^mig: (stream|rr)" "$WORK/$name.console" | head -4 | tr '\n' ';')"; return 1; }
}

make_initrd
# A case whose guest's kernel panicked is run once more, saying so: this
# bed's QEMU migrations (TCG, a tap NIC) corrupt guest memory now and then
# with or without vSocket attached (about 1 destination in 10 panicked;
# docs/live-migration.md), a fault of the test bed, not of what the case
# checks. Any other failure, or a second panic, fails the case.
# (The first try's output waits beside $WORK: a case empties $WORK.)
for c in "${CASES[@]}"; do
  if ! declare -F "case_$c" >/dev/null; then echo "FAIL $c: no such case"; failed=$((failed + 1)); continue; fi
  f0=$failed
  "case_$c" >"$WORK.case" 2>&1
  if [ "$failed" -gt "$f0" ] && grep -qs "Kernel panic" "$WORK"/*.console; then
    echo "RETRY $c: a guest's kernel panicked (the bed's migrations, with or without vSocket); its first try:"
    sed 's/^/  | /' "$WORK.case"
    failed=$f0
    "case_$c"
  else
    cat "$WORK.case"
  fi
  rm -f "$WORK.case"
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
