#!/usr/bin/env python3
"""Same-host benchmark: vSocket vs kernel TCP between the same two VMs
(network namespaces of deploy/testbed.sh), in the same run.

  bench/same_host_bench.py [--bin BAZEL_BIN] [--seconds N] [--out DIR]

Measures, for each mode (kernel TCP, then vSocket with libvsocket.so
preloaded on both ends):
  - sockperf ping-pong RTT, 16 B (p50, p99, p99.9)
  - sockperf message rate, 16 B and 1 KiB, one connection
  - iperf3 bandwidth, 64 KiB writes, one stream
  - redis-benchmark SET/GET requests/s with 1 and 50 clients
  - CPU seconds per million messages (16 B message-rate test: client +
    server + vsocketd)
  - connect-to-first-byte time (connect, send 1 B, get the echo back)
and prints a table of vSocket/kernel ratios. Results go to
OUT/same-host-latest.json and .md (replacing the previous run's; older runs
are in git history), plots (.dat and, with gnuplot, .png) next to them.
"""
import argparse
import datetime
import os
import re
import time

from benchlib import (DEFAULT_BIN, ROOT, Bed, cpu_ticks, find_bin, machine, parse_iperf, parse_sockperf,
                      plot_histogram, ratio, save_results)

CLIENT_VM, SERVER_VM = "vm1", "vm2"


def sockperf(bed, accel, mode, size, seconds, port):
    srv = bed.start(SERVER_VM, accel, ["sockperf", "sr", "--tcp", "-i", bed.server_addr, "-p", str(port)],
                    seconds + 90)
    try:
        bed.wait_listening(SERVER_VM, port)
        server = [srv.child()]
        client = bed.start(CLIENT_VM, accel, ["sockperf", mode, "--tcp", "-i", bed.server_addr, "-p", str(port),
                                              "-t", str(seconds), "-m", str(size)], seconds + 60)
        time.sleep(0.3)
        client_pids = [client.child()]
        daemon = list(bed.daemons.values())
        t0 = cpu_ticks(server + client_pids + daemon)
        client.finish()
        t1 = cpu_ticks(server + daemon)  # the client is gone; its time is in t1 below
    finally:
        srv.stop()
    res = parse_sockperf(client.text)
    res["cpu_ticks_server_daemon"] = t1 - t0
    return res


def iperf(bed, accel, seconds, port):
    srv = bed.start(SERVER_VM, accel, ["iperf3", "-s", "-B", bed.server_addr, "-p", str(port), "-1"], seconds + 90)
    try:
        bed.wait_listening(SERVER_VM, port)
        r = bed.run(CLIENT_VM, accel, ["iperf3", "-c", bed.server_addr, "-p", str(port), "-t", str(seconds),
                                       "-l", "64K", "-J"], timeout=seconds + 60)
    finally:
        srv.stop()
    return parse_iperf(r.stdout, r.stderr)


def redis(bed, accel, port, runs=((1, 20000), (50, 100000))):
    """redis-benchmark SET and GET, for each (clients, requests) of runs:
    {set,get}_c<clients>_rps."""
    srv = bed.start(SERVER_VM, accel, ["redis-server", "--bind", bed.server_addr, "--port", str(port),
                                       "--save", "", "--appendonly", "no", "--protected-mode", "no"], 600)
    res = {}
    try:
        bed.wait_listening(SERVER_VM, port)
        for clients, n in runs:
            r = bed.run(CLIENT_VM, accel, ["redis-benchmark", "-h", bed.server_addr, "-p", str(port),
                                           "-t", "set,get", "-n", str(n), "-c", str(clients), "--csv"])
            for line in r.stdout.splitlines():
                m = re.match(r'"(SET|GET)","([0-9.]+)"', line)
                if m:
                    res[f"{m.group(1).lower()}_c{clients}_rps"] = float(m.group(2))
    finally:
        srv.stop()
    return res


CONNECT_PROBE = r'''
import socket, sys, time
addr, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ts = []
for i in range(n):
    t0 = time.perf_counter()
    c = socket.create_connection((addr, port))
    c.sendall(b"E!")
    c.recv(1)
    ts.append((time.perf_counter() - t0) * 1e6)
    c.close()
ts.sort()
print(ts[len(ts) // 2], ts[int(len(ts) * 0.99)])
'''


