# hostB's vsocketd restarted: idle (the link comes back), and killed or
# stopped under load (bulk_and_rr: suite.sh). With the drain, the move and
# the link count, the suite's last cases.

case_peer_restart() {
  local name=peer_backend_restart_relinks c0
  wait_link_up  # after the previous cut (else the restart meets a backoff)
  c0=$(link_field hostA connects)
  if ! bash $TB restart hostB >"$WORK/restart.log" 2>&1; then
    fail $name "restart: $(tail -3 "$WORK/restart.log" | tr '\n' ' ')"
    return
  fi
  local c1 l1
  c1=$(link_field hostA connects)
  l1=$(link_field hostA losses)
  [ "$c1" -gt "$c0" ] && [ "$l1" -ge 1 ] || { fail $name "hostA saw connects $c0 -> $c1, losses $l1"; return; }
  fabric_xfer after_restart vmA1 vmB1 "$B1" 2 2097152 "$(alloc_port)" ||
    { fail $name "new connections not accelerated after relink: $XFER_MSG"; return; }
  pass "$name (hostB's vsocketd restarted: hostA noticed the loss, relinked with backoff, new connections accelerate again)"
}

# hostB's vsocketd dies (KILL) or is stopped (TERM) in the middle of a
# byte-checked stream and request/response connections from vmA1 to vmB1,
# then starts again. hostB's guests lose their backend, hostA's lose the
# link: both sides finish on kernel TCP (RESYNC) without an error, and the
# request/response connections re-upgrade over the new link. SIGTERM drains
# first: every connection leaves the rings with clean fences across the
# link, so no byte is resent.
case_remote_daemon_restart() {  # case_remote_daemon_restart SIG
  local sig=$1 port name=cross_daemon_restart_${1,,} conns=4
  port=$(alloc_port 2)
  wait_link_up
  bulk_and_rr $name $port $conns
  if ! bash $TB restart hostB "$sig" >"$WORK/$name.restart" 2>&1; then
    fail $name "restart: $(tail -3 "$WORK/$name.restart" | tr '\n' ' ')"
    bulk_and_rr_kill
    return
  fi
  bulk_and_rr_wait $name || { fail $name "$E2E_MSG"; return; }
  local out out2
  # SIGTERM drains first (across the link too): nothing resent.
  local clean=()
  [ "$sig" = TERM ] && clean=(--no-resend)
  out=$(python3 $CHECK "$WORK/$name.bulk.jsonl" --port $port --expect-conns 2 --resynced "${clean[@]}") ||
    { fail $name "bulk: $out"; return; }
  out2=$(python3 $CHECK "$WORK/$name.rr.jsonl" --port $((port + 1)) --expect-conns $((2 * conns)) --reupgraded "${clean[@]}") ||
    { fail $name "request/response: $out2"; return; }
  pass "$name (hostB's vsocketd SIG$sig mid-transfer and restarted: 1 GiB stream byte-exact ($out); $conns request/response connections byte-exact and re-upgraded over the new link ($out2))"
}

register_case peer_backend_restart_relinks case_peer_restart
register_case cross_daemon_restart_kill case_remote_daemon_restart KILL
register_case cross_daemon_restart_term case_remote_daemon_restart TERM
