# shellcheck shell=bash
# shellcheck disable=SC2015  # "A && B || die" is meant: die when A or B fails
# Helpers shared by the test beds, deploy/testbed.sh (one host) and
# deploy/testbed2.sh (two hosts). Sourced, never run. The sourcing script sets
# BED_NAME (the prefix of its messages: "testbed", "testbed2") and REPO_ROOT
# first.
#
# A bed's daemon is identified by a PID file and by its control socket: a PID
# counts as "this bed's vsocketd" only while it is alive (not a zombie), and
# its argv names vsocketd and carries that --ctl path. Nothing here kills a
# process that does not pass that test.

NETNS_RUN_DIR=/run/netns

# --- messages ---------------------------------------------------------------

die() {
  echo "$BED_NAME: error: $*" >&2
  exit 1
}
warn() { echo "$BED_NAME: warning: $*" >&2; }
say() { echo "$BED_NAME: $*" >&2; }

# --- names ------------------------------------------------------------------

ns_exists() { [ -e "$NETNS_RUN_DIR/$1" ] && ip netns list | awk '{print $1}' | grep -qx -- "$1"; }
link_exists() { ip link show dev "$1" >/dev/null 2>&1; }

# bin_path VAR DEFAULT HINT: the binary named by $VAR (else DEFAULT), relative
# paths taken from the repository root ($REPO_ROOT); dies with HINT (how to
# build it) if it is not an executable file.
bin_path() {
  local b=${!1:-$2}
  case $b in /*) ;; *) b="$REPO_ROOT/$b" ;; esac
  [ -x "$b" ] && [ -f "$b" ] || die "binary not found or not executable: $b ($3, or set $1)"
  echo "$b"
}

# --- processes --------------------------------------------------------------

pid_alive() { # running and not a zombie
  local st
  [ -r "/proc/$1/stat" ] || return 1
  st=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}

# pid_is_our_daemon PID CTL_SOCK: its argv must name vsocketd and carry CTL_SOCK.
pid_is_our_daemon() {
  local pid=$1 args
  pid_alive "$pid" || return 1
  args=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  grep -q vsocketd <<<"$args" && grep -qxF -- "$2" <<<"$args"
}

# read_pid_file FILE: the PID it records (fails if none or malformed).
read_pid_file() {
  local pid
  [ -f "$1" ] || return 1
  pid=$(head -n 1 "$1" 2>/dev/null | tr -d '[:space:]')
  [[ $pid =~ ^[1-9][0-9]*$ ]] || return 1
  echo "$pid"
}

# daemon_pid PID_FILE CTL_SOCK: prints the PID if it is this bed's running vsocketd.
daemon_pid() {
  local pid
  pid=$(read_pid_file "$1") || return 1
  pid_is_our_daemon "$pid" "$2" || return 1
  echo "$pid"
}

wait_dead() { # wait_dead PID SECONDS
  local pid=$1 i
  for ((i = 0; i < $2 * 10; i++)); do
    pid_alive "$pid" || return 0
    sleep 0.1
  done
  ! pid_alive "$pid"
}

# stop_daemon PID_FILE CTL_SOCK [SIGNAL [SECONDS]]: sends SIGNAL (TERM) to the
# daemon the file records, SIGKILL if it is still there after SECONDS (5).
# Returns 0 if it stopped a daemon, 1 if there was none to stop (no PID, PID
# gone, or not this bed's vsocketd: then it warns and leaves it alone).
stop_daemon() {
  local pid sig=${3:-TERM} secs=${4:-5}
  pid=$(read_pid_file "$1") || return 1
  pid_alive "$pid" || return 1
  if ! pid_is_our_daemon "$pid" "$2"; then
    warn "PID $pid from $1 is not this bed's vsocketd; not killing it"
    return 1
  fi
  kill "-$sig" "$pid" 2>/dev/null || true
  if ! wait_dead "$pid" "$secs"; then
    warn "vsocketd (PID $pid) still running ${secs}s after SIG$sig; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    wait_dead "$pid" 2 || warn "vsocketd (PID $pid) did not exit after SIGKILL"
  fi
  # Reap it if it is our own child (only when 'up' fails in the same shell).
  wait "$pid" 2>/dev/null || true
  return 0
}

log_tail() { # log_tail FILE [LINES]
  echo "---- last lines of $1 ----" >&2
  tail -n "${2:-40}" "$1" >&2 2>/dev/null || true
  echo "----" >&2
}
