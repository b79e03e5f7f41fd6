# The end-to-end runner's library (tests/e2e/run.sh; sourced after
# tests/e2e/lib.sh): the case registry, the port allocator, and the run of
# one suite.
#
# A suite is a directory tests/e2e/SUITE/ with
#   suite.sh   sourced first: TB (its bed script), WORK_PREFIX (of the
#              scratch directory's name), SUITE_VMS (the VMs alloc_port
#              looks into), the helpers several groups use, and the hooks
#              suite_prepare (exports; may change REQUIRED, the files that
#              must exist), suite_setup (brings the bed up; on failure calls
#              fail and returns non-zero), suite_finish (after the last
#              case), suite_cleanup (at exit, after e2e_cleanup);
#   NN_*.sh    the groups of cases, sourced in name order, which is the run
#              order: each defines its case functions and registers them
#              with register_case. Sourcing one starts nothing: every
#              address, port and file is looked up or made when a case runs.
# A case function prints exactly one PASS or FAIL line (pass/fail, lib.sh).

CASE_NAMES=()                # registration order, which is the run order
declare -A CASE_CMD=()       # name -> the command (shell-quoted)
declare -A CASE_GROUP=()     # name -> its group (NN_topic)
declare -A CASE_NEEDS=()     # name -> cases it judges the aftermath of
declare -A GROUP_TEARDOWN=() # group -> functions to run after its last case
CURRENT_GROUP=""             # the group file being sourced

# register_case NAME FUNCTION [ARGS...]: the case NAME is FUNCTION ARGS
# (which prints NAME's PASS or FAIL line).
register_case() {
  local name=$1
  shift
  if [ -n "${CASE_CMD[$name]+x}" ]; then
    echo "register_case: $name registered twice ($CURRENT_GROUP)" >&2
    exit 2
  fi
  CASE_NAMES+=("$name")
  CASE_CMD[$name]=$(printf '%q ' "$@")
  CASE_GROUP[$name]=$CURRENT_GROUP
}

# case_needs NAME CASE...: NAME judges what the cases CASE... (registered
# before it) leave behind (the daemon's counters, its fallbacks): a run that
# selects NAME runs them too.
case_needs() {
  local name=$1
  shift
  CASE_NEEDS[$name]="$*"
}

# group_teardown FUNCTION: FUNCTION runs after the last case of this group
# that a run selected (e.g. removes a file its cases made lazily and share).
group_teardown() {
  GROUP_TEARDOWN[$CURRENT_GROUP]+="$1 "
}

# with_env VAR=VALUE... FUNCTION [ARGS...]: FUNCTION ARGS with those
# variables set and exported while it runs, as `VAR=VALUE FUNCTION ARGS`
# would (for register_case, which takes a function first).
with_env() {
  while [[ $1 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do
    local -x "$1"
    shift
  done
  "$@"
}

# alloc_port [N]: the first of N consecutive TCP ports (default 1) that no
# earlier alloc_port of this run handed out and that no socket (listening,
# connected, TIME_WAIT) in any of the bed's VMs (SUITE_VMS) has as its local
# port, counting up from E2E_PORT_BASE (default 7100; below the ephemeral
# range); prints it. Works in a command substitution: the next port to try
# is kept in $WORK/next_port.
alloc_port() {
  local n=${1:-1} p k free used vm
  p=$(cat "$WORK/next_port" 2>/dev/null) || p=${E2E_PORT_BASE:-7100}
  used=" $(for vm in "${SUITE_VMS[@]}"; do bash $TB exec "$vm" ss -Htan 2>/dev/null; done |
    awk '{sub(/.*:/, "", $4); print $4}' | sort -un | tr '\n' ' ') "
  while :; do
    if [ $((p + n - 1)) -gt 32767 ]; then
      echo "alloc_port: no $n free consecutive port(s) left below 32768" >&2
      return 1
    fi
    free=1
    for ((k = p; k < p + n; k++)); do
      if [[ $used == *" $k "* ]]; then
        free=0
        p=$((k + 1))
        break
      fi
    done
    [ $free -eq 1 ] && break
  done
  echo $((p + n)) >"$WORK/next_port"
  echo "$p"
}

suite_usage() {
  cat >&2 <<'USAGE'
usage: tests/e2e/run.sh same_host|cross_host [-l] [-t REGEX] [-x REGEX] [BIN_DIR]
  -l        list the case names (those -t selects, with the cases they
            need), one a line, in run order; nothing is started
  -t REGEX  run only the cases whose name matches REGEX (bash ERE; anchor
            it: '^redis$'), plus the cases they need (case_needs)
  -x REGEX  leave out the cases whose name matches REGEX (after -t; a case
            another one needs still runs)
  BIN_DIR   Bazel output (default bazel-out/k8-opt/bin, from the repository root)
Sets the bed up once, runs the selected cases in order, takes the bed down;
prints PASS/FAIL per case and ends with "N passed, N failed". Cases listed
in tests/e2e/known_failures.txt print SKIP instead (", N skipped" is added)
unless E2E_RUN_KNOWN=1.
USAGE
  exit "${1:-2}"
}

# suite_args ARGS...: SUITE, CASE_REGEX, LIST_ONLY, BIN_ARG from the
# command line (suite_usage on a mistake).
suite_args() {
  SUITE="" CASE_REGEX="" SKIP_REGEX="" LIST_ONLY=0 BIN_ARG=""
  while [ $# -gt 0 ]; do
    case $1 in
      -l) LIST_ONLY=1 ;;
      -t) [ $# -ge 2 ] || suite_usage; CASE_REGEX=$2; shift ;;
      -x) [ $# -ge 2 ] || suite_usage; SKIP_REGEX=$2; shift ;;
      -h | --help) suite_usage 0 ;;
      -*) suite_usage ;;
      *)
        if [ -z "$SUITE" ]; then
          SUITE=$1
        elif [ -z "$BIN_ARG" ]; then
          BIN_ARG=$1
        else
          suite_usage
        fi
        ;;
    esac
    shift
  done
  [ -n "$SUITE" ] && [ -f "tests/e2e/$SUITE/suite.sh" ] || suite_usage
}

