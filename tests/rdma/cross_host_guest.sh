#!/usr/bin/env bash
# The guest half of tests/rdma/cross_host_in_qemu.sh (run inside the QEMU
# Soft-RoCE guest by run-in-qemu.sh; not meant to be run on the host).
#
# Two "hypervisors" as in deploy/testbed2.sh (host and VM network
# namespaces, TLS peering over the underlay veth), but with fabric = rdma:
# rdma_rxe (6.1) only works in the initial network namespace, so both
# daemons share rxe0 on the guest's eth0, each with its own RoCEv2 GID
# (hostA ::ffff:203.0.113.10, hostB ::ffff:203.0.113.11); their QPs talk
# through rxe0 like two hosts on one switch. Every case checks the bytes
# (xfer's stream checks), the libraries' VSOCKET_REPORT lines, and the
# daemons' counters: every accelerated byte crossed the rdma link, written
# one-sided into the receiver's RX ring (fabric_bytes_placed).
#
# Env (from run-in-qemu.sh): VSOCKET_RDMA_DEV, VSOCKET_RDMA_GID_INDEX,
# VSOCKET_RDMA_IP. Prints PASS/FAIL lines and "N passed, N failed".
set -uo pipefail
BIN=${VSOCKET_BIN:-bazel-out/k8-opt/bin}
LIB=$(realpath "$BIN/guest/libvsocket.so")
XFER=$(realpath "$BIN/tests/e2e/xfer")
CHECK=tests/e2e/check_report.py
TB=deploy/testbed2.sh
export VSOCKETD VSOCKETCTL
VSOCKETD=$(realpath "$BIN/host-backend/vsocketd")
VSOCKETCTL=$(realpath "$BIN/host-backend/vsocketctl")
export VSOCKET_TESTBED2_DIR=/run/vsocket-testbed2 VSOCKET_LOG_LEVEL=info
export VSOCKET_TESTBED2_FABRIC=rdma VSOCKET_TESTBED2_RDMA_DEVICE=${VSOCKET_RDMA_DEV:-rxe0}
# Two RC QPs per host pair (links_per_peer): connections spread over them.
export VSOCKET_TESTBED2_LINKS=${VSOCKET_TESTBED2_LINKS:-2}
WORK=$(mktemp -d /tmp/vsocket-rdma-e2e-XXXXXX)
CASE_TIMEOUT=${VSOCKET_CASE_TIMEOUT:-150}
E2E_TIMEOUT=$CASE_TIMEOUT  # bounds vm_run/vm_bg (tests/e2e/lib.sh)
passed=0
failed=0
PIDS=()
# pass, vm_run, vm_bg, wait_listen, run_crash, e2e_cleanup (fail is redefined below).
. tests/e2e/lib.sh
fail() {
  echo "FAIL $1: $2"
  failed=$((failed + 1))
  # Enough to diagnose from the saved log: the server's last words, the
  # report lines that are not clean, the daemons' warnings.
  [ -f "$WORK/$1.srv" ] && { echo "  -- server:"; tail -3 "$WORK/$1.srv" | sed 's/^/  /'; }
  [ -f "$WORK/$1.jsonl" ] && { echo "  -- reports not accelerated/ok:"; grep -v '"reason":"accelerated"' "$WORK/$1.jsonl" | head -6 | sed 's/^/  /'; }
  local h
  for h in hostA hostB; do
    echo "  -- $h warnings:"
    grep -E "^[WE] " "$VSOCKET_TESTBED2_DIR/$h/vsocketd.log" 2>/dev/null | tail -8 | sed 's/^/  /'
  done
}
trap e2e_cleanup EXIT

counter() { bash $TB ctl "$1" counters 2>/dev/null | awk -v n="$2" '$1 == n {print $2}'; }
link_json() { # link_json HOST FIELD: from `vsocketctl --json stats` links[0]
  bash $TB ctl "$1" --json stats 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['links'][0]['$2'])"
}
server_status() { # why the background server $1 ended (or that it still runs)
  sleep 1
  if kill -0 "$1" 2>/dev/null; then echo "server still running"; kill "$1" 2>/dev/null; else wait "$1"; echo "server exit $?"; fi
}

