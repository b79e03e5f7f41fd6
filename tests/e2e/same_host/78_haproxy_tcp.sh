# HAProxy in TCP mode (no splice: recv/send through its buffers; the splice
# path is 50_haproxy.sh's) in vm2 balancing round-robin over two nginx in
# vm2, wrk keep-alive (-c 32, 3 s) and curl from vm1, every process
# preloaded, under the default policy and under always. Checked: files of
# every size byte-exact through the proxy (curl), every wrk response body
# (wrk_body.lua), both nginx served, the reports of the three legs (wrk and
# curl -> haproxy, haproxy -> each nginx: tests/e2e/apps/report_summary.py)
# and the leak check (suite.sh) on the three ports.

case_haproxy_tcp() {
  local name=$1 policy=$2
  local -x VSOCKET_UPGRADE=$policy
  local port www=$WORK/$name-www crep=$WORK/$name.cli.jsonl hrep=$WORK/$name.hap.jsonl nrep=$WORK/$name.nginx.jsonl
  local cfg=$WORK/$name.cfg s f
  command -v haproxy >/dev/null || { fail $name "haproxy not installed (deploy/install-deps.sh)"; return; }
  port=$(alloc_port 3)
  mkdir -p "$www" "$WORK/$name-got"
  for s in 0 4095 300000 4194304; do head -c $s /dev/urandom >"$www/f$s"; done
  nginx_conf "$name-n1" "$A2" $((port + 1)) "$www"
  nginx_conf "$name-n2" "$A2" $((port + 2)) "$www"
  cat >"$cfg" <<CFG
global
    maxconn 256
    nbthread 2
defaults
    mode tcp
    timeout connect 5s
    timeout client 30s
    timeout server 30s
listen fwd
    bind $A2:$port
    balance roundrobin
    server n1 $A2:$((port + 1))
    server n2 $A2:$((port + 2))
CFG
  leak_begin
  vm_bg vm2 preload "$nrep" "$WORK/$name-n1.srv" nginx -c "$WORK/$name-n1.conf"
  local n1=$BG
  vm_bg vm2 preload "$nrep" "$WORK/$name-n2.srv" nginx -c "$WORK/$name-n2.conf"
  local n2=$BG
  vm_bg vm2 preload "$hrep" "$WORK/$name.hap" haproxy -f "$cfg" -db
  local hap=$BG
  local bad="" url=http://$A2:$port
  WRK_SUM="(not run)"
  if ! wait_listen vm2 "$port" || ! wait_listen vm2 $((port + 1)) || ! wait_listen vm2 $((port + 2)); then
    bad+="haproxy or nginx did not listen within 30 s: $(tail -2 "$WORK/$name.hap" "$WORK/$name-n1-error.log" | tr '\n' ' '); "
  fi
  if [ -z "$bad" ]; then
    vm_run vm1 preload "$crep" curl -sf -o "$WORK/$name-got/f0" "$url/f0" -o "$WORK/$name-got/f4095" "$url/f4095" \
      -o "$WORK/$name-got/f300000" "$url/f300000" -o "$WORK/$name-got/f4194304" "$url/f4194304" >/dev/null 2>&1 ||
      bad+="curl of the files failed; "
    for f in f0 f4095 f300000 f4194304; do cmp -s "$www/$f" "$WORK/$name-got/$f" || bad+="$f not byte-exact; "; done
    vm_run vm1 preload "$crep" wrk -t 2 -c 32 -d 3 -s "$APPS/wrk_body.lua" "$url/f4095" -- "$www/f4095" \
      >"$WORK/$name.wrk" 2>&1
    wrk_judge "$WORK/$name.wrk" || bad+="wrk keep-alive: $WRK_SUM; "
  fi
  leak_untracked "$port" $((port + 1)) $((port + 2))
  kill "$hap" 2>/dev/null
  kill -QUIT "$(cat "$WORK/$name-n1.pid" 2>/dev/null)" "$(cat "$WORK/$name-n2.pid" 2>/dev/null)" 2>/dev/null
  sleep 0.5
  kill "$n1" "$n2" 2>/dev/null
  wait "$hap" "$n1" "$n2" 2>/dev/null
  leak_verdict "$WORK/$name.hap" "$WORK/$name-n1.srv" "$WORK/$name-n2.srv" "$WORK/$name-n1-error.log" "$WORK/$name-n2-error.log"
  local out o1 o2 o3
  local min=0 min_b=0
  [ "$policy" = always ] && min=32 min_b=16
  o1=$(python3 "$APPS/report_summary.py" --port "$port" --policy "$policy" --server "$hrep" --client "$crep" \
    --min-accel $min --both-ends) || bad+="reports (client -> haproxy): "
  o2=$(python3 "$APPS/report_summary.py" --port $((port + 1)) --policy "$policy" --server "$nrep" --client "$hrep" \
    --min-accel $min_b --both-ends) || bad+="reports (haproxy -> nginx 1): "
  o3=$(python3 "$APPS/report_summary.py" --port $((port + 2)) --policy "$policy" --server "$nrep" --client "$hrep" \
    --min-accel $min_b --both-ends) || bad+="reports (haproxy -> nginx 2): "
  # Round robin: each nginx served connections.
  [[ $o2 =~ server\ ([0-9]+)\ ends ]] && [ "${BASH_REMATCH[1]}" -gt 0 ] &&
    [[ $o3 =~ server\ ([0-9]+)\ ends ]] && [ "${BASH_REMATCH[1]}" -gt 0 ] || bad+="not both nginx served; "
  out="client -> haproxy: $o1; haproxy -> nginx 1: $o2; haproxy -> nginx 2: $o3"
  if [ -n "$bad" ]; then
    fail $name "$bad | wrk -c 32 keep-alive: $WRK_SUM; $out; $LEAK_MSG"
    return
  fi
  pass "$name (files 0 B..4 MiB byte-exact; wrk -c 32 keep-alive: $WRK_SUM; $out; $LEAK_MSG)"
}

# app: HAProxy, TCP mode, before two nginx | wrk -c 32 keep-alive and curl through the proxy | files byte-exact, every wrk body; both nginx served; three legs' reports; leak check | haproxy_tcp_nginx
register_case haproxy_tcp_nginx_auto case_haproxy_tcp haproxy_tcp_nginx_auto auto
register_case haproxy_tcp_nginx_always case_haproxy_tcp haproxy_tcp_nginx_always always