# suite_select: SELECTED, the registered cases CASE_REGEX matches and
# SKIP_REGEX does not, and the cases they need, in registration order.
suite_select() {
  local _ss_name _ss_dep _ss_more=1
  local -A _ss_want=()
  for _ss_name in "${CASE_NAMES[@]}"; do
    if [ -n "$SKIP_REGEX" ] && [[ $_ss_name =~ $SKIP_REGEX ]]; then continue; fi
    if [ -z "$CASE_REGEX" ] || [[ $_ss_name =~ $CASE_REGEX ]]; then _ss_want[$_ss_name]=1; fi
  done
  while [ $_ss_more -eq 1 ]; do
    _ss_more=0
    for _ss_name in "${!_ss_want[@]}"; do
      for _ss_dep in ${CASE_NEEDS[$_ss_name]:-}; do
        if [ -z "${CASE_CMD[$_ss_dep]+x}" ]; then
          echo "case_needs: $_ss_name needs $_ss_dep, which is not registered" >&2
          exit 2
        fi
        [ -n "${_ss_want[$_ss_dep]:-}" ] || { _ss_want[$_ss_dep]=1; _ss_more=1; }
      done
    done
  done
  SELECTED=()
  for _ss_name in "${CASE_NAMES[@]}"; do
    [ -z "${_ss_want[$_ss_name]:-}" ] || SELECTED+=("$_ss_name")
  done
}

# Known failures: tests/e2e/known_failures.txt names cases that fail with
# today's code (a bug found, not yet fixed), one case name a line, then a
# comment saying why ("name  # why"; lines that are blank or start with #
# say nothing). A run prints `SKIP name (known failure: why)` for such a
# case instead of running it and counts it neither passed nor failed;
# E2E_RUN_KNOWN=1 runs them anyway (with -t: the one case to reproduce).
KNOWN_FAILURES_FILE=tests/e2e/known_failures.txt
declare -A KNOWN_FAILURE=()  # name -> why (suite_known_failures)

