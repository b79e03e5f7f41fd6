#!/usr/bin/env python3
"""The do-no-harm guard: a quick same-host comparison of vSocket with kernel
TCP, in the same run, on what a user meets first. Builds nothing; about a
minute on a 2-CPU machine. A benchmark, not a test: it never fails a build,
but it is run, and its table committed, with every change to the data path
or the wait policy.

  bench/quick.sh [--bin BAZEL_BIN] [--reps N] [--out DIR]

Measures (kernel TCP and vSocket alternating, REPS times each; the median
of the repetitions' ratios, each vSocket run against the kernel run next
to it, is compared):
  - sockperf ping-pong RTT, 16 B: p50 and p99
  - redis-benchmark SET and GET, 1 client
  - nginx, 4 KiB file, wrk -c 16 with "Connection: close" (a connection
    per request)
  - connect to first byte (connect, send, echo back), p50
  - nginx, 4 KiB file, wrk -c 32 keep-alive (many busy connections: the
    rings' win the default takes, decision 83)
Prints one table of vSocket/kernel ratios against the do-no-harm goals of
issue 15 (RTT p50 <= 1.0, p99 <= 1.2, connect p50 <= 1.5, every
throughput >= 1.0; keep-alive -c 32 >= 1.3, issue 39) and a last line `quick-bench: OK` or
`quick-bench: REGRESSION <metric>, ...`. It also says what vsocketd
counted in the vSocket repetitions (upgrades, accelerated bytes, refused
registrations): on a machine whose CPUs vsocketd shares, request/response
connections stay on kernel TCP by design (decision 51), so these workloads
may upgrade nothing; a registration vsocketd refused is a silent fallback
and flagged (`REFUSED`). Results: OUT/quick-latest.json and
.md (replacing the previous run's).
"""
import argparse
import os
import re
import shutil
import statistics
import tempfile
import time

from benchlib import DEFAULT_BIN, ROOT, Bed, find_bin, machine, paired_ratio, ratio_text, save_results, utc_now
from same_host_bench import CLIENT_VM, SERVER_VM, connect_first_byte, nginx, redis, sockperf


# (name, key in one repetition's results, higher is better, goal ratio)
METRICS = [
    ("RTT p50, 16 B (us)", lambda R: 2 * R["pingpong"]["p50"], False, 1.0),  # (no percentiles: no value, not 0)
    ("RTT p99, 16 B (us)", lambda R: 2 * R["pingpong"]["p99"], False, 1.2),
    ("redis SET, 1 client (req/s)", lambda R: R["redis"].get("set_c1_rps", 0), True, 1.0),
    ("redis GET, 1 client (req/s)", lambda R: R["redis"].get("get_c1_rps", 0), True, 1.0),
    ("nginx Connection: close (req/s)", lambda R: R["nginx"].get("rps", 0), True, 1.0),
    # Many busy keep-alive connections: the default takes the rings' win
    # there (decision 83; issue 39's goal >= 1.3).
    ("nginx keep-alive, wrk -c 32 (req/s)", lambda R: R["nginx_ka32"].get("rps", 0), True, 1.3),
    ("connect to first byte, p50 (us)", lambda R: R["connect"].get("p50_us", 0), False, 1.5),
]


# vsocketd counters read around each repetition: how it went.
ACCEL_COUNTERS = ("upgrades", "accel_bytes", "direct_bytes", "rejected_spoofed", "rejected_unproven", "rejected_other")


