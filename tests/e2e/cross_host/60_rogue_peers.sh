# Peering security: rogue peers (another CA, no certificate, an unconfigured
# host, a forged link key) refused; the real link untouched.

case_rogue_peers() {
  local name=rogue_peers_refused ctl="bash $TB ctl hostA"
  local t0 n0 l0
  t0=$(counter hostA peers_refused_tls)
  n0=$(counter hostA peers_refused_name)
  l0=$(counter hostA peers_refused_link)
  local certs=$VSOCKET_TESTBED2_DIR/certs
  bash deploy/make-certs.sh --ca-name rogueca "$WORK/rogue" hostB >/dev/null 2>&1 || true
  bash deploy/make-certs.sh "$certs" intruder >/dev/null 2>&1 || true
  local ns=${VSOCKET_TESTBED2_NS_PREFIX:-vs2}hostB
  # 1. A certificate from another CA, claiming to be hostB.
  ip netns exec $ns timeout 5 openssl s_client -connect 203.0.113.1:7300 -tls1_3 -quiet \
    -cert "$WORK/rogue/hostB.crt" -key "$WORK/rogue/hostB.key" </dev/null >/dev/null 2>&1
  # 2. No client certificate at all.
  ip netns exec $ns timeout 5 openssl s_client -connect 203.0.113.1:7300 -tls1_3 -quiet </dev/null >/dev/null 2>&1
  # 3. A valid certificate of our CA, but not a configured peer.
  ip netns exec $ns timeout 5 openssl s_client -connect 203.0.113.1:7300 -tls1_3 -quiet \
    -cert "$certs/intruder.crt" -key "$certs/intruder.key" -CAfile "$certs/ca.crt" </dev/null >/dev/null 2>&1
  # 4. A data link hello with a made-up session key.
  ip netns exec $ns python3 - <<'PY'
import socket, struct, os
s = socket.create_connection(("203.0.113.1", 7300), timeout=3)
s.sendall(struct.pack("<HBBIQQII", 0x4656, 1, 1, 0, 0, 0, 32, 0) + os.urandom(32))
try:
    s.recv(1)
except Exception:
    pass
PY
  sleep 0.5
  local dt dn dl
  dt=$(($(counter hostA peers_refused_tls) - t0))
  dn=$(($(counter hostA peers_refused_name) - n0))
  dl=$(($(counter hostA peers_refused_link) - l0))
  if [ "$dt" -lt 2 ] || [ "$dn" -lt 1 ] || [ "$dl" -lt 1 ]; then
    fail $name "refusals: tls +$dt (want 2), unknown peer +$dn (want 1), bad link key +$dl (want 1); $(grep refused "$VSOCKET_TESTBED2_DIR/hostA/vsocketd.log" | tail -4 | tr '\n' ' ')"
    return
  fi
  local logs
  logs=$(grep -c "refused connection" "$VSOCKET_TESTBED2_DIR/hostA/vsocketd.log")
  # The real link is untouched and still carries data.
  if ! $ctl links | grep -q " up "; then
    fail $name "the real link went down"
    return
  fi
  fabric_xfer after_rogue vmA1 vmB1 "$B1" 1 1048576 "$(alloc_port)" ||
    { fail $name "link broken after the rogue peers: $XFER_MSG"; return; }
  pass "$name (wrong CA, no certificate: TLS refused x$dt; valid cert of an unconfigured host refused; forged link key refused; $logs log lines; real link still accelerates)"
}

register_case rogue_peers_refused case_rogue_peers
