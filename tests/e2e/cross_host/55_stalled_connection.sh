# One stalled connection (its reader stopped reading) must not stall the
# shared link: it fills its own credit window and waits, while other
# connections cross the same link at full speed.
case_stalled_conn() {
  local name=cross_stalled_connection_does_not_stall_link port rep=$WORK/stall.jsonl
  port=$(alloc_port)
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
  fabric_xfer stall_others vmA1 vmB1 "$B1" 4 16777216 "$(alloc_port)" || ok=0
  # Still stalled, still within its window.
  local row2
  row2=$(bash $TB ctl hostA connections 2>/dev/null | awk -v p=":$port" '$5 ~ p && $6 == "accelerated" && $11 == $12')
  kill "$cli" "$srv" 2>/dev/null
  wait "$cli" "$srv" 2>/dev/null
  [ $ok -eq 1 ] || { fail $name "other connections on the link: $XFER_MSG"; return; }
  [ -n "$row2" ] || { fail $name "the stalled connection changed state meanwhile"; return; }
  pass "$name (one upgraded connection stalled at credit_used = window = $(echo "$row" | awk '{print $12}') B; meanwhile $XFER_MSG)"
}

register_case cross_stalled_connection_does_not_stall_link case_stalled_conn
