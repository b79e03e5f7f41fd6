# Accelerated transfers across the fabric (one connection, 64, the other
# way), every link of the host pair used, a sender killed right after its
# last write; and testbed2_link_up, the bed's own case.

case_link_up() {
  pass "testbed2_link_up (hostA <-> hostB: TLS 1.3 mutual auth, $VSOCKET_TESTBED2_LINKS tcp fabric link(s) keyed by the TLS exporter)"
}

case_xfer() {  # case_xfer NAME CLIENT-VM SERVER-VM CONNS BYTES: fabric_xfer to SERVER-VM's address
  local port
  port=$(alloc_port)
  if fabric_xfer "$1" "$2" "$3" "$(addr_of "$3")" "$4" "$5" "$port"; then pass "$1 ($XFER_MSG)"; else fail "$1" "$XFER_MSG"; fi
}

# Every link of the host pair carried frames both ways (each connection
# sends on one link, consecutive connections on different ones).
case_links_spread() {
  local name=cross_links_spread out h
  for h in hostA hostB; do
    if ! out=$(bash $TB ctl $h --json stats 2>/dev/null | python3 -c "
import json, sys
l = json.load(sys.stdin)['links'][0]
want = $VSOCKET_TESTBED2_LINKS
per = l['link_frames_out']
ok = l['links'] == want and len(per) == want and all(n > 0 for n in per)
print(('' if ok else 'want %d links all used: ' % want) + 'links %d, frames out per link %s' % (l['links'], per))
sys.exit(0 if ok else 1)"); then
      fail $name "$h: $out"
      return
    fi
  done
  pass "$name (hostB $out)"
}

# A client killed right after writing: the remote server still gets every byte.
case_sender_killed() {
  local port
  port=$(alloc_port)
  if run_crash cross_sender_killed vmA1 vmB1 "$B1" "$port" 16777216; then
    pass "cross_sender_killed (remote server verified all 16777216 B and EOF after the client was SIGKILLed; $E2E_MSG)"
  else
    fail cross_sender_killed "$E2E_MSG"
  fi
}

register_case testbed2_link_up case_link_up
register_case cross_xfer_one_connection case_xfer cross_xfer_one_connection vmA1 vmB1 1 33554432
# 64 connections open at once: the clients send their streams once hostA
# shows all 64 accelerated (XFER_GATE), and every end must be accelerated.
# Without a gate a pairing raced the whole 1 MiB exchange (the kernel socket
# buffers absorb it in a few ms): on a loaded 2-core machine up to 5 of 64
# connections finished on kernel TCP before their pairing did (CI,
# 2026-11-25), exact but not what this case is about; a fixed pause only
# moves the race. One connection racing its pairing is
# cross_xfer_one_connection above.
register_case cross_xfer_64_connections with_env XFER_GATE=hostA case_xfer cross_xfer_64_connections vmA1 vmB1 64 1048576
register_case cross_xfer_reverse_direction case_xfer cross_xfer_reverse_direction vmB1 vmA2 4 4194304
register_case cross_links_spread case_links_spread
case_needs cross_links_spread cross_xfer_one_connection cross_xfer_64_connections cross_xfer_reverse_direction
register_case cross_sender_killed case_sender_killed
