# VM <-> VM on one host (issue 35; decision 100): sourced by vm_mode.sh,
# whose daemon serves the three VMs' ports (vma, vmb: tenant 1; vmc:
# tenant 2) and whose helpers (ctl, stat, pass, fail, wait_file) it uses.
#
#   vm_to_vm        three TCG guests at once, each on its own vsocketd
#                   port, their ordinary NICs (kernel TCP) taps on one
#                   bridge in a network namespace of the test's own:
#     vm_to_vm_xfer          xfer (unmodified, under libvsocket.so, which
#                            finds the agent at its default path):
#                            4 connections of 1,000,000 byte-checked bytes
#                            each way between a process of guest A and one
#                            of guest B, accelerated (vsocketd's upgrades and
#                            accel_bytes, A's and B's per-VM counters, all 8
#                            library reports "accelerated")
#     vm_to_vm_redis         redis-benchmark in A against redis-server in B,
#                            both under plain vsocket-run --upgrade always
#                            (no --lib, no --socket): every request answered,
#                            every benchmark connection accelerated; the same
#                            benchmark against a plain redis-server in B on
#                            kernel TCP in the same run, for the ratio
#     vm_to_vm_cross_tenant  guest C (tenant 2) to the same xfer server
#                            program in B: byte-exact on kernel TCP, both
#                            ends' reason peer-not-registered, vsocketd's
#                            cross_tenant counter moves, no upgrade
#     vm_to_vm_proofs        every port proves sockets through its VM's
#                            agent (prove_sockets = agent, each guest's last
#                            function on PATH.agent, vsocket-guestd --proofs;
#                            decision 100):
#                            the cases above ran so (vsocketd's vouches
#                            count every registration), and in A
#                            vsocket-agent-probe --steal registers a
#                            connection another process holds: refused
#                            (SPOOFED_ADDRESS, rejected_unproven), also
#                            after proving a socket of its own; its own
#                            proved connection is taken; a look-alike
#                            connection it makes in a network namespace of
#                            its own (the VM's address on its loopback) is
#                            no proof (the agent counts it, decision 127)
#                            and its registration is refused
#     vm_to_vm_sockperf      sockperf ping-pong (16 B, 3 s) from A to a
#                            sockperf server in B, both under plain
#                            vsocket-run --upgrade always: both ends
#                            accelerated; the same against a plain server in
#                            B on kernel TCP in the same run, for the ratio
#                            ; and every function a process got was limited
#                            by its agent to the memory it gave it (vsocketd's
#                            memory_limits, none refused; decision 130)
#     vm_to_vm_non_root      xfer server and client in A run as nobody (the
#                            agent's socket is every user's with proofs):
#                            accelerated, every byte
#     vm_to_container        a process-mode "VM" of tenant 1 (a network
#                            namespace whose processes speak vhost-user to
#                            vsocketd themselves, on port vmp) on the
#                            guests' bridge through a veth: xfer from A to
#                            the container and from the container to B, 2
#                            connections x 1,000,000 byte-checked bytes each
#                            way each, accelerated through vsocketd (every
#                            end's report accelerated on path backend, vmp's
#                            upgrades and accelerated bytes out)
#     vm_to_container_cross_tenant  C (tenant 2) to the container: byte-exact
#                            on kernel TCP, both ends peer-not-registered

PAIR_NS=vsvm-$$ PAIR_CNS=vsvmc-$$
PAIR_A=198.51.100.11 PAIR_B=198.51.100.12 PAIR_C=198.51.100.13 PAIR_P=198.51.100.14

# vm_stat VM KEY: a per-VM counter (vsocketctl --json vms)
vm_stat() {
  ctl --json vms 2>/dev/null | python3 -c "
import json, sys
print(next((v[sys.argv[2]] for v in json.load(sys.stdin) if v['vm'] == sys.argv[1]), -1))" "$1" "$2"
}

