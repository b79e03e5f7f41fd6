# vsocketctl vm add / vm remove at runtime (issue 38, decision 105), under
# a byte-checked accelerated stream between two other VMs. It restarts
# vsocketd (the added VM must be found again), so it runs last.

ADD_NS=vsadd4     # the added VM's network namespace (a name the bed never uses)
ADD_ADDR=198.51.100.14
add_vm_up() {
  add_vm_down
  ip netns add $ADD_NS && ip link add vsadd4h type veth peer name eth0 netns $ADD_NS &&
    ip link set vsadd4h master vsbr0 up && ip -n $ADD_NS link set lo up &&
    ip -n $ADD_NS addr add $ADD_ADDR/24 dev eth0 && ip -n $ADD_NS link set eth0 up
}
add_vm_down() {
  bash $TB ctl vm remove vm4 --wait 2 >/dev/null 2>&1
  ip netns del $ADD_NS 2>/dev/null
  ip link del vsadd4h 2>/dev/null
  true
}
# add_vm_bg REPORT LOG CMD...: CMD in the added VM, preloaded, its socket
# the added port; PID in $BG (bounded like vm_bg).
add_vm_bg() {
  local report=$1 log=$2
  shift 2
  VSOCKET_SOCKET=$WORK/vm4.sock VSOCKET_REPORT=$report LD_PRELOAD=$LIB \
    ip netns exec $ADD_NS timeout "${E2E_TIMEOUT:-60}" "$@" >"$log" 2>&1 &
  BG=$!
  PIDS+=("$BG")
}
# add_vm_xfer NAME PORT CONNS BYTES: vm4 client -> vm2 server, both
# preloaded, byte-checked; 0 if every end was accelerated (XFER_MSG says).
add_vm_xfer() {
  local name=$1 port=$2 conns=$3 bytes=$4 srv rep=$WORK/$1.jsonl
  vm_bg vm2 preload "$rep" "$WORK/$name.srv" "$XFER" server "$A2" "$port" --conns "$conns"
  srv=$BG
  sleep 0.2
  add_vm_bg "$rep" "$WORK/$name.cli" "$XFER" client "$A2" "$port" --conns "$conns" --bytes "$bytes"
  wait "$BG" || { XFER_MSG="client: $(tail -2 "$WORK/$name.cli" | tr '\n' ' ')"; kill "$srv" 2>/dev/null; return 1; }
  wait "$srv" || { XFER_MSG="server: $(tail -2 "$WORK/$name.srv" | tr '\n' ' ')"; return 1; }
  XFER_MSG=$(python3 $CHECK "$rep" --port "$port" --expect-conns $((2 * conns)) --mode accelerated --reason accelerated \
    --accel-min 1 --exact-total $((bytes + 16))) || return 1
}
vm_listed() { bash $TB ctl vms 2>/dev/null | awk '{print $1}' | grep -qx "$1"; }
# never_left REPORT PORT...: every end on those ports accelerated, never
# downgraded nor resynced (the stream was not touched).
never_left() {
  python3 - "$@" <<'PY'
import json, sys
ports = set(sys.argv[2:])
bad, n = [], 0
for line in open(sys.argv[1]):
    l = json.loads(line) if line.strip() else {}
    if "local" not in l or not ports & {l["local"].rsplit(":", 1)[1], l["peer"].rsplit(":", 1)[1]}:
        continue
    n += 1
    if l["mode"] != "accelerated" or l.get("resynced") or l.get("downgrades", 0) or l["accel_tx"] + l["accel_rx"] == 0:
        bad.append(f'{l["local"]}: mode {l["mode"]}, downgrades {l.get("downgrades", 0)}, resynced {l.get("resynced")}')
print(f"{n} ends accelerated throughout" if not bad else "; ".join(bad[:4]))
sys.exit(1 if bad or n == 0 else 0)
PY
}

