# The same-host suite (tests/e2e/run.sh same_host): real applications
# between "VMs" (network namespaces) attached to one vsocketd
# (deploy/testbed.sh). Every case checks the bytes (xfer's stream checks,
# iperf3/sockperf success) and, from libvsocket's per-connection report and
# the daemon's counters, that the data really took the accelerated path (or,
# for the mixed cases, that it stayed on kernel TCP with the right reason).
#
# This file: the bed's setup and teardown, and the helpers that cases of
# several groups use. The cases: the NN_*.sh files next to it, run in name
# order (tests/e2e/suite_lib.sh says how).

TB=deploy/testbed.sh
WORK_PREFIX=vsocket-e2e
SUITE_VMS=(vm1 vm2 vm3)
# Guest servers that run as unprivileged users (postgres, redis) reach
# vm2's socket through its group (`group =`, here VSOCKET_VM_VM2_GROUP): a
# group of this run's own, removed at the end. vsocketd reads it when it
# starts, so suite_setup makes it before the bed is up, whatever cases run.
E2E_GROUP=vsocket-e2e-vm2

suite_prepare() {  # (REQUIRED: libvsocket, xfer, vsocketd)
  # The bed's vsocketctl (testbed.sh ctl, status) from BIN_DIR too, not from
  # whatever bazel-bin points at now (a build of another configuration).
  [ -n "${VSOCKETCTL:-}" ] || [ ! -x "$BIN/host-backend/vsocketctl" ] || export VSOCKETCTL=$BIN/host-backend/vsocketctl
}

suite_setup() {
  groupadd -f "$E2E_GROUP" && usermod -aG "$E2E_GROUP" postgres && usermod -aG "$E2E_GROUP" redis ||
    echo "warning: could not make group $E2E_GROUP (postgres and redis are needed: deploy/install-deps.sh)"
  # (apache's workers run as www-data, mariadbd as mysql: where installed)
  local u
  for u in www-data mysql; do
    ! id "$u" >/dev/null 2>&1 || usermod -aG "$E2E_GROUP" "$u" || echo "warning: could not add $u to $E2E_GROUP"
  done
  export VSOCKET_VM_VM2_GROUP=$E2E_GROUP
  echo "== test bed up"
  if ! VSOCKETD=$BIN/host-backend/vsocketd bash $TB up >"$WORK/up.log" 2>&1; then
    cat "$WORK/up.log"
    fail testbed "deploy/testbed.sh up failed"
    return 1
  fi
  A1=$(bash $TB addr vm1)
  A2=$(bash $TB addr vm2)
  A3=$(bash $TB addr vm3)
}

suite_finish() { :; }

suite_cleanup() { groupdel "$E2E_GROUP" 2>/dev/null; }

# vm_fallbacks VM REASON: VM's connections left on kernel TCP for REASON
# (a column of vsocketctl fallbacks: kernel_faster, peer_not_registered...).
vm_fallbacks() {
  bash $TB ctl fallbacks --json 2>/dev/null | python3 -c "
import json, sys
print(sum(r[sys.argv[2]] for r in json.load(sys.stdin) if r['vm'] == sys.argv[1]))" "$1" "$2"
}

# ctl_counter NAME...: one of the daemon's counters (the sum of several, read
# at once), through vsocketctl (fast: `status` takes a second or more under
# load); -1 if one is missing.
ctl_counter() {
  bash $TB ctl counters --json 2>/dev/null | python3 -c "
import json, sys
try:
    values = {c['counter']: c['value'] for c in json.load(sys.stdin)}
    print(sum(values[name] for name in sys.argv[1:]))
except Exception:
    print(-1)" "$@"
}

# moved_bytes: what the accelerated path carried, as vsocketd counts it: the
# bytes it copied (accel_bytes) and those direct pairs moved without it
# (direct_bytes, decision 97: counted from the pairs' counts, brought up to
# date by a look at the connections).
moved_bytes() {
  bash $TB ctl connections >/dev/null 2>&1
  ctl_counter accel_bytes direct_bytes
}
# wait_moved BEFORE MIN: moved_bytes - BEFORE once it reaches MIN (a direct
# pair's last bytes are counted as its ends' UNREGISTERs arrive), or what
# it is after 5 s.
wait_moved() {
  local i d
  for i in $(seq 50); do
    d=$(($(moved_bytes) - $1))
    [ "$d" -ge "$2" ] && break
    sleep 0.1
  done
  echo "$d"
}

