# The busy-loop rule across hosts (decision 83), under the default policy
# with the applications on one CPU (taskset): across the tcp fabric a busy
# loop's request/response connections stay on kernel TCP, where they are
# faster (the fabric's copies and the daemons' passes cost more than the
# batching saves: Node.js keep-alive 0.84x, redis pipelined 0.88x when they
# were accelerated), like a bulk stream (decision 62): the tentative
# registration is refused kernel-faster and the peer's host told. Two busy
# loops: every end kernel-faster; a busy client loop whose server is a
# thread per connection: the client kernel-faster, the server held
# (request-response). Every answer is checked byte for byte
# (tests/e2e/apps/busy_loop.py), no stream byte crosses the fabric.
#
# The libraries take no direct pairs here (VSOCKET_DIRECT=0): with them
# (the default, decision 102) the direct-peer rule (decision 98) comes
# first, at a connection's 16th turn, and vsocketd keeps that registration
# kernel-faster too (a pair across hosts is never direct): the same outcome
# for the application, but this case is the busy-loop rule's.

# case_cross_busy NAME SERVER-MODE SERVER-WANT: SERVER-WANT kernel-faster |
# held.
case_cross_busy() {
  local name=$1 smode=$2 want=$3
  local -x VSOCKET_DIRECT=0
  local port rep=$WORK/$name.jsonl out bad=""
  port=$(alloc_port)
  local e0 f0 e1 f1
  e0=$(counter hostA kept_kernel_faster)
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
  e1=$(counter hostA kept_kernel_faster)
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
def ok(r, reason, registered_for):
    return (r["mode"] == "kernel" and r["reason"] == reason and (r.get("registered_for") or "-") == registered_for
            and r["accel_tx"] + r["accel_rx"] == 0)
if not all(ok(r, "kernel-faster", "busy-loop") for r in cli):
    bad.append("a client end not kept kernel-faster for its busy loop")
if want == "kernel-faster" and not all(ok(r, "kernel-faster", "busy-loop") for r in srv):
    bad.append("a server end not kept kernel-faster for its busy loop")
if want == "held" and not all(ok(r, "request-response", "-") for r in srv):
    bad.append("a server end not held")
if bad:
    print("; ".join(bad) + " (" + summary + ")")
    sys.exit(1)
print(summary)
PY
) || bad+="reports: $sum; "
  local dk=$((e1 - e0)) df=$((f1 - f0))
  [ "$dk" -ge 32 ] || bad+="hostA kept $dk registrations kernel-faster (want >= 32); "
  [ "$df" -lt 1000000 ] || bad+="hostA sent $df B over the fabric; "
  if [ -n "$bad" ]; then
    fail $name "$bad client: $out"
    return
  fi
  pass "$name ($out; ends: $sum; hostA: $dk kept kernel-faster, $df B over the fabric)"
}

register_case cross_busy_loops_kernel_faster case_cross_busy cross_busy_loops_kernel_faster server kernel-faster
register_case cross_busy_loop_one_sided_kernel_faster case_cross_busy cross_busy_loop_one_sided_kernel_faster server-threads held
