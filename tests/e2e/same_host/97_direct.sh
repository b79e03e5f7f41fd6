# Direct pairs (decision 97, issue 37), on by default between vm1 and vm2
# (one tenant's: decision 102): xfer's byte-checked streams, where every
# connection end must report path direct and vsocketd must move no byte
# (accel_bytes unchanged) while it counts the pairs; vsocketd's death under
# direct streams; a drain and undrain; the default policy's direct-peer
# rule; a hostile peer process scribbling on its own pair (its own case,
# direct_hostile_peer). Then the operator's `direct = off` for vm1 (vsocketd restarted with
# it, and again as before): the same streams through vsocketd. (The
# socket-semantics suite runs with direct pairs in 88_socket_semantics.sh.)

# direct_restart on|off [SIGNAL]: vsocketd again (the old one stopped by
# SIGNAL, TERM by default), with the default (direct pairs) or with
# `direct = off` for vm1.
direct_restart() {
  if [ "$1" = on ]; then
    bash $TB restart "${2:-TERM}" >"$WORK/direct-$1.restart" 2>&1
  else
    VSOCKET_VM_VM1_DIRECT=off bash $TB restart "${2:-TERM}" >"$WORK/direct-$1.restart" 2>&1
  fi
}

# vsocketd killed (SIGKILL) under two direct 1 GiB streams each way and
# started again: every byte arrives, checked by xfer at
# both ends. Today the direct connections go back to kernel TCP through
# RESYNC like the others (decision 97: not yet left undisturbed).
direct_daemon_killed() {
  local name=$1 port rep=$WORK/$1-kill.jsonl
  port=$(alloc_port)
  vm_bg vm2 preload "$rep" "$WORK/$name.ksrv" "$XFER" server "$A2" "$port" --conns 2
  local srv=$BG
  vm_bg vm1 preload "$rep" "$WORK/$name.kcli" "$XFER" client "$A2" "$port" --conns 2 --bytes $((1 << 30))
  local cli=$BG
  sleep 1.5
  direct_restart on KILL || { echo "restart after SIGKILL: $(tail -1 "$WORK/direct-on.restart"); "; return; }
  wait "$cli" || echo "client after the kill: $(tail -2 "$WORK/$name.kcli" | tr '\n' ' '); "
  wait "$srv" || echo "server after the kill: $(tail -2 "$WORK/$name.ksrv" | tr '\n' ' '); "
  local direct_ends out
  direct_ends=$(grep -c '"path":"direct"' "$rep")
  [ "$direct_ends" = 0 ] || echo "$direct_ends ends still direct after the daemon's death (they resync today); "
  grep -q '"resynced":true' "$rep" || echo "no end went through RESYNC; "
  # Each end counts every byte once, out and in (a resent byte is the
  # kernel's, not the ring's; the RESYNC header is nobody's).
  out=$(python3 $CHECK "$rep" --port "$port" --expect-conns 4 --exact-sum $((2 * (1 << 30) + 16))) ||
    echo "daemon killed: $out; "
}

# vsocketctl drain under direct pairs (a 4 GiB stream and four
# request/response connections), then undrain: each direct pair leaves its
# rings with clean fences like any other (no byte resent; cause operator),
# and the request/response ones go direct again after the undrain (their
# last report line: path direct, re-upgraded).
direct_drained() {
  local name=$1-drain port rep=$WORK/$1-drain.jsonl out drained bad=""
  port=$(alloc_port 2)
  bulk_and_rounds $name "$rep" "$port" 500 || { echo "drain: not every connection was direct before the drain; "; return; }
  local d0
  d0=$(stat_field drains_done)
  drained=$(bash $TB ctl drain --wait 10 2>&1) || bad+="vsocketctl drain --wait 10: $drained; "
  sleep 0.3
  bash $TB ctl undrain >"$WORK/$name.undrain" 2>&1 || bad+="undrain: $(cat "$WORK/$name.undrain"); "
  bulk_and_rounds_wait $name
  bad+=$BR_BAD
  out=$(python3 $CHECK "$rep" --port "$port" --expect-conns 2 --downgrade-cause operator --no-resend) ||
    bad+="drain, bulk: $out; "
  out=$(python3 $CHECK "$rep" --port $((port + 1)) --expect-conns 8 --reupgraded --downgrade-cause operator \
    --no-resend --path direct) || bad+="drain, request/response (direct again after the undrain): $out; "
  [ "$(stat_field drains_done)" -gt "$d0" ] || bad+="drain: vsocketd counted no drain done; "
  echo -n "$bad"
}

