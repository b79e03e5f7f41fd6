# Socket semantics, black box (tests/socket), with and without the library.

# case_semantics plain|preload|preload_polling|preload_sleeping|
# preload_default|preload_backend: preload_polling and preload_sleeping force
# either way of waiting (guest/core/cpu_share.h picks one by the machine's
# CPUs; both must behave the same); preload_default runs under the default
# upgrade policy, where short request/response connections stay on kernel
# TCP (held) and epoll changes on them are deferred (decision 61). vm1 and
# vm2 are one tenant's: their accelerated pairs are direct (decision 102),
# except under preload_backend, which runs the suite through vsocketd.
case_semantics() {
  local tag=$1 how=$1 name=socket_semantics_$1 port
  port=$(alloc_port)
  local -a env=()
  case $tag in
    preload_polling) how=preload env=(VSOCKET_POLL_AUTO=0) ;;
    preload_sleeping) how=preload env=(VSOCKET_POLL_US=0 VSOCKET_POLL_MAX_US=0) ;;
    preload_default) how=preload env=(VSOCKET_UPGRADE=auto) ;;  # what a user gets: held connections
    # vsocketd's own path: no direct pairs (every other preload run has
    # them between vm1 and vm2, the product's default: decision 102).
    preload_backend) how=preload env=(VSOCKET_DIRECT=0) ;;
  esac
  local bin=$BIN/tests/socket/socket_semantics_test peer=$BIN/tests/socket/socket_peer
  [ -x "$bin" ] || { fail "$name" "missing $bin"; return; }
  local kv
  for kv in "${env[@]}"; do export "$kv"; done
  vm_bg vm2 "$how" "$WORK/sem-$tag.jsonl" "$WORK/sem-$tag.jsonl.log" "$peer" "$A2" "$port"
  local srv=$BG
  wait_for_text "$WORK/sem-$tag.jsonl.log" listening 50
  VSOCKET_TEST_ADDR=$A1 VSOCKET_TEST_PEER_ADDR=$A2 VSOCKET_TEST_PEER_PORT=$port \
    vm_run vm1 "$how" "$WORK/sem-$tag.jsonl" "$bin" --gtest_brief=${E2E_GTEST_BRIEF:-1} >"$WORK/sem-$tag.log" 2>&1
  local rc=$?
  for kv in "${env[@]}"; do unset "${kv%%=*}"; done
  export VSOCKET_UPGRADE=always  # (lib.sh's, unset above for preload_default)
  kill "$srv" 2>/dev/null
  wait "$srv" 2>/dev/null
  local summary
  summary=$(grep -E "^\[  (PASSED|FAILED)  \]" "$WORK/sem-$tag.log" | tr '\n' ' ')
  if [ $rc -ne 0 ]; then
    # (what failed, with gtest's own words: CI keeps only this line)
    fail "$name" "$summary $(grep -E '^\[  FAILED  \] [A-Z]' "$WORK/sem-$tag.log" | head -5 | tr '\n' ' ') \
$(grep -A5 -E ': Failure$' "$WORK/sem-$tag.log" | head -12 | tr '\n' ' ')"
    return
  fi
  if [ "$how" = preload ]; then
    local out
    if ! out=$(python3 $CHECK "$WORK/sem-$tag.jsonl" --accel-min 0); then
      fail "$name" "$out"
      return
    fi
    local accel direct
    accel=$(grep -c '"mode":"accelerated"' "$WORK/sem-$tag.jsonl")
    direct=$(grep -c '"path":"direct"' "$WORK/sem-$tag.jsonl")
    # Under --upgrade always every accelerated pair is direct, unless the
    # run takes none (preload_backend).
    if [ "$tag" = preload_backend ] && [ "$direct" != 0 ]; then
      fail "$name" "$direct connection ends direct with VSOCKET_DIRECT=0"
      return
    fi
    if [ "$tag" = preload ] && [ "$direct" -lt 100 ]; then
      fail "$name" "only $direct connection ends direct (the default between vm1 and vm2)"
      return
    fi
    pass "$name ($summary; $accel connections accelerated, $direct ends direct)"
  else
    pass "$name ($summary)"
  fi
}

register_case socket_semantics_plain case_semantics plain
register_case socket_semantics_preload case_semantics preload
register_case socket_semantics_preload_polling case_semantics preload_polling
register_case socket_semantics_preload_sleeping case_semantics preload_sleeping
register_case socket_semantics_preload_default case_semantics preload_default
register_case socket_semantics_preload_backend case_semantics preload_backend
