# vsocketd dies or restarts under load (issue 16): killed (KILL) or stopped
# (TERM) and started again under byte-checked streams, request/response
# connections and redis-benchmark. The suite's last cases.

# A bulk stream and request/response connections, both byte-checked, while
# the daemon is stopped with SIG (KILL: a crash; TERM: what systemd sends)
# and started again at a random point of the transfer. Every connection must
# finish byte-exact with no error (RESYNC on kernel TCP: both ends report
# resynced), no process may hang or spin (bounded by E2E_TIMEOUT), and the
# request/response connections must register again with the new daemon and
# end accelerated (report: re-upgraded; the new daemon's counters: bytes
# moved after the restart).
case_daemon_restart() {  # case_daemon_restart SIG REP
  local sig=$1 rep_no=$2 port name=daemon_restart_${1,,}_$2
  port=$(alloc_port 2)
  local rep=$WORK/$name.jsonl conns=4 bad
  # A random kill point once every connection is accelerated, while the
  # bulk stream (about a second accelerated here) still runs.
  bulk_and_rounds $name "$rep" "$port" 300 || { fail $name "not every connection was accelerated before the restart"; return; }
  sleep "0.$((RANDOM % 4))$((RANDOM % 10))"
  local old new
  old=$(bash $TB daemon-pid)
  if ! bash $TB restart "$sig" >"$WORK/$name.restart" 2>&1; then
    fail $name "restart: $(tail -2 "$WORK/$name.restart" | tr '\n' ' ')"
    kill $BR_PIDS 2>/dev/null
    return
  fi
  new=$(bash $TB daemon-pid)
  bulk_and_rounds_wait $name
  bad=$BR_BAD
  [ -z "$bad" ] || { fail $name "$bad"; return; }
  local out out2 after
  # SIGTERM drains first: clean fences, nothing resent (a crash resyncs).
  local cause=(--downgrade-cause backend-unavailable)
  [ "$sig" = TERM ] && cause=(--downgrade-cause operator --no-resend)
  out=$(python3 $CHECK "$rep" --port "$port" --expect-conns 2 --resynced "${cause[@]}") || bad+="bulk: $out; "
  out2=$(python3 $CHECK "$rep" --port $((port + 1)) --expect-conns $((2 * conns)) --reupgraded "${cause[@]}") ||
    bad+="request/response: $out2; "
  [ -z "$bad" ] || { fail $name "$bad"; return; }
  after=$(moved_bytes)
  [ "$after" -gt 0 ] || { fail $name "the new vsocketd moved no bytes"; return; }
  pass "$name (vsocketd $old SIG$sig mid-transfer, $new started: 4 GiB bulk byte-exact ($out); $conns request/response connections byte-exact and re-upgraded ($out2); new daemon moved $after B)"
}
# redis-benchmark's 20 clients while vsocketd is killed and started again:
# no request may fail, and a 1 MiB value set before the kill must come back
# byte-exact after it.
case_daemon_restart_redis() {  # case_daemon_restart_redis SIG
  local sig=$1 name=daemon_restart_redis_${1,,} rep=$WORK/restart-redis-$1.jsonl port
  port=$(alloc_port)
  vm_bg vm2 preload "$rep" "$WORK/$name.srv" redis-server --bind "$A2" --port $port --save '' \
    --appendonly no --protected-mode no
  local srv=$BG
  wait_for_text "$WORK/$name.srv" "Ready to accept" 50
  head -c 1048576 /dev/urandom | base64 -w0 >"$WORK/$name.val"
  vm_run vm1 preload "$rep" redis-cli -h "$A2" -p $port -x set blob <"$WORK/$name.val" >/dev/null 2>&1
  vm_bg vm1 preload "$rep" "$WORK/$name.bench" redis-benchmark -h "$A2" -p $port -t set,get -n 300000 -c 20 -q
  local bench=$BG
  if ! wait_accelerated 20 $port; then
    fail $name "redis-benchmark's connections were not accelerated before the restart"
    kill $bench $srv 2>/dev/null
    return
  fi
  sleep "0.$((RANDOM % 5))"
  bash $TB restart "$sig" >"$WORK/$name.restart" 2>&1 || { fail $name "restart failed"; kill $bench $srv 2>/dev/null; return; }
  local bench_ok=1 lines
  wait $bench || bench_ok=0
  vm_run vm1 preload "$rep" redis-cli -h "$A2" -p $port --raw get blob 2>/dev/null | head -c -1 >"$WORK/$name.got"
  kill $srv 2>/dev/null
  wait $srv 2>/dev/null
  lines=$(tr '\r' '\n' <"$WORK/$name.bench" | grep -E "^(SET|GET): [0-9]" | awk '{print $1 $2}' | tr '\n' ' ')
  if [ $bench_ok -ne 1 ] || grep -qi "error" "$WORK/$name.bench" || [ "$(echo $lines | wc -w)" -ne 2 ]; then
    fail $name "redis-benchmark: $(tr '\r' '\n' <"$WORK/$name.bench" | grep -v '^$' | tail -3 | tr '\n' ' ')"
    return
  fi
  cmp -s "$WORK/$name.val" "$WORK/$name.got" || { fail $name "the 1 MiB value did not come back byte-exact"; return; }
  local out resynced
  out=$(python3 $CHECK "$rep" --port $port) || { fail $name "$out"; return; }
  resynced=$(python3 -c "import json,sys; print(sum(1 for l in open(sys.argv[1]) if l.strip() and json.loads(l).get('resynced')))" "$rep")
  [ "$resynced" -gt 0 ] || { fail $name "no connection was live across the restart"; return; }
  pass "$name (SIG$sig during redis-benchmark -c 20: no error ($lines); 1 MiB value byte-exact after the restart; $resynced connection ends went through RESYNC; $out)"
}

