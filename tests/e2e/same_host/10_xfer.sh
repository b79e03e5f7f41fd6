# Accelerated transfers: xfer's byte-checked streams from vm1 to vm2 (one
# connection, 64, a process per connection, without the doorbell), the
# doorbell negotiated with the default library only, and a sender killed
# right after its last write.

case_xfer() {  # name conns bytes extra-server-args
  local name=$1 conns=$2 bytes=$3 port
  shift 3
  port=$(alloc_port)
  local rep=$WORK/$name.jsonl
  local before path=direct
  # (Direct pairs by default between vm1 and vm2, one tenant's: decision 102.)
  [ "${VSOCKET_DIRECT:-1}" != 0 ] || path=backend
  before=$(moved_bytes)
  vm_bg vm2 preload "$rep" "$WORK/$name.srv" "$XFER" server "$A2" "$port" --conns "$conns" "$@"
  local srv=$BG
  if ! vm_run vm1 preload "$rep" "$XFER" client "$A2" "$port" --conns "$conns" --bytes "$bytes" >"$WORK/$name.cli" 2>&1; then
    fail "$name" "client: $(tail -2 "$WORK/$name.cli" | tr '\n' ' ')"
    kill "$srv" 2>/dev/null
    return
  fi
  if ! wait "$srv"; then
    fail "$name" "server: $(tail -2 "$WORK/$name.srv" | tr '\n' ' ')"
    return
  fi
  local out
  if ! out=$(python3 $CHECK "$rep" --port "$port" --expect-conns $((2 * conns)) --mode accelerated \
      --reason accelerated --accel-min 1 --exact-total $((bytes + 16)) --path $path); then
    fail "$name" "$out"
    return
  fi
  local moved
  moved=$(wait_moved "$before" $((conns * bytes)))
  if [ "$moved" -lt $((conns * bytes)) ]; then
    fail "$name" "vsocketd counted only $moved B on the accelerated path ($path)"
    return
  fi
  pass "$name ($conns conns x $bytes B each way, byte-checked; $out; path $path, $moved B counted by vsocketd)"
}

# doorbell_negotiation reads the daemon's doorbell sessions before the first
# xfer case with the default library (DOORBELL_D0) and before and after
# xfer_without_doorbell (D1, D2), which comes after the others.
DOORBELL_D0="" DOORBELL_D1="" DOORBELL_D2=""
case_xfer_doorbell() {  # case_xfer's arguments
  [ -n "$DOORBELL_D0" ] || DOORBELL_D0=$(stat_field doorbell_sessions)
  case_xfer "$@"
}
# The same through vsocketd with the doorbell turned off in the library: one
# TX_TAIL and CONSUMED message per count, as an older library would send
# them.
case_xfer_without_doorbell() {  # case_xfer's arguments
  DOORBELL_D1=$(stat_field doorbell_sessions)
  VSOCKET_DOORBELL=0 through_vsocketd case_xfer "$@"
  DOORBELL_D2=$(stat_field doorbell_sessions)
}
case_doorbell_negotiation() {
  local d0=$DOORBELL_D0 d1=$DOORBELL_D1 d2=$DOORBELL_D2
  if [ "$d1" -ge $((d0 + 2)) ] && [ "$d2" = "$d1" ]; then
    pass "doorbell_negotiation (doorbell sessions: +$((d1 - d0)) with the default library, +0 with VSOCKET_DOORBELL=0; counts read from blocks: $(stat_field doorbell_counts))"
  else
    fail doorbell_negotiation "doorbell sessions $d0 -> $d1 (default, want +2 at least) -> $d2 (VSOCKET_DOORBELL=0, want +0)"
  fi
}

# A client killed right after writing: the server still gets every byte.
case_sender_killed() {
  local port
  port=$(alloc_port)
  if run_crash xfer_sender_killed vm1 vm2 "$A2" "$port" 33554432; then
    pass "xfer_sender_killed (server verified all 33554432 B and EOF after the client was SIGKILLed; $E2E_MSG)"
  else
    fail xfer_sender_killed "$E2E_MSG"
  fi
}

register_case xfer_one_connection case_xfer_doorbell xfer_one_connection 1 67108864
register_case xfer_64_connections case_xfer_doorbell xfer_64_connections 64 1048576
register_case xfer_fork_per_connection case_xfer_doorbell xfer_fork_per_connection 8 1048576 --fork
register_case xfer_through_vsocketd through_vsocketd case_xfer_doorbell xfer_through_vsocketd 4 33554432
register_case xfer_without_doorbell case_xfer_without_doorbell xfer_without_doorbell 4 8388608
register_case doorbell_negotiation case_doorbell_negotiation
case_needs doorbell_negotiation xfer_one_connection xfer_64_connections xfer_fork_per_connection xfer_through_vsocketd \
  xfer_without_doorbell
register_case xfer_sender_killed case_sender_killed