case_vm_add_remove() {
  local name=vm_add_remove_leaves_others_alone port p2 p3 p4 rep=$WORK/vm_add_remove.jsonl out bad="" msg_add msg_rm msg_restart
  local state=${VSOCKET_TESTBED_DIR:-/run/vsocket-testbed}
  add_vm_up || { fail $name "could not make the added VM's namespace on the bed's bridge"; add_vm_down; return; }
  port=$(alloc_port 2)
  # vm1 -> vm2: a 4 GiB stream and 4 request/response connections (700
  # rounds, 20 ms apart: ~14 s), all accelerated before anything is added.
  bulk_and_rounds vm_add_remove "$rep" "$port" 700 ||
    { fail $name "the stream vm1 -> vm2 was not accelerated to begin with"; add_vm_down; return; }
  # Bad input, each refused with its reason (nothing added).
  local want
  for want in "there is a VM named 'vm1' already|vm add vm1 --socket $WORK/x.sock --tenant 1" \
      "socket $state/vm2.sock is VM 'vm2''s|vm add vm4 --socket $state/vm2.sock --tenant 1" \
      "address 198.51.100.11 is VM 'vm1''s (tenant 1)|vm add vm4 --socket $WORK/vm4.sock --tenant 1 --addresses 198.51.100.11" \
      "tenant must be 1..4294967295|vm add vm4 --socket $WORK/vm4.sock --tenant 0" \
      "is in vsocketd's configuration|vm remove vm1"; do
    # shellcheck disable=SC2086  # the command's words
    if out=$(bash $TB ctl ${want#*|} 2>&1) || [[ $out != *"${want%%|*}"* ]]; then
      bad+="vsocketctl ${want#*|}: '$out' (want an error saying \"${want%%|*}\"); "
    fi
  done
  vm_listed vm4 && bad+="vm4 listed after refused adds; "
  [ -z "$bad" ] || { fail $name "$bad"; kill $BR_PIDS 2>/dev/null; add_vm_down; return; }
  out=$(bash $TB ctl vm add vm4 --socket "$WORK/vm4.sock" --tenant 1 --addresses $ADD_ADDR 2>&1) ||
    { fail $name "vsocketctl vm add vm4: $out"; kill $BR_PIDS 2>/dev/null; add_vm_down; return; }
  vm_listed vm4 || bad+="vm4 not listed by vsocketctl vms after vm add; "
  p2=$(alloc_port)
  add_vm_xfer vm_add_xfer "$p2" 2 4194304 || bad+="vm4 -> vm2 after vm add: $XFER_MSG; "
  msg_add=$XFER_MSG
  # vm4's accelerated request/response connection when vm4 is removed: it
  # leaves the rings with clean fences (the drain), its application sees
  # no error and loses no byte.
  p3=$(alloc_port)
  local rm_rep=$WORK/vm_remove.jsonl srv
  vm_bg vm2 preload "$rm_rep" "$WORK/vm_remove.srv" "$XFER" server "$A2" "$p3" --conns 1 --rounds 300 --gap-ms 20
  srv=$BG
  sleep 0.2
  add_vm_bg "$rm_rep" "$WORK/vm_remove.cli" "$XFER" client "$A2" "$p3" --conns 1 --bytes $((300 * 10240)) --rounds 300 --gap-ms 20
  local cli=$BG
  wait_accelerated 2 "$p3" || bad+="vm4's connection to vm2 not accelerated before vm remove; "
  out=$(bash $TB ctl vm remove vm4 --wait 10 2>&1) || bad+="vsocketctl vm remove vm4: $out; "
  vm_listed vm4 && bad+="vm4 still listed after vm remove; "
  [ ! -e "$WORK/vm4.sock" ] || bad+="vm4's socket still there after vm remove; "
  # Added again at once, at the same socket, while vm4's client still runs
  # its rounds (its library lost the old port and tries again): a new port
  # in the old one's place, nothing of the old one reused.
  kill -0 "$cli" 2>/dev/null || bad+="vm4's client ended before vm4 was added again (the test needs it running); "
  out=$(bash $TB ctl vm add vm4 --socket "$WORK/vm4.sock" --tenant 1 --addresses $ADD_ADDR 2>&1) ||
    bad+="vsocketctl vm add vm4 again at once: $out; "
  wait "$cli" || bad+="vm4's client failed after vm remove: $(tail -1 "$WORK/vm_remove.cli"); "
  wait "$srv" || bad+="vm2's server failed after vm4's removal: $(tail -1 "$WORK/vm_remove.srv"); "
  # (Its connection left the rings with clean fences at the remove and,
  # its library attached to the new port, went back on them: reupgrades.)
  msg_rm=$(python3 $CHECK "$rm_rep" --port "$p3" --expect-conns 2 --resynced --reupgraded --downgrade-cause operator \
    --no-resend --exact-total $((300 * 10240 + 16))) || bad+="vm4's connection at vm remove: $msg_rm; "
  local p5
  p5=$(alloc_port)
  add_vm_xfer vm_readd_xfer "$p5" 2 4194304 || bad+="vm4 -> vm2 after vm4 was removed and added again: $XFER_MSG; "
  local msg_readd=$XFER_MSG
  bulk_and_rounds_wait vm_add_remove
  bad+=$BR_BAD
  local others
  others=$(never_left "$rep" "$port" $((port + 1))) || bad+="vm1 -> vm2 touched by vm add/remove: $others; "
  [ -z "$bad" ] || { fail $name "$bad"; add_vm_down; return; }
  # Persisted: added again (above), vsocketd restarted, vm4 is there and
  # its connections accelerate; removed, restarted, it is gone.
  out=$(bash $TB restart 2>&1) || { fail $name "restart: $(tail -2 <<<"$out" | tr '\n' ' ')"; add_vm_down; return; }
  vm_listed vm4 || bad+="vm4 not found by the restarted vsocketd; "
  p4=$(alloc_port)
  add_vm_xfer vm_add_restart "$p4" 1 1048576 || bad+="vm4 -> vm2 after the restart: $XFER_MSG; "
  msg_restart=$XFER_MSG
  out=$(bash $TB ctl vm remove vm4 --wait 5 2>&1) || bad+="vm remove vm4 (after the restart): $out; "
  out=$(bash $TB restart 2>&1) || bad+="restart after vm remove: $(tail -1 <<<"$out"); "
  vm_listed vm4 && bad+="the restarted vsocketd found vm4 again after vm remove; "
  add_vm_down
  [ -z "$bad" ] || { fail $name "$bad"; return; }
  pass "$name (vm1 -> vm2 4 GiB + 4 request/response connections: $others; vm add vm4 under it: $msg_add; vm remove vm4 under its accelerated connection, then vm add vm4 again at once at the same socket: $msg_rm, accelerated again on the new port; new connections from vm4: $msg_readd; after a restart vm4 was found again: $msg_restart; removed and restarted: gone)"
}

register_case vm_add_remove_leaves_others_alone case_vm_add_remove