# pair_job_server DIR: guest B's job: the agent, two xfer servers (A's
# and C's), redis-server preloaded on 6379 and plain on 6380; "ready" once
# all listen, then waits for the host's "stop".
pair_job_server() {
  cat > "$1/job.sh" <<JOB
cd /run/vsocket-vm
./vsocket-guestd --serve --proofs > agent.out 2>&1 &
apid=\$!
for _ in \$(seq 300); do [ -S /run/vsocket/agent.sock ] && break; sleep 0.1; done
export VSOCKET_REPORT=/run/vsocket-vm/report.jsonl
LD_PRELOAD=/run/vsocket-vm/libvsocket.so ./xfer server $PAIR_B 5201 --conns 4 > xfer-a.out 2>&1 &
xa=\$!
LD_PRELOAD=/run/vsocket-vm/libvsocket.so ./xfer server $PAIR_B 5202 --conns 1 > xfer-c.out 2>&1 &
xc=\$!
LD_PRELOAD=/run/vsocket-vm/libvsocket.so ./xfer server $PAIR_B 5203 --conns 2 > xfer-p.out 2>&1 &
xp=\$!
./vsocket-run --upgrade always \\
  redis-server --bind $PAIR_B --port 6379 --save '' --appendonly no --protected-mode no --dir /run/vsocket-vm \\
  > redis.out 2>&1 &
rs=\$!
redis-server --bind $PAIR_B --port 6380 --save '' --appendonly no --protected-mode no --dir /tmp > redis-plain.out 2>&1 &
rp=\$!
./vsocket-run --upgrade always sockperf sr --tcp -i $PAIR_B -p 11111 > sockperf.out 2>&1 &
sp=\$!
sockperf sr --tcp -i $PAIR_B -p 11112 > sockperf-plain.out 2>&1 &
spp=\$!
for p in 5201 5202 5203 6379 6380 11111 11112; do
  for _ in \$(seq 300); do ss -Hltn "sport = :\$p" | grep -q . && break; sleep 0.1; done
done
echo ready > ready
wait \$xa; echo "xfer server A exit \$?"
wait \$xc; echo "xfer server C exit \$?"
wait \$xp; echo "xfer server P exit \$?"
for _ in \$(seq 900); do [ -f stop ] && break; sleep 0.1; done
kill -TERM \$rs \$rp \$sp \$spp; wait \$rs; wait \$rp; wait \$sp; wait \$spp
kill -TERM \$apid
wait \$apid
echo "agent exit \$?"
JOB
}

# pair_job_client DIR COMMANDS: a client guest's job: the agent, then
# COMMANDS once the host says "go".
pair_job_client() {
  cat > "$1/job.sh" <<JOB
cd /run/vsocket-vm
./vsocket-guestd --serve --proofs > agent.out 2>&1 &
apid=\$!
for _ in \$(seq 300); do [ -S /run/vsocket/agent.sock ] && break; sleep 0.1; done
export VSOCKET_REPORT=/run/vsocket-vm/report.jsonl
echo ready > ready
for _ in \$(seq 900); do [ -f go ] && break; sleep 0.1; done
$2
kill -TERM \$apid
wait \$apid
echo "agent exit \$?"
JOB
}

