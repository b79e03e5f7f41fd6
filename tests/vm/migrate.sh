#!/usr/bin/env bash
# Live migration of a QEMU (TCG) guest attached to vsocketd (issue 36;
# decisions 88, 93, 94): the dirty-log completeness check, and the guest's
# accelerated connections across the move.
#
# The guest's load: its agent (vsocket-guestd) owns two vSocket functions;
# xfer (unmodified, under libvsocket-vm.so) server and client, one process
# each, run 2 connections of XFER_BYTES (200,000,000) each way in 400
# request/response rounds, every byte checked by xfer; the libraries'
# reports (VSOCKET_REPORT) come back on the serial console.
#
#   migrate_under_load  While the connections stream accelerated through
#                   vsocketd A, QMP `migrate` moves the guest to a
#                   destination QEMU (-incoming, -S) attached to vsocketd B.
#                   The migration must complete; then the guest memory of
#                   the source (stopped) and of the destination (paused) is
#                   saved (QMP pmemsave) and compared page by page: every
#                   page equal means no write vsocketd made into the guest
#                   during the migration was left out of QEMU's dirty log.
#                   Continued, the destination runs the transfer to its end:
#                   xfer's client and server exit 0, and every connection
#                   end's report says it left the rings (a downgrade, cause
#                   migration: vsocketd A drained it when the dirty log went
#                   on), was accelerated again (a re-upgrade, accelerated at
#                   its close) and carried every byte; vsocketd A asked the
#                   drains, vsocketd B told the arrived sessions and upgraded
#                   the connections again.
#   migrate_after_function_reset  The same, both of the guest's functions
#                   reset just before (a short connection between two
#                   processes that exit: the agent resets the functions and
#                   sets them up again) : the drain done in the pre-copy,
#                   every page equal, every byte, accelerated again through
#                   vsocketd B (a function reset before a migration stalled
#                   its drain before decision 128).
#   migrate_with_agent_proofs  The same with prove_sockets = agent (the
#                   agent's own function last, on PATH.agent): the devices
#                   that arrive at vsocketd B reach no memory until the
#                   agent limits them again (B flags them; decision 130),
#                   then the ends re-register (vouched for) and are
#                   accelerated through B; every page equal, every byte.
#   migrate_cancelled  The same guest, the migration cancelled during the
#                   pre-copy (QMP migrate_cancel): vsocketd A's dirty log
#                   goes on (the connections leave the rings), then off
#                   (counted, logged, nothing marked after); the guest stays
#                   on the source, its connections are accelerated again
#                   through A, and the transfer ends with the same checks.
#   migrate_without_dirty_log  The negative control: the same with
#                   vsocketd A started with VSOCKET_DEBUG_NO_DIRTY_LOG=1
#                   (it counts what it would mark and marks nothing) and
#                   VSOCKET_DEBUG_NO_MIGRATION_DRAIN=1 (the connections stay
#                   on the rings, so that vsocketd writes during the
#                   pre-copy) and VSOCKET_DEBUG_SWITCHOVER_AS_EXIT=1 (see
#                   the case). Pages must differ: the comparison does see
#                   missed writes.
#   migrate_failed_on_destination  As migrate_cancelled, the destination
#                   QEMU killed instead (decision 107).
#   migrate_drain_unfinished  No drain (VSOCKET_DEBUG_NO_MIGRATION_DRAIN=1):
#                   every connection on the rings at the switchover; no
#                   "peer closed" to the VM's own peers, RESYNC at the
#                   destination, accelerated again (decision 106).
#   migrate_one_way  (by name) Both connections one way (the client only
#                   writes): each end leaves the rings in the pre-copy and
#                   is accelerated again through vsocketd B. It passed
#                   before the sender heard the news from its own sends
#                   too (its kernel socket fills under TCG, and its waits
#                   look): the suite's guard of that is same_host's
#                   drain_undrain (its one-way stream must re-upgrade).
#   migrate_source_daemon_killed  vsocketd A SIGKILLed in the pre-copy: the
#                   migration completes, accelerated again through B.
#   migrate_destination_without_vsocketd  vsocketd B gone before the
#                   migration: kernel TCP on arrival, every byte; B started
#                   again later (decision 107).
#   migrate_source_daemon_restarted, migrate_destination_daemon_restarted
#                   vsocketd A or B killed and started again in the
#                   pre-copy under QEMU's reconnect=1 (decision 111).
#
# Usage: tests/vm/migrate.sh [--no-build] [CASE...]   (as root)
# VSOCKETD=PATH runs both daemons from another build (e.g. one from before
# decision 88, which QEMU refuses to migrate); VSOCKET_MIG_BIN=DIR takes
# every binary from DIR (bazel-bin's layout).
# Prints "PASS CASE (Ns)" / "FAIL CASE: why" and ends with "N passed, N
# failed". Every wait is bounded; QEMU and vsocketd are stopped by PID on
# exit. Run it under `flock /tmp/vsocket-e2e.lock` on shared machines.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/vm/lib.sh

vm_script_args migrate_under_load migrate_after_function_reset migrate_with_agent_proofs migrate_cancelled migrate_without_dirty_log migrate_failed_on_destination \
  migrate_drain_unfinished migrate_source_daemon_killed migrate_destination_without_vsocketd \
  migrate_source_daemon_restarted migrate_destination_daemon_restarted -- "$@"

