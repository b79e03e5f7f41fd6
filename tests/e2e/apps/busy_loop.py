#!/usr/bin/env python3
"""Request/response over many connections at once, byte-checked (decision 83).

  busy_loop.py server ADDR PORT CONNS
      an epoll event loop answering CONNS connections: each request is a
      4-byte length and that many bytes; the answer is the request's
      sha256 followed by the request reversed. Exits when CONNS connections
      have ended.
  busy_loop.py server-threads ADDR PORT CONNS
      the same answers from a thread per connection, blocking (a server
      that is not an event loop).
  busy_loop.py loop ADDR PORT CONNS ROUNDS
      one epoll event loop driving CONNS connections, ROUNDS round trips
      each, every request in flight at once (a busy client: redis-benchmark,
      wrk).
  busy_loop.py threads ADDR PORT CONNS ROUNDS
      CONNS threads, one blocking connection each (a client that is not an
      event loop: its waits never batch).
  busy_loop.py threads-then-loop ADDR PORT CONNS SECONDS
      the same connections driven by CONNS threads for SECONDS, then by one
      epoll loop for 2 x SECONDS (a client that becomes busy late).
  busy_loop.py loop-then-one ADDR PORT CONNS SECONDS
      one epoll loop driving CONNS connections for SECONDS, then closing
      all but the first and driving that one alone, still from the loop,
      for 2 x SECONDS (a busy loop that goes quiet: decision 92).
  busy_loop.py loop-one-loop ADDR PORT CONNS SECONDS
      the same, the others left open and idle meanwhile, then all CONNS
      from the loop again for 2 x SECONDS (busy, quiet, busy again).
  busy_loop.py late-then-one ADDR PORT CONNS SECONDS
      CONNS - 8 connections driven by one epoll loop for SECONDS; 0.5 s
      in, 8 more opened and driven by a second loop (their first turns come
      while the process is already busy: both ends register them for the
      busy loop, not after 16 turns); then all closed but the first late
      one, driven alone for 2 x SECONDS.
Each client checks every answer byte for byte and prints a summary.
"""
import hashlib
import selectors
import socket
import struct
import sys
import threading
import time


def answer(req):
    return hashlib.sha256(req).digest() + req[::-1]


def request(conn_no, i):
    size = 16 + (conn_no * 131 + i * 17) % 400
    seed = hashlib.sha256(b"%d/%d" % (conn_no, i)).digest()
    return (seed * (size // 32 + 1))[:size]


def take_requests(buf):
    """The complete requests at the front of buf (removed from it)."""
    out = []
    while len(buf) >= 4:
        n = struct.unpack("!I", buf[:4])[0]
        if len(buf) < 4 + n:
            break
        out.append(bytes(buf[4:4 + n]))
        del buf[:4 + n]
    return out


def connect(addr, port):
    for _ in range(200):
        try:
            return socket.create_connection((addr, port))
        except ConnectionRefusedError:
            time.sleep(0.05)
    raise SystemExit("could not connect")


def serve(addr, port, conns):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port))
    ls.listen(128)
    ls.setblocking(False)
    sel = selectors.EpollSelector()
    sel.register(ls, selectors.EVENT_READ, None)
    ended = 0
    bufs = {}
    while ended < conns:
        for key, _ in sel.select(60):
            if key.data is None:
                try:
                    c, _ = ls.accept()
                except BlockingIOError:
                    continue
                c.setblocking(False)
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                bufs[c] = bytearray()
                sel.register(c, selectors.EVENT_READ, c)
                continue
            c = key.data
            try:
                b = c.recv(65536)
            except BlockingIOError:
                continue
            if not b:
                sel.unregister(c)
                c.close()
                del bufs[c]
                ended += 1
                continue
            bufs[c].extend(b)
            for req in take_requests(bufs[c]):
                c.setblocking(True)
                c.sendall(answer(req))
                c.setblocking(False)


