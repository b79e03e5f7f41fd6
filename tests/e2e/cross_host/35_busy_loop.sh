# The busy-loop rule across hosts (decision 83), under the default policy
# with the applications on one CPU (taskset): two busy event loops'
# keep-alive connections are accelerated over the fabric; a busy client
# loop whose server is not a loop (a thread per connection) asks the
# server's host to pair, is not answered (the server's side never
# registers), and withdraws: its request cancelled, its registrations
# withdrawn after 500 ms, its connections held again on kernel TCP. Every
# answer is checked byte for byte (tests/e2e/apps/busy_loop.py).

# case_cross_busy NAME SERVER-MODE WANT: WANT accelerated | withdrawn.
case_cross_busy() {
  local name=$1 smode=$2 want=$3
  local port rep=$WORK/$name.jsonl out bad=""
  port=$(alloc_port)
  local e0 f0 e1 f1
  e0=$(counter hostA tentative_expired)
  f0=$(counter hostA fabric_bytes_out)
  VSOCKET_UPGRADE=auto vm_bg vmB1 preload "$rep" "$WORK/$name.srv" taskset -c 0 python3 tests/e2e/apps/busy_loop.py "$smode" "$B1" "$port" 32
  local srv=$BG
  if ! out=$(VSOCKET_UPGRADE=auto E2E_TIMEOUT=120 vm_run vmA1 preload "$rep" taskset -c 0 python3 tests/e2e/apps/busy_loop.py loop "$B1" "$port" 32 1500 2>&1); then
    fail $name "client: $out"
    kill "$srv" 2>/dev/null
    wait "$srv" 2>/dev/null
    return
  fi
  wait "$srv" 2>/dev/null
  e1=$(counter hostA tentative_expired)
  f1=$(counter hostA fabric_bytes_out)
  local sum
  sum=$(python3 - "$rep" "$port" "$want" <<'PY' 2>&1
import collections, json, sys
port, want = sys.argv[2], sys.argv[3]
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r.get("event") in ("close", "exit") and
        (r["local"].endswith(":" + port) or r["peer"].endswith(":" + port))]
cli = [r for r in rows if r["peer"].endswith(":" + port)]
srv = [r for r in rows if r["local"].endswith(":" + port)]
kinds = collections.Counter("%s/%s/%s/%d" % (r["mode"], r["reason"], r.get("registered_for") or "-", r.get("withdrawals", 0)) for r in rows)
summary = ", ".join("%d %s" % (n, k) for k, n in sorted(kinds.items()))
bad = []
if len(cli) != 32 or len(srv) != 32:
    bad.append("%d client and %d server ends reported" % (len(cli), len(srv)))
if want == "accelerated":
    n = sum(1 for r in rows if r["mode"] == "accelerated" and r.get("registered_for") == "busy-loop" and r["accel_tx"] + r["accel_rx"] > 0)
    if n != len(rows):
        bad.append("%d of %d ends accelerated for the busy loop" % (n, len(rows)))
else:
    if any(r["accel_tx"] + r["accel_rx"] for r in rows):
        bad.append("bytes on the rings")
    if not all(r.get("registered_for") == "busy-loop" and r.get("withdrawals", 0) >= 1 for r in cli):
        bad.append("a client end not withdrawn")
    if not all(r["mode"] == "kernel" and r["reason"] == "request-response" for r in srv):
        bad.append("a server end not held")
if bad:
    print("; ".join(bad) + " (" + summary + ")")
    sys.exit(1)
print(summary)
PY
) || bad+="reports: $sum; "
  local de=$((e1 - e0)) df=$((f1 - f0))
  if [ "$want" = accelerated ]; then
    [ "$df" -gt 1000000 ] || bad+="hostA sent $df B over the fabric; "
  else
    [ "$de" -ge 32 ] || bad+="hostA withdrew $de tentative registrations (want >= 32); "
  fi
  if [ -n "$bad" ]; then
    fail $name "$bad client: $out"
    return
  fi
  pass "$name ($out; ends: $sum; hostA: $de tentative registrations withdrawn, $df B over the fabric)"
}

register_case cross_busy_loops_accelerate case_cross_busy cross_busy_loops_accelerate server accelerated
register_case cross_busy_loop_one_sided_withdrawn case_cross_busy cross_busy_loop_one_sided_withdrawn server-threads withdrawn