die() { echo "migrate.sh: $*" >&2; echo "0 passed, 1 failed"; exit 1; }
bash tests/rdma/install-deps.sh || die "installing QEMU and busybox failed"
bash tests/vm/prepare.sh || die "preparing the guest kernel and initramfs failed"
TARGETS=(//host-backend:vsocketd //host-backend:vsocketctl //guest/agent:vsocket-guestd //guest/agent:libvsocket-vm.so
         //tests/e2e:xfer)
if [ "$BUILD" = 1 ]; then
  flock -o /tmp/vsocket-bazel.lock bazel build "${TARGETS[@]}" >/dev/null 2>&1 || die "bazel build failed"
fi
# VSOCKET_MIG_BIN=DIR: every binary from DIR (bazel-bin's layout), e.g. a
# private copy kept stable while others rebuild.
BIN=${VSOCKET_MIG_BIN:-$(bazel info bazel-bin 2>/dev/null)} || die "bazel info failed"
for t in host-backend/vsocketd host-backend/vsocketctl guest/agent/vsocket-guestd guest/agent/libvsocket-vm.so \
         tests/e2e/xfer; do
  [ -e "$BIN/$t" ] || die "$t not built"
done

VSOCKETD=${VSOCKETD:-$BIN/host-backend/vsocketd}
WORK=$(mktemp -d /tmp/vsocket-mig-XXXXXX)
RAM_MB=256
# Bytes each of the guest's 2 connections carries each way (xfer checks
# every one): enough to outlast the migration and the re-upgrade after.
XFER_BYTES=${XFER_BYTES:-200000000}
# The guest's load, BYTES,ROUNDS (the job's mig.load): request/response
# rounds, so that both ends read all along (decision 094 says why).
GUEST_LOAD=$XFER_BYTES,400
# PIDs this script started: the two QEMUs, the two daemons.
SRC_PID="" DST_PID="" DA_PID="" DB_PID=""
# The etcd directory's cases (MIG_ETCD=1, decision 116): one etcd on
# loopback for the whole run (ETCD_PID), started by the first such case.
ETCD_PID="" ETCD_PORT="" MIG_ETCD=0
stop_pid() {
  local pid=$1 i
  [ -n "$pid" ] || return 0
  kill "$pid" 2>/dev/null || return 0
  for i in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.3; done
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
stop_all() {
  stop_pid "$SRC_PID"; stop_pid "$DST_PID"; stop_pid "$DA_PID"; stop_pid "$DB_PID"
  SRC_PID="" DST_PID="" DA_PID="" DB_PID=""
}
cleanup() { stop_all; stop_pid "$ETCD_PID"; rm -rf "$WORK"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

qmp() { timeout 40 python3 tests/vm/qmp.py "$@"; }
# stat CTL KEY: a counter of the daemon on control socket CTL
stat() {
  "$BIN/host-backend/vsocketctl" --socket "$1" stats 2>/dev/null | python3 -c "
import json, sys
s = json.load(sys.stdin)
print(next((g[sys.argv[1]] for g in s.values() if isinstance(g, dict) and sys.argv[1] in g), -1))" "$2"
}

# The guest's initramfs: prepare.sh's (modules, busybox) with this test's
# /init, job and binaries appended as a second archive (the kernel unpacks
# both, the later files winning).
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
  # Two processes, each on a vSocket function of its own (the agent grants
  # one per process): xfer's server and client, 2 connections streaming
  # both ways, far longer than the migration takes. A tick a second shows
  # the guest runs (on the destination too, once continued).
  cat > "$stage/stage/job.sh" <<'JOB'
export LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu
( i=0; while :; do echo "mig: tick $i"; i=$((i + 1)); sleep 1; done ) &
ip link set lo up
ip addr add 203.0.113.10/32 dev lo
# mig.proofs=1: the agent is the VM's socket-proof authority (its last
# function, on the port's agent socket) and limits each function's memory.
AGENT_ARGS=""
tr ' ' '\n' < /proc/cmdline | grep -qx 'mig.proofs=1' && AGENT_ARGS=--proofs
./vsocket-guestd --serve /run/agent.sock $AGENT_ARGS > /tmp/agent.out 2>&1 &
for _ in $(seq 300); do [ -S /run/agent.sock ] && break; sleep 0.1; done
export VSOCKET_SOCKET=/run/agent.sock
export VSOCKET_REPORT=/tmp/report.jsonl VSOCKET_LOG_LEVEL=info
# The load (kernel command line mig.load=BYTES,ROUNDS[,oneway]; ROUNDS 0:
# one stream each way, or one way with oneway): set per case by the test
# (GUEST_LOAD).
# mig.cycle=1: first a short connection between two preloaded processes,
# which take both functions and give them back as they exit (the agent
# resets each and sets it up again), just before the load and the move.
if tr ' ' '\n' < /proc/cmdline | grep -qx 'mig.cycle=1'; then
  LD_PRELOAD=/stage/libvsocket-vm.so ./xfer server 203.0.113.10 5302 --conns 1 > /tmp/cycle-server.out 2>&1 &
  CS=$!
  for _ in $(seq 300); do netstat -ltn | grep -q ':5302 ' && break; sleep 0.1; done
  LD_PRELOAD=/stage/libvsocket-vm.so ./xfer client 203.0.113.10 5302 --conns 1 --bytes 100000 > /tmp/cycle-client.out 2>&1
  echo "mig: cycle client exit $?"
  wait $CS
  echo "mig: cycle server exit $?"
  echo "mig: functions cycled"
fi
LOAD=$(tr ' ' '\n' < /proc/cmdline | sed -n 's/^mig\.load=//p')
IFS=, read -r BYTES ROUNDS WAY <<EOF
$LOAD
EOF
[ "$ROUNDS" = 0 ] && RARGS="" || RARGS="--rounds $ROUNDS"
# WAY oneway: the client only writes, the server only reads.
[ "$WAY" = oneway ] && RARGS="$RARGS --one-way"
LD_PRELOAD=/stage/libvsocket-vm.so ./xfer server 203.0.113.10 5301 --conns 2 $RARGS > /tmp/server.out 2>&1 &
SERVER=$!
for _ in $(seq 300); do netstat -ltn | grep -q ':5301 ' && break; sleep 0.1; done
LD_PRELOAD=/stage/libvsocket-vm.so ./xfer client 203.0.113.10 5301 --conns 2 --bytes "$BYTES" $RARGS --pause-ms 500 \
  > /tmp/client.out 2>&1 &
echo "mig: load started"
wait $!
echo "mig: client exit $?"
wait $SERVER  # (its reports are written as it closes; bounded by vsocket.timeout)
echo "mig: server exit $?"
sed 's/^/mig: client: /' /tmp/client.out
sed 's/^/mig: server: /' /tmp/server.out
sed 's/^/mig: agent: /' /tmp/agent.out
sed 's/^/mig: report: /' /tmp/report.jsonl
echo "mig: job done"
JOB
  (cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) | gzip -1 > "$WORK/extra.cpio.gz"
  cat "$VM_CACHE/initramfs.cpio.gz" "$WORK/extra.cpio.gz" > "$WORK/initrd"
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
etcd_up() {
  local peer i
  [ -n "$ETCD_PID" ] && return 0
  command -v etcd >/dev/null || return 1
  bash deploy/make-certs.sh "$WORK/certs" hostA hostB >/dev/null 2>&1 || return 1
  ETCD_PORT=$(free_port) peer=$(free_port)
  etcd --name mig --data-dir "$WORK/etcd" --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" --listen-peer-urls "http://127.0.0.1:$peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer" --initial-cluster "mig=http://127.0.0.1:$peer" \
    >"$WORK/etcd.log" 2>&1 &
  ETCD_PID=$!
  for i in $(seq 100); do mig_etcdctl endpoint health >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}
mig_etcdctl() { ETCDCTL_API=3 timeout 10 etcdctl --endpoints "127.0.0.1:$ETCD_PORT" "$@"; }
# vm_hosts: the hosts whose records in etcd hold the guest's VM (vmq,
# tenant 1), sorted: "hostA", "hostB", "" or "hostA hostB".
vm_hosts() {
  mig_etcdctl get --prefix --keys-only /vsocket/tenants/ 2>/dev/null | awk -F/ 'NF && $NF == "vmq" { print $(NF - 1) }' |
    sort | tr '\n' ' ' | sed 's/ $//'
}
vm_hosts_are() { [ "$(vm_hosts)" = "$1" ]; }
# wait_ms MS CMD...: runs CMD every 50 ms until it succeeds (0) or MS pass
# (1); WAITED_MS: how long it took.
wait_ms() {
  local t0 now limit=$1
  shift
  t0=$(date +%s%3N)
  while :; do
    now=$(date +%s%3N)
    WAITED_MS=$((now - t0))
    "$@" && return 0
    [ "$WAITED_MS" -lt "$limit" ] || return 1
    sleep 0.05
  done
}

# start_daemon NAME [ENV...]: vsocketd NAME with the guest's port (vmq,
# tenant 1, 203.0.113.10) on $WORK/NAME.sock, control socket
# $WORK/NAME.ctl; pid in DAEMON_PID. With MIG_ETCD=1: as host${NAME^^}
# (hostA, hostB) with locator = etcd, and B's VM incoming (decision 116).
start_daemon() {
  local name=$1 i conf=()
  shift
  if [ "$MIG_ETCD" = 1 ]; then
    local host=host${name^^}
    cat >"$WORK/$name.conf" <<CONF
host_name = $host
peer_listen = 127.0.0.1:$(free_port)
tls_cert = $WORK/certs/$host.crt
tls_key = $WORK/certs/$host.key
tls_ca = $WORK/certs/ca.crt
locator = etcd://127.0.0.1:$ETCD_PORT
CONF
    conf=(--config "$WORK/$name.conf")
    [ "$name" = b ] && set -- "$@" VSOCKET_VM_VMQ_INCOMING=true
  fi
  env "$@" VSOCKET_VM_VMQ_PROVE_SOCKETS="${MIG_PROVE:-false}" "$VSOCKETD" "${conf[@]}" --ctl "$WORK/$name.ctl" --log-level info \
    --port "$WORK/$name.sock,vmq,1,203.0.113.10" >"$WORK/$name.log" 2>&1 &
  DAEMON_PID=$!
  for i in $(seq 100); do
    "$BIN/host-backend/vsocketctl" --socket "$WORK/$name.ctl" counters >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}

# start_qemu NAME SOCKET [QEMU ARGS...]: the guest (two vSocket functions on
# vhost-user SOCKET), QMP on $WORK/NAME.qmp, console in $WORK/NAME.console;
# pid in QEMU_PID. Source and destination differ only in their arguments.
# QEMU_CHARDEV_OPTS: appended to each vhost-user chardev (",reconnect=1").
start_qemu() {
  local name=$1 sock=$2 i
  shift 2
  local vs=()
  for i in 0 1; do
    vs+=(-chardev "socket,id=vs$i,path=$sock${QEMU_CHARDEV_OPTS:-}" -netdev "vhost-user,id=vsn$i,chardev=vs$i"
         -device "$VM_NET_DEVICE,netdev=vsn$i")
  done
  # MIG_PROVE=agent: the agent's own function last, on the port's agent socket.
  [ "${MIG_PROVE:-false}" = agent ] &&
    vs+=(-chardev "socket,id=vsa,path=$sock.agent${QEMU_CHARDEV_OPTS:-}" -netdev "vhost-user,id=vsna,chardev=vsa"
         -device "$VM_NET_DEVICE,netdev=vsna")
  qemu-system-x86_64 \
    -accel tcg,thread=multi -cpu max -smp 1 -m "$RAM_MB" \
    -object "memory-backend-memfd,id=mem0,size=${RAM_MB}M,share=on" -machine memory-backend=mem0 \
    -display none -vga none -monitor none -no-reboot -nodefaults \
    -chardev "file,id=con0,path=$WORK/$name.console" -serial chardev:con0 \
    -qmp "unix:$WORK/$name.qmp,server=on,wait=off" \
    -kernel "$VM_CACHE/vmlinuz" -initrd "$WORK/initrd" \
    -append "console=ttyS0 quiet loglevel=3 panic=-1 vsocket.timeout=280 vsocket.hugepages=40 mig.load=$GUEST_LOAD ${MIG_APPEND:-}" \
    "${vs[@]}" "$@" \
    </dev/null >"$WORK/$name.qemu.log" 2>&1 &
  QEMU_PID=$!
}

# wait_for SECS CMD...: runs CMD every 0.5 s until it succeeds (0) or SECS pass (1).
wait_for() {
  local deadline=$(( $(date +%s) + $1 ))
  shift
  while ! "$@"; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.5
  done
}
console_has() { grep -q "$2" "$WORK/$1.console" 2>/dev/null; }
accel_moving() { [ "$(stat "$WORK/a.ctl" accel_bytes)" -gt "$1" ]; }
migration_done() {
  MIG=$(qmp "$WORK/src.qmp" query-migrate 2>/dev/null) || return 1
  MIG_STATUS=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get("status", "none"))' "$MIG")
  case "$MIG_STATUS" in completed|failed|cancelled) return 0 ;; *) return 1 ;; esac
}
status_is() { qmp "$WORK/$1.qmp" query-status 2>/dev/null | grep -q "\"status\": \"$2\""; }