# ---- setup -----------------------------------------------------------------------
echo "== kernel $(uname -r), $(nproc) CPUs; rdma devices: $(ls /sys/class/infiniband | tr '\n' ' ')"
GIDA=${VSOCKET_RDMA_GID_INDEX:?}
ip addr add 203.0.113.11/24 dev eth0 || { echo "cannot add hostB's address"; exit 1; }
WANT=0000:0000:0000:0000:0000:ffff:cb00:710b  # ::ffff:203.0.113.11
GIDB=""
for _ in $(seq 100); do
  for i in $(seq 0 15); do
    [ "$(cat "/sys/class/infiniband/$VSOCKET_TESTBED2_RDMA_DEVICE/ports/1/gids/$i" 2>/dev/null)" = "$WANT" ] && { GIDB=$i; break 2; }
  done
  sleep 0.1
done
[ -n "$GIDB" ] || { echo "no RoCEv2 GID for 203.0.113.11"; exit 1; }
export VSOCKET_TESTBED2_RDMA_GID_INDEX_HOSTA=$GIDA VSOCKET_TESTBED2_RDMA_GID_INDEX_HOSTB=$GIDB
# vsocketd reads VSOCKET_RDMA_DEVICE / VSOCKET_RDMA_GID_INDEX as overrides of
# its config: the harness's variable of that name would give both daemons
# hostA's GID.
unset VSOCKET_RDMA_GID_INDEX VSOCKET_RDMA_DEV VSOCKET_RDMA_IP
echo "== hostA: $VSOCKET_TESTBED2_RDMA_DEVICE GID index $GIDA (::ffff:203.0.113.10); hostB: GID index $GIDB (::ffff:203.0.113.11)"

# A missing device is a clear startup error, never a fall back to tcp.
mkdir -p "$WORK/neg"
cat >"$WORK/neg/vsocketd.conf" <<CONF
host_name = hostA
peer_listen = 127.0.0.1:7399
tls_cert = $WORK/neg/none.crt
tls_key = $WORK/neg/none.key
tls_ca = $WORK/neg/none.crt
locator = $WORK/neg/none
fabric = rdma
rdma_device = nosuchdev0
[peer hostB]
address = 127.0.0.1:7398
[vm neg]
socket = $WORK/neg/vm.sock
tenant = 1
addresses = 198.51.100.99
CONF
timeout 30 "$VSOCKETD" --config "$WORK/neg/vsocketd.conf" --ctl "$WORK/neg/ctl.sock" >"$WORK/neg/log" 2>&1
rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "fabric = rdma, but RDMA device 'nosuchdev0'" "$WORK/neg/log"; then
  pass "rdma_missing_device_is_fatal (exit $rc: $(grep -o "fabric = rdma.*" "$WORK/neg/log" | head -1))"
else
  fail rdma_missing_device_is_fatal "exit $rc: $(tail -3 "$WORK/neg/log" | tr '\n' ' ')"
fi

start=$(date +%s)
if ! timeout 120 bash $TB up >"$WORK/up.log" 2>&1; then
  cat "$WORK/up.log"
  for h in hostA hostB; do echo "-- $h log"; tail -20 "$VSOCKET_TESTBED2_DIR/$h/vsocketd.log"; done
  fail testbed2_rdma_up "deploy/testbed2.sh up failed"
  echo "$passed passed, $failed failed"
  exit 1
fi
A2=$(bash $TB addr vmA2)
B1=$(bash $TB addr vmB1)
kinds="$(link_json hostA fabric)/$(link_json hostB fabric)"
states="$(link_json hostA state)/$(link_json hostB state)"
devlog=$(grep -h "rdma device" "$VSOCKET_TESTBED2_DIR"/host{A,B}/vsocketd.log | sed 's/.*peering: //' | tr '\n' ';')
if [ "$kinds" = rdma/rdma ] && [ "$states" = up/up ]; then
  pass "testbed2_rdma_link_up (in $(($(date +%s) - start)) s; fabric $kinds, state $states; $devlog setup exchanged as RDMA_SETUP over TLS 1.3)"
else
  fail testbed2_rdma_link_up "fabric $kinds, state $states"
fi
echo "== rdma keys of the daemons' configs"
grep -H "fabric\|rdma_" "$VSOCKET_TESTBED2_DIR"/host{A,B}/vsocketd.conf | sed "s|$VSOCKET_TESTBED2_DIR/||"
echo "== vsocketctl links (hostA)"
bash $TB ctl hostA links

# ---- checksummed transfers over the rdma link -----------------------------------

