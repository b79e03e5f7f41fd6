# Direct pairs (decision 97, issue 37): vsocketd restarted with direct =
# same-tenant for vm1 and vm2, then restarted as before. While it is on:
# xfer's byte-checked streams, where every connection end must report path
# direct and vsocketd must move no byte (accel_bytes unchanged) while it
# counts the pairs; and the whole socket-semantics suite, every pair direct.

# direct_restart on|off: vsocketd again, with or without direct pairs.
direct_restart() {
  if [ "$1" = on ]; then
    VSOCKET_VM_VM1_DIRECT=same-tenant VSOCKET_VM_VM2_DIRECT=same-tenant bash $TB restart TERM >"$WORK/direct-$1.restart" 2>&1
  else
    bash $TB restart TERM >"$WORK/direct-$1.restart" 2>&1
  fi
}

case_direct() {
  local name=direct_pairs conns=4 bytes=$((32 << 20)) port bad=""
  direct_restart on || { fail $name "restart with direct on: $(tail -1 "$WORK/direct-on.restart")"; direct_restart off; return; }
  port=$(alloc_port)
  local rep=$WORK/$name.jsonl pairs0 moved0 pairs1 moved1
  pairs0=$(stat_field direct_pairs)
  moved0=$(stat_field accel_bytes)
  vm_bg vm2 preload "$rep" "$WORK/$name.srv" "$XFER" server "$A2" "$port" --conns $conns
  local srv=$BG
  if ! vm_run vm1 preload "$rep" "$XFER" client "$A2" "$port" --conns $conns --bytes $bytes >"$WORK/$name.cli" 2>&1; then
    bad+="client: $(tail -2 "$WORK/$name.cli" | tr '\n' ' '); "
    kill "$srv" 2>/dev/null
  fi
  wait "$srv" || bad+="server: $(tail -2 "$WORK/$name.srv" | tr '\n' ' '); "
  pairs1=$(stat_field direct_pairs)
  moved1=$(stat_field accel_bytes)
  local out direct_ends
  out=$(python3 $CHECK "$rep" --port "$port" --expect-conns $((2 * conns)) --mode accelerated --reason accelerated \
    --accel-min 1 --exact-total $((bytes + 16))) || bad+="$out; "
  direct_ends=$(grep -c '"path":"direct"' "$rep")
  [ "$direct_ends" = $((2 * conns)) ] || bad+="$direct_ends of $((2 * conns)) ends report path direct; "
  [ $((pairs1 - pairs0)) -ge $conns ] || bad+="vsocketd counted $((pairs1 - pairs0)) direct pairs; "
  [ "$moved1" = "$moved0" ] || bad+="vsocketd moved $((moved1 - moved0)) B of direct pairs; "
  # The whole suite, every pair direct (its own PASS/FAIL line).
  case_semantics preload_direct
  local sem=$WORK/sem-preload_direct.jsonl sem_direct
  sem_direct=$(grep -c '"path":"direct"' "$sem" 2>/dev/null)
  [ "${sem_direct:-0}" -gt 100 ] || bad+="the semantics suite's ends on direct pairs: ${sem_direct:-0}; "
  direct_restart off || bad+="restart with direct off: $(tail -1 "$WORK/direct-off.restart"); "
  [ -z "$bad" ] || { fail $name "$bad"; return; }
  pass "$name ($conns conns x $bytes B each way byte-checked, $direct_ends ends path direct, vsocketd counted $((pairs1 - pairs0)) direct pairs and moved 0 B of them; semantics suite: $sem_direct ends direct)"
}

register_case direct_pairs case_direct
