#!/usr/bin/env bash
# End-to-end tests on the same-host test bed (deploy/testbed.sh): real
# applications between "VMs" (network namespaces) attached to one vsocketd.
# The cases are in tests/e2e/same_host/ (a file per group); this runs them
# all, or some (-t REGEX; -l lists them), through tests/e2e/run.sh:
#
#   tests/e2e/same_host.sh [-l] [-t REGEX] [BIN_DIR]     BIN_DIR: Bazel output (default bazel-out/k8-opt/bin)
#
# Prints PASS/FAIL per case and ends with "N passed, N failed".
exec bash "$(dirname "$0")/run.sh" same_host "$@"
