# vsocketctl drain vmB1 on hostB in the middle of a byte-checked stream and
# request/response connections from vmA1: hostB's guests leave the rings
# and hostA's follow over the link (SHUT_WR with the ring end), nothing is
# resent, the fabric carries no byte while drained; after undrain the
# request/response connections pair again across the link.
case_cross_drain() {
  local port name=cross_drain conns=4
  port=$(alloc_port 2)
  wait_link_up
  bulk_and_rr $name $port $conns
  local drained f0 f1 fabric='import json, sys
print(next(c["value"] for c in json.load(sys.stdin) if c["counter"] == "fabric_bytes_out"))'
  if ! drained=$(bash $TB ctl hostB drain vmB1 --wait 10 2>&1); then
    fail $name "vsocketctl drain vmB1 --wait 10: $drained"
    bash $TB ctl hostB undrain vmB1 >/dev/null 2>&1  # (the cases after this one)
    bulk_and_rr_kill
    return
  fi
  sleep 0.2
  f0=$(bash $TB ctl hostA counters --json | python3 -c "$fabric")
  sleep 0.5
  f1=$(bash $TB ctl hostA counters --json | python3 -c "$fabric")
  bash $TB ctl hostB undrain vmB1 >/dev/null || { fail $name "undrain failed"; bulk_and_rr_kill; return; }
  bulk_and_rr_wait $name || { fail $name "$E2E_MSG"; return; }
  [ "$f0" = "$f1" ] || { fail $name "$((f1 - f0)) B went over the fabric while vmB1 was drained"; return; }
  local out out2
  out=$(python3 $CHECK "$WORK/$name.bulk.jsonl" --port $port --expect-conns 2 --resynced --no-resend \
    --downgrade-cause operator) || { fail $name "bulk: $out"; return; }
  out2=$(python3 $CHECK "$WORK/$name.rr.jsonl" --port $((port + 1)) --expect-conns $((2 * conns)) --reupgraded \
    --no-resend --downgrade-cause operator) || { fail $name "request/response: $out2"; return; }
  pass "$name (vmB1 drained on hostB mid-transfer: ${drained%%$'\n'*}; hostA's ends followed over the link, no fabric byte while drained; 1 GiB stream byte-exact ($out); $conns request/response connections byte-exact and re-upgraded across the link after undrain ($out2))"
}

register_case cross_drain case_cross_drain