# rdma_xfer NAME CLIENT-VM SERVER-VM SERVER-ADDR CONNS BYTES PORT [MIN]: xfer
# with LD_PRELOAD, every byte checked each way; every connection exact and
# accelerated (libraries' reports; with MIN, at least MIN of the 2 x CONNS
# ends, as tests/e2e/cross_host.sh allows for 64 simultaneous connections: a
# pairing may complete only after a connection's exchange ended); the
# daemons' fabric counters account for every accelerated byte, all of them
# placed one-sided; the ends upgraded and their RX rings registered; the
# links read the payload in place from the senders' registered TX rings
# (copied: what was sent before a TX ring's registration, which follows the
# pairing, and what a closing guest had not handed over yet).
# XFER_ARGS: more xfer arguments for both sides (e.g. --rounds).
rdma_xfer() {
  local name=$1 cvm=$2 svm=$3 saddr=$4 conns=$5 bytes=$6 port=$7 min=${8:-$((2 * $5))}
  local rep=$WORK/$name.jsonl h n
  declare -A before
  for h in hostA hostB; do
    for n in fabric_bytes_out fabric_bytes_in fabric_bytes_placed remote_upgrades fabric_violations rdma_rx_regions rdma_tx_regions rdma_reg_us; do
      before[$h.$n]=$(counter $h $n)
    done
    before[$h.inplace]=$(link_json $h inplace_bytes)
    before[$h.copied]=$(link_json $h copied_bytes)
  done
  local t0
  t0=$(date +%s)
  # shellcheck disable=SC2086  # XFER_ARGS is a word list
  vm_bg "$svm" preload "$rep" "$WORK/$name.srv" "$XFER" server "$saddr" "$port" --conns "$conns" ${XFER_ARGS:-}
  local srv=$BG
  wait_listen "$svm" "$port" || { fail "$name" "server not listening after 30 s"; kill "$srv" 2>/dev/null; return; }
  # shellcheck disable=SC2086
  if ! vm_run "$cvm" preload "$rep" "$XFER" client "$saddr" "$port" --conns "$conns" --bytes "$bytes" ${XFER_ARGS:-} \
      >"$WORK/$name.cli" 2>&1; then
    fail "$name" "client: $(tail -2 "$WORK/$name.cli" | tr '\n' ' '); $(server_status "$srv")"
    return
  fi
  if ! wait "$srv"; then
    fail "$name" "server: $(tail -2 "$WORK/$name.srv" | tr '\n' ' ')"
    return
  fi
  local secs=$(($(date +%s) - t0)) out
  local strict="--mode accelerated --reason accelerated --accel-min 1"
  [ "$min" -ge $((2 * conns)) ] || strict="--min-accel $min"
  # shellcheck disable=SC2086  # word list
  if ! out=$(python3 $CHECK "$rep" --port "$port" --expect-conns $((2 * conns)) $strict \
      --exact-total $((bytes + 16))); then
    fail "$name" "$out"
    return
  fi
  declare -A d
  for h in hostA hostB; do
    for n in fabric_bytes_out fabric_bytes_in fabric_bytes_placed remote_upgrades fabric_violations rdma_rx_regions rdma_tx_regions rdma_reg_us; do
      d[$h.$n]=$(($(counter $h $n) - before[$h.$n]))
    done
    d[$h.inplace]=$(($(link_json $h inplace_bytes) - before[$h.inplace]))
    d[$h.copied]=$(($(link_json $h copied_bytes) - before[$h.copied]))
  done
  local accel lines
  accel=$(python3 -c "import json,sys; print(sum(json.loads(l)['accel_tx'] for l in open(sys.argv[1]) if l.strip()))" "$rep")
  lines=$(grep -c . "$rep")
  local sent=$((d[hostA.fabric_bytes_out] + d[hostB.fabric_bytes_out]))
  local got=$((d[hostA.fabric_bytes_in] + d[hostB.fabric_bytes_in]))
  local placed=$((d[hostA.fabric_bytes_placed] + d[hostB.fabric_bytes_placed]))
  local ups=$((d[hostA.remote_upgrades] + d[hostB.remote_upgrades]))
  local viol=$((d[hostA.fabric_violations] + d[hostB.fabric_violations]))
  local regs=$((d[hostA.rdma_rx_regions] + d[hostB.rdma_rx_regions]))
  local txregs=$((d[hostA.rdma_tx_regions] + d[hostB.rdma_tx_regions]))
  local regms=$(((d[hostA.rdma_reg_us] + d[hostB.rdma_reg_us]) / 1000))
  local inplace=$((d[hostA.inplace] + d[hostB.inplace]))
  local copied=$((d[hostA.copied] + d[hostB.copied]))
  local why=""
  [ $((inplace + copied)) -eq "$sent" ] || why="$why links read $inplace B in place + copied $copied B != $sent B sent;"
  [ "$inplace" -gt 0 ] || why="$why nothing read in place from TX rings;"
  [ "$txregs" -ge "$min" ] || why="$why rdma_tx_regions +$txregs < $min;"
  [ "$sent" -eq "$accel" ] || why="$why fabric out $sent B != libraries' accelerated $accel B;"
  [ "$got" -eq "$sent" ] || why="$why fabric in $got B != out $sent B;"
  # RX rings are registered off the worker while the pairing travels: a
  # sender may start before the PLACEMENT of its peer's ring reaches it,
  # and those first bytes go through the link's staging ring.
  [ $((2 * placed)) -ge "$got" ] || why="$why only $placed of $got B placed one-sided;"
  [ $((2 * accel)) -ge $((2 * conns * bytes)) ] || why="$why only $accel B of $((2 * conns * bytes)) accelerated;"
  [ "$ups" -ge "$min" ] || why="$why remote_upgrades +$ups < $min;"
  [ "$regs" -ge "$min" ] || why="$why rdma_rx_regions +$regs < $min;"
  [ "$viol" -eq 0 ] || why="$why fabric_violations +$viol;"
  if [ -n "$why" ]; then
    fail "$name" "$why (ring registrations took $regms ms, $copied B copied)"
    return
  fi
  pass "$name ($conns conns x $bytes B each way in ${secs} s, every byte checked; $lines VSOCKET_REPORT lines: $out; fabric A->B ${d[hostA.fabric_bytes_out]} B, B->A ${d[hostB.fabric_bytes_out]} B = libraries' accelerated $accel B, $placed B placed one-sided, $((got - placed)) B staged, $inplace B read in place from TX rings, $copied B copied; remote_upgrades +$ups; RX rings registered +$regs, TX rings +$txregs, in $regms ms; violations 0)"
}

