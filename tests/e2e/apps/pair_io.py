"""Helpers for the e2e cases' small socket programs (python3 -c, a
connection pair byte-checked by hand): imported after
sys.path.insert(0, APPS)."""
import sys


def recv_n(c, n):
    """Exactly n bytes from c, or exit with how many came before EOF."""
    got = bytearray()
    while len(got) < n:
        b = c.recv(n - len(got))
        if not b:
            sys.exit("early EOF after %d of %d bytes" % (len(got), n))
        got += b
    return bytes(got)


def register_by_reading(c):
    """A read that finds nothing: the connection's first I/O, which
    registers it with vsocketd under --upgrade always. Exits if a byte
    came before any was sent."""
    c.setblocking(False)
    try:
        c.recv(1)
        sys.exit("a byte came before any was sent")
    except BlockingIOError:
        pass
    c.setblocking(True)