# The default policy (decision 98): a request/response connection between
# two processes that may share a pair registers after 16 turns and goes
# direct (report: path direct, registered_for direct-peer); a connection
# per request never registers; one to another tenant's VM (vm3) registers
# for a direct pair, is declined (direct_declined) and stays held.
direct_policy() {
  local name=$1-policy port rep=$WORK/$1-policy.jsonl out bad="" d0 d1 dp0 dp1 kf0 kf1
  port=$(alloc_port 3)
  d0=$(stat_field direct_declined)
  kf0=$(($(vm_fallbacks vm1 kernel_faster) + $(vm_fallbacks vm3 kernel_faster)))
  dp0=$(stat_field direct_pairs)
  vm_bg vm2 preload "$rep" "$WORK/$name.srv" env VSOCKET_UPGRADE=auto "$XFER" server "$A2" "$port" --conns 2 --rounds 2000
  local srv=$BG
  vm_bg vm2 preload "$rep" "$WORK/$name.srv1" env VSOCKET_UPGRADE=auto "$XFER" server "$A2" $((port + 1)) --conns 8 --rounds 1
  local srv1=$BG
  vm_bg vm3 preload "$rep" "$WORK/$name.srv3" env VSOCKET_UPGRADE=auto "$XFER" server "$A3" $((port + 2)) --conns 1 --rounds 2000
  local srv3=$BG
  sleep 0.3
  vm_run vm1 preload "$rep" env VSOCKET_UPGRADE=auto "$XFER" client "$A2" "$port" --conns 2 --bytes 128000 --rounds 2000 \
    >"$WORK/$name.cli" 2>&1 || bad+="policy, rounds client: $(tail -1 "$WORK/$name.cli"); "
  vm_run vm1 preload "$rep" env VSOCKET_UPGRADE=auto "$XFER" client "$A2" $((port + 1)) --conns 8 --bytes 4096 --rounds 1 \
    >"$WORK/$name.cli1" 2>&1 || bad+="policy, one-round client: $(tail -1 "$WORK/$name.cli1"); "
  vm_run vm1 preload "$rep" env VSOCKET_UPGRADE=auto "$XFER" client "$A3" $((port + 2)) --conns 1 --bytes 128000 --rounds 2000 \
    >"$WORK/$name.cli3" 2>&1 || bad+="policy, client to vm3: $(tail -1 "$WORK/$name.cli3"); "
  wait "$srv" || bad+="policy, rounds server: $(tail -1 "$WORK/$name.srv"); "
  wait "$srv1" || bad+="policy, one-round server: $(tail -1 "$WORK/$name.srv1"); "
  wait "$srv3" || bad+="policy, vm3 server: $(tail -1 "$WORK/$name.srv3"); "
  out=$(python3 $CHECK "$rep" --port "$port" --expect-conns 4 --mode accelerated --path direct --exact-total 128016) ||
    bad+="policy, 2000 rounds: $out; "
  [ "$(grep -c '"registered_for":"direct-peer"' "$rep")" = 4 ] || bad+="policy: $(grep -c '"registered_for":"direct-peer"' "$rep") ends registered for direct-peer, expected 4; "
  out=$(python3 $CHECK "$rep" --port $((port + 1)) --expect-conns 16 --mode kernel --reason request-response) ||
    bad+="policy, a connection per request: $out; "
  out=$(python3 $CHECK "$rep" --port $((port + 2)) --expect-conns 2 --mode kernel --reason request-response) ||
    bad+="policy, another tenant's peer: $out; "
  d1=$(stat_field direct_declined)
  dp1=$(stat_field direct_pairs)
  kf1=$(($(vm_fallbacks vm1 kernel_faster) + $(vm_fallbacks vm3 kernel_faster)))
  [ $((d1 - d0)) -ge 1 ] || bad+="policy: vsocketd declined $((d1 - d0)) direct registrations for vm3; "
  # Each declined connection is one fallback (kernel-faster), counted once
  # (vm3 allows direct pairs too: its end registers and is declined).
  [ $((kf1 - kf0)) = $((d1 - d0)) ] ||
    bad+="policy: vm1's and vm3's kernel-faster fallbacks grew by $((kf1 - kf0)) for $((d1 - d0)) declined registrations; "
  [ $((dp1 - dp0)) = 2 ] || bad+="policy: vsocketd made $((dp1 - dp0)) direct pairs, expected 2; "
  echo -n "$bad"
}

