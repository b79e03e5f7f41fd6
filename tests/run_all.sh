#!/usr/bin/env bash
# The full vSocket test suite, as CI runs it:
#   1. the optimized build of every target, and the tests outside the unit
#      directories (integration against the real rte_vhost backend, the
#      etcd directory against a real etcd, the socket semantics, the
#      red-team suite);
#   2. the unit tests (UNIT_TARGETS) under AddressSanitizer, once: not again
#      in the optimized build (decision 115), the ring tests under
#      ThreadSanitizer;
#   3. each libFuzzer target for a bounded time from its seed corpus;
#   4. the end-to-end suites on the same-host test bed (tests/e2e/same_host.sh)
#      and on the two-host test bed (tests/e2e/cross_host.sh, tcp fabric),
#      the latter with a locator file, then its directory cases and one
#      case of each pairing path again with the etcd directory (decision 121);
#   5. VM mode: QEMU TCG guests attached to vsocketd (tests/vm/vm_mode.sh),
#      and their live migration between two vsocketds (tests/vm/migrate.sh,
#      and, with VSOCKET_VM_MIGRATE_HOSTS=1, between the two-host bed's hosts:
#      tests/vm/migrate_hosts.sh);
#   6. the Debian packages: build, install, the demo from the installed files,
#      purge (tests/packaging/deb_test.sh).
# Prints one line per step and ends with "N passed, N failed", where N counts
# individual GoogleTest cases and fuzz runs.
set -uo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh || exit 1

