# HTTP servers of two event loops, each under the default policy (auto) and
# under VSOCKET_UPGRADE=always, vm2 serving and vm1 asking, both preloaded:
# Node.js's http module (libuv: epoll, accept4, writev; it closes sockets
# with syscall(SYS_close, fd), not close()) and Python's asyncio through
# aiohttp. Keep-alive (wrk -c 32) and, for node, one connection per request
# (wrk and curl with "Connection: close"). Every body is checked (curl's
# sha256, wrk_body.lua's comparison of every wrk response); the reports of
# both sides are judged by tests/e2e/apps/report_summary.py; the leak check
# (suite.sh: leak_begin, leak_untracked, leak_end) asks vsocketd, after the
# load and while the server still runs, for the connections it still tracks
# on the port (none: every close reached it), and after the server stopped
# for its devices and active connections (back to where they were), and no
# log may say "shared region full".

# case_http_server NAME SERVER POLICY LOAD: SERVER node|aiohttp, POLICY
# auto|always, LOAD keepalive (wrk -c 32 for 3 s on a 4 KiB body) or close
# (wrk -c 16 for 3 s and 300 curl requests, each on a connection of its own).
case_http_server() {
  local name=$1 server=$2 policy=$3 load=$4
  local -x VSOCKET_UPGRADE=$policy
  local port www=$WORK/$name-www srep=$WORK/$name.srv.jsonl crep=$WORK/$name.cli.jsonl s cmd
  port=$(alloc_port)
  case $server in
    node)
      command -v node >/dev/null || { fail $name "node not installed (deploy/install-deps.sh)"; return; }
      cmd=(node "$APPS/http_server.js" "$A2" "$port" "$www")
      ;;
    aiohttp)
      $SYS_PY -c "import aiohttp" 2>/dev/null || { fail $name "python3-aiohttp not installed (deploy/install-deps.sh)"; return; }
      cmd=("$SYS_PY" "$APPS/aiohttp_server.py" "$A2" "$port" "$www")
      ;;
  esac
  mkdir -p "$www" "$WORK/$name-got"
  for s in 0 4095 300000 4194304; do head -c $s /dev/urandom >"$www/f$s"; done
  leak_begin
  serve_listening $name vm2 "$srep" "${cmd[@]}" || return
  local srv=$BG
  local bad="" f url=http://$A2:$port
  # Every file byte-exact, on one keep-alive connection (the 4 MiB one
  # streams: registered under auto too).
  vm_run vm1 preload "$crep" curl -sf -o "$WORK/$name-got/f0" "$url/f0" -o "$WORK/$name-got/f4095" "$url/f4095" \
    -o "$WORK/$name-got/f300000" "$url/f300000" -o "$WORK/$name-got/f4194304" "$url/f4194304" >/dev/null 2>&1 ||
    bad+="curl of the files failed; "
  for f in f0 f4095 f300000 f4194304; do cmp -s "$www/$f" "$WORK/$name-got/$f" || bad+="$f not byte-exact; "; done
  local wrk_sum="" curl_sum=""
  if [ "$load" = keepalive ]; then
    vm_run vm1 preload "$crep" wrk -t 2 -c 32 -d 3 -s "$APPS/wrk_body.lua" "$url/f4095" -- "$www/f4095" \
      >"$WORK/$name.wrk" 2>&1
    wrk_judge "$WORK/$name.wrk" || bad+="wrk keep-alive: $WRK_SUM; "
    wrk_sum="wrk -c 32 keep-alive: $WRK_SUM"
  else
    vm_run vm1 preload "$crep" wrk -t 2 -c 16 -d 3 -H "Connection: close" -s "$APPS/wrk_body.lua" "$url/f4095" \
      -- "$www/f4095" >"$WORK/$name.wrk" 2>&1
    wrk_judge "$WORK/$name.wrk" || bad+="wrk Connection: close: $WRK_SUM; "
    wrk_sum="wrk -c 16 Connection: close: $WRK_SUM"
    # 300 requests, one connection each, every body compared.
    mkdir -p "$WORK/$name-loop"
    vm_run vm1 preload "$crep" curl -sf -H "Connection: close" -o "$WORK/$name-loop/r#1" "$url/f4095?n=[1-300]" \
      >"$WORK/$name.curl" 2>&1 || bad+="curl loop failed: $(tail -1 "$WORK/$name.curl"); "
    local n_ok=0
    for f in "$WORK/$name-loop"/r*; do cmp -s "$f" "$www/f4095" && n_ok=$((n_ok + 1)); done
    [ "$n_ok" -eq 300 ] || bad+="curl loop: $n_ok of 300 bodies byte-exact; "
    curl_sum="curl: $n_ok/300 one-connection requests byte-exact"
  fi
  leak_untracked "$port"
  kill "$srv" 2>/dev/null
  wait "$srv" 2>/dev/null
  leak_verdict "$WORK/$name.srv"
  local out
  local min=0
  [ "$policy" = always ] && min=32
  out=$(python3 "$APPS/report_summary.py" --port "$port" --policy "$policy" --server "$srep" --client "$crep" \
    --min-accel $min --both-ends) || bad+="reports: "
  if [ -n "$bad" ]; then
    fail $name "$bad | $wrk_sum; ${curl_sum:+$curl_sum; }reports: $out; $LEAK_MSG"
    return
  fi
  pass "$name (files 0 B..4 MiB byte-exact; $wrk_sum; ${curl_sum:+$curl_sum; }$out; $LEAK_MSG)"
}

# app: Node.js `http` (libuv; closes with syscall(SYS_close)) | keep-alive: wrk -c 32, bodies 0 B-4 MiB | every body (curl's sha256, every wrk response); leak check | node_http_keepalive
# app: Node.js `http`, short connections | wrk `Connection: close` and 300 curl | every body; leak check (the region must not fill) | node_http_close
# app: Python asyncio (aiohttp) | keep-alive: wrk -c 32 | every body; leak check | aiohttp_keepalive
register_case node_http_keepalive_auto case_http_server node_http_keepalive_auto node auto keepalive
register_case node_http_keepalive_always case_http_server node_http_keepalive_always node always keepalive
register_case node_http_close_auto case_http_server node_http_close_auto node auto close
register_case node_http_close_always case_http_server node_http_close_always node always close
register_case aiohttp_keepalive_auto case_http_server aiohttp_keepalive_auto aiohttp auto keepalive
register_case aiohttp_keepalive_always case_http_server aiohttp_keepalive_always aiohttp always keepalive
