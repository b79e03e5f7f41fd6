#!/usr/bin/env python3
"""Direct pairs (issue 37, decision 97) against kernel TCP and the path
through vsocketd, between the same two processes, in one run: the one-bed
benchmark of the first increment (direct = same-tenant for vm1 and vm2).

  bench/direct_bench.py [--bin BAZEL_BIN] [--reps N] [--seconds S] [--out DIR]

Modes, alternating within each repetition: kernel TCP (no library),
through vsocketd (libvsocket.so, VSOCKET_UPGRADE=always, VSOCKET_DIRECT=0),
direct (libvsocket.so, VSOCKET_UPGRADE=always: every connection direct) and
the default policy with direct pairs allowed (libvsocket.so as a user gets
it: streams, busy loops and, decision 98, request/response connections of
16 turns or more between direct peers register; a connection per request
stays on kernel TCP).
Measures sockperf ping-pong (16 B: one-way p50 and p99), redis-benchmark
SET/GET with 1 and 50 clients and nginx 4 KiB with wrk -c16 keep-alive and
"Connection: close". Reports medians (min-max) and each mode's median of
per-repetition ratios to kernel TCP; checks that the direct runs paired
direct (vsocketd's direct_pairs grew) and moved nothing through vsocketd
(its accel_bytes did not). Results: OUT/direct-latest.json and .md.
"""
import argparse
import os
import statistics
import sys

import benchlib as bl
import same_host_bench as sh

MODES = ("kernel", "backend", "direct", "default")
ACCEL = ("backend", "direct", "default")


class DirectBed(bl.Bed):
    """The one-host bed with direct pairs allowed for vm1 and vm2; env()
    takes a mode name instead of accel."""

    def __init__(self, bin_dir):
        super().__init__(bin_dir)
        self.base_env["VSOCKET_VM_VM1_DIRECT"] = "same-tenant"
        self.base_env["VSOCKET_VM_VM2_DIRECT"] = "same-tenant"

    def env(self, accel, report=None, extra=None):
        e = dict(self.base_env)
        if accel in ACCEL:
            e["LD_PRELOAD"] = self.lib
            e["VSOCKET_UPGRADE"] = "auto" if accel == "default" else "always"
            if accel == "backend":
                e["VSOCKET_DIRECT"] = "0"
        if report:
            e["VSOCKET_REPORT"] = report
        e.update(extra or {})
        return e


# (metric, key, higher is better)
METRICS = [
    ("one-way latency p50, 16 B (us)", lambda R: R["pingpong"].get("p50"), False),
    ("one-way latency p99, 16 B (us)", lambda R: R["pingpong"].get("p99"), False),
    ("redis SET, 1 client (req/s)", lambda R: R["redis"].get("set_c1_rps"), True),
    ("redis GET, 1 client (req/s)", lambda R: R["redis"].get("get_c1_rps"), True),
    ("redis SET, 50 clients (req/s)", lambda R: R["redis"].get("set_c50_rps"), True),
    ("redis GET, 50 clients (req/s)", lambda R: R["redis"].get("get_c50_rps"), True),
    ("nginx 4 KiB, keep-alive, wrk -c 16 (req/s)", lambda R: R["nginx_ka"].get("rps"), True),
    ("nginx 4 KiB, Connection: close, wrk -c 16 (req/s)", lambda R: R["nginx_close"].get("rps"), True),
]