def connect_first_byte(bed, accel, peer_bin, port):
    srv = bed.start(SERVER_VM, accel, [peer_bin, bed.server_addr, str(port)], 300)
    try:
        bed.wait_listening(SERVER_VM, port)
        r = bed.run(CLIENT_VM, accel, ["python3", "-c", CONNECT_PROBE, bed.server_addr, str(port), "300"])
    finally:
        srv.stop()
    try:
        p50, p99 = (float(x) for x in r.stdout.split())
        return {"p50_us": p50, "p99_us": p99}
    except ValueError:
        return {"error": r.stdout[-300:] + r.stderr[-300:]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=DEFAULT_BIN)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    a = ap.parse_args()
    bed = Bed(a.bin)
    peer = find_bin(a.bin, "tests/socket/socket_peer")
    bed.up(CLIENT_VM, SERVER_VM)
    results = {"date": datetime.datetime.utcnow().isoformat() + "Z", "cpus": os.cpu_count(),
               "machine": machine(), "binaries": bed.binaries(), "kernel": {}, "vsocket": {}}
    try:
        port = 12000
        for mode, accel in (("kernel", False), ("vsocket", True)):
            R = results[mode]
            print(f"== {mode}", flush=True)
            R["pingpong_16"] = sockperf(bed, accel, "pp", 16, a.seconds, port); port += 1
            R["rate_16"] = sockperf(bed, accel, "tp", 16, a.seconds, port); port += 1
            R["rate_1k"] = sockperf(bed, accel, "tp", 1024, a.seconds, port); port += 1
            R["bandwidth_64k"] = iperf(bed, accel, a.seconds, port); port += 1
            R["redis"] = redis(bed, accel, port); port += 1
            R["connect"] = connect_first_byte(bed, accel, peer, port)
            port += 1
    finally:
        bed.down()
    K, V = results["kernel"], results["vsocket"]

    def cpu_per_million(R):
        t = R["rate_16"]
        msgs = t.get("messages") or t.get("msg_per_s", 0) * a.seconds
        hz = os.sysconf("SC_CLK_TCK")
        return (t["cpu_ticks_server_daemon"] / hz) / (msgs / 1e6) if msgs else float("nan")

    rows = [
        ("RTT p50, 16 B (us)", 2 * K["pingpong_16"].get("p50", 0), 2 * V["pingpong_16"].get("p50", 0), "<= 0.1"),
        ("RTT p99, 16 B (us)", 2 * K["pingpong_16"].get("p99", 0), 2 * V["pingpong_16"].get("p99", 0), ""),
        ("RTT p99.9, 16 B (us)", 2 * K["pingpong_16"].get("p99.9", 0), 2 * V["pingpong_16"].get("p99.9", 0), ""),
        ("message rate, 16 B (msg/s)", K["rate_16"].get("msg_per_s", 0), V["rate_16"].get("msg_per_s", 0), ">= 10"),
        ("message rate, 1 KiB (msg/s)", K["rate_1k"].get("msg_per_s", 0), V["rate_1k"].get("msg_per_s", 0), ""),
        ("bandwidth, 64 KiB writes (Gbit/s)", K["bandwidth_64k"].get("gbit_per_s", 0),
         V["bandwidth_64k"].get("gbit_per_s", 0), ">= 1"),
        ("redis SET, 1 client (req/s)", K["redis"].get("set_c1_rps", 0), V["redis"].get("set_c1_rps", 0), ">= 2"),
        ("redis GET, 1 client (req/s)", K["redis"].get("get_c1_rps", 0), V["redis"].get("get_c1_rps", 0), ">= 2"),
        ("redis SET, 50 clients (req/s)", K["redis"].get("set_c50_rps", 0), V["redis"].get("set_c50_rps", 0), ">= 2"),
        ("redis GET, 50 clients (req/s)", K["redis"].get("get_c50_rps", 0), V["redis"].get("get_c50_rps", 0), ">= 2"),
        ("CPU s per million 16 B msgs (server+daemon)", cpu_per_million(K), cpu_per_million(V), "lower is better"),
        ("connect to first byte, p50 (us)", K["connect"].get("p50_us", 0), V["connect"].get("p50_us", 0), ""),
    ]
    results["table"] = [{"metric": m, "kernel": k, "vsocket": v, "ratio": ratio(v, k), "goal": g}
                        for m, k, v, g in rows]
    md = [f"# Same-host benchmark, {results['date']} ({results['cpus']} CPUs), vSocket vs kernel TCP, same run",
          "", "| metric | kernel TCP | vSocket | vSocket/kernel | goal (ratio) |", "|---|--:|--:|--:|---|"]
    for row in results["table"]:
        md.append(f"| {row['metric']} | {row['kernel']:.2f} | {row['vsocket']:.2f} | {row['ratio']:.2f} | {row['goal']} |")
    text = "\n".join(md) + "\n"
    latest = save_results(a.out, "same-host", results, text)
    print(text)
    plot(results, latest)


def plot(results, base):
    table = results["table"]
    lat = [r for r in table if r["metric"].startswith(("RTT", "connect"))]
    plot_histogram(base, "latency", "vSocket vs kernel TCP, same host (absolute)", "microseconds (lower is better)",
                   [r["metric"] for r in lat],
                   [("kernel TCP", [r["kernel"] for r in lat]), ("vSocket", [r["vsocket"] for r in lat])])
    rates = [r for r in table if not r["metric"].startswith(("RTT", "connect", "CPU"))]
    plot_histogram(base, "rates", "vSocket vs kernel TCP, same host (ratio)", "vSocket / kernel TCP (higher is better)",
                   [r["metric"] for r in rates], [("vSocket / kernel TCP", [r["ratio"] for r in rates])],
                   logscale=True, hline=(1, "kernel TCP = 1"))


if __name__ == "__main__":
    main()