rdma_xfer rdma_xfer_one_connection_A_to_B vmA1 vmB1 "$B1" 1 16777216 7601
# 64 simultaneous connections: under TCG a pairing (TLS round trip, two ring
# registrations) can take longer than a 1 MiB exchange on kernel TCP, so
# each connection waits 2 s after its header (xfer --pause-ms; 64 pairings
# under TCG took more than the rounds' 750 ms for 11 of them on 2026-11-25:
# upgraded after their last byte) and then exchanges its MiB in 4
# request/response rounds 250 ms apart.
XFER_ARGS="--rounds 4 --gap-ms 250 --pause-ms 2000" rdma_xfer rdma_xfer_64_connections_A_to_B vmA1 vmB1 "$B1" 64 1048576 7602 120
rdma_xfer rdma_xfer_one_connection_B_to_A vmB1 vmA2 "$A2" 1 16777216 7603
XFER_ARGS="--rounds 4 --gap-ms 250 --pause-ms 2000" rdma_xfer rdma_xfer_64_connections_B_to_A vmB1 vmA2 "$A2" 64 1048576 7604 120

# A client SIGKILLed right after its last write: the remote server still gets
# every byte, and the dead guest's RX ring registration is withdrawn through
# PLACEMENT/PLACEMENT_ACK (the link survives).
l0=$(link_json hostA losses)
if ! run_crash rdma_sender_killed vmA1 vmB1 "$B1" 7605 4194304; then
  fail rdma_sender_killed "$E2E_MSG"
elif [ "$(link_json hostA losses)" != "$l0" ]; then
  fail rdma_sender_killed "the link was lost"
else
  pass "rdma_sender_killed (remote server verified all 4194304 B and EOF after the client was SIGKILLed; $E2E_MSG; link kept)"
fi

