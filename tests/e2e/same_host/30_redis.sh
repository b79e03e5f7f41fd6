# redis between vm1 and vm2: the server as the unprivileged user redis
# (values byte-exact, redis-benchmark) under --upgrade always and under the
# default policy, and the epoll churn of a single-client event loop under
# the default policy.

# The server runs as the unprivileged user redis, which reaches vm2's
# socket through its group (E2E_GROUP, suite.sh).
case_redis() {
  local name=$1 policy=$2 rep=$WORK/$1.jsonl port lib
  local -x VSOCKET_UPGRADE=$policy
  port=$(alloc_port)
  lib=$(shared_lib)
  touch "$rep" && chmod 0666 "$rep"
  vm_bg vm2 plain /dev/null "$WORK/$name.srv" runuser -u redis -- env LD_PRELOAD="$lib" VSOCKET_REPORT="$rep" \
    redis-server --bind "$A2" --port $port --save '' --appendonly no --protected-mode no --dir /tmp
  local srv=$BG
  wait_for_text "$WORK/$name.srv" "Ready to accept" 50
  # Byte check: a 1 MiB random value through SET and GET.
  head -c 1048576 /dev/urandom | base64 -w0 >"$WORK/$name.val"
  local ok=1
  vm_run vm1 preload "$rep" redis-cli -h "$A2" -p $port -x set blob <"$WORK/$name.val" >/dev/null 2>&1 || ok=0
  vm_run vm1 preload "$rep" redis-cli -h "$A2" -p $port --raw get blob 2>/dev/null | head -c -1 >"$WORK/$name.got"
  cmp -s "$WORK/$name.val" "$WORK/$name.got" || ok=0
  local b1 b2
  b1=$(vm_run vm1 preload "$rep" redis-benchmark -h "$A2" -p $port -t set,get -n 50000 -c 50 -q 2>&1 | tr '\r' '\n' | grep -E "^(SET|GET): [0-9]" | awk '{print $1 $2}' | tr '\n' ' ')
  b2=$(vm_run vm1 preload "$rep" redis-benchmark -h "$A2" -p $port -t set,get -n 200000 -c 50 -P 16 -q 2>&1 | tr '\r' '\n' | grep -E "^(SET|GET): [0-9]" | awk '{print $1 $2}' | tr '\n' ' ')
  kill "$srv" 2>/dev/null
  wait "$srv" 2>/dev/null
  if [ $ok -ne 1 ]; then
    fail $name "1 MiB value did not come back byte-exact"
    return
  fi
  if [ -z "$b1" ] || [ -z "$b2" ]; then
    fail $name "redis-benchmark failed"
    return
  fi
  local out
  if [ "$policy" = auto ]; then
    out=$(judge_auto "$rep" $port) || { fail $name "$out"; return; }
    pass "$name (server as user redis; 1 MiB SET/GET byte-exact; -c 50: $b1; -c 50 -P 16: $b2; $out)"
    return
  fi
  if ! out=$(python3 $CHECK "$rep" --port $port --mode accelerated --accel-min 1); then
    fail $name "$out"
    return
  fi
  local srv_accel
  srv_accel=$(python3 -c "import json,sys; print(sum(1 for l in open(sys.argv[1]) if l.strip() and json.loads(l)['local'].endswith(':$port') and json.loads(l)['mode'] == 'accelerated'))" "$rep")
  [ "$srv_accel" -gt 0 ] || { fail $name "the server (user redis) has no accelerated connection"; return; }
  pass "$name (server as user redis; 1 MiB SET/GET byte-exact; -c 50: $b1; -c 50 -P 16: $b2; $out)"
}

# redis-benchmark -c 1 under the default policy (held on kernel TCP: one
# client's request/response), as a user meets it: the event loop deletes and
# adds its socket's epoll registration around every request (5 epoll_ctl
# per request); the library applies those changes together before each wait
# (decision 61) and answers a wait for what the pending change asks for with
# one poll (decision 75): at most 0.5 per request, the data byte-exact, the
# connections on kernel TCP with reason request-response. The counts come
# from strace, the same run without the library giving the kernel's.
case_epoll_churn() {
  local name=epoll_churn_redis port rep=$WORK/epoll_churn.jsonl n=3000
  port=$(alloc_port)
  VSOCKET_UPGRADE=auto vm_bg vm2 preload "$rep" "$WORK/$name.srv" \
    redis-server --bind "$A2" --port $port --save '' --appendonly no --protected-mode no --dir /tmp
  local srv=$BG
  wait_for_text "$WORK/$name.srv" "Ready to accept" 50
  head -c 65536 /dev/urandom | base64 -w0 >"$WORK/$name.val"
  local ok=1 k v
  VSOCKET_UPGRADE=auto vm_run vm1 preload "$rep" redis-cli -h "$A2" -p $port -x set blob <"$WORK/$name.val" >/dev/null 2>&1 || ok=0
  VSOCKET_UPGRADE=auto vm_run vm1 preload "$rep" redis-cli -h "$A2" -p $port --raw get blob 2>/dev/null | head -c -1 >"$WORK/$name.got"
  cmp -s "$WORK/$name.val" "$WORK/$name.got" || ok=0
  vm_run vm1 plain /dev/null strace -f -c -e trace=epoll_ctl -o "$WORK/$name.kernel" \
    redis-benchmark -h "$A2" -p $port -t get -n $n -c 1 -q >/dev/null 2>&1 || ok=0
  VSOCKET_UPGRADE=auto vm_run vm1 preload "$rep" strace -f -c -e trace=epoll_ctl -o "$WORK/$name.vsocket" \
    redis-benchmark -h "$A2" -p $port -t get -n $n -c 1 -q >/dev/null 2>&1 || ok=0
  kill "$srv" 2>/dev/null
  wait "$srv" 2>/dev/null
  k=$(strace_count "$WORK/$name.kernel" epoll_ctl)
  v=$(strace_count "$WORK/$name.vsocket" epoll_ctl)
  if [ $ok -ne 1 ] || [ -z "$k" ] || [ -z "$v" ]; then
    fail $name "redis-cli/redis-benchmark/strace failed or the 64 KiB value did not come back byte-exact (kernel '$k', vsocket '$v')"
    return
  fi
  if [ "$k" -lt $((n * 4)) ] || [ $((v * 2)) -gt $n ]; then
    fail $name "epoll_ctl calls for $n requests: kernel $k (expected >= $((n * 4))), with the library $v (expected <= $((n / 2)))"
    return
  fi
  local out
  if ! out=$(python3 $CHECK "$rep" --port $port --mode kernel --reason request-response); then
    fail $name "$out"
    return
  fi
  pass "$name (epoll_ctl for $n requests: kernel $k, with the library $v; 64 KiB SET/GET byte-exact; $out)"
}

# app: redis (server as the user redis) | redis-cli SET/GET of a 1 MiB value; redis-benchmark -c 50, and -c 50 -P 16 | the value byte-exact | redis
register_case redis_always case_redis redis_always always
register_case redis_auto case_redis redis_auto auto
register_case epoll_churn_redis through_vsocketd case_epoll_churn