# through_vsocketd CMD...: runs a case whose subject is vsocketd's own data
# path or the policy for connections through it (decisions 51, 83, 92):
# its libraries take no direct pairs (VSOCKET_DIRECT=0), which the product
# makes by default between processes of one tenant (decision 102).
through_vsocketd() {
  local -x VSOCKET_DIRECT=0
  "$@"
}

stat_field() {  # stat_field KEY: a number from the daemon's stats JSON
  python3 - "$(bash $TB status 2>/dev/null | sed -n '/^{/,$p')" "$1" <<'PY'
import json, sys
text = sys.argv[1]
try:
    d = json.loads(text[text.index("{"):])
except Exception:
    print(-1); sys.exit()
for section in ("conn_counters", "backend", "worker", "service"):
    if sys.argv[2] in d.get(section, {}):
        print(d[section][sys.argv[2]]); break
else:
    print(-1)
PY
}

# plain_echo_server PORT LOG: a kernel-TCP echo server for one connection
# in vm2 (not preloaded), in the background (PID in BG).
plain_echo_server() {
  vm_bg vm2 plain /dev/null "$2" python3 -c '
import socket, sys
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((sys.argv[1], int(sys.argv[2])))
ls.listen(1)
c, _ = ls.accept()
while True:
    b = c.recv(65536)
    if not b:
        break
    c.sendall(b)
' "$A2" "$1"
}

# THREADED_ECHO: `python3 -c "$THREADED_ECHO" ADDR PORT N` echoes each of
# N connections (0: any number, until killed) in a thread of its own.
THREADED_ECHO='
import socket, sys, threading
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((sys.argv[1], int(sys.argv[2])))
ls.listen(64)
def serve(c):
    while True:
        b = c.recv(65536)
        if not b:
            break
        c.sendall(b)
    c.close()
n, served = int(sys.argv[3]), 0
while n == 0 or served < n:
    c, _ = ls.accept()
    threading.Thread(target=serve, args=(c,), daemon=n == 0).start()
    served += 1
'

# shared_lib: a copy of the library that every user can load (Bazel's
# output is under root's home), in $WORK/shared; prints its path.
shared_lib() {
  local d=$WORK/shared
  if [ ! -e "$d/libvsocket.so" ]; then
    mkdir -p "$d" && chmod a+rx "$WORK" "$d" && install -m 0755 "$LIB" "$d/libvsocket.so"
  fi
  echo "$d/libvsocket.so"
}

# strace_count FILE CALL: how many CALLs `strace -c -o FILE` counted (0 if
# it counted none: strace prints no line for them; empty without FILE).
strace_count() {
  [ -s "$1" ] || return 0
  awk -v call="$2" '$NF == call {n = $4} END {print n + 0}' "$1"
}

# wait_accelerated N PORT...: until the daemon has N accelerated
# connections to or from those ports (bounded: 10 s).
wait_accelerated() {
  local n=$1 i
  shift
  for i in $(seq 100); do
    [ "$(bash $TB status 2>/dev/null | sed -n '/^{/,$p' | python3 -c "
import json, sys
ports = {int(p) for p in sys.argv[1:]}
try:
    d = json.loads(sys.stdin.read())
except Exception:
    print(0); sys.exit()
print(sum(1 for c in d.get('connections', []) if c.get('mode') == 'accelerated' and
          (int(c['local'].rsplit(':', 1)[1]) in ports or int(c['peer'].rsplit(':', 1)[1]) in ports)))" "$@")" -ge "$n" ] && return 0
    sleep 0.1
  done
  return 1
}