# `direct = off` for vm1 (vsocketd restarted with it): vm1 -> vm2 streams
# go through vsocketd (path backend, accel_bytes grows by every byte), then
# vsocketd again with the default. Prints what went wrong; what it saw goes
# to $WORK/NAME-off.note.
direct_off() {
  local name=$1-off port rep=$WORK/$1-off.jsonl out bad="" a0 a1 p0 p1 conns=2 bytes=$((16 << 20))
  direct_restart off || { echo "restart with direct = off for vm1: $(tail -1 "$WORK/direct-off.restart"); "; direct_restart on; return; }
  port=$(alloc_port)
  a0=$(stat_field accel_bytes)
  p0=$(stat_field direct_pairs)
  vm_bg vm2 preload "$rep" "$WORK/$name.srv" "$XFER" server "$A2" "$port" --conns $conns
  local srv=$BG
  vm_run vm1 preload "$rep" "$XFER" client "$A2" "$port" --conns $conns --bytes $bytes >"$WORK/$name.cli" 2>&1 ||
    bad+="direct = off, client: $(tail -1 "$WORK/$name.cli"); "
  wait "$srv" || bad+="direct = off, server: $(tail -1 "$WORK/$name.srv"); "
  a1=$(stat_field accel_bytes)
  p1=$(stat_field direct_pairs)
  out=$(python3 $CHECK "$rep" --port "$port" --expect-conns $((2 * conns)) --mode accelerated --path backend \
    --exact-total $((bytes + 16))) || bad+="direct = off: $out; "
  [ $((a1 - a0)) -ge $((conns * bytes)) ] || bad+="direct = off: vsocketd copied $((a1 - a0)) B; "
  [ "$p1" = "$p0" ] || bad+="direct = off: vsocketd made $((p1 - p0)) direct pairs; "
  direct_restart on || bad+="restart with the default: $(tail -1 "$WORK/direct-on.restart"); "
  echo "$conns x $bytes B each way through vsocketd (path backend), which copied $((a1 - a0)) B, no direct pair" \
    >"$WORK/$1-off.note"
  echo -n "$bad"
}

