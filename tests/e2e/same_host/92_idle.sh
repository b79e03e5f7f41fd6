# Idle costs nothing.

# An accelerated connection left open and idle, both ends blocked in recv():
# neither guest process nor the daemon may burn CPU.
case_idle() {
  local name=idle_connection_costs_no_cpu rep=$WORK/idle.jsonl port
  port=$(alloc_port)
  vm_bg vm2 preload "$rep" "$WORK/idle.srv" "$BIN/tests/socket/socket_peer" "$A2" "$port"
  local srv=$BG
  wait_for_text "$WORK/idle.srv" listening 50
  vm_bg vm1 preload "$rep" "$WORK/idle.cli" python3 -c '
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
c.sendall(b"E" + b"x" * 100)
got = b""
while len(got) < 100:
    got += c.recv(100)
print("echoed", flush=True)
c.settimeout(4)
try:
    c.recv(1)
except socket.timeout:
    print("idle done", flush=True)
' "$A2" "$port"
  local cli=$BG
  wait_for_text "$WORK/idle.cli" echoed 50
  sleep 0.3
  local d s c
  d=$(bash $TB daemon-pid)
  s=$(pgrep -f "socket_peer $A2 $port" | tail -1)
  c=$(pgrep -f "create_connection" | tail -1)
  local t0 t1
  t0=$(cat /proc/"$d"/stat /proc/"$s"/stat /proc/"$c"/stat 2>/dev/null | awk '{t += $14 + $15} END {print t}')
  sleep 2
  t1=$(cat /proc/"$d"/stat /proc/"$s"/stat /proc/"$c"/stat 2>/dev/null | awk '{t += $14 + $15} END {print t}')
  wait "$cli" 2>/dev/null
  kill "$srv" 2>/dev/null
  wait "$srv" 2>/dev/null
  if ! grep -q "idle done" "$WORK/idle.cli"; then
    fail $name "client: $(tr '\n' ' ' < "$WORK/idle.cli")"
  elif ! python3 $CHECK "$rep" --port "$port" --mode accelerated --accel-min 1 >/dev/null; then
    fail $name "the idle connection was not accelerated: $(python3 $CHECK "$rep" --port "$port" --mode accelerated)"
  elif [ $((t1 - t0)) -gt 10 ]; then
    fail $name "$((t1 - t0)) clock ticks in 2 s for daemon + both guests"
  else
    pass "$name ($((t1 - t0)) clock ticks in 2 s: vsocketd + both guest processes, connection accelerated)"
  fi
}

register_case idle_connection_costs_no_cpu case_idle
