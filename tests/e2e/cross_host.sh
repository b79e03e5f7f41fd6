#!/usr/bin/env bash
# End-to-end tests between two hosts (deploy/testbed2.sh): real applications
# in VMs on different hypervisors, each attached to its own vsocketd, the two
# backends linked by the tcp fabric over TLS-authenticated peering.
# Every case checks the bytes (xfer's stream checks, sha256, redis values)
# and proves with libvsocket's per-connection report and both daemons'
# fabric counters that the data crossed the fabric link, not kernel TCP.
#
#   tests/e2e/cross_host.sh [BIN_DIR]     BIN_DIR: Bazel output (default bazel-out/k8-opt/bin)
#
# Prints PASS/FAIL per case and ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=$(realpath "${1:-bazel-out/k8-opt/bin}")
LIB=$BIN/guest/libvsocket.so
XFER=$BIN/tests/e2e/xfer
CHECK=tests/e2e/check_report.py
TB=deploy/testbed2.sh
export VSOCKETD=$BIN/host-backend/vsocketd VSOCKETCTL=$BIN/host-backend/vsocketctl
export VSOCKET_TESTBED2_DIR=${VSOCKET_TESTBED2_DIR:-/run/vsocket-testbed2}
# Two data links per host pair (links_per_peer): connections spread over
# them; the link-loss cases lose both.
export VSOCKET_TESTBED2_LINKS=${VSOCKET_TESTBED2_LINKS:-2}
WORK=$(mktemp -d /tmp/vsocket-e2e2-XXXXXX)
passed=0
failed=0
PIDS=()

for f in "$LIB" "$XFER" "$VSOCKETD" "$VSOCKETCTL"; do
  [ -e "$f" ] || { echo "missing $f (build first)"; echo "0 passed, 1 failed"; exit 1; }
done

trap e2e_cleanup EXIT  # tests/e2e/lib.sh, sourced below

. tests/e2e/lib.sh  # pass, fail, vm_run, vm_bg

counter() { # counter HOST NAME: one value of `vsocketctl counters`
  bash $TB ctl "$1" counters 2>/dev/null | awk -v n="$2" '$1 == n {print $2}'
}
link_field() { # link_field HOST FIELD: from `vsocketctl --json stats` links[0]
  bash $TB ctl "$1" --json stats 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['links'][0]['$2'])"
}

