#!/usr/bin/env bash
# Builds and runs the channel benchmark; keeps the result in bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
bazel build //bench:channel_bench //host-backend:vsocketd 2>&1 | tail -1
out="bench/results/channel-$(date -u +%Y%m%dT%H%M%SZ).md"
bazel-bin/bench/channel_bench bazel-bin/host-backend/vsocketd --iters "${ITERS:-100000}" --out "$out"
cp "$out" bench/results/channel-latest.md
echo "saved $out"
