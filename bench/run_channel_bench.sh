#!/usr/bin/env bash
# Builds and runs the channel benchmark; bench/results/channel-latest.md
# replaces the previous result (older ones are in git history), with the
# date and the machine it was measured on appended.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
bazel build //bench:channel_bench //host-backend:vsocketd 2>&1 | tail -1
out=bench/results/channel-latest.md
bazel-bin/bench/channel_bench bazel-bin/host-backend/vsocketd --iters "${ITERS:-100000}" --out "$out"
{
  echo
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "machine: $(uname -n), $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1), $(nproc) CPUs, Linux $(uname -r)"
} >>"$out"
echo "saved $out"
