# sockperf (ping-pong, throughput) and iperf3 between vm1 and vm2, every
# connection accelerated; the daemon's naps ended early by the library's
# kicks during the ping-pong.

case_sockperf() { # case_sockperf NAME MODE [sockperf args]
  local port
  port=$(alloc_port)
  if run_sockperf "$1" vm1 vm2 "$A2" "$port" "$2" "${@:3}"; then pass "$1 ($E2E_MSG)"; else fail "$1" "$E2E_MSG"; fi
}

# nap_kicks_pingpong judges the daemon's naps and kicks during
# sockperf_pingpong_16B_through_vsocketd (NAPS0, KICKS0: before it). (The
# default pair, direct, never wakes vsocketd: direct_quiet_daemon.)
NAPS0="" KICKS0=""
case_sockperf_pingpong() {  # case_sockperf's arguments
  NAPS0=$(stat_field naps)
  KICKS0=$(stat_field nap_kicks)
  case_sockperf "$@"
}
# On a host of fewer than 4 CPUs, vsocketd (no cpus) naps between passes
# instead of polling, and a library about to wait for its answer kicks it
# awake first (decision 67): the ping-pong's round trips end naps early
# (without the kicks each hop waits out a nap: none ends early).
case_nap_kicks_pingpong() {
  local naps kicks
  naps=$(( $(stat_field naps) - NAPS0 ))
  kicks=$(( $(stat_field nap_kicks) - KICKS0 ))
  if [ "$(nproc)" -ge 4 ]; then
    pass "nap_kicks_pingpong (not napping on a host of $(nproc) CPUs: naps +$naps)"
  elif [ "$naps" -gt 0 ] && [ "$kicks" -ge 1000 ]; then
    pass "nap_kicks_pingpong (naps +$naps, ended early by kicks +$kicks in 2 s of ping-pong)"
  else
    fail nap_kicks_pingpong "naps +$naps, of which kicked +$kicks (want naps and at least 1000 kicks)"
  fi
}

case_iperf() { # case_iperf NAME [iperf3 args]: every connection accelerated
  local port
  port=$(alloc_port)
  if run_iperf "$1" vm1 vm2 "$A2" "$port" "--mode accelerated --accel-min 1" "${@:2}"; then
    pass "$1 ($E2E_MSG)"
  else
    fail "$1" "$E2E_MSG"
  fi
}

register_case sockperf_pingpong_16B case_sockperf sockperf_pingpong_16B pp -m 16
register_case sockperf_pingpong_16B_through_vsocketd through_vsocketd case_sockperf_pingpong \
  sockperf_pingpong_16B_through_vsocketd pp -m 16
register_case nap_kicks_pingpong case_nap_kicks_pingpong
case_needs nap_kicks_pingpong sockperf_pingpong_16B_through_vsocketd
register_case sockperf_throughput_1KiB case_sockperf sockperf_throughput_1KiB tp -m 1024
register_case iperf3_4_streams case_iperf iperf3_4_streams -P 4
register_case iperf3_reverse_4_streams case_iperf iperf3_reverse_4_streams -P 4 -R
