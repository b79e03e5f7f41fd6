#!/usr/bin/env bash
# What vSocket adds to a QEMU live migration (issue 36): the same VM (TCG,
# 384 MiB, the two-host bed) under the same load (a 1 GiB stream each way
# and a request/response loop to a peer on hostA, every byte checked),
# migrated between hostA and hostB BENCH_MOVES times (default 4) with its
# two vSocket functions attached to vsocketd, then again without them (the
# load on plain kernel TCP). Per migration: QMP query-migrate's total time,
# downtime, setup time and MiB transferred, and with vSocket how long after
# `cont` the connections were accelerated again where the VM runs now.
#
#   bench/migration_bench.sh [--no-build]     (root; takes /tmp/vsocket-e2e.lock)
#
# Writes bench/results/migration-latest.json and .md (docs/benchmarks.md
# "Live migration" cites them). The run itself is tests/vm/migrate_hosts.sh
# bench_migration.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=bench/results/migration-latest
BENCH_OUT=$PWD/$OUT.json flock /tmp/vsocket-e2e.lock bash tests/vm/migrate_hosts.sh "$@" bench_migration
# (Which QEMU: the bed's migrations lose pages under Debian's 7.2, decision
# 137; run it with tests/vm/install-qemu-backports.sh's first on PATH.)
QEMU_VERSION=$(qemu-system-x86_64 --version | head -1)
python3 - "$OUT.json" "$OUT.md" "$QEMU_VERSION" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
if len(sys.argv) > 3 and "qemu" not in r:
    r["qemu"] = sys.argv[3]
    json.dump(r, open(sys.argv[1], "w"), indent=1)
s = r["summary"]
def cell(m, k):
    v = s[m][k]
    if v is None:
        return "–"
    return "%g (%g–%g)" % (v["median"], v["min"], v["max"]) if v["min"] != v["max"] else "%g" % v["median"]
lines = [
    "Live migration, %s: a TCG guest of %d MiB between the two-host bed's hosts, %d moves each way of "
    "running it (medians, min–max; %s):" % (r["date"], r["ram_mib"], r["moves"], r.get("qemu", "QEMU version not recorded")),
    "",
    "| | total (ms) | downtime (ms) | setup (ms) | transferred (MiB) | accelerated again after `cont` (s) |",
    "|---|---|---|---|---|---|",
]
for m, name in (("kernel", "without vSocket"), ("vsocket", "with vSocket")):
    lines.append("| %s | %s | %s | %s | %s | %s |" % (name, cell(m, "total_ms"), cell(m, "downtime_ms"), cell(m, "setup_ms"),
                                                     cell(m, "transferred_mib"), cell(m, "accelerated_again_s")))
lines.append("")
lines.append("Per migration: " + "; ".join("%s #%d to %s: %s ms, downtime %s ms" % (x["mode"], x["move"], x["to"], x["total_ms"],
                                                                                    x["downtime_ms"]) for x in r["rows"]))
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