def one_rep(bed, rep, seconds):
    out = {}
    for i, mode in enumerate(MODES):
        port = 7500 + rep * 40 + i * 10
        before = bed.counters()
        R = {"pingpong": sh.sockperf(bed, mode if mode != "kernel" else False, "pp", 16, seconds, port),
             "redis": sh.redis(bed, mode if mode != "kernel" else False, port + 1, runs=((1, 20000), (50, 100000))),
             "nginx_ka": sh.nginx(bed, mode if mode != "kernel" else False, port + 2, close=False, seconds=seconds),
             "nginx_close": sh.nginx(bed, mode if mode != "kernel" else False, port + 3, close=True, seconds=seconds)}
        after = bed.counters()
        R["daemon"] = {k: after.get(k, 0) - before.get(k, 0) for k in ("upgrades", "direct_pairs", "accel_bytes")}
        out[mode] = R
        print(f"   rep {rep} {mode}: p50 {R['pingpong'].get('p50')} us, redis c1 {R['redis'].get('get_c1_rps')}, "
              f"c50 {R['redis'].get('get_c50_rps')}, nginx ka {R['nginx_ka'].get('rps')}, close "
              f"{R['nginx_close'].get('rps')}; daemon {R['daemon']}", flush=True)
    return out


def table(reps):
    rows = []
    for metric, key, higher in METRICS:
        row = {"metric": metric, "higher_is_better": higher}
        for mode in MODES:
            vals = [key(R[mode]) for R in reps if key(R[mode])]
            row[mode] = statistics.median(vals) if vals else None
            row[mode + "_range"] = [min(vals), max(vals)] if vals else None
        for mode in ACCEL:
            ratios = [key(R[mode]) / key(R["kernel"]) for R in reps if key(R[mode]) and key(R["kernel"])]
            row[mode + "_ratio"] = statistics.median(ratios) if ratios else None
        rows.append(row)
    return rows


def machine_text(m):
    return ", ".join(f"{v}" for v in m.values()) if isinstance(m, dict) else str(m)


def markdown(res):
    def num(v):
        return "-" if v is None else (f"{v:.2f}" if v < 100 else f"{v:,.0f}")

    def spread(row, mode):
        r = row[mode + "_range"]
        return "-" if r is None else f"{num(row[mode])} ({num(r[0])}–{num(r[1])})"

    lines = [f"# Direct pairs against kernel TCP and through vsocketd ({res['date']}, {res['commit']})", "",
             f"{res['date']} on {machine_text(res['machine'])}, {res['reps_n']} repetitions of {res['seconds']} s per test, "
             "the modes alternating; medians (min–max); ratios are the medians of each repetition's ratio to kernel "
             "TCP. Direct runs: vsocketd counted " + res["direct_check"] + ".", "",
             "| metric | kernel TCP | through vsocketd | direct | default policy, direct allowed | "
             "through vsocketd/kernel | direct/kernel | default/kernel |",
             "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for row in res["table"]:
        lines.append(f"| {row['metric']} | {spread(row, 'kernel')} | {spread(row, 'backend')} | {spread(row, 'direct')} "
                     f"| {spread(row, 'default')} | {num(row['backend_ratio'])} | {num(row['direct_ratio'])} "
                     f"| {num(row.get('default_ratio'))} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=bl.DEFAULT_BIN)
    ap.add_argument("--seconds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(bl.ROOT, "bench/results"))
    a = ap.parse_args()
    bed = DirectBed(a.bin)
    bed.up(sh.CLIENT_VM, sh.SERVER_VM)
    try:
        reps = [one_rep(bed, i, a.seconds) for i in range(a.reps)]
    finally:
        bed.down()
    pairs = [R["direct"]["daemon"]["direct_pairs"] for R in reps]
    moved = [R["direct"]["daemon"]["accel_bytes"] for R in reps]
    head = bl.sh(["git", "-C", bl.ROOT, "describe", "--always", "--dirty"]).stdout.strip()
    res = {"date": bl.utc_now().strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": head, "machine": bl.machine(), "reps_n": a.reps, "seconds": a.seconds,
           "binaries": bed.binaries(), "reps": reps, "table": table(reps),
           "direct_check": f"{min(pairs)}-{max(pairs)} direct pairs and moved {min(moved)}-{max(moved)} B per "
                           "repetition"}
    md = markdown(res)
    print(md)
    bl.save_results(a.out, "direct", res, md)
    if min(pairs) == 0 or max(moved) != 0:
        print("direct-bench: the direct runs did not all go direct", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