def as_meant(R, mode):
    """Whether a repetition went the way its mode says: kernel runs never
    touched vsocketd; vSocket runs had no registration refused (upgrades are
    up to the library's policy)."""
    d = R.get("daemon", {})
    refused = d.get("rejected_spoofed", 0) + d.get("rejected_unproven", 0) + d.get("rejected_other", 0)
    if mode == "kernel":
        return d.get("upgrades", 0) == 0 and refused == 0
    return refused == 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=DEFAULT_BIN)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    a = ap.parse_args()
    t_start = time.monotonic()
    bed = Bed(a.bin)
    peer = find_bin(a.bin, "tests/socket/socket_peer")
    bed.up(CLIENT_VM, SERVER_VM)
    results = {"date": utc_now().strftime("%Y-%m-%dT%H:%M:%SZ"), "machine": machine(),
               "binaries": bed.binaries(), "reps": a.reps, "kernel": [], "vsocket": []}
    try:
        port = 13000
        for _ in range(a.reps):
            for mode, accel in (("kernel", False), ("vsocket", True)):
                before = bed.counters()
                R = {"pingpong": sockperf(bed, accel, "pp", 16, 2, port)}
                R["pingpong"].pop("raw", None)
                R["redis"] = redis(bed, accel, port + 1, runs=((1, 8000),))
                R["nginx"] = nginx(bed, accel, port + 2, close=True)
                R["connect"] = connect_first_byte(bed, accel, peer, port + 3)
                R["nginx_ka32"] = nginx(bed, accel, port + 4, close=False, conns=32)
                after = bed.counters()
                R["daemon"] = {k: after.get(k, 0) - before.get(k, 0) for k in ACCEL_COUNTERS}
                results[mode].append(R)
                port += 5
    finally:
        bed.down()
    rows, bad = [], []
    for name, get, higher, goal in METRICS:
        k = statistics.median(get(R) for R in results["kernel"])
        v = statistics.median(get(R) for R in results["vsocket"])
        r, rmin, rmax = paired_ratio([get(R) for R in results["kernel"]], [get(R) for R in results["vsocket"]])
        ok = r == r and (r >= goal if higher else r <= goal)
        rows.append({"metric": name, "kernel": k, "vsocket": v, "ratio": r, "ratio_range": [rmin, rmax],
                     "goal": (">= " if higher else "<= ") + f"{goal:g}", "ok": ok})
        if not ok:
            bad.append(name)
    results["table"] = rows
    paths = {mode: [as_meant(R, mode) for R in results[mode]] for mode in ("kernel", "vsocket")}
    if not all(paths["kernel"] + paths["vsocket"]):
        bad.append("REFUSED (" + "; ".join(f"{m} rep {i + 1}: {results[m][i].get('daemon')}"
                                                  for m in paths for i, ok in enumerate(paths[m]) if not ok) + ")")
    results["seconds"] = round(time.monotonic() - t_start, 1)
    md = [f"# Quick benchmark, {results['date']}, {results['machine']['cpus']} CPUs "
          f"({results['machine']['cpu_model']}), median of {a.reps} repetitions, same run",
          "", "| metric | kernel TCP | vSocket | vSocket/kernel | goal | |", "|---|--:|--:|--:|---|---|"]
    for row in rows:
        md.append(f"| {row['metric']} | {row['kernel']:.1f} | {row['vsocket']:.1f} | {ratio_text(row)} | "
                  f"{row['goal']} | {'ok' if row['ok'] else 'REGRESSION'} |")
    verdict = "quick-bench: OK" if not bad else "quick-bench: REGRESSION " + ", ".join(bad)
    v = [R["daemon"] for R in results["vsocket"]]
    md += ["", "vSocket repetitions, as vsocketd counted them: " + "; ".join(
        f"{d['upgrades']} upgrades, {d['accel_bytes'] / 1e6:.1f} MB through vsocketd and "
        f"{d['direct_bytes'] / 1e6:.1f} MB by direct pairs (decision 102), "
        f"{d['rejected_spoofed'] + d['rejected_unproven'] + d['rejected_other']} registrations refused" for d in v)]
    md += ["", f"({results['seconds']} s)", "", verdict]
    text = "\n".join(md) + "\n"
    save_results(a.out, "quick", results, text)
    print(text, end="")


if __name__ == "__main__":
    main()
