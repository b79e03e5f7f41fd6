# Moving a guest (vsocketctl migrate begin|end, deploy/testbed2.sh move):
# vmA1 moves from hostA to hostB and back while it runs byte-checked
# bidirectional streams (request/response rounds) to vmA2, which stays on
# hostA, and to vmB1 on hostB, and a sockperf ping-pong to vmA2. Its
# connections leave the rings with clean fences (nothing resent), go on on
# kernel TCP while it moves, and re-upgrade where it lands: the pairs with
# vmA2 go from same-host to across the fabric, those with vmB1 from across
# the fabric to same-host (vsocketctl connections' "via"), then back.
via_count() { # via_count HOST VM VIA PEER-ADDR: VM's connections on HOST to PEER-ADDR accelerated via VIA
  bash $TB ctl "$1" --json connections 2>/dev/null | python3 -c '
import json, sys
vm, via, peer = sys.argv[1:4]
print(sum(c["vm"] == vm and c["via"] == via and c["peer"].rsplit(":", 1)[0] == peer for c in json.load(sys.stdin)))' "$2" "$3" "$4"
}
wait_vias() { # wait_vias HOST N-TO-A2 VIA-TO-A2 N-TO-B1 VIA-TO-B1: vmA1 on HOST (bounded: 15 s)
  local end=$((SECONDS + 15))
  while [ $SECONDS -lt $end ]; do
    [ "$(via_count "$1" vmA1 "$3" "$A2")" -ge "$2" ] && [ "$(via_count "$1" vmA1 "$5" "$B1")" -ge "$4" ] && return 0
    sleep 0.2
  done
  E2E_MSG="vmA1 on $1: $(via_count "$1" vmA1 "$3" "$A2") connection(s) to vmA2 via $3 (want $2), $(via_count "$1" vmA1 "$5" "$B1") to vmB1 via $5 (want $4)"
  return 1
}
case_move() {
  local port name=cross_move conns=3 pids=() phase out out2 out3 f0 f1
  port=$(alloc_port 3)
  # (About 35 s: the two moves take a few seconds each.)
  local rounds="--bytes 11520000 --rounds 3000 --gap-ms 10"
  wait_link_up
  vm_bg vmA2 preload "$WORK/$name.a2.jsonl" "$WORK/$name.a2.srv" "$XFER" server "$A2" "$port" --conns $conns $rounds
  pids+=("$BG")
  vm_bg vmB1 preload "$WORK/$name.b1.jsonl" "$WORK/$name.b1.srv" "$XFER" server "$B1" $((port + 1)) --conns $conns $rounds
  pids+=("$BG")
  # (The ping-pong through vsocketd: direct, its sub-microsecond round trips
  # fill sockperf's table of them long before 40 s; the xfer pairs with
  # vmA2 are direct.)
  vm_bg vmA2 preload "$WORK/$name.pp.jsonl" "$WORK/$name.pp.srv" env VSOCKET_DIRECT=0 sockperf sr --tcp -i "$A2" -p $((port + 2))
  local ppsrv=$BG
  sleep 0.3
  vm_bg vmA1 preload "$WORK/$name.a2.jsonl" "$WORK/$name.a2.cli" "$XFER" client "$A2" "$port" --conns $conns $rounds
  pids+=("$BG")
  vm_bg vmA1 preload "$WORK/$name.b1.jsonl" "$WORK/$name.b1.cli" "$XFER" client "$B1" $((port + 1)) --conns $conns $rounds
  pids+=("$BG")
  vm_bg vmA1 preload "$WORK/$name.pp.jsonl" "$WORK/$name.pp.cli" env VSOCKET_DIRECT=0 sockperf pp --tcp -i "$A2" -p $((port + 2)) -m 16 -t 40
  pids+=("$BG")
  local stop="kill ${pids[*]} $ppsrv 2>/dev/null; wait ${pids[*]} $ppsrv 2>/dev/null; bash $TB host vmA1 | grep -q hostA || bash $TB move vmA1 hostA >/dev/null 2>&1"
  for phase in "hostA before" "hostB after the move" "hostA after the move back"; do
    case $phase in
      "hostB after the move") out=$(bash $TB move vmA1 hostB 2>&1) || { fail $name "move to hostB: $out"; eval "$stop"; return; } ;;
      "hostA after the move back") out=$(bash $TB move vmA1 hostA 2>&1) || { fail $name "move back: $out"; eval "$stop"; return; } ;;
    esac
    local h=${phase%% *}
    if [ "$h" = hostA ]; then
      wait_vias hostA $((conns + 1)) same-host $conns hostB || { fail $name "$phase: $E2E_MSG"; eval "$stop"; return; }
    else
      wait_vias hostB $((conns + 1)) hostA $conns same-host || { fail $name "$phase: $E2E_MSG"; eval "$stop"; return; }
      # (The pairs with vmA2 cross the fabric now.)
      f0=$(counter hostB fabric_bytes_out)
      sleep 0.5
      f1=$(counter hostB fabric_bytes_out)
      [ "$f1" -gt "$f0" ] || { fail $name "$phase: hostB's fabric carried nothing in 0.5 s"; eval "$stop"; return; }
    fi
  done
  local p rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  kill $ppsrv 2>/dev/null
  wait $ppsrv 2>/dev/null
  [ $rc -eq 0 ] || { fail $name "an application failed (rc $rc): $(tail -n 2 "$WORK/$name".*.cli | tr '\n' ' ')"; return; }
  local check=(--reupgraded --no-resend --downgrade-cause migration --moves 2)
  out=$(python3 $CHECK "$WORK/$name.a2.jsonl" --port $port --expect-conns $((2 * conns)) "${check[@]}") ||
    { fail $name "stream to vmA2: $out"; return; }
  out2=$(python3 $CHECK "$WORK/$name.b1.jsonl" --port $((port + 1)) --expect-conns $((2 * conns)) "${check[@]}") ||
    { fail $name "stream to vmB1: $out2"; return; }
  out3=$(python3 $CHECK "$WORK/$name.pp.jsonl" --port $((port + 2)) --expect-conns 2 "${check[@]}") ||
    { fail $name "sockperf: $out3"; return; }
  grep -q "Summary: Latency" "$WORK/$name.pp.cli" || { fail $name "sockperf: $(tail -n 3 "$WORK/$name.pp.cli" | tr '\n' ' ')"; return; }
  pass "$name (vmA1 moved hostA -> hostB -> hostA mid-run: streams to vmA2 byte-exact, same-host -> fabric -> same-host ($out); to vmB1 byte-exact, fabric -> same-host on hostB -> fabric ($out2); sockperf ping-pong to vmA2 ($out3, $(grep -o "Summary: Latency is [0-9.]* usec" "$WORK/$name.pp.cli"))"
}

register_case cross_move case_move