# suite_known_failures: KNOWN_FAILURE from KNOWN_FAILURES_FILE (the names of
# other suites' cases are harmless: they are never selected here).
suite_known_failures() {
  local _kf_line _kf_name _kf_why
  [ -f "$KNOWN_FAILURES_FILE" ] || return 0
  while IFS= read -r _kf_line || [ -n "$_kf_line" ]; do
    [[ $_kf_line =~ ^[[:space:]]*(#|$) ]] && continue
    _kf_name=${_kf_line%%#*}
    _kf_name=${_kf_name//[[:space:]]/}
    _kf_why=""
    [[ $_kf_line == *"#"* ]] && _kf_why=${_kf_line#*#}
    _kf_why=${_kf_why#"${_kf_why%%[![:space:]]*}"}
    KNOWN_FAILURE[$_kf_name]=${_kf_why:-listed in $KNOWN_FAILURES_FILE}
  done <"$KNOWN_FAILURES_FILE"
}

# suite_skips NAME: true if NAME is a known failure this run skips.
suite_skips() {
  [ -n "${KNOWN_FAILURE[$1]+x}" ] && [ "${E2E_RUN_KNOWN:-0}" != 1 ]
}

# suite_run: after suite.sh and the groups are sourced (run.sh) and
# suite_args: lists, or sets the bed up, runs the selected cases, tears down.
suite_run() {
  local _sr_i _sr_name _sr_next _sr_f _sr_torun=0 _sr_t0 _sr_times=()
  suite_select
  if [ "$LIST_ONLY" -eq 1 ]; then
    [ ${#SELECTED[@]} -eq 0 ] || printf '%s\n' "${SELECTED[@]}"
    exit 0
  fi
  if [ ${#SELECTED[@]} -eq 0 ]; then
    echo "no $SUITE case matches '$CASE_REGEX' (tests/e2e/run.sh $SUITE -l lists them)"
    echo "0 passed, 0 failed"
    exit 1
  fi
  suite_known_failures
  skipped=0
  for _sr_name in "${SELECTED[@]}"; do suite_skips "$_sr_name" || _sr_torun=$((_sr_torun + 1)); done
  if [ "$_sr_torun" -eq 0 ]; then
    # Nothing to run: no bed.
    for _sr_name in "${SELECTED[@]}"; do
      echo "SKIP $_sr_name (known failure: ${KNOWN_FAILURE[$_sr_name]})"
    done
    echo "0 passed, 0 failed, ${#SELECTED[@]} skipped (known failures; E2E_RUN_KNOWN=1 runs them)"
    exit 0
  fi
  BIN=$(realpath "${BIN_ARG:-bazel-out/k8-opt/bin}")
  LIB=$BIN/guest/libvsocket.so
  XFER=$BIN/tests/e2e/xfer
  CHECK=tests/e2e/check_report.py
  passed=0
  failed=0
  PIDS=()
  REQUIRED=("$LIB" "$XFER" "$BIN/host-backend/vsocketd")
  suite_prepare
  for _sr_f in "${REQUIRED[@]}"; do
    [ -e "$_sr_f" ] || { echo "missing $_sr_f (build first)"; echo "0 passed, 1 failed"; exit 1; }
  done
  WORK=$(mktemp -d "/tmp/$WORK_PREFIX-XXXXXX")
  trap 'e2e_cleanup; suite_cleanup' EXIT  # e2e_cleanup: tests/e2e/lib.sh
  [ -z "$CASE_REGEX$SKIP_REGEX" ] || echo "== $SUITE: ${#SELECTED[@]} of ${#CASE_NAMES[@]} cases: ${SELECTED[*]}"
  if ! suite_setup; then
    echo "$passed passed, $failed failed"
    exit 1
  fi
  for ((_sr_i = 0; _sr_i < ${#SELECTED[@]}; _sr_i++)); do
    _sr_name=${SELECTED[_sr_i]}
    if suite_skips "$_sr_name"; then
      echo "SKIP $_sr_name (known failure: ${KNOWN_FAILURE[$_sr_name]})"
      skipped=$((skipped + 1))
    else
      _sr_t0=$SECONDS
      eval "${CASE_CMD[$_sr_name]}"
      _sr_times+=("$((SECONDS - _sr_t0)) $_sr_name")
    fi
    _sr_next=${SELECTED[_sr_i + 1]:-}
    if [ -z "$_sr_next" ] || [ "${CASE_GROUP[$_sr_next]}" != "${CASE_GROUP[$_sr_name]}" ]; then
      for _sr_f in ${GROUP_TEARDOWN[${CASE_GROUP[$_sr_name]}]:-}; do "$_sr_f"; done
    fi
  done
  suite_finish
  # Where the suite's time goes (CI has a time limit): the ten slowest cases.
  echo "TIME $SUITE: ${SECONDS}s in all; slowest: $(printf '%s\n' "${_sr_times[@]}" | sort -rn | head -10 |
    awk '{printf "%s%s %ss", (NR > 1 ? ", " : ""), $2, $1}')"
  if [ "$skipped" -gt 0 ]; then
    echo "$passed passed, $failed failed, $skipped skipped (known failures; E2E_RUN_KNOWN=1 runs them)"
  else
    echo "$passed passed, $failed failed"
  fi
  [ "$failed" -eq 0 ]
}