# conn_rows HOST PORT: HOST's connections to or from PORT (a client's or a
# server's) as "mode/reason via VIA: N B out" (one per line);
# conns_accelerated HOST PORT N: until N of them are accelerated (bounded: 15 s).
conn_rows() {
  bash $TB ctl "$1" --json stats 2>/dev/null | python3 -c "
import json, sys
for c in json.load(sys.stdin)['connections']:
    if c['peer'].endswith(':$2') or c['local'].endswith(':$2'): print(f\"{c['mode']}/{c['reason']} via {c['via'] or '-'}: {c['accel_bytes_out']} B out\")" 2>/dev/null
}
conns_accelerated() {
  local _
  for _ in $(seq 60); do
    [ "$(conn_rows "$1" "$2" | grep -c '^accelerated/')" -ge "$3" ] && return 0
    sleep 0.25
  done
  return 1
}
echo "== two-host test bed up"
if ! bash $TB up >"$WORK/up.log" 2>&1; then
  cat "$WORK/up.log"
  fail testbed2 "deploy/testbed2.sh up failed"
  echo "$passed passed, $failed failed"
  exit 1
fi
A1=$(bash $TB addr vmA1)
A2=$(bash $TB addr vmA2)
B1=$(bash $TB addr vmB1)
B2=$(bash $TB addr vmB2)
pass "testbed2_link_up (hostA <-> hostB: TLS 1.3 mutual auth, $VSOCKET_TESTBED2_LINKS tcp fabric link(s) keyed by the TLS exporter)"

# ---- accelerated transfers across the fabric -----------------------------------

# run_xfer NAME CLIENT-VM SERVER-VM SERVER-ADDR CONNS BYTES PORT [xfer args]:
# a checksummed transfer each way, every connection accelerated and exact
# (from the libraries' reports). Returns 0/1 with the summary or the reason
# in XFER_MSG; counts nothing itself.
# XFER_GATE=HOST: the clients (on HOST) send their streams only once HOST
# shows every connection accelerated (xfer --start-wait-file; bounded: 15 s,
# then they go anyway and the check below says what their ends were).
run_xfer() {
  local name=$1 cvm=$2 svm=$3 saddr=$4 conns=$5 bytes=$6 port=$7
  shift 7
  local rep=$WORK/$name.jsonl start=$WORK/$name.start gate=() rows=
  vm_bg "$svm" preload "$rep" "$WORK/$name.srv" "$XFER" server "$saddr" "$port" --conns "$conns" "$@"
  local srv=$BG
  [ -n "${XFER_GATE:-}" ] && gate=(--start-wait-file "$start")
  vm_bg "$cvm" preload "$rep" "$WORK/$name.cli" "$XFER" client "$saddr" "$port" --conns "$conns" --bytes "$bytes" \
    "${gate[@]}" "$@"
  local cli=$BG
  if [ -n "${XFER_GATE:-}" ]; then
    conns_accelerated "$XFER_GATE" "$port" "$conns" ||
      rows="; after 15 s $XFER_GATE showed: $(conn_rows "$XFER_GATE" "$port" | sort | uniq -c | tr -s ' \n' ' ')"
    touch "$start"
  fi
  if ! wait "$cli"; then
    XFER_MSG="client: $(tail -2 "$WORK/$name.cli" | tr '\n' ' ')$rows"
    kill "$srv" 2>/dev/null
    return 1
  fi
  if ! wait "$srv"; then
    XFER_MSG="server: $(tail -2 "$WORK/$name.srv" | tr '\n' ' ')"
    return 1
  fi
  # XFER_CHECK: how strictly to judge acceleration (default: every end).
  # shellcheck disable=SC2086
  if ! XFER_MSG=$(python3 $CHECK "$rep" --port "$port" --expect-conns $((2 * conns)) \
      ${XFER_CHECK:---mode accelerated --reason accelerated --accel-min 1} --exact-total $((bytes + 16))); then
    XFER_MSG="$XFER_MSG$rows"
    return 1
  fi
  XFER_MSG="$conns conns x $bytes B each way, byte-checked; $XFER_MSG"
}

# fabric_xfer: run_xfer across hosts, plus: every byte the libraries sent
# accelerated crossed the fabric, and most of the stream did (the rest went
# on kernel TCP before the upgrade).
fabric_xfer() {
  local name=$1 conns=$5 bytes=$6
  local a0 b0 da db accel
  a0=$(counter hostA fabric_bytes_out)
  b0=$(counter hostB fabric_bytes_out)
  run_xfer "$@" || return 1
  da=$(($(counter hostA fabric_bytes_out) - a0))
  db=$(($(counter hostB fabric_bytes_out) - b0))
  accel=$(python3 -c "import json,sys; print(sum(json.loads(l)['accel_tx'] for l in open(sys.argv[1]) if l.strip()))" "$WORK/$name.jsonl")
  if [ $((da + db)) -ne "$accel" ] || [ "$accel" -lt "$conns" ] || [ $((2 * accel)) -lt $((2 * conns * bytes)) ]; then
    XFER_MSG="fabric carried $da B A->B + $db B B->A, libraries sent $accel B accelerated of $((2 * conns * bytes))"
    return 1
  fi
  XFER_MSG="$XFER_MSG; fabric A->B $da B, B->A $db B"
}

case_xfer() {
  if fabric_xfer "$@"; then pass "$1 ($XFER_MSG)"; else fail "$1" "$XFER_MSG"; fi
}

case_xfer cross_xfer_one_connection vmA1 vmB1 "$B1" 1 33554432 7101
# 64 connections open at once: the clients send their streams once hostA
# shows all 64 accelerated (XFER_GATE), and every end must be accelerated.
# Without a gate a pairing raced the whole 1 MiB exchange (the kernel socket
# buffers absorb it in a few ms): on a loaded 2-core machine up to 5 of 64
# connections finished on kernel TCP before their pairing did (CI,
# 2026-11-25), exact but not what this case is about; a fixed pause only
# moves the race. One connection racing its pairing is
# cross_xfer_one_connection above.
XFER_GATE=hostA case_xfer cross_xfer_64_connections vmA1 vmB1 "$B1" 64 1048576 7102
case_xfer cross_xfer_reverse_direction vmB1 vmA2 "$A2" 4 4194304 7103

# Every link of the host pair carried frames both ways (each connection
# sends on one link, consecutive connections on different ones).
case_links_spread() {
  local name=cross_links_spread out h
  for h in hostA hostB; do
    if ! out=$(bash $TB ctl $h --json stats 2>/dev/null | python3 -c "
import json, sys
l = json.load(sys.stdin)['links'][0]
want = $VSOCKET_TESTBED2_LINKS
per = l['link_frames_out']
ok = l['links'] == want and len(per) == want and all(n > 0 for n in per)
print(('' if ok else 'want %d links all used: ' % want) + 'links %d, frames out per link %s' % (l['links'], per))
sys.exit(0 if ok else 1)"); then
      fail $name "$h: $out"
      return
    fi
  done
  pass "$name (hostB $out)"
}
case_links_spread

# A client killed right after writing: the remote server still gets every byte.
if run_crash cross_sender_killed vmA1 vmB1 "$B1" 7104 16777216; then
  pass "cross_sender_killed (remote server verified all 16777216 B and EOF after the client was SIGKILLed; $E2E_MSG)"
else
  fail cross_sender_killed "$E2E_MSG"
fi

case_sockperf() { # case_sockperf NAME MODE PORT [sockperf args]; the fabric carried it
  local a0 da
  a0=$(counter hostA fabric_bytes_out)
  run_sockperf "$1" vmA1 vmB1 "$B1" "$3" "$2" "${@:4}" || { fail "$1" "$E2E_MSG"; return; }
  da=$(($(counter hostA fabric_bytes_out) - a0))
  [ "$da" -gt 0 ] || { fail "$1" "no bytes on the fabric"; return; }
  pass "$1 ($E2E_MSG; fabric A->B $da B)"
}
case_sockperf cross_sockperf_pingpong_16B pp 7201 -m 16
case_sockperf cross_sockperf_throughput_1KiB tp 7202 -m 1024

# iperf3's control connection may finish its few bytes before the pairing,
# and a stream may start at full speed on kernel TCP before it: require
# that most of all bytes went accelerated.
case_iperf() { # case_iperf NAME PORT [iperf3 args]
  if run_iperf "$1" vmA1 vmB1 "$B1" "$2" "--bulk-accel 0 --aggregate" "${@:3}"; then
    pass "$1 ($E2E_MSG)"
  else
    fail "$1" "$E2E_MSG"
  fi
}
case_iperf cross_iperf3_4_streams 7301 -P 4
case_iperf cross_iperf3_reverse 7302 -R

# Under the default policy (what a user gets; the other cases run
# VSOCKET_UPGRADE=always): a bulk stream across the tcp fabric stays on
# kernel TCP, where it is faster (decision 62). xfer's client writes
# 128 KiB on average, one way: hostA keeps its registration on kernel TCP
# (reason kernel-faster, counter kept_kernel_faster), no stream byte crosses
# the fabric, every byte arrives. Its receiver, registered on hostB because
# it reads a stream, is told so at once (PAIR_DECLINE; decision 63) and
# leaves its registration instead of waiting on the pending path for good:
# every end reports kernel-faster, and while the server lives on after its
# connections closed, hostB holds no registration of them. A stream of
# 1 KiB messages is still accelerated under the same policy (small writes:
# the fabric wins).
case_bulk_default_policy() {
  local name=cross_bulk_default_policy port=7304 conns=2 bytes=33554432
  local rep=$WORK/$name.jsonl a0 b0 k0 d0 da db dk dd out rows srv cli
  a0=$(counter hostA fabric_bytes_out)
  b0=$(counter hostB fabric_bytes_out)
  k0=$(counter hostA kept_kernel_faster)
  d0=$(counter hostB pair_declines_received)
  VSOCKET_UPGRADE=auto vm_bg vmB1 preload "$rep" "$WORK/$name.srv" "$XFER" server "$B1" $port --conns $conns \
    --one-way --exit-delay-ms 4000
  srv=$BG
  VSOCKET_UPGRADE=auto vm_bg vmA1 preload "$rep" "$WORK/$name.cli" "$XFER" client "$B1" $port --conns $conns \
    --bytes $bytes --one-way
  cli=$BG
  if ! wait "$cli"; then
    fail $name "client: $(tail -2 "$WORK/$name.cli" | tr '\n' ' ')"
    kill "$srv" 2>/dev/null
    return
  fi
  wait_for_text "$WORK/$name.srv" "connections verified" 40
  sleep 0.3  # (the server's close() has unregistered by now, or never will)
  rows=$(conn_rows hostB $port | sort | uniq -c | tr -s ' \n' ' ')
  if ! wait "$srv"; then
    fail $name "server: $(tail -2 "$WORK/$name.srv" | tr '\n' ' ')"
    return
  fi
  if [ -n "$rows" ]; then
    fail $name "after the server closed its connections hostB still holds their registrations: $rows"
    return
  fi
  da=$(($(counter hostA fabric_bytes_out) - a0))
  db=$(($(counter hostB fabric_bytes_out) - b0))
  dk=$(($(counter hostA kept_kernel_faster) - k0))
  dd=$(($(counter hostB pair_declines_received) - d0))
  if ! out=$(python3 - "$rep" $port $conns <<'PY'
import json, sys
port, conns = int(sys.argv[2]), int(sys.argv[3])
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r.get("event") in ("close", "exit") and
        (r["local"].endswith(":%d" % port) or r["peer"].endswith(":%d" % port))]
accel = sum(r.get("accel_tx", 0) + r.get("accel_rx", 0) for r in rows)
kept = sum(1 for r in rows if r.get("reason") == "kernel-faster" and r.get("mode") == "kernel")
others = sorted({"%s/%s" % (r.get("mode"), r.get("reason")) for r in rows} - {"kernel/kernel-faster"})
print("%d ends, %d kept kernel-faster, %d B accelerated%s" % (len(rows), kept, accel,
      "; other ends: " + ", ".join(others) if others else ""))
sys.exit(0 if accel == 0 and kept == 2 * conns and len(rows) == 2 * conns else 1)
PY
  ); then
    fail $name "$out"
    return
  fi
  if [ "$dk" -lt $conns ] || [ "$dd" -lt 1 ] || [ $((da + db)) -gt 1048576 ]; then
    fail $name "hostA kept $dk registrations on kernel TCP (want >= $conns), hostB heard $dd declines (want >= 1); the fabric carried $da B A->B, $db B B->A"
    return
  fi
  out="$out; $(grep -o '[0-9]*/[0-9]* connections verified' "$WORK/$name.srv") by the server"
  pass "$name ($conns conns x $bytes B one way, byte-checked; $out; hostA kept_kernel_faster +$dk, hostB pair_declines_received +$dd; fabric $da B A->B)"
}
case_bulk_default_policy

# The other way round: the server streams (iperf3 -R, default policy). The
# client, registered as a reader, has asked hostB to pair before the
# server's registration is kept on kernel TCP there: hostB answers that
# request PAIR_REJECT kernel-faster, and the client leaves the pending path.
case_bulk_default_policy_reverse() {
  local name=cross_bulk_default_policy_reverse port=7305 rep=$WORK/bulkrev.jsonl out srv
  VSOCKET_UPGRADE=auto vm_bg vmB1 preload "$rep" "$WORK/bulkrev.srv" iperf3 -s -B "$B1" -p $port -1
  srv=$BG
  wait_listen vmB1 $port
  if ! VSOCKET_UPGRADE=auto vm_run vmA1 preload "$rep" iperf3 -c "$B1" -p $port -t 2 -R -l 128K >"$WORK/bulkrev.cli" 2>&1; then
    fail $name "iperf3 -R: $(tail -3 "$WORK/bulkrev.cli" | tr '\n' ' ')"
    kill "$srv" 2>/dev/null
    return
  fi
  wait "$srv"
  if ! out=$(python3 - "$rep" $port <<'PY'
import json, sys
port = int(sys.argv[2])
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r.get("event") in ("close", "exit") and
        (r["local"].endswith(":%d" % port) or r["peer"].endswith(":%d" % port))]
big = [r for r in rows if r.get("kernel_tx", 0) + r.get("kernel_rx", 0) > 1 << 20]
modes = sorted("%s/%s" % (r.get("mode"), r.get("reason")) for r in big)
print("data connection ends: " + ", ".join(modes))
sys.exit(0 if len(big) == 2 and all(m == "kernel/kernel-faster" for m in modes) else 1)
PY
  ); then
    fail $name "$out"
    return
  fi
  pass "$name (iperf3 -R 2 s; $out)"
}
case_bulk_default_policy_reverse
VSOCKET_UPGRADE=auto case_sockperf cross_sockperf_throughput_1KiB_default_policy tp 7203 -m 1024

