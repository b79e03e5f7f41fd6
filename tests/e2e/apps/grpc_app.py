#!/usr/bin/python3
"""A gRPC server and client with grpcio's generic handlers (no protoc, raw
bytes as messages), for the application matrix (68_grpc.sh).

  grpc_app.py server PORT
      listens on [::]:PORT (grpcio's default: a dual-stack IPv6 socket, so
      IPv4 clients arrive as ::ffff:a.b.c.d); prints "listening"; SIGTERM or
      SIGINT stop it (exit 0, "stopped: N unary, M streams").
      /vs.Echo/Unary: the answer is sha256(request) + request.
      /vs.Echo/Stream: the request is 12 bytes (count, size, seed: big
      endian u32s); the answer is `count` messages of `size` bytes,
      message i being block(seed, i, size) (below).
  grpc_app.py client ADDR PORT [--threads T] [--channels N] [--unary U]
                               [--max-size S] [--stream-msgs K]
                               [--stream-size Z] [--seconds D] [--shared 1]
                               [--local-pool 0] [--min-channels M]
      T threads, each opening N channels in turn (a channel of its own, so a
      TCP connection of its own: grpc.use_local_subchannel_pool) and on each
      making U unary calls (payloads of random sizes up to S bytes) and one
      server-streaming call of K messages of Z bytes; every answer checked
      byte for byte; stops early after D seconds. Prints one summary line
      ("ok ... failed ...", the failures by status code with the first
      details of each) and exits 1 if any RPC failed or answered wrong, or
      if fewer than M channels were done (by default all T x N: stopping
      early at D seconds fails).
      --shared 1: one channel for every thread and round (one connection);
      --local-pool 0: new channels share connections (grpcio's default).
"""
import concurrent.futures
import hashlib
import random
import signal
import struct
import sys
import threading
import time

if __name__ == "__main__" and sys.argv[1] == "server":
    # SIGTERM and SIGINT blocked in every thread (grpc's threads, some made
    # at import, inherit the mask) and taken by the server's sigwait.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})

import grpc  # noqa: E402

SERVICE = "vs.Echo"


def block(seed, i, size):
    out = bytearray()
    n = 0
    while len(out) < size:
        out += hashlib.sha256(struct.pack(">III", seed, i, n)).digest()
        n += 1
    return bytes(out[:size])


def serve(port):
    counts = {"unary": 0, "stream": 0}
    lock = threading.Lock()

    def unary(req, ctx):
        with lock:
            counts["unary"] += 1
        return hashlib.sha256(req).digest() + req

    def stream(req, ctx):
        with lock:
            counts["stream"] += 1
        count, size, seed = struct.unpack(">III", req)
        for i in range(count):
            yield block(seed, i, size)

    handler = grpc.method_handlers_generic_handler(SERVICE, {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Stream": grpc.unary_stream_rpc_method_handler(stream),
    })
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=32), handlers=[handler])
    server.add_insecure_port(f"[::]:{port}")
    server.start()
    print("listening", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    server.stop(1).wait(5)
    print(f"stopped: {counts['unary']} unary, {counts['stream']} streams", flush=True)


def client(args):
    addr, port = args[0], int(args[1])
    opt = dict(threads=4, channels=25, unary=20, max_size=65536, stream_msgs=64, stream_size=16384, seconds=40,
               shared=0, local_pool=1, min_channels=-1)
    rest = args[2:]
    while rest:
        k = rest.pop(0).lstrip("-").replace("-", "_")
        opt[k] = int(rest.pop(0))
    deadline = time.monotonic() + opt["seconds"]
    lock = threading.Lock()
    tally = {"unary": 0, "stream_msgs": 0, "bytes": 0, "channels": 0, "bad": 0}
    failures = {}

    def failed(what, e):
        key = f"{what} {e.code().name}" if isinstance(e, grpc.RpcError) else f"{what} {type(e).__name__}"
        det = e.details() if isinstance(e, grpc.RpcError) else str(e)
        with lock:
            f = failures.setdefault(key, [0, det])
            f[0] += 1

    # --shared 1: every thread's calls on one channel (one connection), as a
    # program that makes its channel once does.
    shared = grpc.insecure_channel(f"{addr}:{port}") if opt["shared"] else None

    def worker(t):
        rnd = random.Random(t)
        for c in range(opt["channels"]):
            if time.monotonic() > deadline:
                return
            # (--local-pool 0: grpcio's default, channels to one target share
            # their connection through the global subchannel pool)
            ch = shared or grpc.insecure_channel(
                f"{addr}:{port}", options=[("grpc.use_local_subchannel_pool", 1)] if opt["local_pool"] else [])
            unary = ch.unary_unary(f"/{SERVICE}/Unary")
            stream = ch.unary_stream(f"/{SERVICE}/Stream")
            for _ in range(opt["unary"]):
                req = rnd.randbytes(rnd.randint(0, opt["max_size"]))
                try:
                    ans = unary(req, timeout=10)
                except Exception as e:  # noqa: BLE001 (every failure is counted)
                    failed("unary", e)
                    continue
                with lock:
                    if ans != hashlib.sha256(req).digest() + req:
                        tally["bad"] += 1
                    tally["unary"] += 1
                    tally["bytes"] += len(req) + len(ans)
            seed = rnd.getrandbits(32)
            try:
                n = 0
                for i, msg in enumerate(stream(struct.pack(">III", opt["stream_msgs"], opt["stream_size"], seed), timeout=20)):
                    ok = msg == block(seed, i, opt["stream_size"])
                    with lock:
                        tally["bad"] += not ok
                        tally["stream_msgs"] += 1
                        tally["bytes"] += len(msg)
                    n += 1
                if n != opt["stream_msgs"]:
                    with lock:
                        tally["bad"] += 1
            except Exception as e:  # noqa: BLE001
                failed("stream", e)
            if not shared:
                ch.close()
            with lock:
                tally["channels"] += 1

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(opt["threads"])]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    nfail = sum(f[0] for f in failures.values())
    print(f"ok: {tally['channels']} channels, {tally['unary']} unary, {tally['stream_msgs']} stream messages, "
          f"{tally['bytes']} bytes, {tally['bad']} wrong answers; failed: {nfail}"
          + "".join(f"; {k} x{v[0]} (first: {v[1]})" for k, v in sorted(failures.items())), flush=True)
    want = opt["threads"] * opt["channels"] if opt["min_channels"] < 0 else opt["min_channels"]
    sys.exit(0 if nfail == 0 and tally["bad"] == 0 and tally["channels"] >= want else 1)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve(int(sys.argv[2]))
    else:
        client(sys.argv[2:])
