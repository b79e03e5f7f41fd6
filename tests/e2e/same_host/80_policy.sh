# The upgrade policy: do no harm where vsocketd shares the CPUs (decision 51).
#
# Under the default policy (auto), with the applications on one CPU that
# vsocketd also runs on (taskset: so on any machine, as on 2-CPU ones),
# request/response traffic stays on kernel TCP, never registers, and says
# why; streams are accelerated once they stream; a reader thread asleep in
# the kernel on a held connection while another thread streams on it is
# never stranded. Each byte is checked.

case_policy_holds_request_response() {
  local name=policy_holds_request_response port rep=$WORK/policy_rr.jsonl
  port=$(alloc_port)
  local before after out
  before=$(stat_field registered)
  VSOCKET_UPGRADE=auto vm_bg vm2 preload "$rep" "$WORK/$name.srv" taskset -c 0 python3 -c "$THREADED_ECHO" "$A2" $port 21
  local srv=$BG
  # One connection of 3,000 round trips (100 B each way), then 20 short
  # connections of one round trip each (as HTTP with Connection: close).
  if ! out=$(VSOCKET_UPGRADE=auto vm_run vm1 preload "$rep" taskset -c 0 python3 - "$A2" $port <<'PY' 2>&1
import hashlib, socket, sys, time
addr, port = sys.argv[1], int(sys.argv[2])
for _ in range(100):
    try:
        c = socket.create_connection((addr, port)); break
    except ConnectionRefusedError:
        time.sleep(0.05)
def round_trip(c, i):
    m = hashlib.sha256(b"%d" % i).digest() * 3 + b"0123"
    c.sendall(m)
    got = b""
    while len(got) < len(m):
        b = c.recv(len(m) - len(got))
        if not b:
            raise SystemExit("EOF after %d round trips" % i)
        got += b
    if got != m:
        raise SystemExit("round trip %d came back different" % i)
for i in range(3000):
    round_trip(c, i)
c.close()
for k in range(20):
    s = socket.create_connection((addr, port))
    round_trip(s, 10000 + k)
    s.close()
print("3000 + 20 round trips byte-exact")
PY
  ); then
    fail $name "client: $out"
    kill "$srv" 2>/dev/null
    return
  fi
  wait "$srv" 2>/dev/null
  after=$(stat_field registered)
  local rep_out
  if ! rep_out=$(python3 $CHECK "$rep" --port $port --expect-conns 42 --mode kernel --reason request-response); then
    fail $name "$rep_out"
    return
  fi
  if [ "$before" -lt 0 ] || [ "$after" != "$before" ]; then
    fail $name "the daemon's registrations went $before -> $after (want no change)"
    return
  fi
  pass "$name ($out; $rep_out; no registration reached vsocketd)"
}

case_policy_accelerates_streams() {
  local name=policy_accelerates_streams port rep=$WORK/policy_stream.jsonl bytes=33554432
  port=$(alloc_port)
  VSOCKET_UPGRADE=auto vm_bg vm2 preload "$rep" "$WORK/$name.srv" taskset -c 0 "$XFER" server "$A2" $port --conns 1
  local srv=$BG
  if ! VSOCKET_UPGRADE=auto vm_run vm1 preload "$rep" taskset -c 0 "$XFER" client "$A2" $port --conns 1 \
      --bytes $bytes >"$WORK/$name.cli" 2>&1; then
    fail $name "client: $(tail -2 "$WORK/$name.cli" | tr '\n' ' ')"
    kill "$srv" 2>/dev/null
    return
  fi
  if ! wait "$srv"; then
    fail $name "server: $(tail -2 "$WORK/$name.srv" | tr '\n' ' ')"
    return
  fi
  local out
  if ! out=$(python3 $CHECK "$rep" --port $port --expect-conns 2 --mode accelerated --reason accelerated \
      --accel-min 1 --exact-total $((bytes + 16))); then
    fail $name "$out"
    return
  fi
  pass "$name (32 MiB each way byte-checked, held until it streamed: $out)"
}

# pass_if_streamed NAME REPORT DETAIL: passes NAME if the report has the
# stream's connection accelerated on both ends (the held connections of a
# case may add lines of their own), else fails it.
pass_if_streamed() {
  local modes
  modes=$(python3 -c 'import json,sys; print(" ".join(sorted(json.loads(l)["mode"] for l in open(sys.argv[1]) if l.strip())))' "$2")
  case " $modes " in
    *" accelerated accelerated "*) pass "$1 ($3; modes at the end: $modes)" ;;
    *) fail $1 "the stream was not accelerated on both ends (modes: $modes)" ;;
  esac
}

