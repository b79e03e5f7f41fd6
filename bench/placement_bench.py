#!/usr/bin/env python3
"""Production placement, as far as the machine allows: vsocketd pinned to a
CPU of its own (VSOCKET_CPUS: its worker polls there, decision 67) and the
applications of both VMs on the other CPUs, against kernel TCP with the
applications on those same CPUs, in the same run (issue 15's
"production placement" goals: same-host RTT p50 <= 0.3, redis 50 clients
>= 2, 64 KiB bandwidth >= 3).

  bench/placement_bench.py [--bin BAZEL_BIN] [--seconds N] [--reps N] [--out DIR]

On a 2-CPU machine the daemon has CPU 1 and both VMs' applications share
CPU 0: the goals' placement ("vsocketd on a CPU of its own, guests on the
other") with one CPU left for two guests. Measures, REPS times (default 5),
the modes alternating per test: kernel TCP with the applications on the
guest CPUs; vSocket as a user gets it there (libvsocket preloaded, default
policy); and, for reference, kernel TCP with the applications free to run
on every CPU (what the machine gives without any placement):
  - sockperf ping-pong RTT, 16 B (p50, p99)
  - redis-benchmark SET/GET with 50 clients
  - iperf3 bandwidth, 64 KiB writes, one stream
Results go to OUT/placement-latest.json and .md (replacing the previous
run's; older runs are in git history); vSocket/kernel is the median
(min-max) of each repetition's own ratio (decision 65).
"""
import argparse
import datetime
import os
import time

from benchlib import DEFAULT_BIN, ROOT, Bed, machine, median_range, paired_ratio, ratio_text, rep_values, save_results
from same_host_bench import iperf, redis, sockperf

CLIENT_VM, SERVER_VM = "vm1", "vm2"


class PinnedBed(Bed):
    """A bed whose applications run under `taskset -c CPUS` (None: anywhere)."""

    app_cpus = None

    def _pin(self, argv):
        return (["taskset", "-c", self.app_cpus] if self.app_cpus else []) + list(argv)

    def run(self, vm, accel, argv, timeout=120, extra_env=None):
        return super().run(vm, accel, self._pin(argv), timeout, extra_env)

    def start(self, vm, accel, argv, limit_s, stdin=False, report=None, extra_env=None):
        return super().start(vm, accel, self._pin(argv), limit_s, stdin, report, extra_env)


def counters(bed):
    try:
        c = bed.counters()
    except Exception:  # noqa: BLE001 (the bed's ctl failing is reported as no counters)
        return {}
    return {k: c.get(k, 0) for k in ("upgrades", "accel_bytes")}


def measure(bed, accel, seconds, port):
    before = counters(bed)
    res = {"pingpong_16": sockperf(bed, accel, "pp", 16, seconds, port),
           "redis": redis(bed, accel, port + 1, runs=((50, 100000),)),
           "bandwidth_64k": iperf(bed, accel, seconds, port + 2)}
    after = counters(bed)
    res["daemon"] = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    return res