case_vm_to_vm() {
  local t0=$SECONDS RA=$WORK/pair-a RB=$WORK/pair-b RC=$WORK/pair-c bytes=1000000 conns=4 n=4000 c=8
  local d
  for d in "$RA" "$RB" "$RC"; do
    mkdir -p "$d"
    cp "$BIN/guest/agent/vsocket-guestd" "$BIN/guest/libvsocket.so" "$BIN/tests/e2e/xfer" \
       "$BIN/guest/agent/vsocket-agent-probe" "$ROOT/guest/vsocket-run" "$d/"
    rm -f "$d"/{go,stop,report.jsonl}
  done
  pair_job_server "$RB"
  local bench="redis-benchmark -h $PAIR_B -n $n -c $c -t set,get --csv"
  pair_job_client "$RA" "
LD_PRELOAD=/run/vsocket-vm/libvsocket.so ./xfer client $PAIR_B 5201 --conns $conns --bytes $bytes --pause-ms 500 > client.out 2>&1
echo \"client exit \$?\"
$bench -p 6380 > redis-kernel.out 2>&1; echo \"redis kernel exit \$?\"
./vsocket-run --upgrade always $bench -p 6379 > redis-vsocket.out 2>&1
echo \"redis vsocket exit \$?\"
./vsocket-agent-probe --steal $PAIR_A 5301 > steal.out 2>&1
echo \"steal exit \$?\"
sockperf pp --tcp -i $PAIR_B -p 11112 -t 3 -m 16 > sockperf-kernel.out 2>&1; echo \"sockperf kernel exit \$?\"
./vsocket-run --upgrade always sockperf pp --tcp -i $PAIR_B -p 11111 -t 3 -m 16 > sockperf-vsocket.out 2>&1
echo \"sockperf vsocket exit \$?\"
LD_PRELOAD=/run/vsocket-vm/libvsocket.so ./xfer client $PAIR_P 5204 --conns 2 --bytes $bytes --pause-ms 500 > client-p.out 2>&1
echo \"container client exit \$?\"
mkdir -m 755 /tmp/nb && cp xfer libvsocket.so /tmp/nb/ && chmod 755 /tmp/nb/xfer /tmp/nb/libvsocket.so
nb() { setpriv --reuid=65534 --regid=65534 --clear-groups env LD_PRELOAD=/tmp/nb/libvsocket.so VSOCKET_REPORT=/tmp/nobody.jsonl \"\$@\"; }
nb /tmp/nb/xfer server $PAIR_A 5206 --conns 1 > /tmp/nobody-server.out 2>&1 &
nbs=\$!
for _ in \$(seq 300); do ss -Hltn \"sport = :5206\" | grep -q . && break; sleep 0.1; done
nb /tmp/nb/xfer client $PAIR_A 5206 --conns 1 --bytes $bytes --pause-ms 500 > /tmp/nobody-client.out 2>&1
echo \"nobody client exit \$?\"
wait \$nbs
echo \"nobody server exit \$?\"
cp /tmp/nobody.jsonl /tmp/nobody-client.out /tmp/nobody-server.out . 2>/dev/null"
  pair_job_client "$RC" "
LD_PRELOAD=/run/vsocket-vm/libvsocket.so ./xfer client $PAIR_B 5202 --conns 1 --bytes $bytes > client.out 2>&1
echo \"client exit \$?\"
LD_PRELOAD=/run/vsocket-vm/libvsocket.so ./xfer client $PAIR_P 5205 --conns 1 --bytes $bytes > client-p.out 2>&1
echo \"container client exit \$?\""
  vm_net_down "$PAIR_NS"
  vm_net_up "$PAIR_NS" tapa tapb tapc || { fail vm_to_vm "cannot make the guests' bridge"; return; }
  # The container: its processes are their own vhost-user frontends (port
  # vmp), their kernel TCP on the guests' bridge.
  local P=$WORK/pair-p
  mkdir -p "$P"
  rm -f "$P"/*
  vm_container_down "$PAIR_CNS"
  vm_container_up "$PAIR_NS" "$PAIR_CNS" "$PAIR_P/24" || { fail vm_to_vm "cannot make the container's namespace"; return; }
  local cexec=(ip netns exec "$PAIR_CNS" env LD_PRELOAD="$BIN/guest/libvsocket.so" VSOCKET_SOCKET="$WORK/vmp.sock"
               VSOCKET_REPORT="$P/report.jsonl" VSOCKET_UPGRADE=always)
  "${cexec[@]}" "$BIN/tests/e2e/xfer" server "$PAIR_P" 5204 --conns 2 > "$P/server-a.out" 2>&1 &
  local psa=$!
  "${cexec[@]}" "$BIN/tests/e2e/xfer" server "$PAIR_P" 5205 --conns 1 > "$P/server-c.out" 2>&1 &
  local psc=$!
  local p_up0 p_out0
  p_up0=$(vm_stat vmp upgrades) p_out0=$(vm_stat vmp accel_bytes_out)
  local up0 accel0 xt0 a_up0 b_up0 a_out0 b_out0 v0 vr0 ru0
  up0=$(stat upgrades) accel0=$(stat accel_bytes) xt0=$(stat cross_tenant)
  v0=$(stat vouches) vr0=$(stat vouches_refused) ru0=$(stat rejected_unproven)
  local ml0 mlr0 ml mlr
  ml0=$(stat memory_limits) mlr0=$(stat memory_limits_refused)
  a_up0=$(vm_stat vma upgrades) b_up0=$(vm_stat vmb upgrades)
  a_out0=$(vm_stat vma accel_bytes_out) b_out0=$(vm_stat vmb accel_bytes_out)
  local pa pb pc
  VM_FUNCTIONS=5 VM_AGENT_FUNCTION=1 VM_NIC=$PAIR_NS,tapb,52:54:00:00:51:12 \
    vm_boot "$RB" "$WORK/vmb.sock" 300 vsocket.hugepages=41 vsocket.nic=$PAIR_B/24
  pb=$VM_PID
  VM_FUNCTIONS=2 VM_AGENT_FUNCTION=1 VM_NIC=$PAIR_NS,tapa,52:54:00:00:51:11 \
    vm_boot "$RA" "$WORK/vma.sock" 300 vsocket.hugepages=17 vsocket.nic=$PAIR_A/24
  pa=$VM_PID
  VM_FUNCTIONS=1 VM_AGENT_FUNCTION=1 VM_NIC=$PAIR_NS,tapc,52:54:00:00:51:13 \
    vm_boot "$RC" "$WORK/vmc.sock" 300 vsocket.hugepages=9 vsocket.nic=$PAIR_C/24
  pc=$VM_PID
  local ok=1
  for d in "$RB" "$RA" "$RC"; do
    local i
    for ((i = 0; i < 900; i++)); do [ -e "$d/ready" ] || [ -e "$d/rc" ] && break; sleep 0.2; done
    [ -e "$d/ready" ] || ok=0
  done
  touch "$RA/go" "$RC/go"
  local rca=125 rcc=125 rcb=125 rcp=125
  if [ "$ok" = 1 ]; then
    timeout 120 "${cexec[@]}" "$BIN/tests/e2e/xfer" client "$PAIR_B" 5203 --conns 2 --bytes "$bytes" --pause-ms 500 \
      > "$P/client-b.out" 2>&1
    rcp=$?
    vm_wait_for "$pa" "$RA" 240; rca=$?
    vm_wait_for "$pc" "$RC" 60; rcc=$?
  fi
  local rpsa=125 rpsc=125
  for i in $(seq 50); do kill -0 "$psa" 2>/dev/null || kill -0 "$psc" 2>/dev/null || break; sleep 0.2; done
  kill "$psa" "$psc" 2>/dev/null
  wait "$psa"; rpsa=$?
  wait "$psc"; rpsc=$?
  local p_up p_out
  p_up=$(vm_stat vmp upgrades) p_out=$(vm_stat vmp accel_bytes_out)
  local up accel xt a_up b_up a_out b_out v vr ru
  up=$(stat upgrades) accel=$(stat accel_bytes) xt=$(stat cross_tenant)
  v=$(stat vouches) vr=$(stat vouches_refused) ru=$(stat rejected_unproven)
  ml=$(stat memory_limits) mlr=$(stat memory_limits_refused)
  a_up=$(vm_stat vma upgrades) b_up=$(vm_stat vmb upgrades)
  a_out=$(vm_stat vma accel_bytes_out) b_out=$(vm_stat vmb accel_bytes_out)
  touch "$RB/stop"
  vm_wait_for "$pb" "$RB" 60; rcb=$?
  vm_kill_all
  vm_container_down "$PAIR_CNS"
  vm_net_down "$PAIR_NS"
  echo "  container: client to B exit $rcp, servers for A and C exit $rpsa, $rpsc; vmp upgrades $p_up0 -> $p_up, accel_bytes_out $p_out0 -> $p_out"
  echo "  guest A: $(tr '\n' ' ' < "$RA/stdout" 2>/dev/null); agent: $(tail -1 "$RA/agent.out" 2>/dev/null)"
  echo "  guest B: $(tr '\n' ' ' < "$RB/stdout" 2>/dev/null); agent: $(tail -1 "$RB/agent.out" 2>/dev/null)"
  echo "  guest C: $(tr '\n' ' ' < "$RC/stdout" 2>/dev/null); agent: $(tail -1 "$RC/agent.out" 2>/dev/null)"
  echo "  vsocketd: upgrades $up0 -> $up, accel_bytes $accel0 -> $accel, cross_tenant $xt0 -> $xt;" \
       "vma upgrades $a_up0 -> $a_up, accel_bytes_out $a_out0 -> $a_out; vmb upgrades $b_up0 -> $b_up, accel_bytes_out $b_out0 -> $b_out;" \
       "vouches $v0 -> $v, vouches_refused $vr0 -> $vr, rejected_unproven $ru0 -> $ru"
  if [ "$ok" != 1 ] || [ "$rcb" != 0 ]; then
    fail vm_to_vm "a guest never got ready or B's job failed (A $rca, B $rcb, C $rcc)"
    return
  fi
  cat "$RA/report.jsonl" "$RB/report.jsonl" > "$WORK/pair.jsonl" 2>/dev/null
  cat "$RC/report.jsonl" "$RB/report.jsonl" > "$WORK/pair-c.jsonl" 2>/dev/null

  # xfer A <-> B
  local out
  if [ "$rca" != 0 ] || ! grep -q "client exit 0" "$RA/stdout" || ! grep -q "xfer server A exit 0" "$RB/stdout"; then
    fail vm_to_vm_xfer "xfer failed (bytes not verified): $(tail -2 "$RA/client.out" "$RB/xfer-a.out" 2>/dev/null | tr '\n' ' ')"
  elif ! out=$(python3 tests/e2e/check_report.py "$WORK/pair.jsonl" --port 5201 --expect-conns $((2 * conns)) \
      --mode accelerated --reason accelerated --accel-min 1 --exact-total $((bytes + 16)) 2>&1); then
    fail vm_to_vm_xfer "reports: $out"
  else
    if [ $((a_up - a_up0)) -lt "$conns" ] || [ $((b_up - b_up0)) -lt "$conns" ]; then
      fail vm_to_vm_xfer "per-VM upgrades: vma +$((a_up - a_up0)), vmb +$((b_up - b_up0)), want >= $conns each"
    elif [ $((a_out - a_out0)) -lt "$((conns * bytes * 9 / 10))" ] || [ $((b_out - b_out0)) -lt "$((conns * bytes * 9 / 10))" ]; then
      fail vm_to_vm_xfer "accelerated bytes out: vma +$((a_out - a_out0)), vmb +$((b_out - b_out0)), want most of $((conns * bytes)) each"
    else
      echo "  xfer reports: $out"
      pass vm_to_vm_xfer $((SECONDS - t0))
    fi
  fi

  # redis A -> B
  local rk rv
  rk=$(tr '\n' ' ' < "$RA/redis-kernel.out" 2>/dev/null) rv=$(tr '\n' ' ' < "$RA/redis-vsocket.out" 2>/dev/null)
  echo "  redis-benchmark -n $n -c $c, kernel TCP: $rk"
  echo "  redis-benchmark -n $n -c $c, vSocket:    $rv"
  if ! grep -q "redis vsocket exit 0" "$RA/stdout" || ! grep -q '"GET"' "$RA/redis-vsocket.out"; then
    fail vm_to_vm_redis "redis-benchmark under vsocket-run failed: $rv"
  elif ! out=$(python3 - "$WORK/pair.jsonl" "$c" <<'PY'
import json, sys
ends = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ends = [e for e in ends if "local" in e and 6379 in (int(e["local"].rsplit(":", 1)[1]), int(e["peer"].rsplit(":", 1)[1]))]
accel = [e for e in ends if e.get("mode") == "accelerated"]
want = 2 * 2 * int(sys.argv[2])  # set and get, each -c clients, both ends
if len(accel) < want:
    sys.exit(f"{len(accel)} of {len(ends)} redis ends accelerated, want at least {want}: "
             + ", ".join(sorted({e.get('reason', '?') for e in ends if e.get('mode') != 'accelerated'})))
print(f"{len(accel)} of {len(ends)} redis connection ends accelerated, "
      f"{sum(e.get('accel_tx', 0) for e in accel)} B sent on the rings")
PY
  ); then
    fail vm_to_vm_redis "$out"
  else
    echo "  redis reports: $out"
    pass vm_to_vm_redis $((SECONDS - t0))
  fi

  # sockperf ping-pong A -> B, 16 B, under vsocket-run and on kernel TCP
  # between the same two guests in the same run (TCG: only the ratio says
  # anything).
  local lk lv
  lk=$(sed -n 's/.*percentile 50.000 = *\([0-9.]*\).*/\1/p' "$RA/sockperf-kernel.out" 2>/dev/null | tail -1)
  lv=$(sed -n 's/.*percentile 50.000 = *\([0-9.]*\).*/\1/p' "$RA/sockperf-vsocket.out" 2>/dev/null | tail -1)
  echo "  sockperf ping-pong 16 B, p50 RTT/2 (usec): kernel TCP ${lk:-?}, vSocket ${lv:-?};" \
       "p99: kernel $(sed -n 's/.*percentile 99.000 = *\([0-9.]*\).*/\1/p' "$RA/sockperf-kernel.out" | tail -1)," \
       "vSocket $(sed -n 's/.*percentile 99.000 = *\([0-9.]*\).*/\1/p' "$RA/sockperf-vsocket.out" | tail -1)"
  if ! grep -q "sockperf vsocket exit 0" "$RA/stdout" || [ -z "$lv" ]; then
    fail vm_to_vm_sockperf "sockperf under vsocket-run failed: $(tail -3 "$RA/sockperf-vsocket.out" 2>/dev/null | tr '\n' ' ')"
  # (mode only: the server's end may say peer-downgraded, the client
  # having exited with the connection open.)
  elif ! out=$(python3 tests/e2e/check_report.py "$WORK/pair.jsonl" --port 11111 --expect-conns 2 --mode accelerated \
      --accel-min 1 2>&1); then
    fail vm_to_vm_sockperf "reports: $out"
  else
    echo "  sockperf reports: $out"
    pass vm_to_vm_sockperf $((SECONDS - t0))
  fi

  # Cross-tenant C -> B
  if [ "$rcc" != 0 ] || ! grep -q "client exit 0" "$RC/stdout" || ! grep -q "xfer server C exit 0" "$RB/stdout"; then
    fail vm_to_vm_cross_tenant "xfer failed (bytes not verified): $(tail -2 "$RC/client.out" "$RB/xfer-c.out" 2>/dev/null | tr '\n' ' ')"
  elif ! out=$(python3 tests/e2e/check_report.py "$WORK/pair-c.jsonl" --port 5202 --expect-conns 2 \
      --reason peer-not-registered --exact-total $((bytes + 16)) 2>&1); then
    fail vm_to_vm_cross_tenant "reports: $out"
  elif [ "$xt" -le "$xt0" ]; then
    fail vm_to_vm_cross_tenant "vsocketd's cross_tenant stayed $xt0"
  else
    echo "  cross-tenant reports: $out"
    pass vm_to_vm_cross_tenant $((SECONDS - t0))
  fi

  # VM <-> container (process mode) on one host, through vsocketd.
  cat "$RA/report.jsonl" "$P/report.jsonl" > "$WORK/pair-pa.jsonl" 2>/dev/null
  cat "$RB/report.jsonl" "$P/report.jsonl" > "$WORK/pair-pb.jsonl" 2>/dev/null
  cat "$RC/report.jsonl" "$P/report.jsonl" > "$WORK/pair-pc.jsonl" 2>/dev/null
  local out2
  if [ "$rcp" != 0 ] || ! grep -q "xfer server P exit 0" "$RB/stdout" || [ "$rpsa" != 0 ] ||
     ! grep -q "container client exit 0" "$RA/stdout"; then
    fail vm_to_container "xfer failed (bytes not verified): container to B $rcp, A to container $rpsa: $(tail -1 "$P/client-b.out" "$P/server-a.out" "$RA/client-p.out" 2>/dev/null | tr '\n' ' ')"
  elif ! out=$(python3 tests/e2e/check_report.py "$WORK/pair-pa.jsonl" --port 5204 --expect-conns 4 --mode accelerated \
      --reason accelerated --path backend --accel-min 1 --exact-total $((bytes + 16)) 2>&1) ||
       ! out2=$(python3 tests/e2e/check_report.py "$WORK/pair-pb.jsonl" --port 5203 --expect-conns 4 --mode accelerated \
      --reason accelerated --path backend --accel-min 1 --exact-total $((bytes + 16)) 2>&1); then
    fail vm_to_container "reports: A to container: $out; container to B: $out2"
  elif [ $((p_up - p_up0)) -lt 4 ] || [ $((p_out - p_out0)) -lt $((4 * bytes * 9 / 10)) ]; then
    fail vm_to_container "vmp: upgrades +$((p_up - p_up0)), accel_bytes_out +$((p_out - p_out0)): want 4 and most of $((4 * bytes))"
  else
    echo "  A to container: $out"
    echo "  container to B: $out2"
    pass vm_to_container $((SECONDS - t0))
  fi
  if [ "$rpsc" != 0 ] || ! grep -q "container client exit 0" "$RC/stdout"; then
    fail vm_to_container_cross_tenant "xfer failed (bytes not verified): $(tail -1 "$RC/client-p.out" "$P/server-c.out" 2>/dev/null | tr '\n' ' ')"
  elif ! out=$(python3 tests/e2e/check_report.py "$WORK/pair-pc.jsonl" --port 5205 --expect-conns 2 \
      --reason peer-not-registered --exact-total $((bytes + 16)) 2>&1); then
    fail vm_to_container_cross_tenant "reports: $out"
  else
    echo "  C to container: $out"
    pass vm_to_container_cross_tenant $((SECONDS - t0))
  fi

  # Proofs by the agents. Registrations that were vouched for: both ends
  # of xfer's 4 connections and redis' 2 x 17, C's client and B's server
  # end of C's connection; the probe's own one. Refused: the probe's two
  # attempts at the child's connection and its look-alike of another
  # network namespace (its other registrations: none).
  echo "  probe: $(tr '\n' ' ' < "$RA/steal.out" 2>/dev/null)"
  echo "  agents: A: $(grep -h "authority" "$RA/agent.out" | head -1); proofs A/B/C: $(grep -ho "[0-9]* sockets vouched for, [0-9]* proofs refused ([0-9]* of another network namespace)" "$RA/agent.out" "$RB/agent.out" "$RC/agent.out" | tr '\n' ' ')"
  if ! grep -q "steal exit 0" "$RA/stdout"; then
    fail vm_to_vm_proofs "vsocket-agent-probe --steal: $(tr '\n' ' ' < "$RA/steal.out" 2>/dev/null)"
  elif ! grep -q "proofs refused (1 of another network namespace)" "$RA/agent.out"; then
    fail vm_to_vm_proofs "A's agent did not count the look-alike's proof as of another network namespace: $(grep -h "stopping" "$RA/agent.out")"
  elif [ $((ru - ru0)) -ne 3 ]; then
    fail vm_to_vm_proofs "rejected_unproven $ru0 -> $ru: want the probe's 3 refusals and no other"
  elif [ $((v - v0)) -lt $((2 * conns + 2 * 2 * c + 2 + 1)) ] || [ "$vr" != "$vr0" ]; then
    fail vm_to_vm_proofs "vouches +$((v - v0)), vouches_refused +$((vr - vr0)): want every registration vouched for, none refused"
  elif [ $((ml - ml0)) -lt 10 ] || grep "LIMIT_MEMORY from .* refused" "$WORK/vsocketd.log" | grep -qv "no running device"; then
    fail vm_to_vm_proofs "memory_limits +$((ml - ml0)), memory_limits_refused +$((mlr - mlr0)): want every grant's device limited by its agent (decision 130), none refused but while vsocketd had not started it: $(grep "LIMIT_MEMORY from .* refused" "$WORK/vsocketd.log" | grep -v "no running device" | head -1)"
  else
    echo "  memory limits: +$((ml - ml0)) devices limited by their agents, $((mlr - mlr0)) tries before vsocketd had started the device; agents: $(grep -ho "[0-9]* devices limited" "$RA/agent.out" "$RB/agent.out" "$RC/agent.out" | tr '\n' ' ')"
    pass vm_to_vm_proofs $((SECONDS - t0))
  fi
  # A non-root process of the VM (nobody) gets a function, limited to its
  # own memory (decision 130), and is accelerated: xfer server and client.
  if ! grep -q "nobody client exit 0" "$RA/stdout" || ! grep -q "nobody server exit 0" "$RA/stdout"; then
    fail vm_to_vm_non_root "xfer as nobody failed: $(tail -2 "$RA/nobody-client.out" "$RA/nobody-server.out" 2>/dev/null | tr '\n' ' ')"
  elif ! out=$(python3 tests/e2e/check_report.py "$RA/nobody.jsonl" --port 5206 --expect-conns 2 \
      --mode accelerated --reason accelerated --accel-min 1 --exact-total $((bytes + 16)) 2>&1); then
    fail vm_to_vm_non_root "reports: $out"
  else
    echo "  xfer as nobody: $out"
    pass vm_to_vm_non_root $((SECONDS - t0))
  fi
}
