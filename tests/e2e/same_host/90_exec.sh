# Exec: connections a new program inherits (issue 18), a static binary, sshd.

# An inetd-style server hands its accepted connection to cat across exec,
# with and without libvsocket in cat's environment (sshd scrubs it). The
# library cannot follow a connection into another program: each one is
# named in the log and the report (event exec, reason inherited) and goes on
# over kernel TCP, byte-exact; one it had accelerated is reset instead (the
# client sees ECONNRESET, never a silent EOF or a hang).
# exec_server PORT ENV_OF_CAT [accelerated]: python3 in vm2 that accepts one
# connection and execs cat on it (after a byte-checked accelerated exchange
# if "accelerated").
exec_server() {
  vm_bg vm2 preload "$WORK/exec$1.srv.jsonl" "$WORK/exec$1.srv" python3 -c '
import os, socket, sys
port, env, accel = int(sys.argv[2]), sys.argv[3], len(sys.argv) > 4
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((sys.argv[1], port))
ls.listen(1)
c, _ = ls.accept()
if accel:
    req = c.recv(16)
    c.sendall(bytes(range(256)) * 256)
    c.recv(1)  # the client has it all
os.dup2(c.fileno(), 0)
os.dup2(c.fileno(), 1)
e = dict(os.environ)
if env == "scrubbed":
    e.pop("LD_PRELOAD", None)
os.execve("/bin/cat", ["cat"], e)
' "$A2" "$1" "$2" ${3:-}
}
case_exec() {
  local name=exec_hands_connections_on port out part1
  port=$(alloc_port)
  # 1. Unprobed connection, cat without libvsocket: byte-exact, named.
  exec_server $port scrubbed
  local srv=$BG
  wait_listen vm2 $port
  out=$(vm_run vm1 preload "$WORK/exec.cli.jsonl" python3 -c '
import hashlib, os, socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
data = os.urandom(1 << 20)
c.sendall(data)
c.shutdown(socket.SHUT_WR)
got = b""
while True:
    b = c.recv(65536)
    if not b:
        break
    got += b
print("exact" if got == data else "differs %d" % len(got))
' "$A2" $port 2>&1)
  wait "$srv" 2>/dev/null
  [ "$out" = exact ] || { fail $name "through cat: $out"; return; }
  if ! out=$(python3 - "$WORK/exec$port.srv.jsonl" <<'PY'
import json, sys
try:
    lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
except FileNotFoundError:
    lines = []
ex = [l for l in lines if l["event"] == "exec"]
if len(ex) != 1 or ex[0]["exec"] != "/bin/cat" or ex[0]["reason"] != "inherited" or ex[0]["mode"] != "kernel" \
        or ex[0]["local"].endswith(":0"):
    print("server report: " + " ".join(json.dumps(l) for l in lines)[:600])
    sys.exit(1)
print("exec line: %s %s" % (ex[0]["mode"], ex[0]["reason"]))
PY
  ); then
    fail $name "$out"
    return
  fi
  part1=$out
  grep -q "exec /bin/cat: fd .* whose environment does not preload libvsocket" "$WORK/exec$port.srv" ||
    { fail $name "no log line for the connection passed to cat: $(tr '\n' ' ' < "$WORK/exec$port.srv" | cut -c1-300)"; return; }
  # 2. Accelerated connection: reset, not a silent EOF.
  port=$(alloc_port)
  exec_server $port kept accelerated
  srv=$BG
  wait_listen vm2 $port
  out=$(vm_run vm1 preload "$WORK/exec.cli.jsonl" python3 -c '
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
c.sendall(b"x" * 16)
want = bytes(range(256)) * 256
got = b""
try:
    while len(got) < len(want):
        b = c.recv(65536)
        if not b:
            print("EOF after %d bytes" % len(got))
            sys.exit()
        got += b
    if got != want:
        print("response differs")
        sys.exit()
    c.sendall(b"k")
    for _ in range(64):
        c.sendall(b"y" * 4096)
        b = c.recv(65536)
        if not b:
            print("EOF after the exec")
            sys.exit()
    print("no error")
except (ConnectionResetError, BrokenPipeError) as e:
    print("reset" if got == want else "reset early")
' "$A2" $port 2>&1)
  wait "$srv" 2>/dev/null
  [ "$out" = reset ] || { fail $name "accelerated connection across exec: $out"; return; }
  grep -q "exec /bin/cat: fd .* was accelerated and cannot go on in the new program: connection reset" "$WORK/exec$port.srv" ||
    { fail $name "no log line for the accelerated connection: $(tr '\n' ' ' < "$WORK/exec$port.srv" | cut -c1-300)"; return; }
  grep -q '"event":"exec".*"mode":"accelerated","reason":"inherited"' "$WORK/exec$port.srv.jsonl" ||
    { fail $name "no exec report line for the accelerated connection"; return; }
  pass "$name (1 MiB through cat byte-exact, $part1; an accelerated connection passed to cat reset: the client saw ECONNRESET; both named in the log)"
}

# A statically linked client under vsocket-run (as a Go program would be):
# nothing can be preloaded into it, so vsocket-run says so on stderr and in
# the report (event start, reason static-binary); it runs on kernel TCP,
# byte-exact.
case_static_binary() {
  local name=static_binary_is_named port rep=$WORK/static.jsonl out
  port=$(alloc_port)
  if ! gcc -static -O2 -o "$WORK/static_client" -x c - >"$WORK/static.cc.log" 2>&1 <<'C'
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
int main(int argc, char** argv) {
  static char out[1 << 16], in[1 << 16];
  for (size_t i = 0; i < sizeof(out); ++i) out[i] = (char)(i * 7 + 3);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
  inet_pton(AF_INET, argv[1], &a.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, (struct sockaddr*)&a, sizeof(a)) != 0) return 2;
  for (size_t off = 0; off < sizeof(out);) {
    ssize_t n = write(fd, out + off, sizeof(out) - off);
    if (n <= 0) return 3;
    off += (size_t)n;
  }
  shutdown(fd, SHUT_WR);
  size_t got = 0;
  for (ssize_t n; (n = read(fd, in + got, sizeof(in) - got)) > 0;) got += (size_t)n;
  if (got != sizeof(out) || memcmp(in, out, got) != 0) return 4;
  puts("exact");
  return 0;
}
C
  then
    fail $name "cannot build a static client: $(tail -2 "$WORK/static.cc.log" | tr '\n' ' ')"
    return
  fi
  plain_echo_server $port "$WORK/static.srv"
  local srv=$BG
  wait_listen vm2 $port
  out=$(bash $TB exec vm1 timeout 30 guest/vsocket-run --lib "$LIB" --report "$rep" "$WORK/static_client" "$A2" $port 2>&1)
  wait "$srv" 2>/dev/null
  grep -q "^exact$" <<<"$out" || { fail $name "static client: $out"; return; }
  grep -q "vsocket-run: $WORK/static_client is statically linked" <<<"$out" || { fail $name "nothing said: $out"; return; }
  grep -q "\"event\":\"start\",\"program\":\"$WORK/static_client\",\"mode\":\"kernel\",\"reason\":\"static-binary\"" "$rep" ||
    { fail $name "no report line: $(cat "$rep" 2>/dev/null)"; return; }
  pass "$name (byte-exact on kernel TCP; vsocket-run named it on stderr and in the report)"
}

# Real sshd under vsocket-run: per connection it forks and re-executes
# itself with the socket, a program the library cannot follow into. The
# server side says so (log and report: event exec, reason inherited, the
# program) instead of leaving "why is ssh not accelerated?" unanswered; the
# session works on kernel TCP, byte-exact.
case_sshd() {
  local name=sshd_reexec_is_explained port d=$WORK/sshd rep=$WORK/sshd.jsonl out want made_run=0
  port=$(alloc_port)
  [ -x /usr/sbin/sshd ] || { fail $name "openssh-server not installed (deploy/install-deps.sh)"; return; }
  # sshd's privilege separation directory (its unit makes it; here, we do).
  [ -d /run/sshd ] || { mkdir -p /run/sshd && made_run=1; }
  mkdir -p "$d" && chmod 700 "$d"
  ssh-keygen -q -t ed25519 -N '' -f "$d/host_key" && ssh-keygen -q -t ed25519 -N '' -f "$d/client_key" &&
    cp "$d/client_key.pub" "$d/authorized_keys" || { fail $name "ssh-keygen failed"; return; }
  printf '%s\n' "Port $port" "ListenAddress $A2" "HostKey $d/host_key" "AuthorizedKeysFile $d/authorized_keys" \
    "PermitRootLogin prohibit-password" "StrictModes no" "UsePAM no" "PidFile $d/sshd.pid" >"$d/sshd_config"
  vm_bg vm2 plain /dev/null "$WORK/sshd.log" guest/vsocket-run --lib "$LIB" --report "$rep" \
    /usr/sbin/sshd -D -e -f "$d/sshd_config"
  local srv=$BG
  wait_listen vm2 $port || { fail $name "sshd did not listen: $(tail -3 "$WORK/sshd.log" | tr '\n' ' ')"; kill "$srv" 2>/dev/null; return; }
  want=$(head -c 1000000 /dev/zero | sha256sum | cut -d' ' -f1)
  out=$(vm_run vm1 plain /dev/null ssh -i "$d/client_key" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
    -o BatchMode=yes -o LogLevel=ERROR -p $port "root@$A2" 'head -c 1000000 /dev/zero | sha256sum' 2>&1)
  kill "$srv" 2>/dev/null
  wait "$srv" 2>/dev/null
  [ $made_run -eq 0 ] || rmdir /run/sshd 2>/dev/null
  grep -q "^$want " <<<"$out" || { fail $name "ssh session: $out"; return; }
  local said
  said=$(grep -o "libvsocket: exec /usr/sbin/sshd: fd .*" "$WORK/sshd.log" | head -1)
  [ -n "$said" ] || { fail $name "sshd's log says nothing of the connection: $(tail -5 "$WORK/sshd.log" | tr '\n' ' ')"; return; }
  grep -q '"event":"exec","exec":"/usr/sbin/sshd".*"reason":"inherited"' "$rep" ||
    { fail $name "no exec report line: $(cat "$rep" 2>/dev/null | cut -c1-300)"; return; }
  pass "$name (ssh session byte-exact on kernel TCP; sshd's side said: ${said#libvsocket: })"
}

register_case exec_hands_connections_on case_exec
register_case static_binary_is_named case_static_binary
register_case sshd_reexec_is_explained case_sshd