ROWS = [
    # (metric, value of one repetition, production goal as a ratio, "<=" or ">=")
    ("RTT p50, 16 B (us)", lambda R: 2 * R["pingpong_16"].get("p50", 0), 0.3, "<="),
    ("RTT p99, 16 B (us)", lambda R: 2 * R["pingpong_16"].get("p99", 0), None, ""),
    ("redis SET, 50 clients (req/s)", lambda R: R["redis"].get("set_c50_rps", 0), 2.0, ">="),
    ("redis GET, 50 clients (req/s)", lambda R: R["redis"].get("get_c50_rps", 0), 2.0, ">="),
    ("bandwidth, 64 KiB writes (Gbit/s)", lambda R: R["bandwidth_64k"].get("gbit_per_s", 0), 3.0, ">="),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=DEFAULT_BIN)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results"))
    a = ap.parse_args()
    ncpu = os.cpu_count() or 1
    if ncpu < 2:
        raise SystemExit("placement_bench: needs at least 2 CPUs (one for vsocketd)")
    daemon_cpu = str(ncpu - 1)
    app_cpus = "0" if ncpu == 2 else f"0-{ncpu - 2}"
    bed = PinnedBed(a.bin)
    bed.base_env["VSOCKET_CPUS"] = daemon_cpu
    bed.up(CLIENT_VM, SERVER_VM)
    t_start = time.time()
    results = {"date": datetime.datetime.utcnow().isoformat() + "Z", "cpus": ncpu, "machine": machine(),
               "binaries": bed.binaries(), "reps_n": a.reps, "seconds": a.seconds, "daemon_cpus": daemon_cpu,
               "app_cpus": app_cpus, "loadavg_before": os.getloadavg()[0],
               "reps": {"kernel": [], "vsocket": [], "kernel_anywhere": []}}
    modes = (("kernel", False, app_cpus), ("vsocket", "auto", app_cpus), ("kernel_anywhere", False, None))
    try:
        port = 14000
        for rep in range(a.reps):
            print(f"== rep {rep + 1}/{a.reps}", flush=True)
            for mode, accel, cpus in modes:
                bed.app_cpus = cpus
                results["reps"][mode].append(measure(bed, accel, a.seconds, port))
                port += 10
    finally:
        bed.down()
    results["loadavg_after"] = os.getloadavg()[0]
    results["wall_s"] = round(time.time() - t_start, 1)
    table = []
    for metric, fn, g, op in ROWS:
        kv, vv, fv = (rep_values(results["reps"][m], fn, zero_is_none=True)
                      for m in ("kernel", "vsocket", "kernel_anywhere"))
        k, v, f = median_range(kv), median_range(vv), median_range(fv)
        r = paired_ratio(kv, vv)
        rf = paired_ratio(fv, vv)
        goal_text = f"{op} {g:g}" if g is not None else ""
        met = None if not goal_text else (r[0] <= g if op == "<=" else r[0] >= g)
        table.append({"metric": metric, "kernel": k[0], "kernel_range": [k[1], k[2]], "vsocket": v[0],
                      "vsocket_range": [v[1], v[2]], "ratio": r[0], "ratio_range": [r[1], r[2]],
                      "kernel_anywhere": f[0], "kernel_anywhere_range": [f[1], f[2]],
                      "ratio_anywhere": rf[0], "ratio_anywhere_range": [rf[1], rf[2]], "goal": goal_text, "met": met})
    results["table"] = table
    upg = [R["daemon"].get("upgrades", 0) for R in results["reps"]["vsocket"]]
    acc = [R["daemon"].get("accel_bytes", 0) for R in results["reps"]["vsocket"]]
    md = [f"# Production placement benchmark, {results['date']} ({ncpu} CPUs): vsocketd on CPU {daemon_cpu}, "
          f"the applications on CPU {app_cpus}", "",
          f"{a.reps} repetitions of {a.seconds} s per test, the modes alternating; medians (min-max); vSocket/kernel: "
          "median (min-max) of each repetition's ratio against the kernel TCP run next to it.", "",
          "| metric | kernel TCP, same CPUs | vSocket | vSocket/kernel | goal | kernel TCP, any CPU | vSocket/that |",
          "|---|--:|--:|--:|---|--:|--:|"]
    for t in table:
        g = f"{t['goal']}: {'met' if t['met'] else 'missed'}" if t["goal"] else ""
        md.append(f"| {t['metric']} | {t['kernel']:.1f} ({t['kernel_range'][0]:.1f}-{t['kernel_range'][1]:.1f}) "
                  f"| {t['vsocket']:.1f} ({t['vsocket_range'][0]:.1f}-{t['vsocket_range'][1]:.1f}) "
                  f"| {ratio_text(t)} | {g} | {t['kernel_anywhere']:.1f} | {t['ratio_anywhere']:.2f} |")
    md += ["", f"vsocketd counted per vSocket repetition: upgrades {upg}, accelerated bytes {acc}.",
           f"Wall time {results['wall_s']} s; load average {results['loadavg_before']:.2f} before, "
           f"{results['loadavg_after']:.2f} after."]
    print("\n".join(md))
    save_results(a.out, "placement", results, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
