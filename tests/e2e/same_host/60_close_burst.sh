# A burst of connections the server closes first, in a region that holds
# only a few of them: each closed one lingers until its client reads the
# response, so the next registration finds the region full of rings that
# come back moments later. It must wait for them (up to 20 ms, decision 44),
# not leave that connection on kernel TCP for good.
case_close_burst() {
  local name=close_burst_reuses_rings port n=12 size=131072
  port=$(alloc_port)
  local srep=$WORK/$name.srv.jsonl crep=$WORK/$name.cli.jsonl
  # 512 KiB rings in a 4 MiB region: three connections at most.
  VSOCKET_REGION_MB=4 VSOCKET_RING_KB=512 vm_bg vm2 preload "$srep" "$WORK/$name.srv" python3 -c '
import hashlib, socket, sys
n, size = int(sys.argv[2]), int(sys.argv[3])
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((sys.argv[1], int(sys.argv[4])))
ls.listen(64)
for _ in range(n):
    c, _ = ls.accept()
    i = int(c.recv(16))
    c.sendall((hashlib.sha256(b"%d" % i).digest() * (size // 32)))
    c.close()
print("served", n, flush=True)
' "$A2" $n $size $port
  local srv=$BG
  wait_listen vm2 $port
  # The client sends every request before it reads any response.
  local out
  out=$(vm_run vm1 preload "$crep" python3 -c '
import hashlib, socket, sys
n, size = int(sys.argv[2]), int(sys.argv[3])
conns = []
for i in range(n):
    c = socket.create_connection((sys.argv[1], int(sys.argv[4])))
    c.sendall(b"%d" % i)
    conns.append(c)
bad = 0
for i, c in enumerate(conns):
    got = b""
    while True:
        b = c.recv(65536)
        if not b:
            break
        got += b
    bad += got != hashlib.sha256(b"%d" % i).digest() * (size // 32)
print("bad", bad, flush=True)
' "$A2" $n $size $port 2>&1)
  wait "$srv" 2>/dev/null
  [ "$out" = "bad 0" ] || { fail $name "client: $out"; return; }
  grep -q "served $n" "$WORK/$name.srv" || { fail $name "server: $(tail -2 "$WORK/$name.srv" | tr '\n' ' ')"; return; }
  if ! out=$(python3 $CHECK "$srep" --port $port --expect-conns $n --mode accelerated --reason accelerated \
      --accel-min $size); then
    fail $name "server side: $out"
    return
  fi
  pass "$name ($n responses of $size B byte-exact through a region of 3 ring pairs; $out)"
}

register_case close_burst_reuses_rings case_close_burst