# Full duplex: one thread streams 16 MiB out while another sleeps in recv()
# (blocking) or poll() (a socket timeout: Python polls first) on the same
# held connection, reading the echo. The connection may register only while
# no thread sleeps in the kernel on it: an upgrade under the sleeping reader
# would leave the echo's ring bytes unread (shown: without that rule this
# case fails).
case_policy_full_duplex_threads() {  # NAME block|poll
  local name=$1 port how=$2 rep=$WORK/$1.jsonl out
  port=$(alloc_port)
  VSOCKET_UPGRADE=auto vm_bg vm2 preload "$rep" "$WORK/$name.srv" taskset -c 0 python3 -c "$THREADED_ECHO" "$A2" $port 1
  local srv=$BG
  if ! out=$(VSOCKET_UPGRADE=auto E2E_TIMEOUT=60 vm_run vm1 preload "$rep" taskset -c 0 python3 - "$A2" $port $how <<'PY' 2>&1
import hashlib, socket, sys, threading, time
addr, port = sys.argv[1], int(sys.argv[2])
for _ in range(100):
    try:
        c = socket.create_connection((addr, port)); break
    except ConnectionRefusedError:
        time.sleep(0.05)
if sys.argv[3] == "poll":
    c.settimeout(45)
chunks = [hashlib.sha256(b"%d" % i).digest() * 2048 for i in range(256)]  # 256 x 64 KiB
want = hashlib.sha256(b"".join(chunks)).hexdigest()
got = hashlib.sha256()
n = 0
def reader():
    global n
    while n < 256 * 65536:
        b = c.recv(1 << 20)
        if not b:
            break
        got.update(b)
        n += len(b)
t = threading.Thread(target=reader)
t.start()
time.sleep(0.2)  # the reader is asleep in recv() before the stream starts
for ch in chunks:
    c.sendall(ch)
t.join(50)
if t.is_alive():
    raise SystemExit("the reader is stuck after %d of %d echoed bytes" % (n, 256 * 65536))
if got.hexdigest() != want:
    raise SystemExit("echo differs (%d bytes)" % n)
c.close()
print("16 MiB echoed byte-exact with a reader thread in " + ("poll()" if sys.argv[3] == "poll" else "recv()"))
PY
  ); then
    fail $name "client: $out"
    kill "$srv" 2>/dev/null
    return
  fi
  wait "$srv" 2>/dev/null
  pass_if_streamed "$name" "$rep" "$out"
}

# A connection held from birth (the process has a session: a first
# connection's round trip opened it) whose reader thread sleeps in
# epoll_wait before any I/O, while another thread uploads 16 MiB: the upload
# registers the connection and the server's answer comes by the ring, where
# no kernel event would announce it: the registration must wake the epoll
# wait (EpollKick). The answer is a digest of every byte uploaded.
case_policy_epoll_reader_of_a_held_connection() {
  local name=policy_epoll_reader_of_a_held_connection port rep=$WORK/policy_epoll.jsonl out
  port=$(alloc_port)
  local server='
import hashlib, socket, sys
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((sys.argv[1], int(sys.argv[2])))
ls.listen(4)
c, _ = ls.accept()  # the first connection: one byte echoed
c.sendall(c.recv(1))
c.close()
c, _ = ls.accept()
h, n = hashlib.sha256(), 0
while n < 16 << 20:
    b = c.recv(1 << 20)
    if not b:
        break
    h.update(b)
    n += len(b)
c.sendall(h.digest() * 32768)  # 1 MiB
c.close()
'
  VSOCKET_UPGRADE=auto vm_bg vm2 preload "$rep" "$WORK/$name.srv" taskset -c 0 python3 -c "$server" "$A2" $port
  local srv=$BG
  if ! out=$(VSOCKET_UPGRADE=auto E2E_TIMEOUT=60 vm_run vm1 preload "$rep" taskset -c 0 python3 - "$A2" $port <<'PY' 2>&1
import hashlib, select, socket, sys, threading, time
addr, port = sys.argv[1], int(sys.argv[2])
for _ in range(100):
    try:
        c = socket.create_connection((addr, port)); break
    except ConnectionRefusedError:
        time.sleep(0.05)
c.sendall(b"x")
if c.recv(1) != b"x":
    raise SystemExit("first connection: no echo")
c.close()
c = socket.create_connection((addr, port))
ep = select.epoll()
ep.register(c.fileno(), select.EPOLLIN)
chunks = [hashlib.sha256(b"%d" % i).digest() * 2048 for i in range(256)]  # 256 x 64 KiB
want = hashlib.sha256(b"".join(chunks)).digest() * 32768
got = bytearray()
woke = []
def reader():
    while len(got) < len(want):
        t0 = time.monotonic()
        if not ep.poll(40):
            return
        woke.append(time.monotonic() - t0)
        try:
            b = c.recv(1 << 20, socket.MSG_DONTWAIT)
        except BlockingIOError:
            continue
        if not b:
            return
        got.extend(b)
t = threading.Thread(target=reader)
t.start()
time.sleep(0.2)  # the reader is asleep in epoll_wait before the upload starts
for ch in chunks:
    c.sendall(ch)
t.join(45)
if t.is_alive() or len(got) < len(want):
    raise SystemExit("the reader missed the answer: %d of %d bytes" % (len(got), len(want)))
if bytes(got) != want:
    raise SystemExit("the answer differs")
c.close()
print("16 MiB up, its 1 MiB digest answer read byte-exact by a thread asleep in epoll_wait()")
PY
  ); then
    kill "$srv" 2>/dev/null
    wait "$srv" 2>/dev/null
    # (Both ends' reports and the server's output: once, in a full run, the
    # reader slept through the answer; never seen alone.)
    fail $name "client: $out; reports: $(tr '\n' ' ' <"$rep" | tail -c 2000); server: $(tail -c 500 "$WORK/$name.srv" 2>/dev/null | tr '\n' ' ')"
    return
  fi
  wait "$srv" 2>/dev/null
  pass_if_streamed "$name" "$rep" "$out"
}

register_case policy_holds_request_response through_vsocketd case_policy_holds_request_response
register_case policy_accelerates_streams through_vsocketd case_policy_accelerates_streams
register_case policy_full_duplex_threads through_vsocketd case_policy_full_duplex_threads policy_full_duplex_threads block
register_case policy_full_duplex_threads_poll through_vsocketd case_policy_full_duplex_threads policy_full_duplex_threads_poll poll
register_case policy_epoll_reader_of_a_held_connection through_vsocketd case_policy_epoll_reader_of_a_held_connection