# Every registration made was dropped again once its connection closed (no
# region left behind), most RX ones after the peer acknowledged the
# withdrawal; guests that closed while their rings were still in use were
# told to keep them (rings-held) and every one of them was released.
# Closing is asynchronous: allow a few seconds.
case_regions() {
  local name=rdma_regions_all_dropped_rings_released h ok=0 msg
  for _ in $(seq 50); do
    ok=1
    msg=""
    for h in hostA hostB; do
      local r d w t td rh rr
      r=$(counter $h rdma_rx_regions)
      d=$(counter $h rdma_rx_regions_dropped)
      w=$(counter $h rdma_rx_withdrawn)
      t=$(counter $h rdma_tx_regions)
      td=$(counter $h rdma_tx_regions_dropped)
      rh=$(counter $h rings_held)
      rr=$(counter $h rings_released)
      msg="$msg $h: RX $r registered, $d dropped ($w after PLACEMENT_ACK), TX $t registered, $td dropped, rings held $rh, released $rr;"
      [ "$r" -gt 0 ] && [ "$r" = "$d" ] && [ "$w" -gt 0 ] && [ "$t" -gt 0 ] && [ "$t" = "$td" ] &&
        [ "$rh" -gt 0 ] && [ "$rh" = "$rr" ] || ok=0
    done
    [ $ok = 1 ] && break
    sleep 0.2
  done
  if [ $ok = 1 ]; then pass "$name ($msg)"; else fail $name "$msg"; fi
}
case_regions

echo "== after the transfers"
for h in hostA hostB; do
  echo "-- $h: vsocketctl links"
  bash $TB ctl $h links
  echo "-- $h: fabric counters"
  bash $TB ctl $h counters | grep -E "^(active_connections|remote_upgrades|pair_|fabric_|frames_|rdma_|rings_|credit_)"
done
# The link itself carried it: its payload bytes and frames, no loss.
la=$(link_json hostA data_bytes_out)
lb=$(link_json hostB data_bytes_out)
losses="$(link_json hostA losses)/$(link_json hostB losses)"
qps="$(link_json hostA links)/$(link_json hostB links)"
perqp="$(link_json hostA link_frames_out | tr -d ' ')/$(link_json hostB link_frames_out | tr -d ' ')"
used=$(echo "$perqp" | tr '/,[]' '    ' | awk '{for (i = 1; i <= NF; i++) if ($i == 0) z = 1; print (z ? 0 : NF)}')
want=$VSOCKET_TESTBED2_LINKS
if [ "$la" -gt 0 ] && [ "$lb" -gt 0 ] && [ "$losses" = 0/0 ] && [ "$qps" = "$want/$want" ] && [ "$used" = $((2 * want)) ]; then
  pass "rdma_link_stats (hostA links sent $la B, hostB $lb B; $want QPs each, frames per QP $perqp; no link lost; fabric $(link_json hostA fabric))"
else
  fail rdma_link_stats "link bytes $la/$lb, losses $losses, QPs $qps (want $want each), frames per QP $perqp (want all used)"
fi
warn=$(grep -hE "violation|outside the credit|link lost|ring not registered|connection is reset" "$VSOCKET_TESTBED2_DIR"/host{A,B}/vsocketd.log | head -3)
if [ -z "$warn" ]; then pass "daemon_logs_clean (no violation, no link loss, every ring registered)"; else fail daemon_logs_clean "$warn"; fi

