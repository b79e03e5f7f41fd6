# Under the default policy (what a user gets; the other cases run
# VSOCKET_UPGRADE=always): a bulk stream across the tcp fabric stays on
# kernel TCP, where it is faster (decision 62). xfer's client writes
# 128 KiB on average, one way: hostA keeps its registration on kernel TCP
# (reason kernel-faster, counter kept_kernel_faster), no stream byte crosses
# the fabric, every byte arrives. Its receiver, registered on hostB because
# it reads a stream, is told so at once (PAIR_DECLINE; decision 63) and
# leaves its registration instead of waiting on the pending path for good:
# every end reports kernel-faster, and while the server lives on after its
# connections closed, hostB holds no registration of them. A stream of
# 1 KiB messages is still accelerated under the same policy (small writes:
# the fabric wins).
case_bulk_default_policy() {
  local name=cross_bulk_default_policy port conns=2 bytes=33554432
  port=$(alloc_port)
  local rep=$WORK/$name.jsonl a0 b0 k0 d0 da db dk dd out rows srv cli
  a0=$(counter hostA fabric_bytes_out)
  b0=$(counter hostB fabric_bytes_out)
  k0=$(counter hostA kept_kernel_faster)
  d0=$(counter hostB pair_declines_received)
  VSOCKET_UPGRADE=auto vm_bg vmB1 preload "$rep" "$WORK/$name.srv" "$XFER" server "$B1" $port --conns $conns \
    --one-way --exit-delay-ms 4000
  srv=$BG
  VSOCKET_UPGRADE=auto vm_bg vmA1 preload "$rep" "$WORK/$name.cli" "$XFER" client "$B1" $port --conns $conns \
    --bytes $bytes --one-way
  cli=$BG
  if ! wait "$cli"; then
    fail $name "client: $(tail -2 "$WORK/$name.cli" | tr '\n' ' ')"
    kill "$srv" 2>/dev/null
    return
  fi
  wait_for_text "$WORK/$name.srv" "connections verified" 40
  sleep 0.3  # (the server's close() has unregistered by now, or never will)
  rows=$(conn_rows hostB $port | sort | uniq -c | tr -s ' \n' ' ')
  if ! wait "$srv"; then
    fail $name "server: $(tail -2 "$WORK/$name.srv" | tr '\n' ' ')"
    return
  fi
  if [ -n "$rows" ]; then
    fail $name "after the server closed its connections hostB still holds their registrations: $rows"
    return
  fi
  da=$(($(counter hostA fabric_bytes_out) - a0))
  db=$(($(counter hostB fabric_bytes_out) - b0))
  dk=$(($(counter hostA kept_kernel_faster) - k0))
  dd=$(($(counter hostB pair_declines_received) - d0))
  if ! out=$(python3 - "$rep" $port $conns <<'PY'
import json, sys
port, conns = int(sys.argv[2]), int(sys.argv[3])
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r.get("event") in ("close", "exit") and
        (r["local"].endswith(":%d" % port) or r["peer"].endswith(":%d" % port))]
accel = sum(r.get("accel_tx", 0) + r.get("accel_rx", 0) for r in rows)
kept = sum(1 for r in rows if r.get("reason") == "kernel-faster" and r.get("mode") == "kernel")
others = sorted({"%s/%s" % (r.get("mode"), r.get("reason")) for r in rows} - {"kernel/kernel-faster"})
print("%d ends, %d kept kernel-faster, %d B accelerated%s" % (len(rows), kept, accel,
      "; other ends: " + ", ".join(others) if others else ""))
sys.exit(0 if accel == 0 and kept == 2 * conns and len(rows) == 2 * conns else 1)
PY
  ); then
    fail $name "$out"
    return
  fi
  if [ "$dk" -lt $conns ] || [ "$dd" -lt 1 ] || [ $((da + db)) -gt 1048576 ]; then
    fail $name "hostA kept $dk registrations on kernel TCP (want >= $conns), hostB heard $dd declines (want >= 1); the fabric carried $da B A->B, $db B B->A"
    return
  fi
  out="$out; $(grep -o '[0-9]*/[0-9]* connections verified' "$WORK/$name.srv") by the server"
  pass "$name ($conns conns x $bytes B one way, byte-checked; $out; hostA kept_kernel_faster +$dk, hostB pair_declines_received +$dd; fabric $da B A->B)"
}

# The other way round: the server streams (iperf3 -R, default policy). The
# client, registered as a reader, has asked hostB to pair before the
# server's registration is kept on kernel TCP there: hostB answers that
# request PAIR_REJECT kernel-faster, and the client leaves the pending path.
case_bulk_default_policy_reverse() {
  local name=cross_bulk_default_policy_reverse port rep=$WORK/bulkrev.jsonl out srv
  port=$(alloc_port)
  VSOCKET_UPGRADE=auto vm_bg vmB1 preload "$rep" "$WORK/bulkrev.srv" iperf3 -s -B "$B1" -p $port -1
  srv=$BG
  wait_listen vmB1 $port
  if ! VSOCKET_UPGRADE=auto vm_run vmA1 preload "$rep" iperf3 -c "$B1" -p $port -t 2 -R -l 128K >"$WORK/bulkrev.cli" 2>&1; then
    fail $name "iperf3 -R: $(tail -3 "$WORK/bulkrev.cli" | tr '\n' ' ')"
    kill "$srv" 2>/dev/null
    return
  fi
  wait "$srv"
  if ! out=$(python3 - "$rep" $port <<'PY'
import json, sys
port = int(sys.argv[2])
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r.get("event") in ("close", "exit") and
        (r["local"].endswith(":%d" % port) or r["peer"].endswith(":%d" % port))]
big = [r for r in rows if r.get("kernel_tx", 0) + r.get("kernel_rx", 0) > 1 << 20]
modes = sorted("%s/%s" % (r.get("mode"), r.get("reason")) for r in big)
print("data connection ends: " + ", ".join(modes))
sys.exit(0 if len(big) == 2 and all(m == "kernel/kernel-faster" for m in modes) else 1)
PY
  ); then
    fail $name "$out"
    return
  fi
  pass "$name (iperf3 -R 2 s; $out)"
}

register_case cross_bulk_default_policy case_bulk_default_policy
register_case cross_bulk_default_policy_reverse case_bulk_default_policy_reverse
register_case cross_sockperf_throughput_1KiB_default_policy \
  with_env VSOCKET_UPGRADE=auto case_sockperf cross_sockperf_throughput_1KiB_default_policy tp -m 1024