passed=0 failed=0
pass() { echo "PASS $1 ($2s)"; passed=$((passed + 1)); }
fail() {
  echo "FAIL $1: $2"
  failed=$((failed + 1))
  local f
  # Kept for a look after the run (the work directory goes at exit).
  mkdir -p /tmp/vsocket-mig-last && cp "$WORK"/*.log "$WORK"/*.console /tmp/vsocket-mig-last/ 2>/dev/null
  for f in a.log b.log src.console dst.console src.qemu.log dst.qemu.log; do
    [ -s "$WORK/$f" ] && { echo "--- $f (tail)"; tail -8 "$WORK/$f"; }
  done
}

# boot_pair CASE [ENV for vsocketd A...]: both daemons, the source guest
# streaming through A, the destination QEMU waiting (-incoming, -S) on B
# (its chardevs with DST_CHARDEV_OPTS);
# the migration's port in MIG_PORT. Returns 1 (after fail) if any of it
# does not come up.
boot_pair() {
  local case=$1
  shift
  stop_all
  rm -f "$WORK"/{a,b}.{log,ctl,sock} "$WORK"/{src,dst}.{console,qmp,qemu.log} "$WORK"/*.ram
  rm -rf "$WORK"/{a,b}.ctl.vms.d  # (a VM marked left by an earlier case's migration: decision 139)
  if [ "$MIG_ETCD" = 1 ]; then
    etcd_up || { fail "$case" "etcd did not start (etcd-server installed? $WORK/etcd.log: $(tail -2 "$WORK/etcd.log" 2>/dev/null | tr '\n' ' '))"; return 1; }
    mig_etcdctl del --prefix /vsocket/ >/dev/null
  fi
  start_daemon a "$@" || { fail "$case" "vsocketd A did not start"; return 1; }
  DA_PID=$DAEMON_PID
  start_daemon b || { fail "$case" "vsocketd B did not start"; return 1; }
  DB_PID=$DAEMON_PID
  MIG_PORT=$(free_port)
  QEMU_CHARDEV_OPTS=${SRC_CHARDEV_OPTS:-} start_qemu src "$WORK/a.sock"
  SRC_PID=$QEMU_PID
  local accel0
  accel0=$(stat "$WORK/a.ctl" accel_bytes)
  wait_for 120 console_has src "mig: load started" || { fail "$case" "the source guest never started its load"; return 1; }
  wait_for 60 accel_moving $((accel0 + 4000000)) ||
    { fail "$case" "no accelerated stream through vsocketd A (accel_bytes $(stat "$WORK/a.ctl" accel_bytes))"; return 1; }
  # The destination: same machine, attached to vsocketd B, paused once the
  # state is in (-S) so that nothing runs there before the comparison.
  QEMU_CHARDEV_OPTS=${DST_CHARDEV_OPTS:-} start_qemu dst "$WORK/b.sock" -incoming "tcp:127.0.0.1:$MIG_PORT" -S
  DST_PID=$QEMU_PID
  wait_for 30 status_is dst inmigrate || { fail "$case" "the destination QEMU did not come up"; return 1; }
}

# compare_ram CASE: the stopped source's and the paused destination's whole
# RAM (QMP pmemsave), page by page: PAGES, DIFF_PAGES, DIFF_LIST (the
# first few), and what differs in the first three printed.
compare_ram() {
  local case=$1
  qmp "$WORK/src.qmp" pmemsave "{\"val\": 0, \"size\": $((RAM_MB << 20)), \"filename\": \"$WORK/src.ram\"}" >/dev/null &&
    qmp "$WORK/dst.qmp" pmemsave "{\"val\": 0, \"size\": $((RAM_MB << 20)), \"filename\": \"$WORK/dst.ram\"}" >/dev/null ||
    { fail "$case" "pmemsave failed"; return 1; }
  # (What differs in the first three pages, source against destination,
  # goes to stderr: the case's output.)
  # (Under tests/run_all.sh, a difference keeps the differing pages, the
  # daemons' logs and their connection tables in the failed cases' files.)
  local keep=""
  [ -n "${E2E_FAIL_DIR:-}" ] && keep="$E2E_FAIL_DIR/$case-ram-$(date +%s)"
  read -r PAGES DIFF_PAGES DIFF_LIST < <(python3 tests/vm/compare_ram.py "$WORK/src.ram" "$WORK/dst.ram" \
    ${keep:+--save "$keep"})
  if [ -n "$keep" ] && [ "$DIFF_PAGES" != 0 ]; then
    cp "$WORK"/*.log "$WORK"/*.console "$keep/" 2>/dev/null
    local f
    for f in a b; do "$BIN/host-backend/vsocketctl" --socket "$WORK/$f.ctl" connections > "$keep/$f.connections" 2>&1; done
  fi
  rm -f "$WORK/src.ram" "$WORK/dst.ram"
}

# run_migration CASE [ENV for vsocketd A...]: boot_pair, then migrates
# under load and compares guest memory. Sets DIFF_PAGES, PAGES and the
# figures the cases print; returns 1 (after fail) if the migration itself
# did not happen.
run_migration() {
  local case=$1
  boot_pair "$@" || return 1
  if [ "$MIG_ETCD" = 1 ]; then
    # Before: the VM in hostA's records only (hostB's is incoming).
    wait_ms 3000 vm_hosts_are hostA || { fail "$case" "before the migration the directory places vmq on '$(vm_hosts)', want hostA"; return 1; }
  fi
  ACCEL_BEFORE=$(stat "$WORK/a.ctl" accel_bytes)
  qmp "$WORK/src.qmp" migrate-set-parameters '{"max-bandwidth": 1073741824, "downtime-limit": 300}' >/dev/null
  local t0=$SECONDS
  MIG_OUT=$(qmp "$WORK/src.qmp" migrate "{\"uri\": \"tcp:127.0.0.1:$MIG_PORT\"}" 2>&1) ||
    { fail "$case" "QEMU refused the migration: $MIG_OUT"; return 1; }
  MIG_STATUS=none
  wait_for 150 migration_done || { fail "$case" "the migration did not end within 150 s (status $MIG_STATUS)"; return 1; }
  MIG_SECS=$((SECONDS - t0))
  ACCEL_AFTER=$(stat "$WORK/a.ctl" accel_bytes)
  [ "$MIG_STATUS" = completed ] || { fail "$case" "migration $MIG_STATUS: $MIG"; return 1; }
  wait_for 30 status_is dst paused || { fail "$case" "the destination is not paused after the migration"; return 1; }
  wait_for 30 status_is src postmigrate || { fail "$case" "the source is not stopped after the migration"; return 1; }
  if [ "$MIG_ETCD" = 1 ]; then
    # The switchover withdrew it from hostA's records; hostB's devices have
    # not started (-S): in nobody's (decision 116).
    wait_ms 2000 vm_hosts_are "" ||
      { fail "$case" "after the switchover the directory places vmq on '$(vm_hosts)', want nowhere until the destination runs"; return 1; }
    WITHDRAWN_MS=$WAITED_MS
  fi
  compare_ram "$case" || return 1
  LOG_STARTS=$(stat "$WORK/a.ctl" dirty_log_starts) LOG_BYTES=$(stat "$WORK/a.ctl" dirty_log_bytes)
  LOG_RANGES=$(stat "$WORK/a.ctl" dirty_log_writes)
  MIG_FIGURES=$(python3 -c '
import json, sys
m = json.loads(sys.argv[1]); r = m.get("ram", {})
print("total %s ms, downtime %s ms, %s MiB transferred, %s dirty-sync rounds" % (m.get("total-time"), m.get("downtime"),
      r.get("transferred", 0) >> 20, r.get("dirty-sync-count")))' "$MIG")
  echo "  migration: $MIG_FIGURES (under ${MIG_SECS}s); vsocketd A accel_bytes during it: $((ACCEL_AFTER - ACCEL_BEFORE))"
  echo "  vsocketd A dirty log: $LOG_STARTS starts, $LOG_RANGES ranges, $LOG_BYTES bytes marked"
  echo "  guest memory: $PAGES pages of 4 KiB compared, $DIFF_PAGES differ (first: $DIFF_LIST)"
  return 0
}

# job_checks CASE NAME [CHECK_REPORT ARGS...]: the guest's job on QEMU NAME ends (bounded) with
# xfer's client and server exiting 0 (every byte of every connection
# checked both ways), and the libraries' reports (4 connection ends) say:
# each carried every byte (the stream and xfer's 16-byte header, one way),
# left the rings at least once and was accelerated
# again at its close (JOB_EXPECT, by default --moves 1 --mode accelerated).
job_checks() {
  local case=$1 name=$2 out
  shift 2
  wait_for 200 console_has "$name" "^mig: job done" ||
    { fail "$case" "the guest's transfer did not end within 200 s: $(grep "^mig: " "$WORK/$name.console" | grep -v tick | tail -3 | tr '\n' ';')"; return 1; }
  echo "  libraries on $name: $(grep -E "^mig: (client|server): .*(vsocketd|session|backend)" "$WORK/$name.console" | head -6 | tr '\n' ';')"
  grep -q "^mig: client exit 0" "$WORK/$name.console" && grep -q "^mig: server exit 0" "$WORK/$name.console" &&
    grep -q "^mig: client: xfer client: 2/2 connections verified" "$WORK/$name.console" ||
    { fail "$case" "the guest's client or server failed: $(grep -E "^mig: (client|server)" "$WORK/$name.console" | head -6 | tr '\n' ';')"; return 1; }
  grep "^mig: report: " "$WORK/$name.console" | sed 's/^mig: report: //' | tr -d '\r' > "$WORK/report.jsonl"
  # shellcheck disable=SC2086  # (JOB_EXPECT is words)
  out=$(python3 tests/e2e/check_report.py "$WORK/report.jsonl" --port 5301 --expect-conns 4 ${JOB_EXPECT:---moves 1 --mode accelerated} \
        ${JOB_EXACT:---exact-total $((XFER_BYTES + 16))} "$@" 2>&1) || { fail "$case" "reports: $out"; return 1; }
  echo "  reports: $out"
  echo "  downgrades: $(python3 -c '
import collections, json, sys
c = collections.Counter()
for l in open(sys.argv[1]):
    j = json.loads(l)
    if j.get("event") in ("close", "exit"):
        c["%s x%d, %d re-upgrade(s)" % (j.get("last_downgrade"), j.get("downgrades", 0), j.get("reupgrades", 0))] += 1
print("; ".join("%d end(s) %s" % (n, k) for k, n in c.items()))' "$WORK/report.jsonl")"
}

# (With the etcd directory: the daemons are hostA and hostB, locator =
# etcd, the VM incoming on hostB; the directory must follow: hostA only
# before, nowhere after the switchover, hostB only once the destination
# runs, decision 116.)
case_migrate_under_load() {
  local t0=$SECONDS retried="" MIG_ETCD=1
  run_migration migrate_under_load || return
  if [ "$DIFF_PAGES" != 0 ]; then
    # One run in 26 so far found one page different, not traced to a write
    # of vsocketd's (decision 88): said here, and the migration done again;
    # a second difference fails the case.
    echo "RETRY migrate_under_load: $DIFF_PAGES page(s) differed (first: $DIFF_LIST); once more"
    retried="; retried once: $DIFF_PAGES page(s) differed the first time ($DIFF_LIST)"
    stop_all
    run_migration migrate_under_load || return
  fi
  [ "$DIFF_PAGES" = 0 ] || { fail migrate_under_load "$DIFF_PAGES pages of the destination differ from the source's$retried"; return; }
  [ "$PAGES" -eq $((RAM_MB * 256)) ] || { fail migrate_under_load "compared $PAGES pages, want $((RAM_MB * 256))"; return; }
  [ $((ACCEL_AFTER - ACCEL_BEFORE)) -gt 0 ] || { fail migrate_under_load "no accelerated bytes moved during the migration"; return; }
  [ "$LOG_STARTS" -ge 2 ] && [ "$LOG_BYTES" -gt 0 ] ||
    { fail migrate_under_load "vsocketd A: dirty log started $LOG_STARTS times (want one per device, 2), marked $LOG_BYTES B"; return; }
  grep -q "dirty log on (VHOST_F_LOG_ALL set" "$WORK/a.log" || { fail migrate_under_load "no 'dirty log on' in vsocketd A's log"; return; }
  # The destination runs the guest on: it prints (its console was empty
  # while paused; the job may also end at once, its connections broken).
  [ "$(grep -c "^mig: " "$WORK/dst.console" 2>/dev/null)" = 0 ] ||
    { fail migrate_under_load "the destination ran before it was continued"; return; }
  qmp "$WORK/dst.qmp" cont >/dev/null || { fail migrate_under_load "cont on the destination failed"; return; }
  # The destination's first device started: hostB publishes it (decision
  # 116), and hostA keeps out.
  wait_ms 2000 vm_hosts_are hostB ||
    { fail migrate_under_load "after cont on the destination the directory places vmq on '$(vm_hosts)' ($WAITED_MS ms), want hostB"; return; }
  local published_ms=$WAITED_MS
  wait_for 30 console_has dst "^mig: " || { fail migrate_under_load "the migrated guest does not run on the destination"; return; }
  echo "  destination continued, the guest runs on: $(grep "^mig: " "$WORK/dst.console" | grep -v tick | head -3 | tr '\n' ';')"
  # The connections go on on the destination: every byte checked by xfer,
  # each end left the rings during the copy and is accelerated again at its
  # close, through vsocketd B (decisions 093, 094).
  job_checks migrate_under_load dst
  local checked=$?
  echo "  vsocketd A: drains asked $(stat "$WORK/a.ctl" drains_asked), done $(stat "$WORK/a.ctl" drains_done); vsocketd B: arrivals $(stat "$WORK/b.ctl" migration_arrivals), told $(stat "$WORK/b.ctl" migration_sessions_told), hellos $(stat "$WORK/b.ctl" hellos), upgrades $(stat "$WORK/b.ctl" upgrades), accel_bytes $(stat "$WORK/b.ctl" accel_bytes)"
  [ "$checked" = 0 ] || return
  [ "$(stat "$WORK/a.ctl" drains_asked)" -ge 2 ] ||
    { fail migrate_under_load "vsocketd A asked $(stat "$WORK/a.ctl" drains_asked) connection ends to leave the rings, want 4"; return; }
  [ "$(stat "$WORK/b.ctl" upgrades)" -ge 2 ] && [ "$(stat "$WORK/b.ctl" accel_bytes)" -gt 0 ] ||
    { fail migrate_under_load "nothing accelerated through vsocketd B after the move"; return; }
  kill -0 "$DA_PID" && kill -0 "$DB_PID" || { fail migrate_under_load "a vsocketd died"; return; }
  echo "  directory (etcd): hostA only before; nowhere ${WITHDRAWN_MS} ms after QEMU reported completed; hostB only ${published_ms} ms after cont; hostA migration_withdrawn $(stat "$WORK/a.ctl" migration_withdrawn), hostB migration_published $(stat "$WORK/b.ctl" migration_published)"
  [ "$(stat "$WORK/a.ctl" migration_withdrawn)" = 1 ] && [ "$(stat "$WORK/b.ctl" migration_published)" = 1 ] ||
    { fail migrate_under_load "counters: hostA migration_withdrawn $(stat "$WORK/a.ctl" migration_withdrawn), hostB migration_published $(stat "$WORK/b.ctl" migration_published), want 1 and 1"; return; }
  [ "$(vm_hosts)" = hostB ] || { fail migrate_under_load "at the end the directory places vmq on '$(vm_hosts)', want hostB"; return; }
  # The source's vsocketd restarted after the VM left (vmq still in its
  # configuration): it must not publish the VM again while it runs on
  # hostB (decision 139; before, both hosts claimed it and the directory
  # believed neither, decision 86).
  stop_pid "$DA_PID"
  DA_PID=""
  start_daemon a || { fail migrate_under_load "vsocketd A did not start again"; return; }
  DA_PID=$DAEMON_PID
  local republished=no
  wait_ms 3000 vm_hosts_are "hostA hostB" && republished=yes
  [ "$republished" = no ] && [ "$(vm_hosts)" = hostB ] ||
    { fail migrate_under_load "vsocketd A restarted after vmq left published it again: the directory places vmq on '$(vm_hosts)'"; return; }
  grep -q "vm vmq left this host by a live migration" "$WORK/a.log" ||
    { fail migrate_under_load "vsocketd A restarted does not say vmq left: $(grep -i vmq "$WORK/a.log" | tail -2 | tr '\n' ' ')"; return; }
  echo "  vsocketd A restarted after the move: vmq stays out of its records (directory: '$(vm_hosts)' 3 s later)"
  stop_all
  [ -z "$retried" ] || echo "  ${retried#; }"
  pass migrate_under_load $((SECONDS - t0))
}

case_migrate_without_dirty_log() {
  local t0=$SECONDS
  # (And its connections left on the rings, as before decision 093: with
  # them drained, vsocketd writes next to nothing during the pre-copy.)
  # Its load streams both ways without a pause (one stream per connection
  # and direction, far longer than the test): vsocketd writes RX ring pages
  # all through the pre-copy. (In rounds, two runs of four found no page
  # stale: the rounds' pauses can fall where the copy is.)
  # And VSOCKET_DEBUG_SWITCHOVER_AS_EXIT=1: the first device to stop at the
  # switchover is taken for a process that exited, as before decision 106,
  # so that vsocketd writes its orphaned bytes and its close into the VM's
  # other device, still running. Those unmarked writes are what the
  # comparison shows (0 pages differ without them, 67-217 with them, on
  # 2026-11-29: the pre-copy's unmarked RX ring writes, 23-32 MB, reached
  # the destination anyway; not understood yet). They land only if the
  # worker passes between the two devices' stops (a fraction of a
  # millisecond): 7 runs of 8 did; so up to 3 migrations, the first with
  # pages different passing.
  local try tries=""
  for try in 1 2 3; do
    GUEST_LOAD=4000000000,0 run_migration migrate_without_dirty_log VSOCKET_DEBUG_NO_DIRTY_LOG=1 \
      VSOCKET_DEBUG_NO_MIGRATION_DRAIN=1 VSOCKET_DEBUG_SWITCHOVER_AS_EXIT=1 || return
    grep -q "VSOCKET_DEBUG_NO_DIRTY_LOG=1" "$WORK/a.log" || { fail migrate_without_dirty_log "vsocketd A did not take the switch"; return; }
    grep -q "VSOCKET_DEBUG_NO_MIGRATION_DRAIN=1" "$WORK/a.log" || { fail migrate_without_dirty_log "vsocketd A drained the VM anyway"; return; }
    tries="$tries $DIFF_PAGES"
    [ "$DIFF_PAGES" = 0 ] || break
  done
  echo "  pages different per migration:$tries"
  [ "$DIFF_PAGES" -gt 0 ] ||
    { fail migrate_without_dirty_log "no page differs in 3 migrations although vsocketd A marked nothing: the comparison cannot see missed writes"; return; }
  stop_all
  pass migrate_without_dirty_log $((SECONDS - t0))
}

# A migration that ends during the pre-copy with the guest still on the
# source: the dirty log goes on and off again (a reconfiguration of the
# running devices each way: SET_FEATURES, SET_LOG_BASE, the rings' log
# flag) and the guest stays on the source, its connections accelerated
# again through vsocketd A.
#   migrate_cancelled        QMP migrate_cancel.
#   migrate_failed_on_destination  the destination QEMU killed (SIGKILL):
#                            the source's migration fails (its stream
#                            breaks), as for any failure on the other side.
# precopy_ends CASE HOW: HOW is cancel or kill-destination.
precopy_ends() {
  local case=$1 how=$2 t0=$SECONDS want MIG_ETCD=1
  # Half the load of migrate_under_load: still streaming well past the
  # cancel or the failure (14-15 MB accelerated again within a second
  # of the log going off), in a quarter of the time (25-27 s, 2026-12-01).
  local XFER_BYTES=100000000 GUEST_LOAD=100000000,200
  boot_pair "$case" || return
  # Slow enough to still be copying when it ends (256 MiB at 16 MiB/s).
  qmp "$WORK/src.qmp" migrate-set-parameters '{"max-bandwidth": 16777216}' >/dev/null
  local out
  out=$(qmp "$WORK/src.qmp" migrate "{\"uri\": \"tcp:127.0.0.1:$MIG_PORT\"}" 2>&1) ||
    { fail "$case" "QEMU refused the migration: $out"; return; }
  log_on() { [ "$(stat "$WORK/a.ctl" dirty_log_starts)" -ge 2 ]; }
  wait_for 30 log_on || { fail "$case" "vsocketd A's dirty log never went on"; return; }
  sleep 2
  local marked0
  marked0=$(stat "$WORK/a.ctl" dirty_log_bytes)
  if [ "$how" = cancel ]; then
    want=cancelled
    qmp "$WORK/src.qmp" migrate_cancel >/dev/null || { fail "$case" "migrate_cancel failed"; return; }
  else
    want=failed
    kill -9 "$DST_PID"
    wait "$DST_PID" 2>/dev/null
    DST_PID=""
  fi
  MIG_STATUS=none
  wait_for 30 migration_done || { fail "$case" "the migration did not end after the $how ($MIG_STATUS)"; return; }
  [ "$MIG_STATUS" = "$want" ] || { fail "$case" "migration $MIG_STATUS, not $want"; return; }
  log_off() { [ "$(stat "$WORK/a.ctl" dirty_log_stops)" -ge 2 ]; }
  wait_for 30 log_off || { fail "$case" "vsocketd A's dirty log did not go off ($(stat "$WORK/a.ctl" dirty_log_stops) stops)"; return; }
  status_is src running || { fail "$case" "the source is not running after the $how"; return; }
  # On the source, after the log went off: accelerated again (decision
  # 093: the drain for the migration is lifted, the connections register
  # again and pair), nothing marked.
  local accel1 marked1 accel2 marked2 t1=$SECONDS
  accel1=$(stat "$WORK/a.ctl" accel_bytes) marked1=$(stat "$WORK/a.ctl" dirty_log_bytes)
  wait_for 30 accel_moving $((accel1 + 4000000)) ||
    { fail "$case" "not accelerated again on the source after the $how (accel_bytes $accel1 -> $(stat "$WORK/a.ctl" accel_bytes))"; return; }
  accel2=$(stat "$WORK/a.ctl" accel_bytes) marked2=$(stat "$WORK/a.ctl" dirty_log_bytes)
  echo "  migration $MIG_STATUS; vsocketd A: dirty log $(stat "$WORK/a.ctl" dirty_log_starts) on, $(stat "$WORK/a.ctl" dirty_log_stops) off; marked $marked0 B before the $how, $marked1 B at the end"
  echo "  after the $how: vsocketd A moved $((accel2 - accel1)) accelerated bytes within $((SECONDS - t1)) s and marked $((marked2 - marked1)) B; drains asked $(stat "$WORK/a.ctl" drains_asked), undrains $(stat "$WORK/a.ctl" migration_undrains), upgrades $(stat "$WORK/a.ctl" upgrades)"
  [ "$marked0" -gt 0 ] || { fail "$case" "nothing marked during the pre-copy"; return; }
  [ "$marked2" = "$marked1" ] || { fail "$case" "vsocketd A still marks after the log went off"; return; }
  [ "$(stat "$WORK/a.ctl" drains_asked)" -ge 2 ] ||
    { fail "$case" "vsocketd A asked $(stat "$WORK/a.ctl" drains_asked) connection ends to leave the rings during the pre-copy"; return; }
  job_checks "$case" src || return
  grep -q "dirty log off (VHOST_F_LOG_ALL cleared" "$WORK/a.log" || { fail "$case" "no 'dirty log off' in vsocketd A's log"; return; }
  # The directory (etcd): the VM never left hostA's records, and hostB,
  # whose devices never started, never published it (decision 116).
  echo "  directory (etcd): vmq on '$(vm_hosts)'; hostA migration_withdrawn $(stat "$WORK/a.ctl" migration_withdrawn), hostB migration_published $(stat "$WORK/b.ctl" migration_published 2>/dev/null)"
  [ "$(vm_hosts)" = hostA ] && [ "$(stat "$WORK/a.ctl" migration_withdrawn)" = 0 ] ||
    { fail "$case" "after the $how the directory places vmq on '$(vm_hosts)' (hostA withdrew it $(stat "$WORK/a.ctl" migration_withdrawn) times), want hostA"; return; }
  kill -0 "$DA_PID" || { fail "$case" "vsocketd A died"; return; }
  stop_all
  pass "$case" $((SECONDS - t0))
}
case_migrate_cancelled() { precopy_ends migrate_cancelled cancel; }
case_migrate_failed_on_destination() { precopy_ends migrate_failed_on_destination kill-destination; }

# The switchover with connections still on the rings (decision 106): a
# drain the pre-copy was too short for, forced with
# VSOCKET_DEBUG_NO_MIGRATION_DRAIN=1 on vsocketd A (no drain at all: every
# connection is on the rings when QEMU stops the devices). vsocketd A must
# close them without a word to the VM's other devices (both ends of each
# connection are in this guest, on its two functions: one stopping must
# not tell the other "peer closed"); at the destination both ends learn
# their session is unknown there (decision 094), finish through RESYNC,
# byte-exact, and are accelerated again through vsocketd B.
case_migrate_drain_unfinished() {
  local t0=$SECONDS
  run_migration migrate_drain_unfinished VSOCKET_DEBUG_NO_MIGRATION_DRAIN=1 || return
  grep -q "VSOCKET_DEBUG_NO_MIGRATION_DRAIN=1" "$WORK/a.log" || { fail migrate_drain_unfinished "vsocketd A drained the VM anyway"; return; }
  [ "$(stat "$WORK/a.ctl" drains_asked)" = 0 ] ||
    { fail migrate_drain_unfinished "vsocketd A asked $(stat "$WORK/a.ctl" drains_asked) drains: the connections were not on the rings at the switchover"; return; }
  qmp "$WORK/dst.qmp" cont >/dev/null || { fail migrate_drain_unfinished "cont on the destination failed"; return; }
  # Every end went through RESYNC (its session lost at the destination
  # while upgraded), carried every byte and is accelerated again.
  # (Not --exact-total: after a RESYNC, a report may count its 16-byte
  # header, and resent bytes a second time: 262,144 B in one run of two.
  # xfer's own check of every byte is the judge here.)
  JOB_EXACT=" " job_checks migrate_drain_unfinished dst --resynced
  local checked=$?
  echo "  vsocketd A: connection ends that left with the VM $(stat "$WORK/a.ctl" migration_leaves), orphaned bytes $(stat "$WORK/a.ctl" orphan_bytes); vsocketd B: arrivals $(stat "$WORK/b.ctl" migration_arrivals), told $(stat "$WORK/b.ctl" migration_sessions_told), upgrades $(stat "$WORK/b.ctl" upgrades), accel_bytes $(stat "$WORK/b.ctl" accel_bytes)"
  [ "$checked" = 0 ] || return
  # Both pairs were on the rings at the switchover: 4 ends left with the VM.
  [ "$(stat "$WORK/a.ctl" migration_leaves)" = 4 ] ||
    { fail migrate_drain_unfinished "vsocketd A: $(stat "$WORK/a.ctl" migration_leaves) connection ends left with the VM, want 4"; return; }
  [ "$(stat "$WORK/b.ctl" upgrades)" -ge 2 ] && [ "$(stat "$WORK/b.ctl" accel_bytes)" -gt 0 ] ||
    { fail migrate_drain_unfinished "nothing accelerated through vsocketd B after the move"; return; }
  kill -0 "$DA_PID" && kill -0 "$DB_PID" || { fail migrate_drain_unfinished "a vsocketd died"; return; }
  stop_all
  pass migrate_drain_unfinished $((SECONDS - t0))
}

# Both connections one way (the client only writes, the server only reads)
# across the move: the sender must hear, from its own sends, its peer's
# ring end (the drain) and, at the destination, that its session is
# unknown there (decision 094), and so register and re-upgrade there.
# (Run by name: it passes with the library from before that change too,
# 71 s on 2026-12-02; the drain case in same_host is the one that failed.)
case_migrate_one_way() {
  local t0=$SECONDS case=migrate_one_way
  local XFER_BYTES=600000000 GUEST_LOAD=600000000,0,oneway
  run_migration $case || return
  [ "$DIFF_PAGES" = 0 ] || { fail $case "$DIFF_PAGES pages of the destination differ from the source's"; return; }
  qmp "$WORK/dst.qmp" cont >/dev/null || { fail $case "cont on the destination failed"; return; }
  # Each end left the rings (the drain) and is accelerated again through
  # vsocketd B at its close; xfer checks every byte at the server.
  JOB_EXACT=" " job_checks $case dst
  local checked=$?
  echo "  vsocketd A: drains asked $(stat "$WORK/a.ctl" drains_asked), done $(stat "$WORK/a.ctl" drains_done); vsocketd B: told $(stat "$WORK/b.ctl" migration_sessions_told), upgrades $(stat "$WORK/b.ctl" upgrades), accel_bytes $(stat "$WORK/b.ctl" accel_bytes)"
  [ "$checked" = 0 ] || return
  [ "$(stat "$WORK/b.ctl" upgrades)" -ge 2 ] && [ "$(stat "$WORK/b.ctl" accel_bytes)" -gt 0 ] ||
    { fail $case "nothing accelerated through vsocketd B after the move"; return; }
  stop_all
  pass $case $((SECONDS - t0))
}

# Both of the guest's functions reset (given back by a process that exited,
# the agent resetting and setting each up again) just before the load and
# the move. Before decision 128 such a function could start with INTx
# disabled and no call eventfd from QEMU: docs/vm-mode.md had a reset
# before a migration stall its drain (3 runs of 3, the agent then probing
# every function at its start). The migration must go as
# migrate_under_load's: the drain done in the pre-copy, every page equal,
# every byte checked, accelerated again through vsocketd B.
case_migrate_after_function_reset() {
  local t0=$SECONDS case=migrate_after_function_reset
  MIG_APPEND=mig.cycle=1 run_migration $case || return
  grep -q "^mig: functions cycled" "$WORK/src.console" && grep -q "^mig: cycle client exit 0" "$WORK/src.console" ||
    { fail $case "the guest did not cycle its functions: $(grep "^mig: cycle" "$WORK/src.console" | tr '\n' ';')"; return; }
  [ "$DIFF_PAGES" = 0 ] || { fail $case "$DIFF_PAGES pages of the destination differ from the source's ($DIFF_LIST)"; return; }
  local drains=$(stat "$WORK/a.ctl" drains_asked) done=$(stat "$WORK/a.ctl" drains_done)
  qmp "$WORK/dst.qmp" cont >/dev/null || { fail $case "cont on the destination failed"; return; }
  job_checks $case dst
  local checked=$?
  echo "  vsocketd A: drains asked $drains, done $done; vsocketd B: upgrades $(stat "$WORK/b.ctl" upgrades), accel_bytes $(stat "$WORK/b.ctl" accel_bytes)"
  [ "$checked" = 0 ] || return
  # The cycle's connection was accelerated: both its processes held a
  # function (the agent resets each as they exit).
  local out
  out=$(python3 tests/e2e/check_report.py "$WORK/report.jsonl" --port 5302 --expect-conns 2 --mode accelerated 2>&1) ||
    { fail $case "the cycle's connection: $out"; return; }
  echo "  the cycle's connection: $out"
  [ "$drains" -ge 2 ] && [ "$done" -ge 2 ] ||
    { fail $case "vsocketd A: drains asked $drains, done $done at the switchover, want 2 of 2 or more"; return; }
  [ "$(stat "$WORK/b.ctl" upgrades)" -ge 2 ] && [ "$(stat "$WORK/b.ctl" accel_bytes)" -gt 0 ] ||
    { fail $case "nothing accelerated through vsocketd B after the move"; return; }
  kill -0 "$DA_PID" && kill -0 "$DB_PID" || { fail $case "a vsocketd died"; return; }
  stop_all
  pass $case $((SECONDS - t0))
}

# The same migration of a VM whose agent proves its sockets and limits each
# function's memory (prove_sockets = agent, decisions 100 and 130). Its
# functions' devices are new to vsocketd B at the arrival and reach no
# memory until the agent limits them again: vsocketd B flags them in their
# request rings, the agent limits them on its next look, and the libraries
# learn from B that their sessions are unknown, as without proofs.
case_migrate_with_agent_proofs() {
  local t0=$SECONDS case=migrate_with_agent_proofs
  MIG_PROVE=agent MIG_APPEND="mig.proofs=1 vsocket.hugepages=56" run_migration $case || return
  [ "$DIFF_PAGES" = 0 ] || { fail $case "$DIFF_PAGES pages of the destination differ from the source's ($DIFF_LIST)"; return; }
  local la=$(stat "$WORK/a.ctl" memory_limits) lra=$(stat "$WORK/a.ctl" memory_limits_refused)
  qmp "$WORK/dst.qmp" cont >/dev/null || { fail $case "cont on the destination failed"; return; }
  job_checks $case dst
  local checked=$?
  local lb=$(stat "$WORK/b.ctl" memory_limits) lrb=$(stat "$WORK/b.ctl" memory_limits_refused)
  echo "  memory limits: vsocketd A $la (refused $lra), vsocketd B $lb (refused $lrb); vouches A $(stat "$WORK/a.ctl" vouches), B $(stat "$WORK/b.ctl" vouches); B upgrades $(stat "$WORK/b.ctl" upgrades), accel_bytes $(stat "$WORK/b.ctl" accel_bytes)"
  [ "$checked" = 0 ] || return
  # (A refusal for a device vsocketd has not started yet is the agent's
  # cue to try again; any other is a failure.)
  local other
  other=$(grep -h "LIMIT_MEMORY from .* refused" "$WORK/a.log" "$WORK/b.log" | grep -v "no running device" | head -2)
  [ -z "$other" ] || { fail $case "a LIMIT_MEMORY refused: $other"; return; }
  [ "$la" -ge 2 ] || { fail $case "vsocketd A limited $la devices, want the 2 functions'"; return; }
  # At B: the 2 devices that arrived (flagged, limited again), then the 2
  # the processes were granted afresh.
  [ "$lb" -ge 4 ] || { fail $case "vsocketd B limited $lb devices, want 4"; return; }
  grep -q "device 1 limited by the VM's agent" "$WORK/b.log" && grep -q "device 2 limited by the VM's agent" "$WORK/b.log" ||
    { fail $case "vsocketd B: the 2 devices that arrived were not limited again"; return; }
  [ "$(stat "$WORK/b.ctl" vouches)" -ge 4 ] || { fail $case "vsocketd B: $(stat "$WORK/b.ctl" vouches) vouches, want the 4 ends re-registered"; return; }
  [ "$(stat "$WORK/b.ctl" upgrades)" -ge 2 ] && [ "$(stat "$WORK/b.ctl" accel_bytes)" -gt 0 ] ||
    { fail $case "nothing accelerated through vsocketd B after the move"; return; }
  kill -0 "$DA_PID" && kill -0 "$DB_PID" || { fail $case "a vsocketd died"; return; }
  stop_all
  pass $case $((SECONDS - t0))
}

# vsocketd A killed (SIGKILL) during the pre-copy, a second after the
# dirty log went on (the drain under way or done). The source QEMU loses
# its vhost-user backend mid-migration.
case_migrate_source_daemon_killed() {
  local t0=$SECONDS case=migrate_source_daemon_killed
  boot_pair $case || return
  # A pre-copy of a few seconds (256 MiB at 64 MiB/s).
  qmp "$WORK/src.qmp" migrate-set-parameters '{"max-bandwidth": 67108864, "downtime-limit": 300}' >/dev/null
  local out
  out=$(qmp "$WORK/src.qmp" migrate "{\"uri\": \"tcp:127.0.0.1:$MIG_PORT\"}" 2>&1) ||
    { fail $case "QEMU refused the migration: $out"; return; }
  log_on() { [ "$(stat "$WORK/a.ctl" dirty_log_starts)" -ge 2 ]; }
  wait_for 30 log_on || { fail $case "vsocketd A's dirty log never went on"; return; }
  sleep 1
  local asked done
  asked=$(stat "$WORK/a.ctl" drains_asked) done=$(stat "$WORK/a.ctl" drains_done)
  kill -9 "$DA_PID"
  wait "$DA_PID" 2>/dev/null
  DA_PID=""
  echo "  vsocketd A killed in the pre-copy (drains asked $asked, done $done)"
  MIG_STATUS=none
  wait_for 150 migration_done || { fail $case "the migration did not end within 150 s (status $MIG_STATUS)"; return; }
  echo "  migration $MIG_STATUS: $(python3 -c 'import json,sys; m=json.loads(sys.argv[1]); print(m.get("error-desc", ""), "total", m.get("total-time"), "ms, downtime", m.get("downtime"), "ms")' "$MIG")"
  echo "  source QEMU: $(grep -v "^$" "$WORK/src.qemu.log" | tail -3 | tr '\n' ';')"
  # QEMU does not stop a migration for a vhost-user backend that went
  # (nothing of vsocketd's is in the migration stream; its log is QEMU's
  # memory): the guest moves on, and vsocketd B takes it as any arrival.
  [ "$MIG_STATUS" = completed ] || { fail $case "migration $MIG_STATUS"; return; }
  wait_for 30 status_is dst paused || { fail $case "the destination is not paused after the migration"; return; }
  qmp "$WORK/dst.qmp" cont >/dev/null || { fail $case "cont on the destination failed"; return; }
  job_checks $case dst || return
  echo "  vsocketd B: arrivals $(stat "$WORK/b.ctl" migration_arrivals), told $(stat "$WORK/b.ctl" migration_sessions_told), upgrades $(stat "$WORK/b.ctl" upgrades), accel_bytes $(stat "$WORK/b.ctl" accel_bytes)"
  [ "$(stat "$WORK/b.ctl" upgrades)" -ge 2 ] && [ "$(stat "$WORK/b.ctl" accel_bytes)" -gt 0 ] ||
    { fail $case "nothing accelerated through vsocketd B after the move"; return; }
  stop_all
  pass $case $((SECONDS - t0))
}

# A destination without vsocketd: QEMU does not start without its
# vhost-user socket (with reconnect= it waits for it in its start-up), so
# the destination QEMU attaches to vsocketd B with reconnect=1, and B is
# killed (SIGKILL) before the migration: the guest arrives where nothing
# serves its vSocket functions. Its connections, drained in the pre-copy,
# go on on kernel TCP, every byte checked, each end's report naming the
# migration as its last downgrade, and the libraries say vsocketd does not
# answer. A few seconds later vsocketd B starts again on the same socket:
# what QEMU's reconnect brings is printed (its devices are refused today:
# see docs/live-migration.md), and nothing may break.
case_migrate_destination_without_vsocketd() {
  local t0=$SECONDS case=migrate_destination_without_vsocketd
  # Half the load: most of it runs on kernel TCP here.
  local XFER_BYTES=100000000 GUEST_LOAD=100000000,200
  DST_CHARDEV_OPTS=,reconnect=1 boot_pair $case || return
  kill -9 "$DB_PID"
  wait "$DB_PID" 2>/dev/null
  DB_PID=""
  rm -f "$WORK/b.sock"
  qmp "$WORK/src.qmp" migrate-set-parameters '{"max-bandwidth": 1073741824, "downtime-limit": 300}' >/dev/null
  local out
  out=$(qmp "$WORK/src.qmp" migrate "{\"uri\": \"tcp:127.0.0.1:$MIG_PORT\"}" 2>&1) ||
    { fail $case "QEMU refused the migration: $out"; return; }
  MIG_STATUS=none
  wait_for 150 migration_done || { fail $case "the migration did not end within 150 s (status $MIG_STATUS)"; return; }
  [ "$MIG_STATUS" = completed ] || { fail $case "migration $MIG_STATUS: $MIG"; return; }
  wait_for 30 status_is dst paused || { fail $case "the destination is not paused after the migration"; return; }
  qmp "$WORK/dst.qmp" cont >/dev/null || { fail $case "cont on the destination failed"; return; }
  wait_for 30 console_has dst "^mig: tick" || { fail $case "the migrated guest does not run on the destination"; return; }
  sleep 5
  start_daemon b || { fail $case "vsocketd B did not start again"; return; }
  DB_PID=$DAEMON_PID
  echo "  vsocketd B started again 5 s after the guest ran on"
  JOB_EXPECT="--downgrade-cause migration" job_checks $case dst
  local checked=$?
  echo "  vsocketd B: frontends connected $(grep -c "frontend connected" "$WORK/b.log"), devices refused $(grep -c "rejecting device" "$WORK/b.log") ($(grep -m1 -o "rejecting device.*" "$WORK/b.log")), arrivals $(stat "$WORK/b.ctl" migration_arrivals), upgrades $(stat "$WORK/b.ctl" upgrades)"
  echo "  destination QEMU: $(grep -v "^$" "$WORK/dst.qemu.log" | sort | uniq -c | tr -s ' ' | tr '\n' ';')"
  [ "$checked" = 0 ] || return
  python3 - "$WORK/report.jsonl" <<'PY' || { fail $case "reports: an end without the migration's downgrade"; return; }
import json, sys
ends = [json.loads(l) for l in open(sys.argv[1]) if '"local"' in l]
bad = [e for e in ends if e.get("downgrades", 0) < 1 or e.get("last_downgrade") != "migration"]
sys.exit(1 if bad or len(ends) != 4 else 0)
PY
  grep -q "vsocketd did not answer" "$WORK/dst.console" ||
    { fail $case "the guest's libraries did not say that vsocketd does not answer"; return; }
  kill -0 "$DB_PID" || { fail $case "vsocketd B died"; return; }
  stop_all
  pass $case $((SECONDS - t0))
}

# A vsocketd restarted during the pre-copy (decision 111): SIGKILLed a
# second after the dirty log went on and started again on the same socket
# at once; the QEMU on that side has reconnect=1 on its vhost-user
# chardevs. The migration must complete, no page of guest memory differ,
# and the guest's job end with every byte.
#   migrate_source_daemon_restarted  vsocketd A: QEMU starts the devices
#                   again with the log on already; the restarted vsocketd
#                   takes that for the migration's start and drains the VM
#                   (nothing accelerated through it during the rest of the
#                   pre-copy). Whether the connections are accelerated again
#                   at the destination is printed, not asserted (vsocket-
#                   guestd refused one process's third grant in the runs so
#                   far: "another process holds the VM's vSocket device").
#   migrate_destination_daemon_restarted  vsocketd B: QEMU reconnects before
#                   the guest's state arrives, so the guest's features come
#                   with it; all 4 ends are accelerated again through B.
daemon_restarted() {
  local case=$1 side=$2 t0=$SECONDS
  local XFER_BYTES=100000000 GUEST_LOAD=100000000,200
  if [ "$side" = a ]; then SRC_CHARDEV_OPTS=,reconnect=1 boot_pair "$case" || return
  else DST_CHARDEV_OPTS=,reconnect=1 boot_pair "$case" || return
  fi
  # A pre-copy of several seconds (16 MiB/s): QEMU's reconnect (every
  # second) comes while it runs.
  qmp "$WORK/src.qmp" migrate-set-parameters '{"max-bandwidth": 16777216, "downtime-limit": 300}' >/dev/null
  local out
  out=$(qmp "$WORK/src.qmp" migrate "{\"uri\": \"tcp:127.0.0.1:$MIG_PORT\"}" 2>&1) ||
    { fail "$case" "QEMU refused the migration: $out"; return; }
  log_on() { [ "$(stat "$WORK/a.ctl" dirty_log_starts)" -ge 2 ]; }
  wait_for 30 log_on || { fail "$case" "vsocketd A's dirty log never went on"; return; }
  sleep 1
  if [ "$side" = a ]; then
    kill -9 "$DA_PID"; wait "$DA_PID" 2>/dev/null; DA_PID=""
    start_daemon a || { fail "$case" "vsocketd A did not start again"; return; }
    DA_PID=$DAEMON_PID
  else
    kill -9 "$DB_PID"; wait "$DB_PID" 2>/dev/null; DB_PID=""
    start_daemon b || { fail "$case" "vsocketd B did not start again"; return; }
    DB_PID=$DAEMON_PID
  fi
  echo "  vsocketd ${side^^} killed in the pre-copy and started again"
  MIG_STATUS=none
  wait_for 150 migration_done || { fail "$case" "the migration did not end within 150 s (status $MIG_STATUS)"; return; }
  echo "  migration $MIG_STATUS: $(python3 -c 'import json,sys; m=json.loads(sys.argv[1]); print(m.get("error-desc", ""), "total", m.get("total-time"), "ms, downtime", m.get("downtime"), "ms")' "$MIG")"
  [ "$MIG_STATUS" = completed ] || { fail "$case" "migration $MIG_STATUS"; return; }
  wait_for 30 status_is dst paused || { fail "$case" "the destination is not paused after the migration"; return; }
  wait_for 30 status_is src postmigrate || { fail "$case" "the source is not stopped after the migration"; return; }
  compare_ram "$case" || return
  echo "  guest memory: $PAGES pages of 4 KiB compared, $DIFF_PAGES differ (first: $DIFF_LIST)"
  if [ "$DIFF_PAGES" != 0 ] && [ -z "${RESTART_RETRIED:-}" ]; then
    # CI 2026-11-30 (migrate_destination_daemon_restarted): 32 pages in a
    # row zero on the destination, transfer data on the source, not seen
    # again in 18 runs of the case alone; not traced (as
    # migrate_under_load's single page, which is also retried once). Said
    # here, the differing pages kept with a failed case's files under
    # tests/run_all.sh (compare_ram), and the case run again; a second
    # difference fails it.
    echo "RETRY $case: $DIFF_PAGES page(s) differed (first: $DIFF_LIST); once more"
    stop_all
    RESTART_RETRIED="$DIFF_PAGES ($DIFF_LIST)" daemon_restarted "$case" "$side"
    return
  fi
  [ "$DIFF_PAGES" = 0 ] ||
    { fail "$case" "$DIFF_PAGES pages of the destination differ from the source's${RESTART_RETRIED:+; retried once: $RESTART_RETRIED the first time}"; return; }
  local drains upgrades
  drains=$(stat "$WORK/a.ctl" migration_drains) upgrades=$(stat "$WORK/a.ctl" upgrades)
  qmp "$WORK/dst.qmp" cont >/dev/null || { fail "$case" "cont on the destination failed"; return; }
  # (Every byte, by xfer; the reports only counted: the kill may leave ends
  # on the rings, which resync with whatever reason they last heard.)
  JOB_EXPECT=" " JOB_EXACT=" " job_checks "$case" dst
  local checked=$?
  local f
  for f in a b; do
    echo "  vsocketd ${f^^}: frontends connected $(grep -c "frontend connected" "$WORK/$f.log"), devices started $(grep -c "started (vid" "$WORK/$f.log"), refused $(grep -c "rejecting device" "$WORK/$f.log") $(grep -m1 -o "rejecting device.*" "$WORK/$f.log"), arrivals $(stat "$WORK/$f.ctl" migration_arrivals), upgrades $(stat "$WORK/$f.ctl" upgrades), accel_bytes $(stat "$WORK/$f.ctl" accel_bytes)"
  done
  for f in src dst; do echo "  $f QEMU: $(grep -v "^$" "$WORK/$f.qemu.log" | sort | uniq -c | tr -s ' ' | tr '\n' ';')"; done
  mkdir -p "/tmp/vsocket-mig-$case" && cp "$WORK"/*.log "$WORK"/*.console "/tmp/vsocket-mig-$case/" 2>/dev/null
  [ "$checked" = 0 ] || return
  local ends
  ends=$(python3 -c '
import json, sys
print(sum(1 for l in open(sys.argv[1]) if "local" in l and json.loads(l).get("mode") == "accelerated"))' "$WORK/report.jsonl")
  echo "  connection ends accelerated at their close: $ends of 4"
  if [ "$side" = a ]; then
    grep -q "dirty log on at the device's start" "$WORK/a.log" ||
      { fail "$case" "the restarted vsocketd A did not see the log on at the devices' start"; return; }
    [ "$drains" -ge 1 ] && [ "$upgrades" = 0 ] ||
      { fail "$case" "the restarted vsocketd A: $drains migration drain(s), $upgrades upgrade(s) in the pre-copy (want >= 1, 0)"; return; }
  else
    [ "$ends" = 4 ] && [ "$(grep -c "rejecting device" "$WORK/b.log")" = 0 ] ||
      { fail "$case" "$ends of 4 ends accelerated at their close through the restarted vsocketd B"; return; }
  fi
  stop_all
  pass "$case" $((SECONDS - t0))
}
case_migrate_source_daemon_restarted() { daemon_restarted migrate_source_daemon_restarted a; }
case_migrate_destination_daemon_restarted() { daemon_restarted migrate_destination_daemon_restarted b; }

command -v qemu-system-x86_64 >/dev/null || die "no qemu-system-x86_64"
make_initrd
for c in "${CASES[@]}"; do
  if declare -F "case_$c" >/dev/null; then "case_$c"; else echo "FAIL $c: no such case"; failed=$((failed + 1)); fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
