# Shared by the end-to-end suites (same_host.sh, cross_host.sh). The caller
# sets TB (its test bed script, with an `exec VM CMD...` command), LIB
# (libvsocket.so), passed=0, failed=0 and PIDS=().

pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); }

# vm_run VM preload|plain REPORT CMD...: runs CMD in VM (bounded by 60 s).
vm_run() {
  local vm=$1 how=$2 report=$3
  shift 3
  if [ "$how" = preload ]; then
    VSOCKET_REPORT=$report LD_PRELOAD=$LIB bash $TB exec "$vm" timeout 60 "$@"
  else
    bash $TB exec "$vm" timeout 60 "$@"
  fi
}

# vm_bg VM how REPORT LOG CMD...: the same in the background; PID in $BG.
# Started directly (not through vm_run in a subshell) so that $BG is the
# bounded `timeout` process itself (the test bed script and ip netns exec
# exec into it), and killing it stops the server.
vm_bg() {
  local vm=$1 how=$2 report=$3 log=$4
  shift 4
  if [ "$how" = preload ]; then
    VSOCKET_REPORT=$report LD_PRELOAD=$LIB bash $TB exec "$vm" timeout 60 "$@" >"$log" 2>&1 &
  else
    bash $TB exec "$vm" timeout 60 "$@" >"$log" 2>&1 &
  fi
  BG=$!
  PIDS+=("$BG")
}
