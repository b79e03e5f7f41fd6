#!/usr/bin/env bash
# End-to-end tests between two hosts (deploy/testbed2.sh): real applications
# in VMs on different hypervisors, each attached to its own vsocketd, the two
# backends linked by the tcp fabric over TLS-authenticated peering.
# The cases are in tests/e2e/cross_host/ (a file per group); this runs them
# all, or some (-t REGEX, -x REGEX leaves out; -l lists them), through
# tests/e2e/run.sh:
#
#   tests/e2e/cross_host.sh [-l] [-t REGEX] [-x REGEX] [BIN_DIR]     BIN_DIR: Bazel output (default bazel-out/k8-opt/bin)
#
# VSOCKET_TESTBED2_LOCATOR=etcd runs the whole suite with the etcd
# directory as the locator (no locator file; tests/run_all.sh runs it both
# ways).
#
# Prints PASS/FAIL per case and ends with "N passed, N failed".
exec bash "$(dirname "$0")/run.sh" cross_host "$@"
