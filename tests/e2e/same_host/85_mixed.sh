# Mixed deployments stay correct on kernel TCP, and the operator views
# (vsocketctl, metrics) agree with what happened.

case_mixed() {  # name client-vm client-how server-how expected-reason expected-conns
  local name=$1 cvm=$2 chow=$3 show=$4 reason=$5 port
  port=$(alloc_port)
  local rep=$WORK/$name.jsonl
  vm_bg vm2 "$show" "$rep" "$WORK/$name.srv" "$XFER" server "$A2" "$port" --conns 2
  local srv=$BG
  if ! vm_run "$cvm" "$chow" "$rep" "$XFER" client "$A2" "$port" --conns 2 --bytes 4194304 >"$WORK/$name.cli" 2>&1; then
    fail "$name" "client: $(tail -2 "$WORK/$name.cli" | tr '\n' ' ')"
    kill "$srv" 2>/dev/null
    return
  fi
  if ! wait "$srv"; then
    fail "$name" "server failed"
    return
  fi
  local out
  if ! out=$(python3 $CHECK "$rep" --port "$port" --expect-conns "$6" --reason "$reason" --exact-total $((4194304 + 16))); then
    fail "$name" "$out"
    return
  fi
  pass "$name (byte-checked on kernel TCP, reason $reason; $out)"
}

# vsocketctl_and_metrics reads what the cases before it left: the mixed
# cases' fallbacks, an accelerated transfer each way between vm1 and vm2.
case_operator_views() {
  local name=vsocketctl_and_metrics ctl=$BIN/host-backend/vsocketctl sock=/run/vsocket-testbed/ctl.sock
  local vms metrics
  vms=$("$ctl" -s "$sock" --json vms 2>&1) || { fail $name "vsocketctl vms: $vms"; return; }
  metrics=$("$ctl" -s "$sock" metrics 2>&1) || { fail $name "vsocketctl metrics failed"; return; }
  local out fb
  fb=$("$ctl" -s "$sock" --json fallbacks 2>&1) || { fail $name "vsocketctl fallbacks: $fb"; return; }
  if ! out=$(python3 - "$vms" "$metrics" "$fb" <<'PY'
import json, re, sys
vms = {v["vm"]: v for v in json.loads(sys.argv[1])}
m = sys.argv[2]
errs = []
# Fallbacks by reason (the mixed cases ran before): a preloaded end whose
# peer was plain, per VM and summed per tenant, and in Prometheus.
fb = {(r["vm"], r["tenant"]): r for r in json.loads(sys.argv[3])}
for name in ("vm1", "vm2"):
    if fb[(name, 1)]["peer_not_registered"] == 0:
        errs.append(f"{name} counts no peer-not-registered fallback")
if fb[("*", 1)]["peer_not_registered"] != fb[("vm1", 1)]["peer_not_registered"] + fb[("vm2", 1)]["peer_not_registered"]:
    errs.append("tenant 1's fallbacks are not the sum of its VMs'")
if fb[("vm3", 2)]["cross_tenant"] + fb[("vm2", 1)]["cross_tenant"] == 0:
    errs.append("the cross-tenant connection counts no cross-tenant fallback")
prom = re.search(r'^vsocket_fallbacks_total\{vm="vm1",tenant="1",reason="peer-not-registered"\} (\d+)$', m, re.M)
if not prom or int(prom.group(1)) != fb[("vm1", 1)]["peer_not_registered"]:
    errs.append("vsocket_fallbacks_total for vm1 missing or different from vsocketctl's")
for name in ("vm1", "vm2"):
    if vms[name]["accel_bytes_out"] == 0 or vms[name]["upgrades"] == 0:
        errs.append(f"{name} shows no accelerated traffic")
if vms["vm3"]["upgrades"] != 0:
    errs.append("vm3 (other tenant) shows upgrades")
for metric in ("vsocket_accelerated_bytes_total{vm=\"vm1\"", "vsocket_cross_tenant_total", "vsocket_connections{",
               "vsocket_doorbell_counts_total"):
    if metric not in m:
        errs.append(f"metric {metric} missing")
counts = [l for l in m.splitlines() if l.startswith("vsocket_doorbell_counts_total ")]
if not counts or int(counts[0].split()[1]) == 0:
    errs.append("no count was read from a doorbell block")
if errs:
    print("; ".join(errs)); sys.exit(1)
print(f'vm1 moved {vms["vm1"]["accel_bytes_out"]} B out, vm2 {vms["vm2"]["accel_bytes_out"]} B; vm3 never upgraded; '
      f'fallbacks peer-not-registered vm1 {fb[("vm1", 1)]["peer_not_registered"]}, vm2 {fb[("vm2", 1)]["peer_not_registered"]}, '
      f'cross-tenant {fb[("vm3", 2)]["cross_tenant"] + fb[("vm2", 1)]["cross_tenant"]}')
PY
  ); then
    fail $name "$out"
    return
  fi
  pass "$name ($out)"
}

register_case preloaded_client_plain_server case_mixed preloaded_client_plain_server vm1 preload plain peer-not-registered 2
register_case plain_client_preloaded_server case_mixed plain_client_preloaded_server vm1 plain preload peer-not-registered 2
# Tenants never learn about each other: to tenant 2's client, tenant 1's
# server is simply not accelerated.
register_case cross_tenant case_mixed cross_tenant vm3 preload preload peer-not-registered 4
register_case vsocketctl_and_metrics through_vsocketd case_operator_views
case_needs vsocketctl_and_metrics xfer_one_connection preloaded_client_plain_server plain_client_preloaded_server cross_tenant
