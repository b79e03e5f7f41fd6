#!/usr/bin/env bash
# Runs every libFuzzer target (coverage-guided, ASan) for SECONDS each.
#   tests/fuzz.sh [SECONDS]        default 60
# New inputs go to a scratch corpus; crashes are written as crash-* files in
# the current directory and make the script fail.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${1:-60}"
# TARGET:SEED_CORPUS, the same list as FUZZ_TARGETS in tests/run_all.sh.
TARGETS=(
  //proto/fuzz:control_fuzz:proto/fuzz/corpus/control
  //vhost/fuzz:vring_fuzz:vhost/fuzz/corpus/vring
  //proto/fuzz:fabric_fuzz:proto/fuzz/corpus/fabric
  //host-backend/fabric/fuzz:stream_link_fuzz:host-backend/fabric/fuzz/corpus/stream_link
  //host-backend/peering/fuzz:tls_channel_fuzz:host-backend/peering/fuzz/corpus/tls_channel
  //host-backend/remote/fuzz:peer_frames_fuzz:host-backend/remote/fuzz/corpus/peer_frames
  //host-backend/fabric/fuzz:locator_fuzz:host-backend/fabric/fuzz/corpus/locator
  //host-backend/fuzz:config_fuzz:host-backend/fuzz/corpus/config
)
failed=0
bazel build --config=fuzz "${TARGETS[@]%:*}" 2>&1 | tail -1
for spec in "${TARGETS[@]}"; do
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
