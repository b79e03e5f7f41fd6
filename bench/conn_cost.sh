#!/usr/bin/env bash
# What a connection per request costs its process with and without
# libvsocket.so (bench/conn_cost.cc), on the same-host bed, the two ways
# taking turns; prints each run and the medians. Builds nothing; run under
# the e2e lock (it brings the bed up and down).
#   bench/conn_cost.sh [--bin BAZEL_BIN] [--reps N] [--conns N] [--lib OTHER_LIBVSOCKET.so]
# --lib adds a third way (another build of the library: before/after).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(readlink -f bazel-bin) reps=5 conns=200000 other=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin=$(readlink -f "$2"); shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --conns) conns=$2; shift 2 ;;
    --lib) other=$(readlink -f "$2"); shift 2 ;;
    *) echo "usage: $0 [--bin DIR] [--reps N] [--conns N] [--lib SO]" >&2; exit 2 ;;
  esac
done
export VSOCKETD=${VSOCKETD:-$bin/host-backend/vsocketd}
tb=deploy/testbed.sh
trap 'bash $tb down >/dev/null 2>&1' EXIT
bash $tb up >/dev/null
ways=(kernel library)
[[ -n "$other" ]] && ways+=(other)
out=$(mktemp)
for ((i = 0; i < reps; i++)); do
  for way in "${ways[@]}"; do
    case $way in
      kernel) env=(env -u LD_PRELOAD) ;;
      library) env=(env LD_PRELOAD="$bin/guest/libvsocket.so") ;;
      other) env=(env LD_PRELOAD="$other") ;;
    esac
    # (Each run from no TIME_WAIT sockets: the last run's would make connect() dearer.)
    bash $tb exec vm1 ss -K -Htan state time-wait >/dev/null
    line=$(bash $tb exec vm1 "${env[@]}" "$bin/bench/conn_cost" "$conns")
    echo "$way $line" | tee -a "$out"
  done
done
python3 - "$out" <<'PY'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\w+) .*wall ([\d.]+) us, user ([\d.]+) us, sys ([\d.]+) us", line)
    if m:
        runs.setdefault(m.group(1), []).append([float(x) for x in m.groups()[1:]])
for way, rs in runs.items():
    med = [statistics.median(r[i] for r in rs) for i in range(3)]
    print(f"{way:8} median per connection: wall {med[0]:.2f} us, user {med[1]:.2f} us, sys {med[2]:.2f} us "
          f"(user {min(r[1] for r in rs):.2f}-{max(r[1] for r in rs):.2f}, {len(rs)} runs)")
PY
rm -f "$out"
