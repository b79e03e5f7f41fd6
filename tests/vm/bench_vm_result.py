#!/usr/bin/env python3
"""bench_vm_pair's result (tests/vm/bench_cases.sh): reads guest A's run
outputs (runs/NAME-MODE-REP.out), the host's CPU samples at each run's
start and end marks, and both guests' library reports; checks that every
run exited 0, that every vSocket end was accelerated and that vsocketd
carried bytes; writes the JSON result (medians, min-max, ratios against
kernel TCP in the same run, CPU per message) and prints a summary. Exit 1
with the reason when a check fails."""
import argparse
import json
import os
import re
import statistics
import sys
import time

WORKLOADS = {
    # name: (what, metric, unit, higher is better)
    "pp16": ("sockperf ping-pong, 16 B", "latency p50 (RTT/2)", "us", False),
    "tp16k": ("sockperf throughput, 16 KiB messages", "messages/s", "msg/s", True),
    "redis1": ("redis-benchmark GET, 1 client", "requests/s", "req/s", True),
    "redis16": ("redis-benchmark GET, 16 clients", "requests/s", "req/s", True),
}
PORTS = {"pp16": 11111, "tp16k": 11111, "redis1": 6379, "redis16": 6379}


def parse(name, text):
    """(value, messages, extra) of one run's output."""
    if name == "pp16":
        p50 = re.search(r"percentile 50\.000 =\s+([\d.]+)", text)
        p99 = re.search(r"percentile 99\.000 =\s+([\d.]+)", text)
        total = re.search(r"\[Total Run\].*ReceivedMessages=(\d+)", text)
        if not (p50 and p99 and total):
            raise ValueError("no sockperf ping-pong summary")
        return float(p50.group(1)), int(total.group(1)), {"p99": float(p99.group(1))}
    if name == "tp16k":
        rate = re.search(r"Message Rate is (\d+)", text)
        sent = re.search(r"Total of (\d+) messages sent", text)
        if not (rate and sent):
            raise ValueError("no sockperf throughput summary")
        return float(rate.group(1)), int(sent.group(1)), {}
    m = re.search(r'^"GET","([\d.]+)"', text, re.M)
    if not m:
        raise ValueError("no GET line in redis-benchmark's CSV")
    n = 1500 if name == "redis1" else 6000
    return float(m.group(1)), n, {}


def spread(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True)
    ap.add_argument("--stdout", required=True)
    ap.add_argument("--cpu", required=True)
    ap.add_argument("--reports", required=True)
    ap.add_argument("--accel-bytes", type=int, required=True)
    ap.add_argument("--reps", type=int, required=True)
    ap.add_argument("--hz", type=int, default=100)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    stdout = open(a.stdout).read()
    marks = {}
    for line in open(a.cpu):
        mark, _, qemu, daemon = line.split()
        marks[mark] = (int(qemu), int(daemon))
    problems = []
    runs = {}
    for name in WORKLOADS:
        for mode in ("kernel", "vsocket"):
            for rep in range(1, a.reps + 1):
                key = f"{name}-{mode}-{rep}"
                if f"{name} {mode} {rep} exit 0" not in stdout:
                    problems.append(f"{key} did not exit 0")
                    continue
                try:
                    value, msgs, extra = parse(name, open(os.path.join(a.runs, key + ".out")).read())
                except (OSError, ValueError) as e:
                    problems.append(f"{key}: {e}")
                    continue
                s, e = marks.get(key + "-start"), marks.get(key + "-end")
                cpu = None
                if s and e:
                    cpu = {"qemu_us_per_msg": (e[0] - s[0]) * 1e6 / a.hz / msgs,
                           "vsocketd_us_per_msg": (e[1] - s[1]) * 1e6 / a.hz / msgs}
                runs[key] = {"value": value, "messages": msgs, "cpu": cpu, **extra}
    # (vsocket-run's line for a program it could not preload names no connection.)
    ends = [e for e in (json.loads(l) for l in open(a.reports) if l.strip()) if "local" in e]
    port_of = lambda ep: int(ep.rsplit(":", 1)[1])
    accel = {}
    for port in sorted(set(PORTS.values())):
        mine = [e for e in ends if port in (port_of(e["local"]), port_of(e["peer"]))]
        accel[port] = (sum(1 for e in mine if e.get("mode") == "accelerated"), len(mine))
    for port, (n_acc, n) in accel.items():
        if n == 0 or n_acc != n:
            problems.append(f"port {port}: {n_acc} of {n} vSocket ends accelerated")
    if a.accel_bytes <= 0:
        problems.append("vsocketd carried no accelerated bytes")
    if problems:
        print("; ".join(problems[:8]))
        return 1

    summary = {}
    for name, (what, metric, unit, higher) in WORKLOADS.items():
        k = [runs[f"{name}-kernel-{r}"]["value"] for r in range(1, a.reps + 1)]
        v = [runs[f"{name}-vsocket-{r}"]["value"] for r in range(1, a.reps + 1)]
        # Per repetition, vSocket against the kernel TCP run next to it;
        # above 1 is vSocket better (for latency: kernel / vSocket).
        ratios = [(vv / kk if higher else kk / vv) for kk, vv in zip(k, v)]
        row = {"what": what, "metric": metric, "unit": unit, "kernel": spread(k), "vsocket": spread(v),
               "ratio": spread(ratios)}
        if name == "pp16":
            row["kernel_p99"] = spread([runs[f"pp16-kernel-{r}"]["p99"] for r in range(1, a.reps + 1)])
            row["vsocket_p99"] = spread([runs[f"pp16-vsocket-{r}"]["p99"] for r in range(1, a.reps + 1)])
        for mode in ("kernel", "vsocket"):
            cpus = [runs[f"{name}-{mode}-{r}"]["cpu"] for r in range(1, a.reps + 1)]
            if all(cpus):
                row[f"{mode}_qemu_us_per_msg"] = spread([c["qemu_us_per_msg"] for c in cpus])
                row[f"{mode}_vsocketd_us_per_msg"] = spread([c["vsocketd_us_per_msg"] for c in cpus])
        summary[name] = row
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "reps": a.reps,
           "machine": f"{os.cpu_count()} CPUs; guests: QEMU TCG, 1 vCPU, 512 MiB each",
           "accelerated_ends": {str(p): n for p, (n, _) in accel.items()}, "accel_bytes": a.accel_bytes,
           "summary": summary, "runs": runs}
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    for name, row in summary.items():
        print(f"{row['what']}: kernel {row['kernel']['median']:.1f}, vSocket {row['vsocket']['median']:.1f} {row['unit']}, "
              f"ratio {row['ratio']['median']:.2f} ({row['ratio']['min']:.2f}-{row['ratio']['max']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
