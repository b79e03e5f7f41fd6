# What must stay on kernel TCP (another tenant, a peer without the library),
# and same-host peers on the two-host bed, which pair locally.

# vmA1 is tenant 1, vmB2 tenant 2: never paired, bytes still exact.
case_cross_tenant() {
  local name=cross_tenant_stays_kernel rep=$WORK/tenant.jsonl port a0
  port=$(alloc_port)
  a0=$(counter hostA fabric_bytes_out)
  vm_bg vmB2 preload "$rep" "$WORK/tenant.srv" "$XFER" server "$B2" "$port"
  local srv=$BG
  if ! vm_run vmA1 preload "$rep" "$XFER" client "$B2" "$port" --bytes 4194304 >"$WORK/tenant.cli" 2>&1; then
    fail $name "client: $(tail -2 "$WORK/tenant.cli" | tr '\n' ' ')"
    kill "$srv" 2>/dev/null
    return
  fi
  wait "$srv" || { fail $name "server failed"; return; }
  local out
  if ! out=$(python3 $CHECK "$rep" --port $port --expect-conns 2 --mode kernel-pending --exact-total $((4194304 + 16))); then
    fail $name "$out"
    return
  fi
  [ "$(counter hostA fabric_bytes_out)" = "$a0" ] || { fail $name "bytes crossed the fabric"; return; }
  pass "$name (tenant 1 -> tenant 2 across hosts: kernel TCP, byte-exact, no fabric bytes; $out)"
}

case_mixed() {
  local name=cross_peer_not_preloaded rep=$WORK/mixed.jsonl port
  port=$(alloc_port)
  vm_bg vmB1 plain "$rep" "$WORK/mixed.srv" "$XFER" server "$B1" "$port"
  local srv=$BG
  if ! vm_run vmA1 preload "$rep" "$XFER" client "$B1" "$port" --bytes 4194304 >"$WORK/mixed.cli" 2>&1; then
    fail $name "client: $(tail -2 "$WORK/mixed.cli" | tr '\n' ' ')"
    kill "$srv" 2>/dev/null
    return
  fi
  wait "$srv" || { fail $name "server failed"; return; }
  local out
  if ! out=$(python3 $CHECK "$rep" --port $port --expect-conns 1 --mode kernel-pending --exact-total $((4194304 + 16))); then
    fail $name "$out"
    return
  fi
  pass "$name (server without libvsocket: kernel TCP, byte-exact; $out)"
}

# Same-host peers on the two-host bed still pair locally (no fabric bytes).
case_same_host() {
  local name=cross_bed_same_host_stays_local a0
  a0=$(counter hostA fabric_bytes_out)
  run_xfer $name vmA1 vmA2 "$A2" 2 4194304 "$(alloc_port)" || { fail $name "$XFER_MSG"; return; }
  [ "$(counter hostA fabric_bytes_out)" = "$a0" ] || { fail $name "same-host bytes went over the fabric"; return; }
  pass "$name (vmA1 <-> vmA2 accelerated by hostA alone; $XFER_MSG)"
}

register_case cross_tenant_stays_kernel case_cross_tenant
register_case cross_peer_not_preloaded case_mixed
register_case cross_bed_same_host_stays_local case_same_host