case_redis() {
  local name=cross_redis rep=$WORK/redis.jsonl port=6379
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
case_redis

case_nginx() {
  local name=cross_nginx_curl_sha256 rep=$WORK/nginx.jsonl port=8080 www=$WORK/www
  mkdir -p "$www" "$WORK/nginx-tmp"
  local sizes="0 1 4095 65536 1048577 16777216 67108864"
  for s in $sizes; do head -c "$s" /dev/urandom >"$www/f$s"; done
  cat >"$WORK/nginx.conf" <<CONF
daemon off;
master_process on;
user root;
worker_processes 2;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  client_body_temp_path $WORK/nginx-tmp;
  proxy_temp_path $WORK/nginx-tmp;
  fastcgi_temp_path $WORK/nginx-tmp;
  uwsgi_temp_path $WORK/nginx-tmp;
  scgi_temp_path $WORK/nginx-tmp;
  server { listen $B1:$port; root $www; }
}
CONF
  vm_bg vmB1 preload "$rep" "$WORK/nginx.srv" nginx -c "$WORK/nginx.conf"
  local srv=$BG b0
  for _ in $(seq 50); do [ -s "$WORK/nginx.pid" ] && break; sleep 0.1; done
  sleep 0.3
  b0=$(counter hostB fabric_bytes_out)
  local bad=""
  for s in $sizes; do
    local got want
    got=$(vm_run vmA2 preload "$rep" curl -sf "http://$B1:$port/f$s" | sha256sum | cut -d' ' -f1)
    want=$(sha256sum "$www/f$s" | cut -d' ' -f1)
    [ "$got" = "$want" ] || bad="$bad f$s"
  done
  kill -QUIT "$(cat "$WORK/nginx.pid" 2>/dev/null)" 2>/dev/null
  sleep 0.5
  kill "$srv" 2>/dev/null
  wait "$srv" 2>/dev/null
  [ -z "$bad" ] || { fail $name "sha256 mismatch for:$bad"; return; }
  local db out
  db=$(($(counter hostB fabric_bytes_out) - b0))
  if ! out=$(python3 $CHECK "$rep" --port $port --bulk-accel 4194304); then
    fail $name "$out"
    return
  fi
  [ "$db" -gt 67108864 ] || { fail $name "only $db B crossed the fabric B->A"; return; }
  pass "$name (files up to 64 MiB via sendfile, sha256 equal; $out; fabric B->A $db B)"
}
case_nginx