def serve_threads(addr, port, conns):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port))
    ls.listen(128)

    def one(c):
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray()
        while True:
            b = c.recv(65536)
            if not b:
                break
            buf.extend(b)
            for req in take_requests(buf):
                c.sendall(answer(req))
        c.close()

    ts = []
    for _ in range(conns):
        c, _ = ls.accept()
        t = threading.Thread(target=one, args=(c,))
        t.start()
        ts.append(t)
    for t in ts:
        t.join()


def drive_loop(socks, first, done, close=True):
    """One epoll loop driving every connection of socks (connection k's
    next round trip is first[k]), every request in flight at once, each
    answer checked; done(round trips made on it) says when a connection
    ends. Returns the round trips made."""
    sel = selectors.EpollSelector()
    state = {}
    for k, c in enumerate(socks):
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        state[c] = [k, first[k], bytearray(), None]
        sel.register(c, selectors.EVENT_READ, c)

    def send_next(c):
        st = state[c]
        req = request(st[0], st[1])
        st[3] = answer(req)
        c.sendall(struct.pack("!I", len(req)) + req)

    for c in socks:
        send_next(c)
    made, open_conns = 0, len(socks)
    while open_conns:
        events = sel.select(30)
        if not events:
            raise SystemExit("no answer for 30 s: %d of %d connections open" % (open_conns, len(socks)))
        for key, _ in events:
            c = key.data
            st = state[c]
            b = c.recv(65536)
            if not b:
                raise SystemExit("EOF on connection %d after %d round trips" % (st[0], st[1]))
            st[2].extend(b)
            if len(st[2]) < len(st[3]):
                continue
            if bytes(st[2]) != st[3]:
                raise SystemExit("connection %d round trip %d: the answer differs" % (st[0], st[1]))
            st[2].clear()
            st[1] += 1
            made += 1
            if done(st[1] - first[st[0]]):
                sel.unregister(c)
                if close:
                    c.close()
                open_conns -= 1
            else:
                send_next(c)
    return made


def client_loop(addr, port, conns, rounds):
    socks = [connect(addr, port) for _ in range(conns)]
    t0 = time.monotonic()
    drive_loop(socks, [0] * conns, lambda n: n == rounds)
    dt = time.monotonic() - t0
    print("%d connections x %d round trips byte-exact (%.0f round trips/s)" % (conns, rounds, conns * rounds / dt))


def round_trip(c, k, i):
    req = request(k, i)
    want = answer(req)
    c.sendall(struct.pack("!I", len(req)) + req)
    got = bytearray()
    while len(got) < len(want):
        b = c.recv(len(want) - len(got))
        if not b:
            raise RuntimeError("EOF on connection %d after %d round trips" % (k, i))
        got.extend(b)
    if bytes(got) != want:
        raise RuntimeError("connection %d round trip %d: the answer differs" % (k, i))


