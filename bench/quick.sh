#!/usr/bin/env bash
# The do-no-harm guard (bench/quick.py): vSocket vs kernel TCP on the
# same-host test bed, about a minute, builds nothing. Last line:
# "quick-bench: OK" or "quick-bench: REGRESSION <metric>, ...".
#   bench/quick.sh [--bin BAZEL_BIN] [--reps N] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 bench/quick.py "$@"