# bulk_and_rounds NAME REP PORT ROUNDS: in the background, a 4 GiB one-way
# xfer stream from vm1 to vm2 on PORT and 4 request/response connections
# (ROUNDS rounds of 10 KiB each way, 20 ms apart) on PORT+1, every byte
# checked by xfer; their PIDs in BR_PIDS (bulk client, bulk server, rounds
# client, rounds server). Fails (and stops them) unless all 10 ends are
# accelerated within 10 s.
bulk_and_rounds() {
  local name=$1 rep=$2 port=$3 rounds=$4 bsrv rsrv bcli
  vm_bg vm2 preload "$rep" "$WORK/$name.bsrv" "$XFER" server "$A2" "$port" --conns 1 --one-way
  bsrv=$BG
  vm_bg vm2 preload "$rep" "$WORK/$name.rsrv" "$XFER" server "$A2" $((port + 1)) --conns 4 --rounds "$rounds" --gap-ms 20
  rsrv=$BG
  sleep 0.3
  vm_bg vm1 preload "$rep" "$WORK/$name.bcli" "$XFER" client "$A2" "$port" --conns 1 --bytes 4294967296 --one-way
  bcli=$BG
  vm_bg vm1 preload "$rep" "$WORK/$name.rcli" "$XFER" client "$A2" $((port + 1)) --conns 4 --bytes $((rounds * 10240)) \
    --rounds "$rounds" --gap-ms 20
  BR_PIDS="$bcli $bsrv $BG $rsrv"  # (the order of bulk_and_rounds_wait's names)
  wait_accelerated 10 "$port" $((port + 1)) || { kill $BR_PIDS 2>/dev/null; return 1; }
}
# bulk_and_rounds_wait NAME: waits for bulk_and_rounds' processes (in this
# shell: they are its children); BR_BAD says which failed and their last
# lines (empty if none did).
bulk_and_rounds_wait() {
  local name=$1 pid i=0
  local names=("bulk client" "bulk server" "rounds client" "rounds server")
  BR_BAD=""
  for pid in $BR_PIDS; do
    wait "$pid" || BR_BAD+="${names[$i]} failed; "
    i=$((i + 1))
  done
  [ -z "$BR_BAD" ] ||
    BR_BAD+=$(tail -1 "$WORK/$name.bcli" "$WORK/$name.bsrv" "$WORK/$name.rcli" "$WORK/$name.rsrv" 2>/dev/null | tr '\n' ' ')
}

# ---- the application matrix (62_node.sh .. 78_haproxy_tcp.sh) -------------
# Real applications under both policies, vm1 client, vm2 server, both
# preloaded. Helpers: tests/e2e/apps/ (servers, clients, the wrk body check
# wrk_body.lua, the report judge report_summary.py).

APPS=tests/e2e/apps
# The system's Python (its packages: python3-aiohttp, python3-grpcio), not
# whatever python3 comes first in PATH.
SYS_PY=/usr/bin/python3

# daemon_counts [PORT...]: "CONNS DEVICES ACTIVE REGISTERED UPGRADES": the
# connections vsocketd tracks to or from those ports now (any mode; all of
# them without ports), the devices (attached guest processes) of vm1 and
# vm2, and the counters active (registered connections not yet closed by
# their guest), registered and upgrades.
daemon_counts() {
  bash $TB status 2>/dev/null | sed -n '/^{/,$p' | python3 "$APPS/daemon_view.py" counts "$@"
}

# judge_auto REP PORT: an application case under the default policy: the
# reports of both ends (one file) judged as report_summary.py judges them
# (no missed wake-up, no kernel bytes after an upgrade without a RESYNC,
# no reason that is a failure); prints its summary, false if it fails.
judge_auto() {
  python3 "$APPS/report_summary.py" --port "$2" --policy auto --server "$1" --client "$1"
}

# daemon_counter NAME: vsocketd's conn_counters NAME now (-1 if absent).
daemon_counter() {
  bash $TB status 2>/dev/null | sed -n '/^{/,$p' | python3 "$APPS/daemon_view.py" counter "$1"
}

# leak_begin: LEAK0, the daemon's counts before a case starts its processes.
leak_begin() { LEAK0=($(daemon_counts)); }

