# Benchmarks inside QEMU guests (issue 35): sourced by vm_mode.sh, whose
# daemon serves the guests' ports (vma, vmb: tenant 1, sockets proved by
# each VM's agent) and whose helpers (ctl, stat, pass, fail) it uses.
# Run by name only, through bench/vm_bench.sh (BENCH_OUT: the JSON file).
#
#   bench_vm_pair   two TCG guests of one vCPU each, A (clients) and B
#                   (servers), their kernel TCP on a bridge of the bed's
#                   own; in B each server twice, under plain vsocket-run
#                   (the default policy) and plain. BENCH_REPS (default 3)
#                   repetitions of: sockperf ping-pong (16 B, 3 s),
#                   sockperf throughput (16 KiB messages, 3 s), redis-benchmark
#                   GET with 1 and with 16 clients, each against kernel TCP
#                   and vSocket in turn (the order alternating by
#                   repetition). For each run the host reads the CPU time of
#                   both QEMUs and of vsocketd before and after (the guest
#                   waits for it), so the result has CPU per message too.
#                   Every vSocket end's report must say accelerated, and
#                   vsocketd's accelerated bytes must move; the numbers are
#                   ratios against kernel TCP between the same two guests
#                   in the same run (TCG inflates absolute times).

# bench_cpu_ticks PID...: utime + stime of the PIDs, in clock ticks
bench_cpu_ticks() {
  local p t=0 f
  for p in "$@"; do
    f=$(cut -d' ' -f14,15 "/proc/$p/stat" 2>/dev/null) || continue
    t=$((t + ${f% *} + ${f#* }))
  done
  echo "$t"
}

case_bench_vm_pair() {
  local t0=$SECONDS RA=$WORK/bench-a RB=$WORK/bench-b reps=${BENCH_REPS:-3} d
  for d in "$RA" "$RB"; do
    mkdir -p "$d"
    rm -rf "$d"/{go,stop,report.jsonl,marks,runs}
    mkdir -p "$d/marks" "$d/runs"
    cp "$BIN/guest/agent/vsocket-guestd" "$BIN/guest/libvsocket.so" "$ROOT/guest/vsocket-run" "$d/"
  done
  cat > "$RB/job.sh" <<JOB
cd /run/vsocket-vm
./vsocket-guestd --serve --proofs > agent.out 2>&1 &
apid=\$!
for _ in \$(seq 300); do [ -S /run/vsocket/agent.sock ] && break; sleep 0.1; done
export VSOCKET_REPORT=/run/vsocket-vm/report.jsonl
./vsocket-run sockperf sr --tcp -i $PAIR_B -p 11111 > sockperf.out 2>&1 &
s1=\$!
sockperf sr --tcp -i $PAIR_B -p 11112 > sockperf-plain.out 2>&1 &
s2=\$!
./vsocket-run redis-server --bind $PAIR_B --port 6379 --save '' --appendonly no --protected-mode no --dir /tmp \\
  > redis.out 2>&1 &
r1=\$!
redis-server --bind $PAIR_B --port 6380 --save '' --appendonly no --protected-mode no --dir /tmp > redis-plain.out 2>&1 &
r2=\$!
for p in 11111 11112 6379 6380; do
  for _ in \$(seq 300); do ss -Hltn "sport = :\$p" | grep -q . && break; sleep 0.1; done
done
echo ready > ready
for _ in \$(seq 3000); do [ -f stop ] && break; sleep 0.2; done
kill -TERM \$s1 \$s2 \$r1 \$r2; wait \$s1; wait \$s2; wait \$r1; wait \$r2
kill -TERM \$apid
wait \$apid
echo "agent exit \$?"
JOB
  # A (pair_job_client): each run between two marks the host answers (it
  # reads the CPU times then); RUN NAME MODE REP CMD...
  local runs
  runs=$(cat <<JOB
mark() { echo > marks/\$1; for _ in \$(seq 300); do [ -f marks/\$1.ack ] && return; sleep 0.05; done; }
run() {
  local name=\$1 mode=\$2 rep=\$3 pre=
  shift 3
  [ \$mode = vsocket ] && pre=./vsocket-run
  mark \$name-\$mode-\$rep-start
  \$pre "\$@" > runs/\$name-\$mode-\$rep.out 2>&1
  echo "\$name \$mode \$rep exit \$?"
  mark \$name-\$mode-\$rep-end
}
for rep in \$(seq $reps); do
  modes="kernel vsocket"
  [ \$((rep % 2)) = 0 ] && modes="vsocket kernel"
  for m in \$modes; do
    port=11112; [ \$m = vsocket ] && port=11111
    run pp16 \$m \$rep sockperf pp --tcp -i $PAIR_B -p \$port -t 3 -m 16
  done
  for m in \$modes; do
    port=11112; [ \$m = vsocket ] && port=11111
    run tp16k \$m \$rep sockperf tp --tcp -i $PAIR_B -p \$port -t 3 -m 16384
  done
  for m in \$modes; do
    port=6380; [ \$m = vsocket ] && port=6379
    run redis1 \$m \$rep redis-benchmark -h $PAIR_B -p \$port -n 1500 -c 1 -t get --csv
  done
  for m in \$modes; do
    port=6380; [ \$m = vsocket ] && port=6379
    run redis16 \$m \$rep redis-benchmark -h $PAIR_B -p \$port -n 6000 -c 16 -t get --csv
  done
done
JOB
)
  pair_job_client "$RA" "$runs"
  vm_net_down "$PAIR_NS"
  vm_net_up "$PAIR_NS" tapa tapb || { fail bench_vm_pair "cannot make the guests' bridge"; return; }
  local accel0 up0
  accel0=$(stat accel_bytes) up0=$(stat upgrades)
  local pa pb
  VM_FUNCTIONS=2 VM_AGENT_FUNCTION=1 VM_NIC=$PAIR_NS,tapb,52:54:00:00:51:12 \
    vm_boot "$RB" "$WORK/vmb.sock" 900 vsocket.hugepages=17 vsocket.nic=$PAIR_B/24
  pb=$VM_PID
  VM_FUNCTIONS=2 VM_AGENT_FUNCTION=1 VM_NIC=$PAIR_NS,tapa,52:54:00:00:51:11 \
    vm_boot "$RA" "$WORK/vma.sock" 900 vsocket.hugepages=17 vsocket.nic=$PAIR_A/24
  pa=$VM_PID
  local i ok=1
  for d in "$RB" "$RA"; do
    for ((i = 0; i < 900; i++)); do [ -e "$d/ready" ] || [ -e "$d/rc" ] && break; sleep 0.2; done
    [ -e "$d/ready" ] || ok=0
  done
  [ "$ok" = 1 ] || { touch "$RB/stop"; vm_kill_all; vm_net_down "$PAIR_NS"; fail bench_vm_pair "a guest never got ready"; return; }
  touch "$RA/go"
  # Answer A's marks with the CPU times of both QEMUs and vsocketd.
  local samples=$WORK/bench-cpu.txt m
  : > "$samples"
  for ((i = 0; i < 12000; i++)); do
    for m in "$RA"/marks/*; do
      [ -e "$m" ] || continue
      case "$m" in *.ack) continue ;; esac
      [ -e "$m.ack" ] && continue
      echo "${m##*/} $(date +%s.%N) $(bench_cpu_ticks "$pa" "$pb") $(bench_cpu_ticks "$D_PID")" >> "$samples"
      touch "$m.ack"
    done
    kill -0 "$pa" 2>/dev/null || break
    sleep 0.05
  done
  vm_wait_for "$pa" "$RA" 60
  local rca=$? accel up
  accel=$(stat accel_bytes) up=$(stat upgrades)
  touch "$RB/stop"
  vm_wait_for "$pb" "$RB" 60
  local rcb=$?
  vm_kill_all
  vm_net_down "$PAIR_NS"
  echo "  guest A: $(tr '\n' ' ' < "$RA/stdout" 2>/dev/null | cut -c1-600)"
  echo "  guest B: $(tr '\n' ' ' < "$RB/stdout" 2>/dev/null)"
  echo "  vsocketd: accel_bytes $accel0 -> $accel, upgrades $up0 -> $up"
  [ "$rca" = 0 ] && [ "$rcb" = 0 ] || { fail bench_vm_pair "guest jobs: A $rca, B $rcb"; return; }
  cat "$RA/report.jsonl" "$RB/report.jsonl" > "$WORK/bench.jsonl" 2>/dev/null
  local out
  out=$(python3 tests/vm/bench_vm_result.py --runs "$RA/runs" --stdout "$RA/stdout" --cpu "$samples" \
      --reports "$WORK/bench.jsonl" --accel-bytes $((accel - accel0)) --reps "$reps" --hz "$(getconf CLK_TCK)" \
      --out "${BENCH_OUT:-$WORK/bench-vm.json}" 2>&1) ||
    { fail bench_vm_pair "$out"; return; }
  echo "$out" | sed 's/^/  /'
  pass bench_vm_pair $((SECONDS - t0))
}
