# memcached in vm2, memccp/memccat and memcaslap in vm1, under --upgrade
# always (accelerated) and under the default policy.

case_memcached() {
  local name=$1 policy=$2 rep=$WORK/$1.jsonl port
  local -x VSOCKET_UPGRADE=$policy
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
  if [ "$policy" = auto ]; then
    out=$(judge_auto "$rep" $port) || { fail $name "$out"; return; }
  elif ! out=$(python3 $CHECK "$rep" --port $port --mode accelerated --accel-min 1); then
    fail $name "$out"
    return
  fi
  pass "$name (100 KB value byte-exact via memccp/memccat; memcaslap $tps; $out)"
}

# app: memcached | memccp/memccat of a 100 KB value; memcaslap -c 16 | the value byte-exact | memcached
register_case memcached_always case_memcached memcached_always always
register_case memcached_auto case_memcached memcached_auto auto
