# The host that connects (hostA: its name sorts first) decides how many
# links the pair runs; hostB, configured for another count, follows it.
# Last: hostA runs 3 links from here on (cross_links_spread wants
# VSOCKET_TESTBED2_LINKS).
case_link_count_follows_initiator() {
  local name=link_count_follows_initiator n
  if ! VSOCKET_LINKS_PER_PEER=3 bash $TB restart hostA >"$WORK/restart3.log" 2>&1; then
    fail $name "restart: $(tail -3 "$WORK/restart3.log" | tr '\n' ' ')"
    return
  fi
  for h in hostA hostB; do
    n=$(link_field $h links)
    [ "$n" = 3 ] || { fail $name "$h runs $n links, want 3 (hostA's links_per_peer)"; return; }
  done
  grep -q "runs 3 link(s) per host pair, this host's links_per_peer is $VSOCKET_TESTBED2_LINKS" \
    "$VSOCKET_TESTBED2_DIR/hostB/vsocketd.log" || { fail $name "hostB did not log the count it follows"; return; }
  fabric_xfer three_links vmA1 vmB1 "$B1" 6 2097152 "$(alloc_port)" ||
    { fail $name "not accelerated over 3 links: $XFER_MSG"; return; }
  pass "$name (hostA restarted with links_per_peer = 3, hostB configured for $VSOCKET_TESTBED2_LINKS: both run 3; $XFER_MSG)"
}

register_case link_count_follows_initiator case_link_count_follows_initiator
