# The VM's firewall still applies.

case_firewall() {
  local name=firewall_reject_still_applies port rep=$WORK/fw.jsonl
  port=$(alloc_port)
  vm_bg vm2 preload "$rep" "$WORK/fw.srv" "$XFER" server "$A2" "$port"
  local srv=$BG
  bash $TB fw vm2 add input tcp dport $port reject with tcp reset
  if vm_run vm1 preload "$rep" "$XFER" client "$A2" "$port" --bytes 1024 >"$WORK/fw.cli" 2>&1; then
    fail $name "connection succeeded through a reject rule"
    bash $TB fw vm2 flush
    return
  fi
  if ! grep -q "Connection refused" "$WORK/fw.cli"; then
    fail $name "expected ECONNREFUSED: $(tail -1 "$WORK/fw.cli")"
    bash $TB fw vm2 flush
    return
  fi
  bash $TB fw vm2 flush
  if ! vm_run vm1 preload "$rep" "$XFER" client "$A2" "$port" --bytes 1048576 >"$WORK/fw2.cli" 2>&1 || ! wait "$srv"; then
    fail $name "after removing the rule the connection did not work"
    return
  fi
  pass "$name (rejected with ECONNREFUSED while the rule stood, accelerated after it was removed)"
}

register_case firewall_reject_still_applies case_firewall