FUZZ_SECONDS="${VSOCKET_FUZZ_SECONDS:-10}"  # decision 118
UNIT_TARGETS=(//base/... //proto/... //vhost/... //guest/... //host-backend/fabric/... //host-backend/peering/... //tests/hostile/...)
. tests/fuzz_targets.sh  # FUZZ_TARGETS
passed=0
failed=0
failures=()  # what failed, named again just above the last line
LOGDIR=$(mktemp -d /tmp/vsocket-tests-XXXXXX)
times=("deps ${SECONDS}s")  # "stage Ns": where the time went (CI stops a run at 90 min)
_mark=$SECONDS
# timed STAGE: adds the seconds since the last mark to the stage's account.
timed() {
  times+=("$1 $((SECONDS - _mark))s")
  _mark=$SECONDS
}

# Adds the GoogleTest case counts of every test.log under bazel-testlogs.
count_gtest() {
  local p f
  while IFS= read -r log; do
    p=$(grep -E '^\[  PASSED  \] [0-9]+ test' "$log" | tail -1 | awk '{print $4}')
    f=$(grep -E '^\[  FAILED  \] [0-9]+ test' "$log" | tail -1 | awk '{print $4}')
    if [ -z "$p" ] && [ -z "$f" ]; then
      # A GoogleTest target that crashed before printing a summary counts as
      # one failure; a test that is not GoogleTest (an sh_test) counts as one
      # test, passed if bazel's test.xml beside its log says so.
      if grep -q '^\[==========\]' "$log"; then
        :
      elif grep -q '^\[ RUN      \]' "$log"; then
        f=1
      elif grep -qs 'failures="0" errors="0"' "${log%.log}.xml"; then
        p=1
      else
        f=1
      fi
    fi
    passed=$((passed + ${p:-0}))
    failed=$((failed + ${f:-0}))
  done < <(find -L bazel-testlogs/ -name test.log -newer "$LOGDIR/stamp" 2>/dev/null)
}

# tally LOG TAG [KINDS]: a suite's verdict lines (KINDS, by default
# PASS|FAIL) printed as [TAG] ..., and the "N passed, M failed" of its last
# line added to the totals (a log without one counts as one failure: the
# suite died).
tally() {
  local log=$1 tag=$2 kinds=${3:-PASS|FAIL} p f
  grep -E "^($kinds) " "$log" | sed "s/^/[$tag] /"
  # (each with its own words, cut to 1,500 characters: CI keeps only the tail)
  while read -r line; do failures+=("[$tag] ${line:0:1500}"); done < <(grep -E '^FAIL ' "$log" | sed 's/^FAIL //')
  read -r p f < <(tail -1 "$log" | awk '/passed,/ {print $1, $3}')
  [ -n "${f:-}" ] || failures+=("[$tag] no summary: the suite died (see $log)")
  passed=$((passed + ${p:-0}))
  failed=$((failed + ${f:-1}))
}

run_bazel_tests() {  # label, bazel args...
  local label=$1
  shift
  touch "$LOGDIR/stamp"
  sleep 1
  if bazel test --nocache_test_results "$@" >"$LOGDIR/$label.log" 2>&1; then
    echo "[$label] bazel test: ok"
  else
    echo "[$label] bazel test: FAILED (see below)"
    grep -E "FAILED|NO STATUS|TIMEOUT|ERROR" "$LOGDIR/$label.log" | head -20
    while read -r t; do failures+=("[$label] $t"); done \
      < <(grep -E "^//.* (FAILED|NO STATUS|TIMEOUT)" "$LOGDIR/$label.log" | awk '{print $1}')
    if ! grep -q "Executed" "$LOGDIR/$label.log"; then
      tail -30 "$LOGDIR/$label.log"
      failures+=("[$label] bazel test ran nothing (see $LOGDIR/$label.log)")
      failed=$((failed + 1))
    fi
  fi
  count_gtest
}

# The unit directories' tests run under ASan only (decision 115: a second,
# optimized build of every unit test binary doubled the suite's compile time
# after a change under base/); their libraries are built here as the other
# targets' dependencies, the shipped binaries by the e2e step below. The
# red-team suite (tests/hostile) runs in both: only the optimized build can
# preload the library into beside_victim_test's victim (docs/security.md).
not_unit=()
for t in "${UNIT_TARGETS[@]}"; do [ "$t" = //tests/hostile/... ] || not_unit+=("-$t"); done
run_bazel_tests default -- //... "${not_unit[@]}"
timed default
run_bazel_tests asan --config=asan "${UNIT_TARGETS[@]}"
timed asan
run_bazel_tests tsan --config=tsan //vhost:ring_stress_test //vhost:ring_test //host-backend:registry_snapshot_test //base:mutex_test
timed tsan

if bazel build --config=fuzz "${FUZZ_TARGETS[@]%:*}" >"$LOGDIR/fuzz-build.log" 2>&1; then
  for spec in "${FUZZ_TARGETS[@]}"; do
    target=${spec%:*}
    corpus=${spec##*:}
    bin="bazel-bin/$(echo "${target#//}" | tr ':' '/')"
    work=$(mktemp -d "$LOGDIR/corpus-XXXXXX")
    if "$bin" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 "$work" "$corpus" \
        >"$LOGDIR/fuzz-$(basename "$bin").log" 2>&1; then
      echo "[fuzz] $target: ${FUZZ_SECONDS}s clean ($(grep -o 'Done [0-9]* runs' "$LOGDIR/fuzz-$(basename "$bin").log"))"
      passed=$((passed + 1))
    else
      echo "[fuzz] $target: CRASH"
      failures+=("[fuzz] $target")
      tail -30 "$LOGDIR/fuzz-$(basename "$bin").log"
      failed=$((failed + 1))
    fi
  done
else
  echo "[fuzz] build FAILED"
  failures+=("[fuzz] build")
  tail -30 "$LOGDIR/fuzz-build.log"
  failed=$((failed + 1))
fi
timed fuzz

# End-to-end on the same-host test bed (network namespaces, real vsocketd,
# real applications). Needs root for the namespaces. A failed case's files
# and the test bed's vsocketd logs are kept in $LOGDIR/failed/CASE
# (tests/e2e/lib.sh: keep_failure).
export E2E_FAIL_DIR=$LOGDIR/failed
if bazel build //host-backend:vsocketd //host-backend:vsocketctl //guest:libvsocket.so //tests/e2e:xfer //tests/socket:all \
    >"$LOGDIR/e2e-build.log" 2>&1; then
  timed e2e-build
  bash tests/e2e/same_host.sh "$(bazel info bazel-bin 2>/dev/null)" >"$LOGDIR/e2e.log" 2>&1
  tally "$LOGDIR/e2e.log" e2e
  timed e2e
  # The cross-host suite with a locator file (its etcd group runs in the
  # etcd pass below), then again with locator = etcd: no locator file, every
  # pairing placed by the directory (issue 38): the directory's own cases
  # and one case of each way a pairing is made or lost (decision 121;
  # VSOCKET_ETCD_PASS=full: the whole suite).
  bash tests/e2e/cross_host.sh -x '^etcd_' "$(bazel info bazel-bin 2>/dev/null)" >"$LOGDIR/e2e2.log" 2>&1
  tally "$LOGDIR/e2e2.log" e2e-cross-host
  timed cross-host
  etcd_cases=(-t '^(etcd_|testbed2_link_up|cross_xfer_|cross_redis|cross_tenant_stays_kernel|cross_link_loss_resync|cross_daemon_restart_kill)')
  [ "${VSOCKET_ETCD_PASS:-}" = full ] && etcd_cases=()
  VSOCKET_TESTBED2_LOCATOR=etcd bash tests/e2e/cross_host.sh "${etcd_cases[@]}" "$(bazel info bazel-bin 2>/dev/null)" \
    >"$LOGDIR/e2e2-etcd.log" 2>&1
  tally "$LOGDIR/e2e2-etcd.log" e2e-cross-host-etcd
  timed cross-host-etcd
else
  echo "[e2e] build FAILED"
  failures+=("[e2e] build")
  tail -30 "$LOGDIR/e2e-build.log"
  failed=$((failed + 1))
fi

# VM mode (issue 35): real QEMU TCG guests attached to vsocketd; the
# in-guest agent opens a session and serves processes, an unmodified
# program's connections inside a guest are accelerated (and survive a
# process killed mid-way, vsocketd killed or restarted), a foreign driver
# breaks only its device, a killed QEMU leaves vsocketd serving the port,
# VM to VM and VM to container (tests/vm/vm_mode.sh, about 4 minutes;
# needs root). (//guest/agent:libvsocket-vm.so is a name of
# //guest:libvsocket.so kept for the migration scripts: decision 108.)
if bazel build //host-backend:vsocketd //host-backend:vsocketctl //guest/agent:vsocket-guestd //guest/agent:vsocket-agent-probe \
    //guest/agent:libvsocket-vm.so //guest:libvsocket.so //tests/e2e:xfer //tests/integration:echo_client \
    >"$LOGDIR/vm-build.log" 2>&1; then
  timed vm-build
  bash tests/vm/vm_mode.sh --no-build >"$LOGDIR/vm.log" 2>&1
  tally "$LOGDIR/vm.log" vm
  timed vm
  # Live migration under load, guest memory compared page by page on
  # both sides; the comparison's negative control (decision 88); every
  # other ending: cancelled, failed on the destination, vsocketd killed on
  # the source, a destination without vsocketd, connections still on the
  # rings at the switchover (decisions 93, 94, 106, 107; about 4 min).
  bash tests/vm/migrate.sh --no-build >"$LOGDIR/vm-migrate.log" 2>&1
  tally "$LOGDIR/vm-migrate.log" vm
  timed vm-migrate
  # Between the two hosts of the two-host bed (tcp fabric, file locator):
  # a VM on each host, accelerated across the fabric (issue 35), and a VM
  # migrated there and back, with a peer that stays on hostA (same-host,
  # kernel TCP while copied, across the fabric, same-host again; the pairs
  # still on the rings at each switchover resynced at both ends: decision
  # 110), and one migrated while paused (decision 123), about 6 min. Under QEMU 10.0.2 from bookworm-backports
  # (tests/vm/install-qemu-backports.sh, decision 137): the system's 7.2
  # loses guest pages on this bed's migrations now and then, with or
  # without vSocket (2 of 6 migrations on 2026-12-02, 14:52 UTC, one guest
  # panicked; 0 in 16 under 10.0.2 on two machines that day).
  # VSOCKET_VM_MIGRATE_HOSTS=0 runs vm_across_hosts alone.
  if [ "${VSOCKET_VM_MIGRATE_HOSTS:-1}" = 1 ]; then
    if qemu_bin=$(bash tests/vm/install-qemu-backports.sh 2>>"$LOGDIR/vm-migrate-hosts.log"); then
      PATH=$qemu_bin:$PATH \
      bash tests/vm/migrate_hosts.sh --no-build vm_across_hosts migrate_hosts_there_and_back migrate_hosts_drain_unfinished migrate_hosts_while_paused \
        >>"$LOGDIR/vm-migrate-hosts.log" 2>&1
      tally "$LOGDIR/vm-migrate-hosts.log" vm "PASS|FAIL|RETRY"
    else
      echo "[vm] FAIL migrate_hosts: QEMU 10 from bookworm-backports could not be installed (see $LOGDIR/vm-migrate-hosts.log)"
      failures+=("[vm] migrate_hosts: QEMU 10 could not be installed")
      failed=$((failed + 1))
    fi
  else
    bash tests/vm/migrate_hosts.sh --no-build vm_across_hosts >"$LOGDIR/vm-migrate-hosts.log" 2>&1
    tally "$LOGDIR/vm-migrate-hosts.log" vm "PASS|FAIL|RETRY"
    echo "[vm] SKIP tests/vm/migrate_hosts.sh's migrations (VSOCKET_VM_MIGRATE_HOSTS=0)"
  fi
  timed vm-hosts
else
  echo "[vm] build FAILED"
  failures+=("[vm] build")
  tail -30 "$LOGDIR/vm-build.log"
  failed=$((failed + 1))
fi

# The Debian packages on this machine: build, dpkg -i, the same-host demo
# from the installed files only, dpkg --purge leaves nothing (needs root).
bash tests/packaging/deb_test.sh >"$LOGDIR/packaging.log" 2>&1
tally "$LOGDIR/packaging.log" packaging
timed packaging

# What failed, once more where a reader of the last lines alone sees it
# (CI shows only the tail of this output).
echo "time: ${SECONDS}s in all (${times[*]})"  # (each e2e suite's slowest cases: its TIME line in $LOGDIR)
for f in "${failures[@]}"; do echo "failed: $f"; done
echo "logs: $LOGDIR"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
