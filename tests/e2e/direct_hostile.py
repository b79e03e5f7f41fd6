#!/usr/bin/env python3
"""A redis client that turns hostile on its direct pair (issue 37, decision
97: the shared ring is untrusted input for each side), for e2e
direct_hostile_peer.

Run under LD_PRELOAD=libvsocket.so with VSOCKET_UPGRADE=always against a
redis-server whose library pairs it directly. It talks RESP over one
connection until that connection's pair memory is mapped in this process
(/proc/self/maps: memfd:vsocket-direct), finds its own side of the pair (the
ring holding a marker it sent), then writes what a hostile peer process can
write into memory the server's library reads (proto/direct.h):

  produced-past-window    its produced count past the server's window
  produced-backwards      its produced count below what it already published
  consumed-past-produced  its consumed count past what the server produced
  ring-end-below          a ring end below what it already produced
  header-and-wake-words   the header (magic, ring size) and both sides' wake
                          words: nothing the server's checks rely on

For the first four, a thread keeps the bad value in place (for at most 2 s)
while the main thread goes on sending PINGs: the server's library must reset
this connection alone. For the last, the connection must go on working
(GET returns what SET stored). Prints one JSON line: what happened.

  direct_hostile.py HOST PORT ATTACK
  direct_hostile.py HOST PORT good SECONDS   (a well-behaved client:
      SET/GET of random 64 KiB values, each compared, for SECONDS)
"""
import ctypes
import json
import os
import socket
import struct
import sys
import threading
import time

SIDE_OFFSET = (64, 128)  # DirectSide[0], DirectSide[1]
PRODUCED, CONSUMED, RING_END, SHUT_WR, WANT_PRODUCED, WANT_CONSUMED = 0, 8, 16, 24, 28, 32
RINGS = 4096


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Conn:
    def __init__(self, host, port):
        self.s = socket.create_connection((host, port), timeout=10)
        self.buf = b""

    def _fill(self):
        d = self.s.recv(1 << 16)
        if not d:
            raise EOFError("EOF")
        self.buf += d

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def call(self, *args):
        self.s.sendall(resp(*args))
        line = self._line()
        if line[:1] == b"$":
            n = int(line[1:])
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self._fill()
            v, self.buf = self.buf[:n], self.buf[n + 2:]
            return v
        if line[:1] == b"-":
            raise RuntimeError(line.decode(errors="replace"))
        return line[1:]


def direct_maps():
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            if "memfd:vsocket-direct" in line:
                a, b = line.split()[0].split("-")
                out.append((int(a, 16), int(b, 16)))
    return out


def u64(addr):
    return ctypes.c_uint64.from_address(addr)


def u32(addr):
    return ctypes.c_uint32.from_address(addr)


def good(host, port, seconds):
    c = Conn(host, port)
    ops = bad = 0
    end = time.time() + seconds
    while time.time() < end and ops < 50000:
        v = os.urandom(65536)
        key = "good-%d" % (ops % 16)
        c.call("SET", key, v)
        got = c.call("GET", key)
        bad += got != v
        ops += 1
    direct = len(direct_maps())
    print(json.dumps({"mode": "good", "ops": ops, "mismatches": bad, "direct_maps": direct}))
    return 0 if bad == 0 and ops > 0 else 1


def hostile(host, port, attack):
    res = {"mode": "hostile", "attack": attack}
    before = set(direct_maps())
    c = Conn(host, port)
    marker = os.urandom(16).hex().encode()
    mine = None
    for i in range(200):  # until the pair is mapped (bounded: ~2 s)
        c.call("SET", b"hostile-" + marker, marker)
        new = sorted(set(direct_maps()) - before)
        if new:
            mine = new[0]
            break
        time.sleep(0.01)
    if mine is None:
        res["error"] = "the connection never went direct"
        print(json.dumps(res))
        return 3
    base = mine[0]
    ring_bytes = u32(base + 8).value
    # Which ring is ours: the one holding what we sent.
    for _ in range(3):
        c.call("SET", b"hostile-" + marker, marker)
    rings = [ctypes.string_at(base + RINGS + k * ring_bytes, ring_bytes) for k in (0, 1)]
    sides = [k for k in (0, 1) if marker in rings[k]]
    if len(sides) != 1:
        res["error"] = "cannot tell our side (marker in rings %s)" % sides
        print(json.dumps(res))
        return 3
    me, peer = base + SIDE_OFFSET[sides[0]], base + SIDE_OFFSET[1 - sides[0]]
    res["side"] = sides[0]
    res["ring_bytes"] = ring_bytes
    if attack == "header-and-wake-words":
        u32(base).value = 0xDEADBEEF         # magic
        u32(base + 8).value = 0xFFFFFFFF     # ring size
        for side in (me, peer):
            u32(side + WANT_PRODUCED).value = 0xFFFFFFFF
            u32(side + WANT_CONSUMED).value = 0xFFFFFFFF
        ok = 0
        try:
            for i in range(50):
                v = os.urandom(4096)
                c.call("SET", b"hostile-" + marker, v)
                ok += c.call("GET", b"hostile-" + marker) == v
        except (OSError, EOFError) as e:
            res["error"] = "%s after %d checked round trips" % (type(e).__name__, ok)
        res["checked_round_trips"] = ok
        c.s.close()
        print(json.dumps(res))
        return 0 if ok == 50 else 1
    fields = {
        "produced-past-window": (PRODUCED, lambda: u64(peer + CONSUMED).value + 2 * ring_bytes),
        "produced-backwards": (PRODUCED, lambda: 0),
        "consumed-past-produced": (CONSUMED, lambda: u64(peer + PRODUCED).value + 4096),
        "ring-end-below": (RING_END, lambda: 1),
    }
    if attack not in fields:
        res["error"] = "no attack " + attack
        print(json.dumps(res))
        return 2
    off, value = fields[attack]
    stop = threading.Event()

    def scribble():  # bounded: 2 s at most
        end = time.time() + 2
        while not stop.is_set() and time.time() < end:
            u64(me + off).value = value()

    t = threading.Thread(target=scribble)
    t.start()
    ended = None
    t0 = time.time()
    try:
        c.s.settimeout(3)
        for i in range(400):  # ~2 s of PINGs at most
            c.call("PING")
            time.sleep(0.005)
        ended = "still answering"
    except ConnectionResetError:
        ended = "reset"
    except EOFError:
        ended = "eof"
    except socket.timeout:
        ended = "timeout"
    except OSError as e:
        ended = "error " + os.strerror(e.errno or 0)
    stop.set()
    t.join()
    res["ended"] = ended
    res["after_s"] = round(time.time() - t0, 3)
    c.s.close()
    print(json.dumps(res))
    return 0 if ended in ("reset", "eof") else 1


def main():
    host, port, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if what == "good":
        return good(host, port, float(sys.argv[4]))
    return hostile(host, port, what)


if __name__ == "__main__":
    sys.exit(main())