# A process that lives through several vsocketd restarts gives each lost
# session's memory back (issue 36): the library kept every lost session's
# region mapped until the process exited (in a VM, 8 huge pages per move:
# a VM moved three times stopped re-accelerating). redis-server, preloaded,
# outlives three SIGKILL restarts, each under redis-benchmark's accelerated
# connections; after each, the server's connections resynced and re-upgraded
# (reports) and it maps exactly one session region, the live one
# (/proc/PID/maps: memfd:vsocket-guest). A 1 MiB value set first comes back
# byte-exact at the end.
case_daemon_restart_memory() {
  local name=daemon_restart_memory rep=$WORK/restart-memory.jsonl port
  local -x VSOCKET_UPGRADE=always
  port=$(alloc_port)
  VSOCKET_LOG_LEVEL=info vm_bg vm2 preload "$rep" "$WORK/$name.srv" redis-server --bind "$A2" --port $port --save '' \
    --appendonly no --protected-mode no
  local srv=$BG pid=""
  wait_for_text "$WORK/$name.srv" "Ready to accept" 50
  pid=$(pgrep -P "$srv" redis-server | head -1)
  [ -n "$pid" ] || { fail $name "no redis-server under $srv"; kill $srv 2>/dev/null; return; }
  head -c 1048576 /dev/urandom | base64 -w0 >"$WORK/$name.val"
  vm_run vm1 preload "$rep" redis-cli -h "$A2" -p $port -x set blob <"$WORK/$name.val" >/dev/null 2>&1
  local round regions=() bench n
  for round in 1 2 3; do
    vm_bg vm1 preload "$rep" "$WORK/$name.bench$round" redis-benchmark -h "$A2" -p $port -t set,get -n 100000 -c 4 -q
    bench=$BG
    if ! wait_accelerated 8 $port; then
      fail $name "round $round: redis-benchmark's connections were not accelerated before the restart"
      kill $bench $srv 2>/dev/null
      return
    fi
    sleep "0.$((RANDOM % 3))"
    if ! bash $TB restart KILL >"$WORK/$name.restart$round" 2>&1; then
      fail $name "round $round: restart failed"
      kill $bench $srv 2>/dev/null
      return
    fi
    if ! wait $bench || grep -qi error "$WORK/$name.bench$round"; then
      fail $name "round $round: redis-benchmark: $(tr '\r' '\n' <"$WORK/$name.bench$round" | grep -v '^$' | tail -2 | tr '\n' ' ')"
      kill $srv 2>/dev/null
      return
    fi
    # The benchmark's connections closed: none of the server's is on a lost
    # session's rings any more. (A look now and then: the closes are the
    # server's to notice.)
    for _ in $(seq 30); do
      n=$(grep -c "memfd:vsocket-guest" "/proc/$pid/maps" 2>/dev/null)
      [ "${n:-9}" -le 1 ] && break
      sleep 0.1
    done
    regions+=("$n")
  done
  vm_run vm1 preload "$rep" redis-cli -h "$A2" -p $port --raw get blob 2>/dev/null | head -c -1 >"$WORK/$name.got"
  kill $srv 2>/dev/null
  wait $srv 2>/dev/null
  cmp -s "$WORK/$name.val" "$WORK/$name.got" || { fail $name "the 1 MiB value did not come back byte-exact"; return; }
  local resynced reup
  resynced=$(python3 -c "import json,sys; print(sum(1 for l in open(sys.argv[1]) if l.strip() and json.loads(l).get('resynced')))" "$rep")
  reup=$(grep -c "ring memory given back" "$WORK/$name.srv")
  [ "$resynced" -ge 3 ] || { fail $name "only $resynced connection ends went through RESYNC: not every restart was under load"; return; }
  [ "$reup" -ge 3 ] || { fail $name "the server's library gave back $reup lost sessions' memory, want 3"; return; }
  # (0: the round's connections all closed on kernel TCP before any
  # registered again, so no new session was opened: seen on a fast machine,
  # 2026-12-02. What is judged is that no lost region stays mapped.)
  local r
  for r in "${regions[@]}"; do
    [ "$r" -le 1 ] ||
      { fail $name "after restarts 1, 2, 3 redis-server mapped ${regions[*]} session regions (want at most 1 each: the lost ones given back)"; return; }
  done
  pass "$name (redis-server through 3 SIGKILL restarts under redis-benchmark -c 4: one session region mapped after each (${regions[*]}); $resynced connection ends resynced; the server's library gave $reup lost sessions' memory back; 1 MiB value byte-exact)"
}