# leak_untracked PORT...: after the client finished, while the server still
# runs: until vsocketd tracks no connection to or from those ports (every
# connection's close reached the daemon from both libraries; bounded: 10 s).
# LEAK_IDLE: how many it still tracks (0 when none leaked).
leak_untracked() {
  local i c
  for i in $(seq 50); do
    c=($(daemon_counts "$@"))
    [ "${c[0]}" -eq 0 ] && break
    sleep 0.2
  done
  LEAK_IDLE=${c[0]}
  LEAK_WHO=""
  [ "$LEAK_IDLE" -eq 0 ] || LEAK_WHO=$(bash $TB status 2>/dev/null | sed -n '/^{/,$p' | python3 "$APPS/daemon_view.py" who "$@")
}

# leak_end: after every process of the case stopped: until the devices of
# vm1 and vm2 and the active connections are back to LEAK0's (bounded:
# 10 s). LEAK_MSG says what was seen, LEAK_BAD what is not back (empty if
# all is), with LEAK_IDLE (leak_untracked) and the registrations and
# upgrades the case made (LEAK_REG, LEAK_UPG).
leak_end() {
  local i c
  for i in $(seq 50); do
    c=($(daemon_counts))
    [ "${c[1]}" -le "${LEAK0[1]}" ] && [ "${c[2]}" -le "${LEAK0[2]}" ] && break
    sleep 0.2
  done
  LEAK_REG=$((c[3] - LEAK0[3])) LEAK_UPG=$((c[4] - LEAK0[4]))
  LEAK_MSG="daemon: $LEAK_REG registered, $LEAK_UPG upgraded; left tracked after the load ${LEAK_IDLE:-?}; after the stop devices ${LEAK0[1]}->${c[1]}, active ${LEAK0[2]}->${c[2]}"
  LEAK_BAD=""
  [ "${LEAK_IDLE:-0}" -eq 0 ] || LEAK_BAD+="$LEAK_IDLE connections still tracked by vsocketd after the load ended (server running: $LEAK_WHO); "
  [ "${c[1]}" -le "${LEAK0[1]}" ] || LEAK_BAD+="devices ${LEAK0[1]} -> ${c[1]} after every process stopped; "
  [ "${c[2]}" -le "${LEAK0[2]}" ] || LEAK_BAD+="active connections ${LEAK0[2]} -> ${c[2]} after every process stopped; "
}

# region_full FILE...: the library's "shared region full" lines in those
# logs (count, and the first one), empty if none.
region_full() {
  local n
  n=$(cat "$@" 2>/dev/null | grep -c "shared region full")
  [ "$n" -eq 0 ] || echo "$n 'shared region full' log lines, first: $(cat "$@" 2>/dev/null | grep -m1 "shared region full" | cut -c1-300)"
}

# leak_verdict LOG...: once the servers stopped: leak_end, and no LOG may say
# "shared region full"; what is wrong is added to the caller's $bad.
leak_verdict() {
  leak_end
  local full
  full=$(region_full "$@")
  [ -z "$full" ] || bad+="logs: $full; "
  [ -z "$LEAK_BAD" ] || bad+="leak: $LEAK_BAD"
}

# wrk_judge OUT: wrk's result in OUT (its output); WRK_SUM: "N
# requests, R req/s, bodies: ok/bad, errors"; false unless every body was
# right and wrk saw no socket error or non-2xx answer.
wrk_judge() {
  local out=$1 n rps bodies errs
  n=$(awk '/requests in/ {print $1}' "$out")
  rps=$(awk '/Requests\/sec/ {print $2}' "$out")
  bodies=$(grep -oE "bodies: [0-9]+ ok, [0-9]+ bad" "$out")
  errs=$(grep -E "Socket errors|Non-2xx" "$out" | tr -s ' \n' ' ')
  WRK_SUM="${n:-?} requests, ${rps:-?} req/s, ${bodies:-no body check}${errs:+, $errs}"
  [ -n "$n" ] && [ "$n" -gt 0 ] && [ -z "$errs" ] && [[ $bodies =~ ^bodies:\ ([0-9]+)\ ok,\ 0\ bad$ ]] &&
    [ "${BASH_REMATCH[1]}" -gt 0 ]
}
