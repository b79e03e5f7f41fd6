# redis in vmB1, clients in vmA1 and vmA2.

case_redis() {
  local name=cross_redis rep=$WORK/redis.jsonl port
  port=$(alloc_port)
  vm_bg vmB1 preload "$rep" "$WORK/redis.srv" redis-server --bind "$B1" --port $port --save '' \
    --appendonly no --protected-mode no
  local srv=$BG
  wait_for_text "$WORK/redis.srv" "Ready to accept" 50
  head -c 1048576 /dev/urandom | base64 -w0 >"$WORK/redis.val"
  local ok=1 a0
  a0=$(counter hostA fabric_bytes_out)
  vm_run vmA1 preload "$rep" redis-cli -h "$B1" -p $port -x set blob <"$WORK/redis.val" >/dev/null 2>&1 || ok=0
  vm_run vmA2 preload "$rep" redis-cli -h "$B1" -p $port --raw get blob 2>/dev/null | head -c -1 >"$WORK/redis.got"
  cmp -s "$WORK/redis.val" "$WORK/redis.got" || ok=0
  local b1
  b1=$(vm_run vmA1 preload "$rep" redis-benchmark -h "$B1" -p $port -t set,get -n 50000 -c 100 -q 2>&1 | tr '\r' '\n' | grep -E "^(SET|GET): [0-9]" | awk '{print $1 $2}' | tr '\n' ' ')
  kill "$srv" 2>/dev/null
  wait "$srv" 2>/dev/null
  [ $ok -eq 1 ] || { fail $name "1 MiB value did not come back byte-exact"; return; }
  [ -n "$b1" ] || { fail $name "redis-benchmark failed"; return; }
  local out da
  # redis-cli's 1 MiB SET is written at once, usually before the pairing
  # completes (kernel TCP, still byte-checked); redis-benchmark's 100
  # connections must be accelerated.
  if ! out=$(python3 $CHECK "$rep" --port $port --bulk-accel 4194304); then
    fail $name "$out"
    return
  fi
  local nacc
  nacc=$(python3 -c "import json,sys; print(sum(json.loads(l)['mode']=='accelerated' for l in open(sys.argv[1]) if l.strip()))" "$rep")
  [ "$nacc" -ge 150 ] || { fail $name "only $nacc connection ends accelerated"; return; }
  da=$(($(counter hostA fabric_bytes_out) - a0))
  [ "$da" -gt 1048576 ] || { fail $name "only $da B on the fabric"; return; }
  pass "$name (1 MiB SET from vmA1, GET from vmA2 byte-exact; redis-benchmark -c 100: $b1; $out; fabric A->B $da B)"
}

register_case cross_redis case_redis