# gRPC's short channels (a TCP connection each, opened all along) while
# vsocketd is killed and started again: connections opened while no
# vsocketd listens (its socket file is gone: connect() to it fails with
# ENOENT) and while it starts must go on over kernel TCP, and no RPC may
# fail. A gRPC run once failed 1,230 RPCs with "No such file or directory"
# (issue 34): the library's own failure to reach vsocketd must never reach
# an application's errno.
# RESTARTS (x8): vsocketd SIGKILLed and started again that many times,
# 1-2 s apart, under the same load: every restart catches some pairings
# half done. On 2026-12-02, 1 of 6 x8 runs (and 1 of about 30 single
# restarts under a CPU hog) had RPCs fail ("Connection reset by peer",
# "Socket closed", "Failed parsing HTTP/2"): a direct pair's DIRECT event
# reached one end after vsocketd died (its fetch failed) while the other
# end had its UPGRADE and wrote into the pair (decision 133, open: a known
# failure), or a direct sender reset at an unconfirmed FENCE (decision 134
# took that away).
case_daemon_restart_grpc() {  # case_daemon_restart_grpc POLICY [RESTARTS]
  local policy=$1 restarts=${2:-1} name=daemon_restart_grpc_$1 port k
  [ "$restarts" = 1 ] || name=${name}_x$restarts
  local -x VSOCKET_UPGRADE=$policy
  local srep=$WORK/$name.srv.jsonl crep=$WORK/$name.cli.jsonl
  $SYS_PY -c "import grpc" 2>/dev/null || { fail $name "python3-grpcio not installed (deploy/install-deps.sh)"; return; }
  port=$(alloc_port)
  serve_listening $name vm2 "$srep" "$SYS_PY" "$APPS/grpc_app.py" server "$port" || return
  local srv=$BG
  # What is judged is every RPC before, across and after the restart (1-2 s
  # in): none failed or answered wrong, and most of the run came after it.
  # How many of the 1,200 channels 40 s hold depends on the machine: all
  # alone, 1,010 and 1,025 in a full run on 2026-11-30 (both policies).
  vm_bg vm1 preload "$crep" "$WORK/$name.cli" "$SYS_PY" "$APPS/grpc_app.py" client "$A2" "$port" --threads 8 \
    --channels 150 --unary 3 --stream-msgs 20 --stream-size 16384 --seconds 40 --min-channels 600
  local cli=$BG
  for ((k = 0; k < restarts; k++)); do
    sleep "1.$((RANDOM % 10))"
    bash $TB restart KILL >>"$WORK/$name.restart" 2>&1 || { fail $name "restart failed"; kill $cli $srv 2>/dev/null; return; }
  done
  local rc=0
  wait $cli || rc=$?
  kill $srv 2>/dev/null
  wait $srv 2>/dev/null
  local sum
  sum=$(grep -m1 "^ok:" "$WORK/$name.cli")
  if [ $rc -ne 0 ] || [ -z "$sum" ]; then
    fail $name "client rc $rc: ${sum:-$(tail -3 "$WORK/$name.cli" | tr '\n' ' ')}"
    return
  fi
  local out
  out=$(python3 "$APPS/report_summary.py" --port "$port" --policy auto --server "$srep" --client "$crep") ||
    { fail $name "$out"; return; }
  pass "$name (vsocketd SIGKILL and restart during gRPC short channels: $sum; $out)"
}

