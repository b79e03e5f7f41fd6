# Shared by the end-to-end suites (tests/e2e/run.sh: same_host/,
# cross_host/; tests/rdma/cross_host_guest.sh). The caller sets TB (its test
# bed script, with `exec VM CMD...` and `down`), LIB (libvsocket.so), WORK (a
# scratch directory), passed=0, failed=0 and PIDS=(); for the run_* cases
# also XFER (tests/e2e/xfer) and CHECK (check_report.py).

# The cases prove the accelerated path, so every connection registers at
# its first I/O. On a machine of few CPUs vsocketd shares, the default
# policy (auto) keeps request/response connections on kernel TCP until they
# stream (decision 51); the cases of that policy set VSOCKET_UPGRADE=auto
# themselves.
export VSOCKET_UPGRADE=always

# For `trap e2e_cleanup EXIT`: stops the background processes we started,
# takes the test bed down, removes WORK.
e2e_cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  bash $TB down >/dev/null 2>&1
  if [ -n "${E2E_KEEP:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}

pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() {
  echo "FAIL $1: $2"
  failed=$((failed + 1))
  keep_failure "$1"
}

# keep_failure NAME: with E2E_FAIL_DIR set (tests/run_all.sh sets it to its
# logs directory), what a failed case leaves for the one who reads the log
# later: its files in WORK (reports, servers' and tools' output: the names
# that start with NAME, each up to 16 MiB, gzipped if larger) and the last
# 3,000 lines of each vsocketd log of the test bed, in E2E_FAIL_DIR/NAME/. A
# flaky failure in CI is otherwise gone with the scratch directory.
keep_failure() {
  [ -n "${E2E_FAIL_DIR:-}" ] && [ -n "$1" ] || return 0
  local dir=$E2E_FAIL_DIR/$1 f
  mkdir -p "$dir" || return 0
  for f in "$WORK/$1".* "$WORK/$1"-*; do
    [ -f "$f" ] || continue
    if [ "$(stat -c %s "$f" 2>/dev/null || echo 0)" -le 16777216 ]; then
      cp "$f" "$dir/" 2>/dev/null
    else  # (a report of thousands of connections: compressed, if that fits)
      gzip -c "$f" 2>/dev/null | head -c 16777217 >"$dir/${f##*/}.gz"
      [ "$(stat -c %s "$dir/${f##*/}.gz")" -le 16777216 ] || rm -f "$dir/${f##*/}.gz"
    fi
  done
  local log n=0
  for log in "${VSOCKET_TESTBED_DIR:-/run/vsocket-testbed}/vsocketd.log" "${VSOCKET_TESTBED2_DIR:-/run/vsocket-testbed2}"/*/vsocketd.log; do
    [ -f "$log" ] || continue
    n=$((n + 1))
    tail -n 3000 "$log" >"$dir/vsocketd-$n.log" 2>/dev/null
    echo "$log" >>"$dir/vsocketd-logs.txt"
  done
  return 0
}

# vm_run VM preload|plain REPORT CMD...: runs CMD in VM, bounded by
# E2E_TIMEOUT seconds (default 60).
vm_run() {
  local vm=$1 how=$2 report=$3
  shift 3
  if [ "$how" = preload ]; then
    VSOCKET_REPORT=$report LD_PRELOAD=$LIB bash $TB exec "$vm" timeout "${E2E_TIMEOUT:-60}" "$@"
  else
    bash $TB exec "$vm" timeout "${E2E_TIMEOUT:-60}" "$@"
  fi
}

# vm_bg VM how REPORT LOG CMD...: the same in the background; PID in $BG.
# Started directly (not through vm_run in a subshell) so that $BG is the
# bounded `timeout` process itself (the test bed script and ip netns exec
# exec into it), and killing it stops the server.
vm_bg() {
  local vm=$1 how=$2 report=$3 log=$4
  shift 4
  if [ "$how" = preload ]; then
    VSOCKET_REPORT=$report LD_PRELOAD=$LIB bash $TB exec "$vm" timeout "${E2E_TIMEOUT:-60}" "$@" >"$log" 2>&1 &
  else
    bash $TB exec "$vm" timeout "${E2E_TIMEOUT:-60}" "$@" >"$log" 2>&1 &
  fi
  BG=$!
  PIDS+=("$BG")
}

# Two-host bed (deploy/testbed2.sh): the fabric link is cut for SECONDS.
# hostB's kernel answers every segment hostA sends to the peering port
# (7300: TLS and tcp link; hostA is the side that connects) with an RST, so
# hostA's sockets die at its next segment; hostB learns from its own
# sends, or when hostA reconnects. Then the rule goes away.
# stall_link DROP_SECONDS RST_SECONDS: hostB first drops hostA's link
# segments silently (what hostA sends meanwhile is in flight, unacked),
# then answers them with RST (hostA's links die with those bytes lost).
# A third argument names a file to create once the drop is in place (the
# client under test waits for it before it writes what must be lost).
stall_link() {
  local ns=${VSOCKET_TESTBED2_NS_PREFIX:-vs2}hostB
  ip netns exec "$ns" nft -f - <<'NFT'
table inet vsocket_fault {
  chain in { type filter hook input priority 0; tcp dport 7300 drop; }
}
NFT
  [ -n "${3:-}" ] && touch "$3"
  sleep "$1"
  ip netns exec "$ns" nft -f - <<'NFT'
flush chain inet vsocket_fault in
add rule inet vsocket_fault in tcp dport 7300 reject with tcp reset
NFT
  sleep "$2"
  ip netns exec "$ns" nft delete table inet vsocket_fault
}

cut_link() { # cut_link SECONDS
  local ns=${VSOCKET_TESTBED2_NS_PREFIX:-vs2}hostB
  ip netns exec "$ns" nft -f - <<'NFT'
table inet vsocket_fault {
  chain in { type filter hook input priority 0; tcp dport 7300 reject with tcp reset; }
}
NFT
  sleep "$1"
  ip netns exec "$ns" nft delete table inet vsocket_fault
}

# ---- cases shared by the same-host and cross-host suites --------------------
# Each runs a real application between CLIENT-VM and SERVER-VM (server at
# ADDR), both preloaded, checks what it must, and returns 0/1 with the
# summary or the reason in E2E_MSG; it counts nothing itself.

# nginx_conf TAG ADDR PORT WWW [DIRECTIVE...]: $WORK/TAG.conf, nginx serving
# WWW on ADDR:PORT (2 workers, sendfile), its pid in $WORK/TAG.pid; the
# directives go into the http block.
nginx_conf() {
  local tag=$1 addr=$2 port=$3 www=$4
  shift 4
  mkdir -p "$WORK/$tag-tmp"
  cat >"$WORK/$tag.conf" <<CONF
daemon off;
master_process on;
user root;
worker_processes 2;
pid $WORK/$tag.pid;
error_log $WORK/$tag-error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  $*
  client_body_temp_path $WORK/$tag-tmp;
  proxy_temp_path $WORK/$tag-tmp;
  fastcgi_temp_path $WORK/$tag-tmp;
  uwsgi_temp_path $WORK/$tag-tmp;
  scgi_temp_path $WORK/$tag-tmp;
  server { listen $addr:$port; root $www; }
}
CONF
}

# wait_for_text FILE PATTERN TENTHS: until FILE has a line matching PATTERN
# (grep), at most TENTHS tenths of a second; false if it never came.
wait_for_text() {
  local _
  for _ in $(seq "$3"); do grep -q -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}

# serve_listening NAME VM REPORT CMD...: CMD in VM, preloaded (output in
# $WORK/NAME.srv, PID in $BG), once it printed a line "listening" (within
# 30 s). Otherwise it is stopped, the case NAME fails, and this returns 1.
serve_listening() {
  local name=$1 vm=$2 report=$3
  shift 3
  vm_bg "$vm" preload "$report" "$WORK/$name.srv" "$@"
  wait_for_text "$WORK/$name.srv" "^listening" 300 && return 0
  kill "$BG" 2>/dev/null
  wait "$BG" 2>/dev/null
  fail $name "the server did not listen within 30 s: $(tail -3 "$WORK/$name.srv" | tr '\n' ' ')"
  return 1
}

# wait_listen VM PORT: until a server listens there (bounded: 30 s; a
# preloaded process can take seconds to start under emulation).
wait_listen() {
  local _
  for _ in $(seq 150); do
    bash $TB exec "$1" ss -Hltn "sport = :$2" 2>/dev/null | grep -q . && return 0
    sleep 0.2
  done
  return 1
}

# run_crash NAME CLIENT-VM SERVER-VM ADDR PORT BYTES: a client SIGKILLed right
# after its last write; the server must still verify every byte and EOF, on
# one accelerated connection.
run_crash() {
  local name=$1 cvm=$2 svm=$3 addr=$4 port=$5 bytes=$6 rep=$WORK/$1.jsonl
  vm_bg "$svm" preload "$rep" "$WORK/$name.srv" "$XFER" server "$addr" "$port" --one-way
  local srv=$BG
  if ! wait_listen "$svm" "$port"; then
    E2E_MSG="server not listening after 30 s"
    kill "$srv" 2>/dev/null
    return 1
  fi
  vm_run "$cvm" preload "$rep" "$XFER" client "$addr" "$port" --bytes "$bytes" --one-way --crash >/dev/null 2>&1
  if ! wait "$srv"; then
    E2E_MSG="server: $(tail -2 "$WORK/$name.srv" | tr '\n' ' ')"
    return 1
  fi
  E2E_MSG=$(python3 $CHECK "$rep" --port "$port" --expect-conns 1 --mode accelerated --accel-min 1 \
    --exact-total $((bytes + 16)))
}

# run_sockperf NAME CLIENT-VM SERVER-VM ADDR PORT MODE [sockperf args]: sockperf
# MODE (pp, tp) for 2 s; every connection accelerated.
run_sockperf() {
  local name=$1 cvm=$2 svm=$3 addr=$4 port=$5 mode=$6 rep=$WORK/$1.jsonl
  shift 6
  vm_bg "$svm" preload "$rep" "$WORK/$name.srv" sockperf sr --tcp -i "$addr" -p "$port"
  local srv=$BG
  sleep 0.5
  # (Ping-pong: sockperf's table of round trips holds what its default
  # rate cap allows, about 1.8 M in 2 s, and a direct pair makes more: it
  # stops with "_seqN > m_maxSequenceNo". A higher cap paces nothing here.)
  local mps=()
  [ "$mode" = pp ] && mps=(--mps 10000000)
  vm_run "$cvm" preload "$rep" sockperf "$mode" --tcp -i "$addr" -p "$port" -t 2 "${mps[@]}" "$@" >"$WORK/$name.cli" 2>&1
  local rc=$?
  kill "$srv" 2>/dev/null
  wait "$srv" 2>/dev/null
  local summary out
  summary=$(grep -E "Summary: (Latency|Message Rate)" "$WORK/$name.cli" | head -1 | sed 's/.*Summary: //')
  if [ $rc -ne 0 ] || [ -z "$summary" ]; then
    E2E_MSG="sockperf: $(tail -3 "$WORK/$name.cli" | tr '\n' ' ')"
    return 1
  fi
  out=$(python3 $CHECK "$rep" --port "$port" --mode accelerated --accel-min 1) || { E2E_MSG=$out; return 1; }
  E2E_MSG="$summary; $out"
}

# run_iperf NAME CLIENT-VM SERVER-VM ADDR PORT "CHECK ARGS" [iperf3 args]:
# iperf3 for 2 s, the report judged by check_report.py CHECK ARGS.
run_iperf() {
  local name=$1 cvm=$2 svm=$3 addr=$4 port=$5 check=$6 rep=$WORK/$1.jsonl
  shift 6
  vm_bg "$svm" preload "$rep" "$WORK/$name.srv" iperf3 -s -B "$addr" -p "$port" -1
  local srv=$BG
  sleep 0.5
  if ! vm_run "$cvm" preload "$rep" iperf3 -c "$addr" -p "$port" -t 2 "$@" >"$WORK/$name.cli" 2>&1; then
    E2E_MSG="iperf3: $(tail -3 "$WORK/$name.cli" | tr '\n' ' ')"
    kill "$srv" 2>/dev/null
    return 1
  fi
  wait "$srv" 2>/dev/null
  local rate out
  rate=$(grep -E "SUM.*receiver|^\[ *[0-9]+\].*receiver" "$WORK/$name.cli" | tail -1 | grep -oE "[0-9.]+ [GM]bits/sec")
  # shellcheck disable=SC2086  # check is a word list
  out=$(python3 $CHECK "$rep" --port "$port" $check) || { E2E_MSG=$out; return 1; }
  E2E_MSG="$rate; $out"
}