# Ring registrations (pinning guest memory) are made by vsocketd's registrar
# thread, never by the data-path worker (issue 17, finding 6): the thread
# exists in both daemons and the time spent registering was counted there.
case_registrar_thread() {
  local h pid threads msg="" ok=1
  for h in hostA hostB; do
    pid=$(bash $TB daemon-pid $h 2>/dev/null)
    threads=$(cat /proc/"$pid"/task/*/comm 2>/dev/null | sort | uniq -c | tr -s ' ' | tr '\n' ',')
    msg="$msg $h: threads$threads registration time $(counter $h rdma_reg_us) us, discarded $(counter $h rdma_reg_discarded);"
    grep -q "vsocketd-mr" /proc/"$pid"/task/*/comm 2>/dev/null || ok=0
  done
  if [ $ok = 1 ]; then pass "rdma_registrar_thread ($msg)"; else fail rdma_registrar_thread "no vsocketd-mr thread:$msg"; fi
}
case_registrar_thread

# The link is lost in the middle of request/response connections (the TLS
# channel to hostB is cut for 8 s, so both daemons take the rdma link down):
# every connection goes back to kernel TCP through RESYNC without losing a
# byte, registers again, and re-upgrades onto the rdma link when it is back.
case_link_loss() {
  local name=rdma_link_loss_resync_reupgrade rep=$WORK/linkloss.jsonl port=7606 conns=2 bytes=4194304
  local d0 u0 p0
  d0=$(counter hostA fabric_downgrades)
  u0=$(counter hostA remote_upgrades)
  vm_bg vmB1 preload "$rep" "$WORK/$name.srv" "$XFER" server "$B1" "$port" --conns $conns --rounds 200
  local srv=$BG
  wait_listen vmB1 "$port" || { fail $name "server not listening after 30 s"; kill "$srv" 2>/dev/null; return; }
  vm_bg vmA1 preload "$rep" "$WORK/$name.cli" "$XFER" client "$B1" "$port" --conns $conns --bytes $bytes --rounds 200 \
    --gap-ms 100
  local cli=$BG
  for _ in $(seq 100); do
    [ "$(counter hostA remote_upgrades)" -ge $((u0 + conns)) ] && break
    sleep 0.1
  done
  sleep 1
  cut_link 8 &
  local cut=$!
  # The data moves over RDMA, so the TLS channel is idle and meets no RST by
  # itself: a new connection's PAIR_REQUEST on it does.
  vm_run vmA1 preload /dev/null python3 -c "import socket; s = socket.create_connection(('$B1', $port)); s.send(b'x'); s.close()" \
    >/dev/null 2>&1
  wait "$cut"
  p0=$(counter hostA fabric_bytes_placed)
  local crc=0 src=0
  wait "$cli" || crc=$?
  wait "$srv" || src=$?
  if [ $crc -ne 0 ] || [ $src -ne 0 ]; then
    fail $name "client rc $crc: $(tail -2 "$WORK/$name.cli" | tr '\n' ' ') server rc $src"
    return
  fi
  local out dd up dp
  dd=$(($(counter hostA fabric_downgrades) - d0))
  up=$(($(counter hostA remote_upgrades) - u0))
  dp=$(($(counter hostA fabric_bytes_placed) - p0))
  if ! out=$(python3 $CHECK "$rep" --port "$port" --expect-conns $((2 * conns)) --reupgraded); then
    fail $name "$out (fabric_downgrades +$dd, remote_upgrades +$up)"
    return
  fi
  [ "$dd" -ge 1 ] && [ "$up" -ge $((2 * conns)) ] && [ "$dp" -gt 0 ] ||
    { fail $name "fabric_downgrades +$dd, remote_upgrades +$up, placed after the cut $dp B"; return; }
  pass "$name ($conns conns x 200 byte-checked rounds across an 8 s cut: $out; downgrades +$dd, upgrades +$up, $dp B placed one-sided after the relink)"
}
case_link_loss

# hostB's vsocketd restarts: hostA notices the loss, sets up a new QP over a
# new TLS session (backoff), and new connections are placed one-sided again.
case_restart() {
  local name=rdma_peer_restart_relinks c0 c1 l1 i
  c0=$(link_json hostA connects)
  timeout 120 bash $TB restart hostB >"$WORK/restart.log" 2>&1  # its own 10 s wait may be short under TCG
  for i in $(seq 120); do
    [ "$(link_json hostA state 2>/dev/null)" = up ] && [ "$(link_json hostB state 2>/dev/null)" = up ] && break
    sleep 0.5
  done
  c1=$(link_json hostA connects)
  l1=$(link_json hostA losses)
  if [ "$(link_json hostA state)" != up ] || [ "$c1" -le "$c0" ] || [ "$l1" -lt 1 ]; then
    fail $name "hostA: state $(link_json hostA state), connects $c0 -> $c1, losses $l1; $(tail -2 "$WORK/restart.log" | tr '\n' ' ')"
    return
  fi
  local before=$failed
  # In 4 rounds 250 ms apart, as the 64-connection cases: a single 1 MiB
  # exchange can end on kernel TCP before the first pairings over the new
  # TLS session complete under TCG (seen: 1.7 of 4.2 MB accelerated).
  XFER_ARGS="--rounds 4 --gap-ms 250" rdma_xfer rdma_xfer_after_restart vmA1 vmB1 "$B1" 2 1048576 7606
  [ "$failed" -eq "$before" ] || return
  pass "$name (hostA saw the loss and relinked: connects $c0 -> $c1, losses $l1, fabric $(link_json hostA fabric))"
}
case_restart

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
