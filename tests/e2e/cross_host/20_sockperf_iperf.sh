# sockperf and iperf3 from vmA1 to vmB1 across the fabric
# (case_sockperf: also 30_default_policy.sh).

case_sockperf() { # case_sockperf NAME MODE [sockperf args]; the fabric carried it
  local a0 da port
  port=$(alloc_port)
  a0=$(counter hostA fabric_bytes_out)
  run_sockperf "$1" vmA1 vmB1 "$B1" "$port" "$2" "${@:3}" || { fail "$1" "$E2E_MSG"; return; }
  da=$(($(counter hostA fabric_bytes_out) - a0))
  [ "$da" -gt 0 ] || { fail "$1" "no bytes on the fabric"; return; }
  pass "$1 ($E2E_MSG; fabric A->B $da B)"
}

# iperf3's control connection may finish its few bytes before the pairing,
# and a stream may start at full speed on kernel TCP before it: require
# that most of all bytes went accelerated.
case_iperf() { # case_iperf NAME [iperf3 args]
  local port
  port=$(alloc_port)
  if run_iperf "$1" vmA1 vmB1 "$B1" "$port" "--bulk-accel 0 --aggregate" "${@:2}"; then
    pass "$1 ($E2E_MSG)"
  else
    fail "$1" "$E2E_MSG"
  fi
}

register_case cross_sockperf_pingpong_16B case_sockperf cross_sockperf_pingpong_16B pp -m 16
register_case cross_sockperf_throughput_1KiB case_sockperf cross_sockperf_throughput_1KiB tp -m 1024
register_case cross_iperf3_4_streams case_iperf cross_iperf3_4_streams -P 4
register_case cross_iperf3_reverse case_iperf cross_iperf3_reverse -R