def client_threads(addr, port, conns, rounds, socks=None, until=None):
    """Blocking round trips on each connection from a thread of its own:
    `rounds` of them, or (until) as many as fit before that time. Returns
    the sockets still open (socks given) and the round trips made."""
    errors = []
    made = [0] * conns

    def one(k):
        try:
            c = socks[k] if socks else connect(addr, port)
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            i = 0
            while (i < rounds) if until is None else (time.monotonic() < until):
                round_trip(c, k, i)
                i += 1
            made[k] = i
            if socks is None:
                c.close()
        except Exception as e:  # reported below
            errors.append(str(e))

    ts = [threading.Thread(target=one, args=(k,)) for k in range(conns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    if errors or any(t.is_alive() for t in ts):
        raise SystemExit("; ".join(errors[:3]) or "a thread hung")
    if until is None:
        print("%d threads x %d round trips byte-exact" % (conns, rounds))
    return made


def client_threads_then_loop(addr, port, conns, seconds):
    socks = [connect(addr, port) for _ in range(conns)]
    made = client_threads(addr, port, conns, 0, socks=socks, until=time.monotonic() + seconds)
    # The same connections, now one epoll loop's.
    end = time.monotonic() + 2 * seconds
    looped = drive_loop(socks, made, lambda n: time.monotonic() >= end)
    print("%d connections: %d round trips from threads, then %d from one loop, byte-exact" % (conns, sum(made), looped))


def client_loop_then_one(addr, port, conns, seconds):
    socks = [connect(addr, port) for _ in range(conns)]
    end = time.monotonic() + seconds
    busy = drive_loop(socks, [0] * conns, lambda n: time.monotonic() >= end, close=False)
    for c in socks[1:]:
        c.close()
    # (Round trip numbers go on from far ahead: the answer depends on the
    # request alone.)
    end = time.monotonic() + 2 * seconds
    alone = drive_loop(socks[:1], [10 ** 6], lambda n: time.monotonic() >= end)
    print("%d connections: %d round trips from one busy loop, then %d on one connection alone, byte-exact" %
          (conns, busy, alone))


def client_late_then_one(addr, port, conns, seconds):
    early = [connect(addr, port) for _ in range(conns - 8)]
    end = time.monotonic() + seconds
    made = [0]
    errors = []

    def run_early():
        try:
            made[0] = drive_loop(early, [0] * len(early), lambda n: time.monotonic() >= end, close=False)
        except BaseException as e:  # (SystemExit too) reported below
            errors.append(str(e))

    t = threading.Thread(target=run_early)
    t.start()
    time.sleep(0.5)
    late = [connect(addr, port) for _ in range(8)]
    # (Round trip numbers apart from the early ones': the answer depends on
    # the request alone.)
    busy = drive_loop(late, [10 ** 6] * 8, lambda n: time.monotonic() >= end, close=False)
    t.join(120)
    if errors or t.is_alive():
        raise SystemExit("early connections: " + ("; ".join(errors) or "hung"))
    for c in early + late[1:]:
        c.close()
    end = time.monotonic() + 2 * seconds
    alone = drive_loop(late[:1], [2 * 10 ** 6], lambda n: time.monotonic() >= end)
    print("%d connections (8 late): %d round trips from two busy loops, then %d on one late connection alone, "
          "byte-exact" % (conns, made[0] + busy, alone))


def client_loop_one_loop(addr, port, conns, seconds):
    socks = [connect(addr, port) for _ in range(conns)]
    made = [0] * conns
    n = 0
    for phase, (some, length) in enumerate(((conns, seconds), (1, 2 * seconds), (conns, 2 * seconds))):
        end = time.monotonic() + length
        # (Round trip numbers go on from far ahead each phase: the answer
        # depends on the request alone.)
        n += drive_loop(socks[:some], [(phase + 1) * 10 ** 6] * some, lambda k: time.monotonic() >= end, close=False)
    for c in socks:
        c.close()
    print("%d connections: %d round trips, busy, then one alone, then all again, byte-exact" % (conns, n))


def main():
    mode, addr, port, conns = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if mode == "server":
        serve(addr, port, conns)
    elif mode == "server-threads":
        serve_threads(addr, port, conns)
    elif mode == "loop":
        client_loop(addr, port, conns, int(sys.argv[5]))
    elif mode == "threads":
        client_threads(addr, port, conns, int(sys.argv[5]))
    elif mode == "threads-then-loop":
        client_threads_then_loop(addr, port, conns, float(sys.argv[5]))
    elif mode == "loop-then-one":
        client_loop_then_one(addr, port, conns, float(sys.argv[5]))
    elif mode == "late-then-one":
        client_late_then_one(addr, port, conns, float(sys.argv[5]))
    elif mode == "loop-one-loop":
        client_loop_one_loop(addr, port, conns, float(sys.argv[5]))
    else:
        raise SystemExit("mode: server | loop | threads")


if __name__ == "__main__":
    main()