# ---- what must stay on kernel TCP ------------------------------------------------

# vmA1 is tenant 1, vmB2 tenant 2: never paired, bytes still exact.
case_cross_tenant() {
  local name=cross_tenant_stays_kernel rep=$WORK/tenant.jsonl port=7401 a0
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
case_cross_tenant

case_mixed() {
  local name=cross_peer_not_preloaded rep=$WORK/mixed.jsonl port=7402
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
case_mixed

# Same-host peers on the two-host bed still pair locally (no fabric bytes).
case_same_host() {
  local name=cross_bed_same_host_stays_local a0
  a0=$(counter hostA fabric_bytes_out)
  run_xfer $name vmA1 vmA2 "$A2" 2 4194304 7403 || { fail $name "$XFER_MSG"; return; }
  [ "$(counter hostA fabric_bytes_out)" = "$a0" ] || { fail $name "same-host bytes went over the fabric"; return; }
  pass "$name (vmA1 <-> vmA2 accelerated by hostA alone; $XFER_MSG)"
}
case_same_host

# One stalled connection (its reader stopped reading) must not stall the
# shared link: it fills its own credit window and waits, while other
# connections cross the same link at full speed.
case_stalled_conn() {
  local name=cross_stalled_connection_does_not_stall_link port=7109 rep=$WORK/stall.jsonl
  vm_bg vmB1 preload "$rep" "$WORK/stall.srv" python3 -c "
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('$B1', $port)); s.listen(1)
c, _ = s.accept()
c.recv(1)          # registers; then never reads again
time.sleep(12)"
  local srv=$BG
  sleep 0.3
  vm_bg vmA1 preload "$rep" "$WORK/stall.cli" python3 -c "
import socket, time
for attempt in range(50):          # the server may still be starting
    try:
        s = socket.create_connection(('$B1', $port)); break
    except ConnectionRefusedError:
        time.sleep(0.1)
s.sendall(b'x'); time.sleep(0.5)   # both ends registered and paired
s.settimeout(10)
try:
    while True: s.sendall(b'y' * 65536)
except Exception:
    pass"
  local cli=$BG
  # Wait (bounded) until the stalled connection has used its whole window.
  local row="" i
  for i in $(seq 50); do
    row=$(bash $TB ctl hostA connections 2>/dev/null | awk -v p=":$port" '$5 ~ p && $6 == "accelerated" && $11 == $12 && $11 > 0')
    [ -n "$row" ] && break
    sleep 0.1
  done
  if [ -z "$row" ]; then
    fail $name "the stalled connection never filled its window on the fabric: $(bash $TB ctl hostA connections | grep ":$port")"
    kill "$cli" "$srv" 2>/dev/null
    return
  fi
  local ok=1
  fabric_xfer stall_others vmA1 vmB1 "$B1" 4 16777216 7110 || ok=0
  # Still stalled, still within its window.
  local row2
  row2=$(bash $TB ctl hostA connections 2>/dev/null | awk -v p=":$port" '$5 ~ p && $6 == "accelerated" && $11 == $12')
  kill "$cli" "$srv" 2>/dev/null
  wait "$cli" "$srv" 2>/dev/null
  [ $ok -eq 1 ] || { fail $name "other connections on the link: $XFER_MSG"; return; }
  [ -n "$row2" ] || { fail $name "the stalled connection changed state meanwhile"; return; }
  pass "$name (one upgraded connection stalled at credit_used = window = $(echo "$row" | awk '{print $12}') B; meanwhile $XFER_MSG)"
}
case_stalled_conn

# ---- peering security ------------------------------------------------------------

case_rogue_peers() {
  local name=rogue_peers_refused ctl="bash $TB ctl hostA"
  local t0 n0 l0
  t0=$(counter hostA peers_refused_tls)
  n0=$(counter hostA peers_refused_name)
  l0=$(counter hostA peers_refused_link)
  local certs=$VSOCKET_TESTBED2_DIR/certs
  bash deploy/make-certs.sh --ca-name rogueca "$WORK/rogue" hostB >/dev/null 2>&1 || true
  bash deploy/make-certs.sh "$certs" intruder >/dev/null 2>&1 || true
  local ns=${VSOCKET_TESTBED2_NS_PREFIX:-vs2}hostB
  # 1. A certificate from another CA, claiming to be hostB.
  ip netns exec $ns timeout 5 openssl s_client -connect 203.0.113.1:7300 -tls1_3 -quiet \
    -cert "$WORK/rogue/hostB.crt" -key "$WORK/rogue/hostB.key" </dev/null >/dev/null 2>&1
  # 2. No client certificate at all.
  ip netns exec $ns timeout 5 openssl s_client -connect 203.0.113.1:7300 -tls1_3 -quiet </dev/null >/dev/null 2>&1
  # 3. A valid certificate of our CA, but not a configured peer.
  ip netns exec $ns timeout 5 openssl s_client -connect 203.0.113.1:7300 -tls1_3 -quiet \
    -cert "$certs/intruder.crt" -key "$certs/intruder.key" -CAfile "$certs/ca.crt" </dev/null >/dev/null 2>&1
  # 4. A data link hello with a made-up session key.
  ip netns exec $ns python3 - <<'PY'
import socket, struct, os
s = socket.create_connection(("203.0.113.1", 7300), timeout=3)
s.sendall(struct.pack("<HBBIQQII", 0x4656, 1, 1, 0, 0, 0, 32, 0) + os.urandom(32))
try:
    s.recv(1)
except Exception:
    pass
PY
  sleep 0.5
  local dt dn dl
  dt=$(($(counter hostA peers_refused_tls) - t0))
  dn=$(($(counter hostA peers_refused_name) - n0))
  dl=$(($(counter hostA peers_refused_link) - l0))
  if [ "$dt" -lt 2 ] || [ "$dn" -lt 1 ] || [ "$dl" -lt 1 ]; then
    fail $name "refusals: tls +$dt (want 2), unknown peer +$dn (want 1), bad link key +$dl (want 1); $(grep refused "$VSOCKET_TESTBED2_DIR/hostA/vsocketd.log" | tail -4 | tr '\n' ' ')"
    return
  fi
  local logs
  logs=$(grep -c "refused connection" "$VSOCKET_TESTBED2_DIR/hostA/vsocketd.log")
  # The real link is untouched and still carries data.
  if ! $ctl links | grep -q " up "; then
    fail $name "the real link went down"
    return
  fi
  fabric_xfer after_rogue vmA1 vmB1 "$B1" 1 1048576 7501 ||
    { fail $name "link broken after the rogue peers: $XFER_MSG"; return; }
  pass "$name (wrong CA, no certificate: TLS refused x$dt; valid cert of an unconfigured host refused; forged link key refused; $logs log lines; real link still accelerates)"
}
case_rogue_peers

# ---- link loss and re-establishment ------------------------------------------------

# The fabric link is cut in the middle of transfers (both hosts' kernels
# answer the link's packets with RST for a second): every connection on it
# goes back to kernel TCP through RESYNC without losing or duplicating a
# byte (xfer checks every byte and the EOF after it), both daemons count the
# downgrades, the link comes back with backoff, and new connections
# accelerate again.
# xfer_bg NAME PORT CONNS BYTES [xfer args for both sides]: an xfer server in
# vmB1 and its client in vmA1 (or XFER_CVM), in the background (PIDs in
# XSRV, XCLI).
# xfer_wait NAME: both verified every byte (else 1, the reason in E2E_MSG).
# wait_link_up: until hostA reports its link to hostB up (bounded: 15 s).
xfer_bg() {
  local name=$1 port=$2 conns=$3 bytes=$4 rep=$WORK/$1.jsonl
  shift 4
  vm_bg vmB1 preload "$rep" "$WORK/$name.srv" "$XFER" server "$B1" "$port" --conns "$conns" "$@"
  XSRV=$BG
  sleep 0.2
  vm_bg "${XFER_CVM:-vmA1}" preload "$rep" "$WORK/$name.cli" "$XFER" client "$B1" "$port" --conns "$conns" \
    --bytes "$bytes" "$@"
  XCLI=$BG
}
xfer_wait() {
  local crc=0 src=0
  wait "$XCLI" || crc=$?
  wait "$XSRV" || src=$?
  [ $crc -eq 0 ] && [ $src -eq 0 ] && return 0
  E2E_MSG="client rc $crc: $(tail -6 "$WORK/$1.cli" | tr '\n' ' ') server rc $src: $(tail -6 "$WORK/$1.srv" | tr '\n' ' ')"
  return 1
}
wait_link_up() {
  local _
  for _ in $(seq 150); do
    bash $TB ctl hostA links 2>/dev/null | grep -q " up " && return 0
    sleep 0.1
  done
  return 1
}

case_link_loss() {
  local name=cross_link_loss_resync port=7106 conns=8 bytes=134217728
  local rep=$WORK/$name.jsonl a0 da0 db0 a i
  a0=$(counter hostA fabric_bytes_out)
  da0=$(counter hostA fabric_downgrades)
  db0=$(counter hostB fabric_downgrades)
  xfer_bg $name $port $conns $bytes
  # Cut once the fabric carries the transfer (bounded: 10 s).
  for i in $(seq 200); do
    a=$(counter hostA fabric_bytes_out)
    [ $((a - a0)) -gt 16777216 ] && break
    sleep 0.05
  done
  local moved=$((a - a0))
  cut_link 1
  xfer_wait $name || { fail $name "$E2E_MSG"; return; }
  local da db out
  da=$(($(counter hostA fabric_downgrades) - da0))
  db=$(($(counter hostB fabric_downgrades) - db0))
  if ! out=$(python3 $CHECK "$rep" --port $port --expect-conns $((2 * conns)) --resynced --downgrade-cause fabric-down); then
    fail $name "$out"
    return
  fi
  if [ "$da" -lt 1 ] || [ "$db" -lt 1 ]; then
    fail $name "fabric_downgrades +$da on hostA, +$db on hostB"
    return
  fi
  # The link comes back (backoff from 0.2 s) and new connections accelerate.
  wait_link_up
  fabric_xfer after_link_loss vmA1 vmB1 "$B1" 4 8388608 7107 ||
    { fail $name "no acceleration after the link came back: $XFER_MSG"; return; }
  pass "$name (link cut after $moved B on the fabric: $conns conns x $bytes B each way all byte-exact; $out; downgrades hostA +$da hostB +$db; relinked, new connections accelerated)"
}
case_link_loss

# Long-lived request/response connections across a link cut: each goes
# back to kernel TCP (RESYNC), registers again, and re-upgrades once the
# link is back; the fabric carries the rounds after the cut.
case_link_loss_reupgrade() {
  local name=cross_link_loss_reupgrade port=7108 conns=4 bytes=67108864
  local rep=$WORK/$name.jsonl u0 u1 a1 a2 a3
  u0=$(counter hostA remote_upgrades)
  xfer_bg $name $port $conns $bytes --rounds 400 --gap-ms 10
  # Cut once every connection is upgraded and the rounds cross the fabric.
  local i
  for i in $(seq 100); do
    [ "$(counter hostA remote_upgrades)" -ge $((u0 + conns)) ] && break
    sleep 0.05
  done
  sleep 0.3
  a1=$(counter hostA fabric_bytes_out)
  cut_link 1
  a2=$(counter hostA fabric_bytes_out)
  xfer_wait $name || { fail $name "$E2E_MSG"; return; }
  a3=$(counter hostA fabric_bytes_out)
  u1=$(($(counter hostA remote_upgrades) - u0))
  local out
  if ! out=$(python3 $CHECK "$rep" --port $port --expect-conns $((2 * conns)) --reupgraded --downgrade-cause fabric-down); then
    fail $name "$out"
    return
  fi
  # Initial upgrades plus re-upgrades on hostA, and the rounds after the
  # cut went over the fabric again.
  if [ "$u1" -lt $((2 * conns)) ] || [ $((a3 - a2)) -lt $((bytes / 4)) ]; then
    fail $name "remote_upgrades +$u1 (want >= $((2 * conns))), fabric bytes after the cut $((a3 - a2))"
    return
  fi
  pass "$name ($conns conns x 400 byte-checked rounds; $out; remote_upgrades +$u1; fabric A->B $a1 B total before the cut, $((a3 - a2)) B after)"
}
case_link_loss_reupgrade

# A client writes half its stream accelerated, then the other half and
# shuts down its write side while hostB silently drops the link (those
# bytes are in flight, never to arrive), then the link dies (RST). The
# server has read nothing yet. The library kept its kernel FIN back (the
# peer had not consumed the bytes), so RESYNC resends the unconsumed bytes
# on kernel TCP and only then sends the FIN: the server reads every byte,
# then EOF (not ECONNRESET), and answers.
# With "close" the client closes right after its last write instead (no
# shutdown, one-way) and stays alive (a long-lived process): its library
# lingers on a dup of the socket, resends after the loss, then sends the
# FIN, although the application has no socket any more.
# reports_with REPORT FIELD: how many report lines have FIELD true.
reports_with() {
  python3 -c "import json,sys; print(sum(1 for l in open(sys.argv[1]) if l.strip() and json.loads(l).get(sys.argv[2])))" "$1" "$2"
}
case_link_loss_after_end() {
  local how=$1 name=cross_link_loss_after_$1 port=$2 conns=2 bytes=131072
  local rep=$WORK/$name.jsonl i out extra=() go=$WORK/$name.go start=$WORK/$name.start
  rm -f "$go" "$start"
  [ "$how" = close ] && extra=(--one-way --close-after-write --exit-delay-ms 8000)
  wait_link_up  # after the previous cut
  # An idle link would outlive the cut (no segment meets the RST): a
  # request/response pair from vmA2 keeps it busy meanwhile.
  XFER_CVM=vmA2 xfer_bg $name.load $((port + 1)) 1 19660800 --rounds 300 --gap-ms 10
  local lsrv=$XSRV lcli=$XCLI
  # (The libraries log their RESYNC steps: on a failure, xfer_wait shows them.)
  VSOCKET_LOG_LEVEL=info xfer_bg $name $port $conns $bytes --start-wait-file "$start" --split-wait-file "$go" \
    --stall-ms 7000 "${extra[@]}"
  # The clients write their first halves once hostA shows every connection
  # accelerated (a fixed pause raced a pairing slowed by a loaded machine:
  # the first halves went on kernel TCP, and the wait below never ended).
  # abandon WHY: let the clients finish, then fail with what hostA showed.
  abandon() {
    local rows
    rows=$(conn_rows hostA $port | tr '\n' ';')
    touch "$start" "$go"
    xfer_wait $name
    XSRV=$lsrv XCLI=$lcli
    xfer_wait $name.load
    fail $name "$1; hostA's connections to :$port: ${rows:-none}"
  }
  conns_accelerated hostA $port $conns || { abandon "not every connection accelerated after 15 s"; return; }
  touch "$start"
  # Once the first halves crossed the fabric (and the FENCEs were
  # acknowledged): drop, and only then let the clients write the second
  # halves and shut down (a fixed pause raced a slow poll of the counters).
  local moved=0
  for i in $(seq 100); do
    moved=$(conn_rows hostA $port | awk '{s += $(NF - 2)} END {print s + 0}')
    [ "$moved" -ge $((conns * bytes / 2)) ] && break
    sleep 0.05
  done
  [ "$moved" -ge $((conns * bytes / 2)) ] || { abandon "the first halves did not cross the fabric ($moved B)"; return; }
  sleep 0.3
  # The RST phase must meet a retransmission: with the 200 ms minimum RTO
  # the lost segments are sent again 0.2, 0.6, 1.4 and 3.0 s after the
  # first loss, and 3.0 s falls inside [1.5 s, 5.5 s].
  stall_link 1.5 4 "$go"
  xfer_wait $name || { fail $name "$E2E_MSG"; return; }
  XSRV=$lsrv XCLI=$lcli
  xfer_wait $name.load || { fail $name "the background pair failed: $E2E_MSG"; return; }
  if ! out=$(python3 $CHECK "$rep" --port $port --expect-conns $((2 * conns)) --resynced --downgrade-cause fabric-down); then
    fail $name "$out"
    return
  fi
  local deferred lingered
  deferred=$(reports_with "$rep" fin_deferred)
  lingered=$(reports_with "$rep" lingered)
  [ "$deferred" -ge "$conns" ] || { fail $name "only $deferred of $conns clients kept their FIN back"; return; }
  if [ "$how" = close ]; then
    [ "$lingered" -ge "$conns" ] || { fail $name "only $lingered of $conns clients lingered after close()"; return; }
    pass "$name ($conns clients: half of $bytes B accelerated, the rest written and the socket closed while the link dropped it; $lingered lingered on a dup, resent after the loss, FIN after; server got every byte then EOF; $out)"
  else
    pass "$name ($conns clients: half of $bytes B accelerated, the rest and the shutdown lost in flight with the link; FIN kept back by $deferred, resent, server got every byte then EOF; $out)"
  fi
}
case_link_loss_after_end shutdown 7110
case_link_loss_after_end close 7112

case_peer_restart() {
  local name=peer_backend_restart_relinks c0
  wait_link_up  # after the previous cut (else the restart meets a backoff)
  c0=$(link_field hostA connects)
  if ! bash $TB restart hostB >"$WORK/restart.log" 2>&1; then
    fail $name "restart: $(tail -3 "$WORK/restart.log" | tr '\n' ' ')"
    return
  fi
  local c1 l1
  c1=$(link_field hostA connects)
  l1=$(link_field hostA losses)
  [ "$c1" -gt "$c0" ] && [ "$l1" -ge 1 ] || { fail $name "hostA saw connects $c0 -> $c1, losses $l1"; return; }
  fabric_xfer after_restart vmA1 vmB1 "$B1" 2 2097152 7502 ||
    { fail $name "new connections not accelerated after relink: $XFER_MSG"; return; }
  pass "$name (hostB's vsocketd restarted: hostA noticed the loss, relinked with backoff, new connections accelerate again)"
}
case_peer_restart

# bulk_and_rr NAME PORT CONNS: a 1 GiB one-way stream (PORT) and CONNS
# request/response connections (PORT+1) from vmA1 to vmB1 in the
# background (PIDs in BSRV BCLI, RSRV RCLI), then 0.5-0.9 s (random) for
# them to get going. bulk_and_rr_wait NAME: both verified every byte (else
# 1, the reason in E2E_MSG); bulk_and_rr_kill: stops all four.
bulk_and_rr() {
  xfer_bg $1.bulk $2 1 1073741824 --one-way
  BSRV=$XSRV BCLI=$XCLI
  xfer_bg $1.rr $(($2 + 1)) $3 6144000 --rounds 600 --gap-ms 20
  RSRV=$XSRV RCLI=$XCLI
  sleep "0.$((5 + RANDOM % 5))"
}
bulk_and_rr_wait() {
  XSRV=$BSRV XCLI=$BCLI
  xfer_wait $1.bulk || { E2E_MSG="bulk: $E2E_MSG"; kill $RSRV $RCLI 2>/dev/null; return 1; }
  XSRV=$RSRV XCLI=$RCLI
  xfer_wait $1.rr || { E2E_MSG="request/response: $E2E_MSG"; return 1; }
}
bulk_and_rr_kill() { kill $BSRV $BCLI $RSRV $RCLI 2>/dev/null; }

# hostB's vsocketd dies (KILL) or is stopped (TERM) in the middle of a
# byte-checked stream and request/response connections from vmA1 to vmB1,
# then starts again. hostB's guests lose their backend, hostA's lose the
# link: both sides finish on kernel TCP (RESYNC) without an error, and the
# request/response connections re-upgrade over the new link. SIGTERM drains
# first: every connection leaves the rings with clean fences across the
# link, so no byte is resent.
case_remote_daemon_restart() {  # case_remote_daemon_restart SIG PORT
  local sig=$1 port=$2 name=cross_daemon_restart_${1,,} conns=4
  wait_link_up
  bulk_and_rr $name $port $conns
  if ! bash $TB restart hostB "$sig" >"$WORK/$name.restart" 2>&1; then
    fail $name "restart: $(tail -3 "$WORK/$name.restart" | tr '\n' ' ')"
    bulk_and_rr_kill
    return
  fi
  bulk_and_rr_wait $name || { fail $name "$E2E_MSG"; return; }
  local out out2
  # SIGTERM drains first (across the link too): nothing resent.
  local clean=()
  [ "$sig" = TERM ] && clean=(--no-resend)
  out=$(python3 $CHECK "$WORK/$name.bulk.jsonl" --port $port --expect-conns 2 --resynced "${clean[@]}") ||
    { fail $name "bulk: $out"; return; }
  out2=$(python3 $CHECK "$WORK/$name.rr.jsonl" --port $((port + 1)) --expect-conns $((2 * conns)) --reupgraded "${clean[@]}") ||
    { fail $name "request/response: $out2"; return; }
  pass "$name (hostB's vsocketd SIG$sig mid-transfer and restarted: 1 GiB stream byte-exact ($out); $conns request/response connections byte-exact and re-upgraded over the new link ($out2))"
}
case_remote_daemon_restart KILL 7520
case_remote_daemon_restart TERM 7530

# vsocketctl drain vmB1 on hostB in the middle of a byte-checked stream and
# request/response connections from vmA1: hostB's guests leave the rings
# and hostA's follow over the link (SHUT_WR with the ring end), nothing is
# resent, the fabric carries no byte while drained; after undrain the
# request/response connections pair again across the link.
case_cross_drain() {  # case_cross_drain PORT
  local port=$1 name=cross_drain conns=4
  wait_link_up
  bulk_and_rr $name $port $conns
  local drained f0 f1 fabric='import json, sys
print(next(c["value"] for c in json.load(sys.stdin) if c["counter"] == "fabric_bytes_out"))'
  if ! drained=$(bash $TB ctl hostB drain vmB1 --wait 10 2>&1); then
    fail $name "vsocketctl drain vmB1 --wait 10: $drained"
    bash $TB ctl hostB undrain vmB1 >/dev/null 2>&1  # (the cases after this one)
    bulk_and_rr_kill
    return
  fi
  sleep 0.2
  f0=$(bash $TB ctl hostA counters --json | python3 -c "$fabric")
  sleep 0.5
  f1=$(bash $TB ctl hostA counters --json | python3 -c "$fabric")
  bash $TB ctl hostB undrain vmB1 >/dev/null || { fail $name "undrain failed"; bulk_and_rr_kill; return; }
  bulk_and_rr_wait $name || { fail $name "$E2E_MSG"; return; }
  [ "$f0" = "$f1" ] || { fail $name "$((f1 - f0)) B went over the fabric while vmB1 was drained"; return; }
  local out out2
  out=$(python3 $CHECK "$WORK/$name.bulk.jsonl" --port $port --expect-conns 2 --resynced --no-resend \
    --downgrade-cause operator) || { fail $name "bulk: $out"; return; }
  out2=$(python3 $CHECK "$WORK/$name.rr.jsonl" --port $((port + 1)) --expect-conns $((2 * conns)) --reupgraded \
    --no-resend --downgrade-cause operator) || { fail $name "request/response: $out2"; return; }
  pass "$name (vmB1 drained on hostB mid-transfer: ${drained%%$'\n'*}; hostA's ends followed over the link, no fabric byte while drained; 1 GiB stream byte-exact ($out); $conns request/response connections byte-exact and re-upgraded across the link after undrain ($out2))"
}
case_cross_drain 7540

# Moving a guest (vsocketctl migrate begin|end, deploy/testbed2.sh move):
# vmA1 moves from hostA to hostB and back while it runs byte-checked
# bidirectional streams (request/response rounds) to vmA2, which stays on
# hostA, and to vmB1 on hostB, and a sockperf ping-pong to vmA2. Its
# connections leave the rings with clean fences (nothing resent), go on on
# kernel TCP while it moves, and re-upgrade where it lands: the pairs with
# vmA2 go from same-host to across the fabric, those with vmB1 from across
# the fabric to same-host (vsocketctl connections' "via"), then back.
via_count() { # via_count HOST VM VIA PEER-ADDR: VM's connections on HOST to PEER-ADDR accelerated via VIA
  bash $TB ctl "$1" --json connections 2>/dev/null | python3 -c '
import json, sys
vm, via, peer = sys.argv[1:4]
print(sum(c["vm"] == vm and c["via"] == via and c["peer"].rsplit(":", 1)[0] == peer for c in json.load(sys.stdin)))' "$2" "$3" "$4"
}
wait_vias() { # wait_vias HOST N-TO-A2 VIA-TO-A2 N-TO-B1 VIA-TO-B1: vmA1 on HOST (bounded: 15 s)
  local end=$((SECONDS + 15))
  while [ $SECONDS -lt $end ]; do
    [ "$(via_count "$1" vmA1 "$3" "$A2")" -ge "$2" ] && [ "$(via_count "$1" vmA1 "$5" "$B1")" -ge "$4" ] && return 0
    sleep 0.2
  done
  E2E_MSG="vmA1 on $1: $(via_count "$1" vmA1 "$3" "$A2") connection(s) to vmA2 via $3 (want $2), $(via_count "$1" vmA1 "$5" "$B1") to vmB1 via $5 (want $4)"
  return 1
}
case_move() {  # case_move PORT
  local port=$1 name=cross_move conns=3 pids=() phase out out2 out3 f0 f1
  # (About 35 s: the two moves take a few seconds each.)
  local rounds="--bytes 11520000 --rounds 3000 --gap-ms 10"
  wait_link_up
  vm_bg vmA2 preload "$WORK/$name.a2.jsonl" "$WORK/$name.a2.srv" "$XFER" server "$A2" "$port" --conns $conns $rounds
  pids+=("$BG")
  vm_bg vmB1 preload "$WORK/$name.b1.jsonl" "$WORK/$name.b1.srv" "$XFER" server "$B1" $((port + 1)) --conns $conns $rounds
  pids+=("$BG")
  vm_bg vmA2 preload "$WORK/$name.pp.jsonl" "$WORK/$name.pp.srv" sockperf sr --tcp -i "$A2" -p $((port + 2))
  local ppsrv=$BG
  sleep 0.3
  vm_bg vmA1 preload "$WORK/$name.a2.jsonl" "$WORK/$name.a2.cli" "$XFER" client "$A2" "$port" --conns $conns $rounds
  pids+=("$BG")
  vm_bg vmA1 preload "$WORK/$name.b1.jsonl" "$WORK/$name.b1.cli" "$XFER" client "$B1" $((port + 1)) --conns $conns $rounds
  pids+=("$BG")
  vm_bg vmA1 preload "$WORK/$name.pp.jsonl" "$WORK/$name.pp.cli" sockperf pp --tcp -i "$A2" -p $((port + 2)) -m 16 -t 40
  pids+=("$BG")
  local stop="kill ${pids[*]} $ppsrv 2>/dev/null; wait ${pids[*]} $ppsrv 2>/dev/null; bash $TB host vmA1 | grep -q hostA || bash $TB move vmA1 hostA >/dev/null 2>&1"
  for phase in "hostA before" "hostB after the move" "hostA after the move back"; do
    case $phase in
      "hostB after the move") out=$(bash $TB move vmA1 hostB 2>&1) || { fail $name "move to hostB: $out"; eval "$stop"; return; } ;;
      "hostA after the move back") out=$(bash $TB move vmA1 hostA 2>&1) || { fail $name "move back: $out"; eval "$stop"; return; } ;;
    esac
    local h=${phase%% *}
    if [ "$h" = hostA ]; then
      wait_vias hostA $((conns + 1)) same-host $conns hostB || { fail $name "$phase: $E2E_MSG"; eval "$stop"; return; }
    else
      wait_vias hostB $((conns + 1)) hostA $conns same-host || { fail $name "$phase: $E2E_MSG"; eval "$stop"; return; }
      # (The pairs with vmA2 cross the fabric now.)
      f0=$(counter hostB fabric_bytes_out)
      sleep 0.5
      f1=$(counter hostB fabric_bytes_out)
      [ "$f1" -gt "$f0" ] || { fail $name "$phase: hostB's fabric carried nothing in 0.5 s"; eval "$stop"; return; }
    fi
  done
  local p rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  kill $ppsrv 2>/dev/null
  wait $ppsrv 2>/dev/null
  [ $rc -eq 0 ] || { fail $name "an application failed (rc $rc): $(tail -n 2 "$WORK/$name".*.cli | tr '\n' ' ')"; return; }
  local check=(--reupgraded --no-resend --downgrade-cause migration --moves 2)
  out=$(python3 $CHECK "$WORK/$name.a2.jsonl" --port $port --expect-conns $((2 * conns)) "${check[@]}") ||
    { fail $name "stream to vmA2: $out"; return; }
  out2=$(python3 $CHECK "$WORK/$name.b1.jsonl" --port $((port + 1)) --expect-conns $((2 * conns)) "${check[@]}") ||
    { fail $name "stream to vmB1: $out2"; return; }
  out3=$(python3 $CHECK "$WORK/$name.pp.jsonl" --port $((port + 2)) --expect-conns 2 "${check[@]}") ||
    { fail $name "sockperf: $out3"; return; }
  grep -q "Summary: Latency" "$WORK/$name.pp.cli" || { fail $name "sockperf: $(tail -n 3 "$WORK/$name.pp.cli" | tr '\n' ' ')"; return; }
  pass "$name (vmA1 moved hostA -> hostB -> hostA mid-run: streams to vmA2 byte-exact, same-host -> fabric -> same-host ($out); to vmB1 byte-exact, fabric -> same-host on hostB -> fabric ($out2); sockperf ping-pong to vmA2 ($out3, $(grep -o "Summary: Latency is [0-9.]* usec" "$WORK/$name.pp.cli"))"
}
case_move 7550

