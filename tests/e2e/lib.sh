# Shared by the end-to-end suites (same_host.sh, cross_host.sh,
# tests/rdma/cross_host_guest.sh). The caller sets TB (its test bed script,
# with `exec VM CMD...` and `down`), LIB (libvsocket.so), WORK (a scratch
# directory), passed=0, failed=0 and PIDS=().

# For `trap e2e_cleanup EXIT`: stops the background processes we started,
# takes the test bed down, removes WORK.
e2e_cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  bash $TB down >/dev/null 2>&1
  rm -rf "$WORK"
}

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

# Two-host bed (deploy/testbed2.sh): the fabric link is cut for SECONDS.
# hostB's kernel answers every segment hostA sends to the peering port
# (7300: TLS and tcp link; hostA is the side that connects) with an RST, so
# hostA's sockets die at its next segment; hostB learns from its own
# sends, or when hostA reconnects. Then the rule goes away.
cut_link() { # cut_link SECONDS
  local ns=${VSOCKET_TESTBED2_NS_PREFIX:-vs2}hostB
  ip netns exec "$ns" nft -f - <<'NFT'
table inet vsocket_fault {
  chain in { type filter hook input priority 0; tcp dport 7300 reject with tcp reset; }
}
NFT
  sleep "$1"
  ip netns exec "$ns" nft delete table inet vsocket_fault
}