# vsocketd killed before it took the FENCEs of a connection that had just
# switched over both ways (CI 2026-11-30, daemon_restart_grpc_auto: one gRPC
# stream reset, both ends logging "fabric link lost before the peer
# confirmed our fence"). Made certain here: both ends register (a read
# that finds nothing) and are paired, vsocketd is stopped (SIGSTOP), each end
# writes 64 KiB (it hears its UPGRADE, posts its FENCE, puts its bytes in
# its TX ring), then vsocketd is killed and started again.
# Neither FENCE was taken, so no peer has one: each end's ring bytes follow
# its kernel bytes with no header (decision 124), never a reset.
# $2 (exit): wait, each end shuts down writing and reads to the other's EOF
# before it exits; at-once, each closes and exits as soon as it has its 64
# KiB, often before its library saw vsocketd go: its close lingers (its own
# ring bytes unconsumed) and its exit must not take them along (the library
# waits for the resend at exit: FinishLingersAtExit; before, the peer read
# EOF after 0 of 65,536 bytes in 1 of 3 runs).
case_daemon_killed_before_the_fence() {
  local name=$1 how=$2 port rep=$WORK/unfenced.jsonl d
  rm -f "$WORK/unfenced.go" "$rep"
  # (Through vsocketd: a direct pair's FENCEs never wait for it.)
  local -x VSOCKET_UPGRADE=always VSOCKET_DIRECT=0
  port=$(alloc_port)
  local prog='
import hashlib, os, socket, sys, time
role, addr, port, work, how = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[6]
sys.path.insert(0, sys.argv[5])
from pair_io import recv_n, register_by_reading
def wait_file(p):
    for _ in range(600):
        if os.path.exists(p):
            return
        time.sleep(0.05)
    sys.exit("no " + p)
if role == "server":
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((addr, port))
    l.listen(1)
    c, _ = l.accept()
else:
    c = socket.create_connection((addr, port))
# A read that finds nothing registers the connection (its first I/O); once
# both ends are paired their UPGRADE waits in their event queues. Neither
# has written, so neither has switched over.
register_by_reading(c)
time.sleep(0.5)
print("up", flush=True)
wait_file(work + "/unfenced.go")
data = os.urandom(65536)
c.sendall(data)
print("sent " + hashlib.sha256(data).hexdigest(), flush=True)
got = recv_n(c, 65536)
print("got " + hashlib.sha256(got).hexdigest(), flush=True)
if how == "wait":
    c.shutdown(socket.SHUT_WR)
    while c.recv(4096):
        pass
c.close()
'
  VSOCKET_LOG_LEVEL=info vm_bg vm2 preload "$rep" "$WORK/unfenced.srv" python3 -c "$prog" server "$A2" $port "$WORK" "$APPS" "$how"
  local srv=$BG
  wait_listen vm2 $port
  VSOCKET_LOG_LEVEL=info vm_bg vm1 preload "$rep" "$WORK/unfenced.cli" python3 -c "$prog" client "$A2" $port "$WORK" "$APPS" "$how"
  local cli=$BG
  if ! wait_for_text "$WORK/unfenced.cli" '^up' 100 || ! wait_for_text "$WORK/unfenced.srv" '^up' 100; then
    fail $name "the ends never exchanged their first bytes"
    kill $cli $srv 2>/dev/null
    return
  fi
  d=$(bash $TB daemon-pid)
  kill -STOP "$d"
  touch "$WORK/unfenced.go"
  wait_for_text "$WORK/unfenced.cli" '^sent' 100
  wait_for_text "$WORK/unfenced.srv" '^sent' 100
  sleep 0.3
  if ! bash $TB restart KILL >"$WORK/unfenced.restart" 2>&1; then
    kill -CONT "$d" 2>/dev/null
    fail $name "restart: $(tail -2 "$WORK/unfenced.restart" | tr '\n' ' ')"
    kill $cli $srv 2>/dev/null
    return
  fi
  local rc_c=0 rc_s=0
  wait $cli || rc_c=$?
  wait $srv || rc_s=$?
  local cs cg ss sg
  cs=$(awk '/^sent/ {print $2}' "$WORK/unfenced.cli"); cg=$(awk '/^got/ {print $2}' "$WORK/unfenced.cli")
  ss=$(awk '/^sent/ {print $2}' "$WORK/unfenced.srv"); sg=$(awk '/^got/ {print $2}' "$WORK/unfenced.srv")
  if [ $rc_c -ne 0 ] || [ $rc_s -ne 0 ] || [ -z "$cs" ] || [ "$cs" != "$sg" ] || [ "$ss" != "$cg" ]; then
    fail $name "client rc $rc_c, server rc $rc_s: $(grep -hE 'W |early|Error' "$WORK/unfenced.cli" "$WORK/unfenced.srv" | head -4 | tr '\n' ' ')"
    return
  fi
  local unread
  unread=$(cat "$WORK/unfenced.cli" "$WORK/unfenced.srv" | grep -c "the backend went before it took our FENCE")
  [ "$unread" -eq 2 ] ||
    { fail $name "$unread of 2 ends resent an untaken FENCE's ring bytes without a header (the case did not reach that point: both ends must have switched over while vsocketd was stopped)"; return; }
  local out
  out=$(python3 $CHECK "$rep" --port "$port" --expect-conns 2 --resynced --downgrade-cause backend-unavailable) ||
    { fail $name "$out"; return; }
  pass "$name (vsocketd SIGKILLed with both ends' FENCEs untaken: 64 KiB each way byte-exact, each end's ring bytes resent with no header after its kernel bytes (exit: $how); $out)"
}

register_case daemon_restart_kill_1 case_daemon_restart KILL 1
register_case daemon_restart_kill_2 case_daemon_restart KILL 2
register_case daemon_restart_kill_3 case_daemon_restart KILL 3
register_case daemon_restart_redis_kill case_daemon_restart_redis KILL
register_case daemon_restart_redis_term case_daemon_restart_redis TERM
register_case daemon_restart_term_1 case_daemon_restart TERM 1
register_case daemon_restart_term_2 case_daemon_restart TERM 2
register_case daemon_restart_memory case_daemon_restart_memory
register_case daemon_restart_grpc_auto case_daemon_restart_grpc auto
register_case daemon_restart_grpc_always case_daemon_restart_grpc always
register_case daemon_restart_grpc_always_x8 case_daemon_restart_grpc always 8
register_case daemon_killed_before_the_fence case_daemon_killed_before_the_fence daemon_killed_before_the_fence wait
register_case daemon_killed_before_the_fence_exit_at_once case_daemon_killed_before_the_fence daemon_killed_before_the_fence_exit_at_once at-once