# The host that connects (hostA: its name sorts first) decides how many
# links the pair runs; hostB, configured for another count, follows it.
case_link_count_follows_initiator() {
  local name=link_count_follows_initiator n
  if ! VSOCKET_LINKS_PER_PEER=3 bash $TB restart hostA >"$WORK/restart3.log" 2>&1; then
    fail $name "restart: $(tail -3 "$WORK/restart3.log" | tr '\n' ' ')"
    return
  fi
  for h in hostA hostB; do
    n=$(link_field $h links)
    [ "$n" = 3 ] || { fail $name "$h runs $n links, want 3 (hostA's links_per_peer)"; return; }
  done
  grep -q "runs 3 link(s) per host pair, this host's links_per_peer is $VSOCKET_TESTBED2_LINKS" \
    "$VSOCKET_TESTBED2_DIR/hostB/vsocketd.log" || { fail $name "hostB did not log the count it follows"; return; }
  fabric_xfer three_links vmA1 vmB1 "$B1" 6 2097152 7503 ||
    { fail $name "not accelerated over 3 links: $XFER_MSG"; return; }
  pass "$name (hostA restarted with links_per_peer = 3, hostB configured for $VSOCKET_TESTBED2_LINKS: both run 3; $XFER_MSG)"
}
case_link_count_follows_initiator

if [ "$failed" -gt 0 ]; then
  # For the CI log: what the daemons said last.
  for h in hostA hostB; do
    echo "== $h: vsocketd.log, warnings and errors (last 20)"
    grep -E "^[WE] " "$VSOCKET_TESTBED2_DIR/$h/vsocketd.log" 2>/dev/null | tail -20
  done
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
