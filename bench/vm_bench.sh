#!/usr/bin/env bash
# vSocket against kernel TCP between two QEMU guests on one host (issue 35):
# sockperf ping-pong and throughput, redis-benchmark GET with 1 and 16
# clients, BENCH_REPS repetitions (default 3) alternating the order, each
# with the CPU time of both QEMUs and of vsocketd per message. Under TCG
# absolute times mean little: read the ratios (same two guests, same run).
#
#   bench/vm_bench.sh [--no-build]     (root; takes /tmp/vsocket-e2e.lock)
#
# Writes bench/results/vm-latest.json and .md (docs/benchmarks.md "Inside
# QEMU guests" is generated from them). The run itself is
# tests/vm/vm_mode.sh bench_vm_pair (tests/vm/bench_cases.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=bench/results/vm-latest
BENCH_OUT=$PWD/$OUT.json flock /tmp/vsocket-e2e.lock bash tests/vm/vm_mode.sh "$@" bench_vm_pair
python3 - "$OUT.json" "$OUT.md" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
def cell(x, fmt="%.1f"):
    if x["min"] == x["max"]:
        return fmt % x["median"]
    return (fmt + " (" + fmt + "–" + fmt + ")") % (x["median"], x["min"], x["max"])
lines = [
    "Inside QEMU guests, %s: %s; kernel TCP and vSocket (plain `vsocket-run`, the default policy) between the same two "
    "guests, alternating, medians of %d repetitions (min–max). Ratio: vSocket's rate over kernel TCP's, or kernel TCP's "
    "latency over vSocket's (above 1: vSocket better). CPU: both QEMUs' and vsocketd's CPU time per message, "
    "µs." % (r["date"], r["machine"], r["reps"]),
    "",
    "| workload | metric | kernel TCP | vSocket | ratio | CPU/msg kernel TCP (QEMUs) | CPU/msg vSocket (QEMUs + vsocketd) |",
    "|---|---|--:|--:|--:|--:|--:|",
]
for name, row in r["summary"].items():
    kc = row.get("kernel_qemu_us_per_msg")
    vc, vd = row.get("vsocket_qemu_us_per_msg"), row.get("vsocket_vsocketd_us_per_msg")
    lines.append("| %s | %s | %s | %s | %s | %s | %s |" % (
        row["what"], row["metric"], cell(row["kernel"]), cell(row["vsocket"]), cell(row["ratio"], "%.2f"),
        "%.1f" % kc["median"] if kc else "–",
        "%.1f + %.1f" % (vc["median"], vd["median"]) if vc and vd else "–"))
    if name == "pp16":
        lines.append("| %s | latency p99 (RTT/2) | %s | %s | %.2f | | |" % (
            row["what"], cell(row["kernel_p99"]), cell(row["vsocket_p99"]),
            row["kernel_p99"]["median"] / row["vsocket_p99"]["median"]))
lines.append("")
lines.append("Every vSocket connection end's report said accelerated (%s ends by port); vsocketd carried %d bytes "
             "accelerated." % (", ".join("%s: %d" % kv for kv in r["accelerated_ends"].items()), r["accel_bytes"]))
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
