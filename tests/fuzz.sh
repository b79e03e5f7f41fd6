#!/usr/bin/env bash
# Runs every libFuzzer target (coverage-guided, ASan) for SECONDS each.
#   tests/fuzz.sh [SECONDS]        default 60
# New inputs go to a scratch corpus; crashes are written as crash-* files in
# the current directory and make the script fail.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${1:-60}"
. tests/fuzz_targets.sh  # FUZZ_TARGETS
failed=0
bazel build --config=fuzz "${FUZZ_TARGETS[@]%:*}" 2>&1 | tail -1
for spec in "${FUZZ_TARGETS[@]}"; do
  target=${spec%:*}
  bin="bazel-bin/$(echo "${target#//}" | tr ':' '/')"
  work=$(mktemp -d)
  echo "== $bin for ${SECONDS_EACH}s"
  if "$bin" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 "$work" "${spec##*:}" >"$work.log" 2>&1; then
    grep -E "^Done" "$work.log"
  else
    grep -E "ERROR|SUMMARY|Test unit written" "$work.log"
    failed=1
  fi
  rm -rf "$work" "$work.log"
done
exit "$failed"