case_direct() {
  local name=direct_pairs conns=4 bytes=$((32 << 20)) port bad=""
  port=$(alloc_port)
  local rep=$WORK/$name.jsonl pairs0 moved0 pairs1 moved1 db0 db1
  pairs0=$(stat_field direct_pairs)
  moved0=$(stat_field accel_bytes)
  db0=$(stat_field direct_bytes)
  vm_bg vm2 preload "$rep" "$WORK/$name.srv" "$XFER" server "$A2" "$port" --conns $conns
  local srv=$BG
  if ! vm_run vm1 preload "$rep" "$XFER" client "$A2" "$port" --conns $conns --bytes $bytes >"$WORK/$name.cli" 2>&1; then
    bad+="client: $(tail -2 "$WORK/$name.cli" | tr '\n' ' '); "
    kill "$srv" 2>/dev/null
  fi
  wait "$srv" || bad+="server: $(tail -2 "$WORK/$name.srv" | tr '\n' ' '); "
  pairs1=$(stat_field direct_pairs)
  moved1=$(stat_field accel_bytes)
  # vsocketd counts a direct pair's bytes from its counts when its ends go
  # (their UNREGISTERs may still be on their way): every ring byte the
  # reports name, within a few seconds.
  local ring_bytes i
  ring_bytes=$(python3 -c "
import json, sys
print(sum(l.get('accel_tx', 0) for l in map(json.loads, open(sys.argv[1])) if 'local' in l))" "$rep")
  for i in $(seq 50); do
    db1=$(stat_field direct_bytes)
    [ $((db1 - db0)) -ge "$ring_bytes" ] && break
    sleep 0.1
  done
  local out direct_ends
  out=$(python3 $CHECK "$rep" --port "$port" --expect-conns $((2 * conns)) --mode accelerated --reason accelerated \
    --accel-min 1 --exact-total $((bytes + 16))) || bad+="$out; "
  direct_ends=$(grep -c '"path":"direct"' "$rep")
  [ "$direct_ends" = $((2 * conns)) ] || bad+="$direct_ends of $((2 * conns)) ends report path direct; "
  # Ends that published without a full fence at some time (decision 114:
  # only while the reader asks for a wake-up less than once per 64
  # publishes; xfer's readers here sleep more often than that, so this is
  # reported, not judged: guest:direct_ring_test proves the mode). Every
  # end must say one or the other.
  local light_ends fenced_ends
  light_ends=$(grep -c '"direct_fences":"light"' "$rep")
  fenced_ends=$(grep -c '"direct_fences":"full"' "$rep")
  [ $((light_ends + fenced_ends)) = $((2 * conns)) ] ||
    bad+="$((light_ends + fenced_ends)) of $((2 * conns)) direct ends say how they fenced; "
  [ $((pairs1 - pairs0)) -ge $conns ] || bad+="vsocketd counted $((pairs1 - pairs0)) direct pairs; "
  [ "$moved1" = "$moved0" ] || bad+="vsocketd moved $((moved1 - moved0)) B of direct pairs; "
  [ "$ring_bytes" -gt 0 ] || bad+="the reports name no ring bytes; "
  [ $((db1 - db0)) -ge "$ring_bytes" ] ||
    bad+="vsocketd counted $((db1 - db0)) B moved by direct pairs, the reports $ring_bytes; "
  bad+=$(direct_daemon_killed $name)
  bad+=$(direct_drained $name)
  bad+=$(direct_policy $name)
  local off
  off=$(direct_off $name)
  bad+=$off
  [ -z "$bad" ] || { fail $name "$bad"; return; }
  pass "$name ($conns conns x $bytes B each way byte-checked, $direct_ends ends path direct ($light_ends with light fences), vsocketd counted $((pairs1 - pairs0)) direct pairs and $((db1 - db0)) B they moved, and copied 0 B of them; vsocketd SIGKILLed under two direct 1 GiB streams each way: byte-exact through RESYNC; vsocketctl drain under a direct 4 GiB stream and 4 request/response pairs, then undrain: clean fences, nothing resent, the 4 pairs direct again; default policy: 2000-round connections direct after 16 turns, a connection per request held, a peer of another tenant declined and held; direct = off for vm1: $(cat "$WORK/$name-off.note" 2>/dev/null))"
}

register_case direct_pairs case_direct

# vsocketd is not on a direct pair's data path, and is not woken by it
# either: 2 connections x 3000 byte-checked round trips between vm1 and vm2,
# direct from their first I/O, while vsocketd counts its worker's wake-ups
# and naps cut short by a guest's kick. Every library used to owe vsocketd
# a kick for each count it moved, direct or not, and kicked before each
# wait: Apache prefork under ab -k woke vsocketd ~12,000 times a second
# and ran at 0.8x kernel TCP (1.5x without: 2026-11-29).
case_direct_quiet_daemon() {
  local name=$1 port rep=$WORK/$1.jsonl out bad="" k0 k1 rounds=3000
  port=$(alloc_port)
  k0=$(ctl_counter worker_wakeups worker_nap_kicks)
  vm_bg vm2 preload "$rep" "$WORK/$name.srv" "$XFER" server "$A2" "$port" --conns 2 --rounds $rounds
  local srv=$BG
  sleep 0.3
  vm_run vm1 preload "$rep" "$XFER" client "$A2" "$port" --conns 2 --bytes 64000 --rounds $rounds \
    >"$WORK/$name.cli" 2>&1 || bad+="client: $(tail -1 "$WORK/$name.cli"); "
  wait "$srv" || bad+="server: $(tail -1 "$WORK/$name.srv"); "
  k1=$(ctl_counter worker_wakeups worker_nap_kicks)
  out=$(python3 $CHECK "$rep" --port "$port" --expect-conns 4 --mode accelerated --path direct) || bad+="reports: $out; "
  # (Setting the pairs up takes a few: registrations, proofs, the pair's
  # memory. Each of 12,000 one-ways kicked before.)
  [ $((k1 - k0)) -le 200 ] ||
    bad+="vsocketd woke $((k1 - k0)) times (worker wake-ups and naps cut short) for $((2 * rounds)) direct round trips; "
  [ -z "$bad" ] || { fail $name "$bad"; return; }
  pass "$name ($((2 * rounds)) round trips byte-checked on 2 direct pairs; vsocketd woke $((k1 - k0)) times meanwhile; $out)"
}

register_case direct_quiet_daemon case_direct_quiet_daemon direct_quiet_daemon

# A direct pair whose memory one library cannot fetch (decisions 133,
# 135). The server's process is out of fds when its DIRECT event comes (the
# pair's memfd and wake eventfd do not fit: MSG_CTRUNC); the same happens
# when vsocketd is killed between its DIRECT and the fetch (gRPC under
# daemon_restart_grpc_always saw "Failed parsing HTTP/2" from it). The
# server stays on kernel TCP and tells vsocketd, which has the client resend
# on the kernel socket what it wrote into the pair, from byte 0 with no
# header. Before decision 135 the server read EOF after 0 of 65,536 bytes.
# $2: early, the client is told before it writes (it waits for the server's
# word that its fds are back: nothing to resend); late,
# the server's library sees its DIRECT only after the client wrote its 64
# KiB into the pair (the server sleeps without calling the library), so the
# client resends all of it. Both: 64 KiB each way byte-exact, both ends
# reporting direct-unavailable, vsocketd's direct_unmapped +1.
case_direct_fetch_fails() {
  local name=$1 when=$2 port rep=$WORK/$1.jsonl bad="" out u0 u1 resent
  local -x VSOCKET_UPGRADE=always
  port=$(alloc_port)
  local prog='
import hashlib, os, socket, sys, time
role, addr, port, when = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[5]
sys.path.insert(0, sys.argv[4])
from pair_io import recv_n, register_by_reading
if role == "server":
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((addr, port))
    l.listen(2)
    print("listening", flush=True)
    w, _ = l.accept()          # a first connection: the session is up
    w.sendall(b"w"); recv_n(w, 1)
    fill = []
    try:
        while True:
            fill.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    os.close(fill.pop())       # one fd left: the accept takes it
    c, _ = l.accept()
    register_by_reading(c)
    if when == "late":
        time.sleep(1.5)        # no call into the library: its DIRECT waits
    # DIRECT comes while this process has no fd to spare.
    for _ in range(100):
        c.setblocking(False)
        try:
            c.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            pass
        c.setblocking(True)
        time.sleep(0.01)
    for f in fill:
        os.close(f)
    print("fds back", flush=True)
    if when == "early":
        w.sendall(b"d")        # the client writes only now
else:
    w = socket.create_connection((addr, port))
    recv_n(w, 1); w.sendall(b"w")
    time.sleep(0.3)
    c = socket.create_connection((addr, port))
    if when == "late":
        time.sleep(0.3)        # the server registers first: its DIRECT waits for its next call
    register_by_reading(c)
    if when == "early":
        recv_n(w, 1)           # the server has seen its DIRECT (and told vsocketd)
    else:
        time.sleep(0.2)        # its UPGRADE in: the sendall below switches and writes into the pair
data = hashlib.sha256(role.encode()).digest() * 2048
c.sendall(data)
got = recv_n(c, 65536)
want = hashlib.sha256(("client" if role == "server" else "server").encode()).digest() * 2048
if got != want:
    sys.exit("64 KiB from the peer differ")
print("exact", flush=True)
c.close()
w.close()
'
  u0=$(stat_field direct_unmapped)
  VSOCKET_LOG_LEVEL=info serve_listening "$name" vm2 "$rep" python3 -c "$prog" server "$A2" "$port" "$APPS" "$when" || return
  local srv=$BG
  vm_run vm1 preload "$rep" python3 -c "$prog" client "$A2" "$port" "$APPS" "$when" >"$WORK/$name.cli" 2>&1 ||
    bad+="client: $(tail -1 "$WORK/$name.cli"); "
  wait "$srv" || bad+="server: $(tail -1 "$WORK/$name.srv"); "
  grep -q "no direct ring pair" "$WORK/$name.srv" ||
    bad+="the server's fetch did not fail (the case did not reach its point: $(grep -m1 -E '^[WE] ' "$WORK/$name.srv")); "
  [ -z "$bad" ] || { fail $name "$bad$(grep -hm2 'no direct ring pair' "$WORK/$name.srv")"; return; }
  out=$(python3 $CHECK "$rep" --port "$port") || { fail $name "$out"; return; }
  u1=$(stat_field direct_unmapped)
  [ "$((u1 - u0))" = 1 ] || bad+="vsocketd's direct_unmapped went $u0 -> $u1, not +1; "
  [ "$(grep -c '"reason":"direct-unavailable"' "$rep")" = 2 ] ||
    bad+="$(grep -c '"reason":"direct-unavailable"' "$rep") ends report direct-unavailable, not 2; "
  # What the client resent on the kernel socket (its report's resent_bytes).
  resent=$(grep '"reason":"direct-unavailable"' "$rep" | grep -o '"resent_bytes":[0-9]*' | cut -d: -f2 | sort -n | tail -1)
  if [ "$when" = late ]; then
    [ "${resent:-0}" = 65536 ] || bad+="the client resent ${resent:-0} B, not its 65536 (it did not write into the pair first); "
  else
    [ "${resent:-0}" = 0 ] || bad+="the client resent ${resent:-0} B, though told before it wrote; "
  fi
  [ -z "$bad" ] || { fail $name "$bad"; return; }
  pass "$name (the server's fetch failed out of fds; the client resent ${resent:-0} B of its ring stream on kernel TCP; 64 KiB each way byte-exact; direct_unmapped +1; $out)"
}

register_case direct_fetch_fails case_direct_fetch_fails direct_fetch_fails early
register_case direct_fetch_fails_after_writes case_direct_fetch_fails direct_fetch_fails_after_writes late

# A hostile peer process on a direct pair (issue 37: the shared ring is
# untrusted input for each side). redis-server in vm2, every connection
# direct (under --upgrade always at once, under the default policy after 16
# turns: decision 98); a well-behaved client in vm1 does SET/GET of
# random 64 KiB values, each compared, the whole time; five clients in vm1
# (tests/e2e/direct_hostile.py) each turn hostile on their own pair, writing
# into the memory redis's library reads: a produced count past the window,
# one going backwards, a consumed count past what redis produced, a ring end
# below what was produced (each must cost that connection alone: reset or
# EOF at the client, redis closing it), then the header and both sides'
# wake words (which nothing relies on: that connection goes on, 50 SET/GET
# byte-checked). redis must live, the good client see every byte, and redis
# end with as many fds and pair mappings as before, one client connected.
case_direct_hostile() {
  local name=$1 port rep=$WORK/$1.jsonl bad="" pid fd0 fd1 maps1 out attack
  local -x VSOCKET_UPGRADE=$2
  port=$(alloc_port)
  touch "$rep"
  vm_bg vm2 preload "$rep" "$WORK/$name.srv" redis-server --bind "$A2" --port $port --save '' --appendonly no \
    --protected-mode no --dir /tmp --pidfile "$WORK/$name.pid"
  local srv=$BG
  wait_for_text "$WORK/$name.srv" "Ready to accept" 100 || { fail $name "redis-server did not start"; kill "$srv"; return; }
  pid=$(cat "$WORK/$name.pid")
  local good=""
  for attack in produced-past-window produced-backwards consumed-past-produced ring-end-below header-and-wake-words; do
    vm_run vm1 preload "$rep" python3 tests/e2e/direct_hostile.py "$A2" $port $attack >"$WORK/$name.$attack" 2>&1 ||
      bad+="$attack: $(tail -1 "$WORK/$name.$attack"); "
    if [ -z "$good" ]; then
      # The library's session and its background writer (started by the
      # first reset) are there now: the fds after the first hostile client
      # are the baseline the other four must not add to. The good client
      # runs beside those four.
      sleep 0.3
      fd0=$(ls /proc/$pid/fd | wc -l)
      ls -l /proc/$pid/fd >"$WORK/$name.fd0"
      vm_bg vm1 preload "$rep" "$WORK/$name.good" python3 tests/e2e/direct_hostile.py "$A2" $port good 10
      good=$BG
      sleep 0.5
    fi
  done
  wait "$good" || bad+="the good client: $(tail -1 "$WORK/$name.good"); "
  kill -0 "$pid" 2>/dev/null || bad+="redis-server died; "
  sleep 0.5
  fd1=$(ls /proc/$pid/fd | wc -l)
  ls -l /proc/$pid/fd >"$WORK/$name.fd1"
  maps1=$(grep -c 'memfd:vsocket-direct' /proc/$pid/maps)
  # Every fd the same, but for the library's background writer's eventfd
  # (one per process, from its first close that lingers or waits for the
  # peer's FIN: which close that is depends on timing). Four pairs' wake
  # eventfds or sockets not given back would show.
  local extra
  extra=$(diff <(awk '{print $(NF-2), $NF}' "$WORK/$name.fd0") <(awk '{print $(NF-2), $NF}' "$WORK/$name.fd1") | grep '^[<>]' | tr '\n' ' ')
  [ "$fd1" = "$fd0" ] || { [ "$fd1" = $((fd0 + 1)) ] && [[ $extra =~ ^\>\ [0-9]+\ anon_inode:\[eventfd\]\ $ ]]; } ||
    bad+="redis holds $fd1 fds, $fd0 after the first hostile client (difference: $extra); "
  [ "$maps1" = 0 ] || bad+="redis still maps $maps1 direct pair(s); "
  out=$(vm_run vm1 plain /dev/null redis-cli -h "$A2" -p $port info clients | tr -d '\r' | grep '^connected_clients:')
  [ "$out" = connected_clients:1 ] || bad+="redis has '$out' after every client closed (1: redis-cli itself); "
  kill "$srv" 2>/dev/null
  wait "$srv" 2>/dev/null
  # redis's library reset the four (its report: peer-corrupted-ring, path direct).
  local resets
  resets=$(python3 -c "
import json, sys
print(sum(1 for d in map(json.loads, open(sys.argv[1])) if d.get('local', '').endswith(':' + sys.argv[2])
          and d.get('reason') == 'peer-corrupted-ring' and d.get('path') == 'direct'))" "$rep" $port)
  [ "$resets" = 4 ] || bad+="redis's library reports $resets connections reset for peer-corrupted-ring, expected 4; "
  [ -z "$bad" ] || { fail $name "$bad"; return; }
  local summary=""
  for attack in produced-past-window produced-backwards consumed-past-produced ring-end-below; do
    summary+="$attack: $(python3 -c "import json,sys; d=json.loads(open(sys.argv[1]).read().splitlines()[-1]); print(d['ended'], 'after', d['after_s'], 's')" "$WORK/$name.$attack"); "
  done
  pass "$name (redis-server, VSOCKET_UPGRADE=$2, every connection direct: ${summary}header and wake words scribbled: 50 SET/GET byte-checked on that connection; the good client: $(tail -1 "$WORK/$name.good"); redis's library reset those 4 (peer-corrupted-ring), redis alive, its fds as before, no pair mapped, 1 client connected)"
}

register_case direct_hostile_peer case_direct_hostile direct_hostile_peer always
register_case direct_hostile_peer_auto case_direct_hostile direct_hostile_peer_auto auto
