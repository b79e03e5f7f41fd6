# memcached in vm2, memccp/memccat and memcaslap in vm1, accelerated.

case_memcached() {
  local name=memcached rep=$WORK/mc.jsonl port
  port=$(alloc_port)
  vm_bg vm2 preload "$rep" "$WORK/mc.srv" memcached -u root -l "$A2" -p $port -t 2
  local srv=$BG
  sleep 0.5
  head -c 100000 /dev/urandom >"$WORK/mcblob"
  local ok=1
  vm_run vm1 preload "$rep" memccp --servers="$A2:$port" "$WORK/mcblob" >/dev/null 2>&1 || ok=0
  # memccat ends the value with a newline of its own.
  vm_run vm1 preload "$rep" memccat --servers="$A2:$port" mcblob 2>/dev/null | head -c -1 >"$WORK/mcblob.got" || ok=0
  cmp -s "$WORK/mcblob" "$WORK/mcblob.got" || ok=0
  local tps
  tps=$(vm_run vm1 preload "$rep" memcaslap -s "$A2:$port" -t 2s -c 16 -T 2 2>&1 | grep -oE "TPS: [0-9]+" | tail -1)
  kill "$srv" 2>/dev/null
  wait "$srv" 2>/dev/null
  [ $ok -eq 1 ] || { fail $name "100 KB value did not come back byte-exact"; return; }
  [ -n "$tps" ] || { fail $name "memcaslap failed"; return; }
  local out
  if ! out=$(python3 $CHECK "$rep" --port $port --mode accelerated --accel-min 1); then
    fail $name "$out"
    return
  fi
  pass "$name (100 KB value byte-exact via memccp/memccat; memcaslap $tps; $out)"
}

register_case memcached case_memcached
