# The cluster directory in etcd (issue 38): the bed again in etcd mode
# (deploy/testbed2.sh, VSOCKET_TESTBED2_LOCATOR=etcd: one etcd in its own
# namespace with its auth on, no locator file), pairing found through the
# directory, etcd stopped and back, a VM moved, a host killed. Last: they take the bed
# down and up again in etcd mode (or find it so, when the whole suite runs
# that way), and the host-death case kills hostB's vsocketd.
# VSOCKET_TESTBED2_ETCD_TLS=1 runs them with etcd over TLS (etcds://).

# dir_field HOST FIELD: one field of `vsocketctl locator --json`;
# dir_has HOST ADDRESS OWNER: the directory cache places ADDRESS on OWNER.
dir_field() {
  bash $TB ctl "$1" --json locator 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['$2'])"
}
dir_has() {
  bash $TB ctl "$1" --json locator 2>/dev/null | python3 -c "
import json, sys
sys.exit(0 if any(e['address'].split('/')[0] == '$2' and e['host'] == '$3' for e in json.load(sys.stdin)['entries']) else 1)"
}
# until_true SECONDS CMD...: CMD every 0.2 s until it succeeds (bounded).
until_true() {
  local secs=$1 i
  shift
  for ((i = 0; i < secs * 5; i++)); do
    "$@" && return 0
    sleep 0.2
  done
  "$@"
}
dir_lacks() { ! dir_has "$@"; }
# fallbacks_of HOST VM COLUMN: one column of `vsocketctl fallbacks` (the
# connections of VM on HOST left on kernel TCP, by reason).
fallbacks_of() {
  bash $TB ctl "$1" fallbacks 2>/dev/null | awk -v vm="$2" -v col="$3" '
    NR == 1 { for (i = 1; i <= NF; i++) if ($i == col) c = i; next }
    $1 == vm && c { print $c; found = 1 } END { if (!found) print "none" }'
}
dir_connected_is() { [ "$(dir_field "$1" connected)" = "$2" ]; }

etcd_bed() { # the bed in etcd mode (brought up so unless it is)
  export VSOCKET_TESTBED2_LOCATOR=etcd
  local want="^locator = etcd://"
  [ "${VSOCKET_TESTBED2_ETCD_TLS:-0}" = 1 ] && want="^locator = etcds://"
  grep -q "$want" "$VSOCKET_TESTBED2_DIR/hostA/vsocketd.conf" 2>/dev/null && return 0
  bash $TB down >"$WORK/etcd_up.log" 2>&1
  if ! bash $TB up >>"$WORK/etcd_up.log" 2>&1; then
    E2E_MSG="deploy/testbed2.sh up in etcd mode: $(tail -3 "$WORK/etcd_up.log" | tr '\n' ' ')"
    return 1
  fi
}

# No locator file anywhere: each host publishes its VMs in etcd under its
# own etcd user, and follows the others there; vmA1 finds vmB1's host in the
# directory and the connections cross the fabric, byte-checked.
case_etcd_pairs() {
  local name=etcd_directory_pairs out
  etcd_bed || { fail $name "$E2E_MSG"; return; }
  [ ! -e "$VSOCKET_TESTBED2_DIR/locator" ] || { fail $name "a locator file exists"; return; }
  until_true 10 dir_has hostA "$B1" hostB || { fail $name "hostA's directory cache does not place $B1 on hostB"; return; }
  dir_has hostB "$A1" hostA || { fail $name "hostB's directory cache does not place $A1 on hostA"; return; }
  [ "$(dir_field hostA hosts)" = 2 ] && [ "$(dir_field hostA published)" = True ] ||
    { fail $name "hostA: hosts $(dir_field hostA hosts), published $(dir_field hostA published)"; return; }
  # Its lease as etcd last confirmed it: a TTL of 10 s at most, renewed
  # every 10/3 s (confirmed within the TTL), and the text says what is left.
  local ttl ago
  ttl=$(dir_field hostA lease_ttl_s)
  ago=$(dir_field hostA lease_confirmed_ms_ago)
  [ "$ttl" -ge 1 ] && [ "$ttl" -le 10 ] && [ "$ago" -ge 0 ] && [ "$ago" -lt 10000 ] &&
    bash $TB ctl hostA locator | grep -q "^this host: published under lease [0-9]*, TTL [0-9]* s confirmed [0-9]* ms ago, [0-9.]* s left" ||
    { fail $name "hostA's lease: TTL '$ttl' s confirmed '$ago' ms ago; $(bash $TB ctl hostA locator | grep '^this host')"; return; }
  # hostA's etcd user cannot write hostB's keys, nor in a tenant it was not
  # granted (etcd RBAC; decisions 86 and 103).
  local key
  for key in /vsocket/tenants/1/hostB/evil /vsocket/tenants/3/hostA/evil; do
    if out=$(bash $TB etcdctl-as hostA put $key '{"tenant":1,"addresses":["198.51.100.18"]}' 2>&1) ||
        [[ $out != *"permission denied"* ]]; then
      fail $name "hostA's etcd user wrote $key (or another error): $out"
      return
    fi
  done
  fabric_xfer etcd_pairs vmA1 vmB1 "$B1" 2 2097152 "$(alloc_port)" ||
    { fail $name "not accelerated through the directory: $XFER_MSG"; return; }
  [ "$(counter hostA directory_connected)" = 1 ] && [ "$(counter hostA directory_entries)" -ge 4 ] ||
    { fail $name "hostA's metrics: connected $(counter hostA directory_connected), entries $(counter hostA directory_entries)"; return; }
  local via="etcd"
  grep -q "^locator = etcds://" "$VSOCKET_TESTBED2_DIR/hostA/vsocketd.conf" && via="etcd over TLS (client certificates)"
  pass "$name (no locator file: hostA found $B1 on hostB in $via; hostA's etcd user refused under hostB's name and in a tenant not granted; $XFER_MSG)"
}

# Decision 103: a vsocketd follows only the tenants it serves. hostA
# restarted without vmB2 (tenant 2; the bed configures every VM on both
# hosts): hostA follows tenant 1 alone, hostB tenants 1 and 2; hostB's own
# record of vmB2 is in hostB's cache, not in hostA's; 20 records written
# under tenant 2 and one under tenant 1 (as etcd's root) reach hostB's watch
# (21 events) and only the tenant-1 one reaches hostA's (1 event); vmA1 to
# vmB1 still pairs across the fabric. hostA gets vmB2 back at the end.
case_etcd_watch_scoped() {
  local name=etcd_watch_scoped_per_tenant i a0 a1 b0 b1 out
  etcd_bed || { fail $name "$E2E_MSG"; return; }
  local restore="bash $TB configure; bash $TB restart hostA >/dev/null 2>&1; bash $TB etcdctl del --prefix /vsocket/tenants/2/hostB/extra >/dev/null 2>&1; bash $TB etcdctl del /vsocket/tenants/1/hostB/extra >/dev/null 2>&1"
  python3 - "$VSOCKET_TESTBED2_DIR/hostA/vsocketd.conf" <<'PY' || { fail $name "could not drop vmB2 from hostA's configuration"; eval "$restore"; return; }
import re, sys
p = sys.argv[1]
s = open(p).read()
t = re.sub(r"\n\[vm vmB2\]\n(?:[^\[\n][^\n]*\n)*", "\n", s)
assert t != s
open(p, "w").write(t)
PY
  out=$(bash $TB restart hostA 2>&1) || { fail $name "hostA without vmB2: $(tail -3 <<<"$out" | tr '\n' ' ')"; eval "$restore"; return; }
  until_true 10 dir_has hostA "$B1" hostB || { fail $name "hostA's cache does not place $B1 on hostB"; eval "$restore"; return; }
  dir_has hostB "$B2" hostB || { fail $name "hostB's cache does not place its own $B2 (tenant 2)"; eval "$restore"; return; }
  if dir_has hostA "$B2" hostB; then
    fail $name "hostA, which serves no VM of tenant 2, has $B2 (tenant 2) in its cache"; eval "$restore"; return
  fi
  [ "$(dir_field hostA tenants)" = "[1]" ] && [ "$(dir_field hostB tenants)" = "[1, 2]" ] ||
    { fail $name "tenants followed: hostA $(dir_field hostA tenants), hostB $(dir_field hostB tenants)"; eval "$restore"; return; }
  a0=$(dir_field hostA watch_events)
  b0=$(dir_field hostB watch_events)
  for ((i = 0; i < 20; i++)); do
    bash $TB etcdctl put /vsocket/tenants/2/hostB/extra$i "{\"tenant\":2,\"addresses\":[\"203.0.113.$((100 + i))\"]}" >/dev/null ||
      { fail $name "etcdctl put (tenant 2) failed"; eval "$restore"; return; }
  done
  bash $TB etcdctl put /vsocket/tenants/1/hostB/extra '{"tenant":1,"addresses":["203.0.113.99"]}' >/dev/null ||
    { fail $name "etcdctl put (tenant 1) failed"; eval "$restore"; return; }
  until_true 5 dir_has hostA 203.0.113.99 hostB || { fail $name "hostA did not follow a tenant-1 record"; eval "$restore"; return; }
  b_has_all() { [ $(($(dir_field hostB watch_events) - b0)) -ge 21 ]; }
  until_true 5 b_has_all || { fail $name "hostB's watch saw $(($(dir_field hostB watch_events) - b0)) of 21 events"; eval "$restore"; return; }
  sleep 0.5  # (anything else on its way to hostA would be there by now)
  a1=$(dir_field hostA watch_events)
  b1=$(dir_field hostB watch_events)
  [ $((a1 - a0)) -eq 1 ] || { fail $name "hostA's watch saw $((a1 - a0)) events, want 1 (tenant 1's alone)"; eval "$restore"; return; }
  ! dir_has hostA 203.0.113.100 hostB || { fail $name "hostA has a tenant-2 record"; eval "$restore"; return; }
  fabric_xfer etcd_scoped vmA1 vmB1 "$B1" 1 1048576 "$(alloc_port)" ||
    { fail $name "vmA1 -> vmB1 with hostA following tenant 1 alone: $XFER_MSG"; eval "$restore"; return; }
  eval "$restore"
  [ "$(dir_field hostA tenants)" = "[1, 2]" ] || { fail $name "hostA after the restore follows $(dir_field hostA tenants)"; return; }
  pass "$name (hostA without vmB2 follows tenant 1 alone, hostB tenants 1 and 2; vmB2 ($B2) in hostB's cache, not hostA's; 21 changes (20 of tenant 2): hostB's watch $b0 -> $b1, hostA's $a0 -> $a1; $XFER_MSG)"
}

# A VM taken off hostB and put back at runtime (vsocketctl migrate
# begin/detach, then migrate end, on hostB alone: vsocketd has no
# `vm add`; a configured VM comes and goes so): hostA's cache loses it and
# finds it again through the directory within a second, and a new
# connection from vmA1 pairs across the fabric; nothing is done on hostA.
case_etcd_vm_runtime() {
  local name=etcd_vm_removed_and_added_at_runtime out t0 t1 t2 ctlB="bash $TB ctl hostB"
  etcd_bed || { fail $name "$E2E_MSG"; return; }
  until_true 10 dir_has hostA "$B1" hostB || { fail $name "hostA does not place $B1 on hostB to begin with"; return; }
  local back="$ctlB migrate end vmB1 >/dev/null 2>&1"
  out=$($ctlB migrate begin vmB1 --wait 5 2>&1) && out=$($ctlB migrate detach vmB1 2>&1) ||
    { fail $name "removing vmB1 on hostB: $out"; eval "$back"; return; }
  t0=$(date +%s%N)
  until_true 2 dir_lacks hostA "$B1" hostB || { fail $name "hostA still places $B1 on hostB 2 s after it left"; eval "$back"; return; }
  t1=$(date +%s%N)
  out=$($ctlB migrate end vmB1 2>&1) || { fail $name "adding vmB1 back on hostB: $out"; return; }
  until_true 2 dir_has hostA "$B1" hostB || { fail $name "hostA does not place $B1 on hostB 2 s after it came back"; return; }
  t2=$(date +%s%N)
  fabric_xfer etcd_vm_runtime vmA1 vmB1 "$B1" 1 1048576 "$(alloc_port)" ||
    { fail $name "vmA1 -> vmB1 after vmB1 came back: $XFER_MSG"; return; }
  pass "$name (vmB1 taken off hostB: gone from hostA's cache in $(((t1 - t0) / 1000000)) ms; put back: in hostA's cache $(((t2 - t1) / 1000000)) ms after, both read by polling every 0.2 s; nothing done on hostA; $XFER_MSG)"
}

# A VM new to the bed added on hostB at runtime (vsocketctl vm add,
# decision 105): vmB3, tenant 1, 198.51.100.20, a namespace on hostB's
# bridge made here. Nothing is done on hostA: its cache places the address
# on hostB at once, and vmA1's connections to it cross the fabric
# accelerated and byte-checked (the fabric and the directory's placements
# count them). Removed again (vsocketctl vm remove): its record leaves etcd
# and hostA's cache, and a new connection from vmA1 to it stays on kernel
# TCP with a reason (its own end: no vsocketd port; vmA1's: the directory
# places no host), every byte there.
B3=198.51.100.20
vmB3_up() {
  local ns="${VSOCKET_TESTBED2_NS_PREFIX:-vs2}vmB3" nsh="${VSOCKET_TESTBED2_NS_PREFIX:-vs2}hostB"
  vmB3_down
  ip netns add "$ns" && ip -n "$ns" link set lo up &&
    ip link add tvmB3 netns "$ns" type veth peer name pvmB3 netns "$nsh" &&
    ip -n "$ns" link set tvmB3 name eth0 && ip -n "$nsh" link set pvmB3 master br0 up &&
    ip -n "$ns" addr add "$B3/28" dev eth0 && ip -n "$ns" link set eth0 up &&
    ip -n "$ns" route add default via 198.51.100.17 &&
    ln -sfn ../hostB/vmB3.sock "$VSOCKET_TESTBED2_DIR/vms/vmB3.sock"
}
# end_reasons REPORT PORT: "ADDRESS:MODE/REASON" of each connection end on
# PORT; 1 if any of them moved a byte accelerated.
end_reasons() {
  python3 - "$1" "$2" <<'PY'
import json, sys
ends, accel = [], 0
for line in open(sys.argv[1]):
    l = json.loads(line) if line.strip() else {}
    if "local" in l and sys.argv[2] in (l["local"].rsplit(":", 1)[1], l["peer"].rsplit(":", 1)[1]):
        ends.append(l["local"].rsplit(":", 1)[0] + ":" + l["mode"] + "/" + (l["reason"] or "-"))
        accel += l["accel_tx"] + l["accel_rx"]
print(" ".join(sorted(ends)) + (f" ({accel} B accelerated)" if accel else ""))
sys.exit(1 if accel else 0)
PY
}
vmB3_down() {
  bash $TB ctl hostB vm remove vmB3 --wait 2 >/dev/null 2>&1
  ip netns del "${VSOCKET_TESTBED2_NS_PREFIX:-vs2}vmB3" 2>/dev/null
  rm -f "$VSOCKET_TESTBED2_DIR/vms/vmB3.sock"
  true
}
case_etcd_vm_add() {
  local name=etcd_vm_added_and_removed_with_vsocketctl out t0 t1 t2 t3 msg1 rec port reasons
  etcd_bed || { fail $name "$E2E_MSG"; return; }
  vmB3_up || { fail $name "could not make vmB3's namespace on hostB's bridge"; vmB3_down; return; }
  until_true 10 dir_has hostA "$B1" hostB || { fail $name "hostA does not place $B1 on hostB to begin with"; vmB3_down; return; }
  dir_lacks hostA "$B3" hostB || { fail $name "hostA places $B3 before vmB3 was added"; vmB3_down; return; }
  t0=$(date +%s%N)
  out=$(bash $TB ctl hostB vm add vmB3 --socket "$VSOCKET_TESTBED2_DIR/hostB/vmB3.sock" --tenant 1 --addresses "$B3" 2>&1) ||
    { fail $name "vsocketctl vm add on hostB: $out"; vmB3_down; return; }
  until_true 2 dir_has hostA "$B3" hostB || { fail $name "hostA does not place $B3 on hostB 2 s after vm add"; vmB3_down; return; }
  t1=$(date +%s%N)
  fabric_xfer etcd_vm_add vmA1 vmB3 "$B3" 2 1048576 "$(alloc_port)" ||
    { fail $name "vmA1 -> vmB3 (added at runtime): $XFER_MSG"; vmB3_down; return; }
  msg1=$XFER_MSG
  t2=$(date +%s%N)
  out=$(bash $TB ctl hostB vm remove vmB3 --wait 5 2>&1) || { fail $name "vsocketctl vm remove on hostB: $out"; vmB3_down; return; }
  until_true 2 dir_lacks hostA "$B3" hostB || { fail $name "hostA still places $B3 on hostB 2 s after vm remove"; vmB3_down; return; }
  t3=$(date +%s%N)
  rec=$(bash $TB etcdctl get --prefix /vsocket/tenants/1/hostB/vmB3 2>&1)
  [ -z "$rec" ] || { fail $name "vmB3's record is still in etcd after vm remove: $rec"; vmB3_down; return; }
  ! bash $TB ctl hostB vms 2>/dev/null | grep -q '^vmB3 ' || { fail $name "hostB still lists vmB3"; vmB3_down; return; }
  port=$(alloc_port)
  # (Judged below: every byte on kernel TCP, each end's mode and reason.)
  XFER_CHECK="--expect-conns 2" run_xfer etcd_vm_removed vmA1 vmB3 "$B3" 1 262144 "$port" ||
    { fail $name "vmA1 -> vmB3 after vm remove: $XFER_MSG"; vmB3_down; return; }
  # vmA1's end: registered on hostA, whose directory places the address on
  # no host: it stays on kernel TCP, its peer never registered
  # (peer-not-registered, decision 91; it would pair if vmB3 came back);
  # vmB3's end: its port is gone (backend-unavailable).
  reasons=$(end_reasons "$WORK/etcd_vm_removed.jsonl" "$port") &&
    [[ " $reasons " == *" 198.51.100.2:kernel-pending/peer-not-registered "* ]] &&
    [[ " $reasons " == *" $B3:kernel/backend-unavailable "* ]] ||
    { fail $name "after vm remove, the ends: $reasons (want vmA1's kernel-pending/peer-not-registered, vmB3's kernel/backend-unavailable, no byte accelerated)"; vmB3_down; return; }
  vmB3_down
  pass "$name (vm add on hostB: $B3 in hostA's cache $(((t1 - t0) / 1000000)) ms later; $msg1; vm remove: gone from hostA's cache in $(((t3 - t2) / 1000000)) ms and from etcd; a new connection then on kernel TCP, ends' reasons: $reasons; nothing done on hostA)"
}

# etcd stopped: accelerated connections go on; a new connection to an
# address the cache lacks (vmB1's record withdrawn just before: a VM hostA
# has not heard of) stays on kernel TCP, and both its ends say why: their
# libraries' reports name directory-unavailable (decision 95), and so do
# both hosts' per-VM fallbacks; hostA counts it as directory-unavailable;
# etcd back: hostA's watch resumes, the record is back, and a new connection
# to vmB1 accelerates again. No vsocketd restarted.
case_etcd_unavailable() {
  local name=etcd_down_keeps_connections_falls_back key=/vsocket/tenants/1/hostB/vmB1 rr kport value lease
  local c0 f0 f1 out a0 b0 a1 b1
  etcd_bed || { fail $name "$E2E_MSG"; return; }
  rr=$(alloc_port)
  kport=$(alloc_port)
  # 2 request/response connections for about 8 s, accelerated first.
  xfer_bg etcd_rr "$rr" 2 4096000 --rounds 400 --gap-ms 20
  conns_accelerated hostA "$rr" 2 || { fail $name "the long-lived connections did not accelerate"; xfer_wait etcd_rr; return; }
  # vmB1's record, withdrawn by the operator (kept to put back under hostB's lease).
  out=$(bash $TB etcdctl get "$key" -w json) || { fail $name "etcdctl get: $out"; return; }
  value=$(python3 -c "import json,sys,base64; print(base64.b64decode(json.load(sys.stdin)['kvs'][0]['value']).decode())" <<<"$out")
  lease=$(python3 -c "import json,sys; print('%x' % json.load(sys.stdin)['kvs'][0]['lease'])" <<<"$out")
  bash $TB etcdctl del "$key" >/dev/null || { fail $name "etcdctl del failed"; return; }
  until_true 5 dir_lacks hostA "$B1" hostB || { fail $name "hostA still places $B1 on hostB"; return; }
  c0=$(dir_field hostA connects)
  bash $TB etcd-stop
  until_true 20 dir_connected_is hostA False || { fail $name "hostA did not notice etcd stop"; return; }
  f0=$(counter hostA directory_unavailable_fallbacks)
  a0=$(fallbacks_of hostA vmA1 directory_unavailable)
  b0=$(fallbacks_of hostB vmB1 directory_unavailable)
  XFER_CHECK="--mode kernel --reason directory-unavailable" run_xfer etcd_unknown vmA1 vmB1 "$B1" 1 1048576 "$kport" ||
    { fail $name "new connection to an unknown address: $XFER_MSG"; bash $TB etcd-start; xfer_wait etcd_rr; return; }
  local unknown=$XFER_MSG
  f1=$(counter hostA directory_unavailable_fallbacks)
  [ "$f1" -gt "$f0" ] || { fail $name "directory_unavailable_fallbacks $f0 -> $f1"; bash $TB etcd-start; xfer_wait etcd_rr; return; }
  a1=$(fallbacks_of hostA vmA1 directory_unavailable)
  b1=$(fallbacks_of hostB vmB1 directory_unavailable)
  [[ $a0 =~ ^[0-9]+$ && $b0 =~ ^[0-9]+$ && $a1 =~ ^[0-9]+$ && $b1 =~ ^[0-9]+$ ]] && [ "$a1" -gt "$a0" ] && [ "$b1" -gt "$b0" ] ||
    { fail $name "fallbacks directory_unavailable: hostA vmA1 $a0 -> $a1, hostB vmB1 $b0 -> $b1"; bash $TB etcd-start; xfer_wait etcd_rr; return; }
  # The connections paired before carry on, every byte checked.
  xfer_wait etcd_rr || { fail $name "long-lived connections: $E2E_MSG"; bash $TB etcd-start; return; }
  out=$(python3 $CHECK "$WORK/etcd_rr.jsonl" --port "$rr" --expect-conns 4 --mode accelerated --reason accelerated) ||
    { fail $name "long-lived connections: $out"; bash $TB etcd-start; return; }
  [ "$(bash $TB ctl hostA locator)" != "" ] || { fail $name "vsocketctl locator failed while etcd was down"; return; }
  # etcd back: the watch resumes (a reconnect, no restart) and follows the record put back.
  bash $TB etcd-start >"$WORK/etcd_start.log" 2>&1 || { fail $name "etcd-start: $(tail -2 "$WORK/etcd_start.log")"; return; }
  until_true 15 dir_connected_is hostA True || { fail $name "hostA did not reconnect to etcd"; return; }
  out=$(bash $TB etcdctl put "$key" "$value" --lease="$lease" 2>&1) || { fail $name "etcdctl put: $out"; return; }
  until_true 5 dir_has hostA "$B1" hostB || { fail $name "hostA did not learn $B1 again"; return; }
  [ "$(dir_field hostA connects)" -gt "$c0" ] || { fail $name "connects $c0 -> $(dir_field hostA connects)"; return; }
  fabric_xfer etcd_back vmA1 vmB1 "$B1" 1 1048576 "$(alloc_port)" ||
    { fail $name "not accelerated after etcd came back: $XFER_MSG"; return; }
  pass "$name (etcd stopped: 2 accelerated connections went on byte-exact; a new one to an address not in the cache stayed on kernel TCP, both ends reporting directory-unavailable ($unknown), directory_unavailable_fallbacks $f0 -> $f1, per-VM fallbacks hostA vmA1 $a0 -> $a1, hostB vmB1 $b0 -> $b1; etcd back: hostA reconnected (connects $c0 -> $(dir_field hostA connects)) and paired across the fabric again: $XFER_MSG)"
}

# vmA1 moves to hostB and back (deploy/testbed2.sh move: migrate begin,
# detach, end) while it runs byte-checked request/response connections to
# vmB1: no locator file is touched; the host it leaves withdraws its record,
# the one it reaches publishes it, both caches follow within a second, and
# the connections re-upgrade where it lands (same-host on hostB, across the
# fabric again back on hostA).
vm_vias() { # vm_vias HOST VIA N: vmA1's connections on HOST to vmB1 accelerated via VIA reach N (bounded: 15 s)
  local end=$((SECONDS + 15))
  while [ $SECONDS -lt $end ]; do
    [ "$(via_count "$1" vmA1 "$2" "$B1")" -ge "$3" ] && return 0
    sleep 0.2
  done
  E2E_MSG="vmA1 on $1: $(via_count "$1" vmA1 "$2" "$B1") connection(s) to vmB1 via $2 (want $3)"
  return 1
}
# move_rr_start NAME PORT CONNS ROUNDS: CONNS request/response connections
# of ROUNDS rounds (3,840 B each way each, 10 ms apart) from vmA1 to vmB1
# in the background, accelerated across the fabric before it returns (else
# 1, the reason in E2E_MSG). MOVE_STOP: what undoes it (the applications
# stopped, vmA1 back on hostA). move_rr_finish NAME PORT CONNS: both ends
# exited 0, every connection re-upgraded after 2 moves, nothing resent
# (else 1, the reason in E2E_MSG); the check's summary in MOVE_OUT.
move_rr_start() {
  local name=$1 port=$2 conns=$3 rounds="--bytes $((3840 * $4)) --rounds $4 --gap-ms 10"
  MOVE_PIDS=()
  vm_bg vmB1 preload "$WORK/$name.jsonl" "$WORK/$name.srv" "$XFER" server "$B1" "$port" --conns $conns $rounds
  MOVE_PIDS+=("$BG")
  sleep 0.3
  vm_bg vmA1 preload "$WORK/$name.jsonl" "$WORK/$name.cli" "$XFER" client "$B1" "$port" --conns $conns $rounds
  MOVE_PIDS+=("$BG")
  MOVE_STOP="kill ${MOVE_PIDS[*]} 2>/dev/null; wait ${MOVE_PIDS[*]} 2>/dev/null; [ \"\$(bash $TB host vmA1)\" = hostA ] || bash $TB move vmA1 hostA >/dev/null 2>&1"
  vm_vias hostA hostB $conns || { E2E_MSG="before: $E2E_MSG"; return 1; }
}
move_rr_finish() {
  local name=$1 port=$2 conns=$3 p rc=0
  for p in "${MOVE_PIDS[@]}"; do wait "$p" || rc=$?; done
  [ $rc -eq 0 ] || { E2E_MSG="an application failed (rc $rc): $(tail -n 2 "$WORK/$name".cli | tr '\n' ' ')"; return 1; }
  MOVE_OUT=$(python3 $CHECK "$WORK/$name.jsonl" --port "$port" --expect-conns $((2 * conns)) --reupgraded --no-resend \
    --downgrade-cause migration --moves 2) || { E2E_MSG=$MOVE_OUT; return 1; }
}
case_etcd_move() {
  local name=etcd_move_follows port conns=2 out dst h t0 waits=()
  etcd_bed || { fail $name "$E2E_MSG"; return; }
  port=$(alloc_port)
  # (About 45 s: the streams outlive both moves, a few seconds each.)
  move_rr_start $name "$port" $conns 4000 || { fail $name "$E2E_MSG"; eval "$MOVE_STOP"; return; }
  local stop=$MOVE_STOP
  for dst in hostB hostA; do
    out=$(bash $TB move vmA1 $dst 2>&1) || { fail $name "move to $dst: $out"; eval "$stop"; return; }
    t0=$(date +%s%N)
    for h in hostA hostB; do
      until_true 2 dir_has $h "$A1" $dst || { fail $name "$h's cache does not place $A1 on $dst 2 s after the move"; eval "$stop"; return; }
    done
    waits+=("$dst $((($(date +%s%N) - t0) / 1000000)) ms")
    if [ $dst = hostB ]; then
      vm_vias hostB same-host $conns ||
        { fail $name "on hostB: $E2E_MSG; hostB has: $(conn_rows hostB "$port" | sort | uniq -c | tr -s ' \n' ' ')"; eval "$stop"; return; }
    else
      vm_vias hostA hostB $conns ||
        { fail $name "back on hostA: $E2E_MSG; hostA has: $(conn_rows hostA "$port" | sort | uniq -c | tr -s ' \n' ' ')"; eval "$stop"; return; }
    fi
  done
  move_rr_finish $name "$port" $conns || { fail $name "$E2E_MSG"; return; }
  [ ! -e "$VSOCKET_TESTBED2_DIR/locator" ] || { fail $name "a locator file exists"; return; }
  pass "$name (vmA1 moved to hostB and back with no locator file: both caches placed it on its new host within ${waits[*]}; $conns request/response connections to vmB1 byte-exact, fabric -> same-host -> fabric ($MOVE_OUT))"
}

# Decision 104: the host a VM moves back to asks its peer host to pair
# before that host's watch has caught up (the cause of etcd_move_follows'
# intermittent failure under load: hostB answered from a cache that still
# placed vmA1 on hostB, or nowhere, and refused for good). Made certain
# here: hostB's watch stream is held (nft drops what etcd sends on it)
# from before the move back until 3 s after it; hostA's pairing requests
# wait at hostB for the directory instead of being refused, and once the
# watch delivers, vmA1's connections re-upgrade across the fabric.
# watch_port HOST: the local port of HOST's watch on etcd (its one
# long-lived connection there; unary calls each open their own).
watch_port() {
  local ns=${VSOCKET_TESTBED2_NS_PREFIX:-vs2}$1 a b p
  a=$(ip netns exec "$ns" ss -Htn state established dst 192.0.2.10 | awk '{sub(/.*:/, "", $3); print $3}' | sort)
  sleep 0.7
  b=$(ip netns exec "$ns" ss -Htn state established dst 192.0.2.10 | awk '{sub(/.*:/, "", $3); print $3}' | sort)
  p=$(comm -12 <(echo "$a") <(echo "$b") | head -1)
  [ -n "$p" ] && echo "$p"
}
hold_watch() { # hold_watch HOST PORT: drop what etcd sends on that connection
  ip netns exec "${VSOCKET_TESTBED2_NS_PREFIX:-vs2}$1" nft -f - <<NFT
table inet vsocket_late_watch {
  chain in { type filter hook input priority 0; ip saddr 192.0.2.10 tcp sport 2379 tcp dport $2 drop; }
}
NFT
}
release_watch() { ip netns exec "${VSOCKET_TESTBED2_NS_PREFIX:-vs2}$1" nft delete table inet vsocket_late_watch 2>/dev/null; }
case_etcd_move_late_watch() {
  local name=etcd_move_follows_a_late_watch port conns=2 out wp r0 r1 t0 t1
  etcd_bed || { fail $name "$E2E_MSG"; return; }
  port=$(alloc_port)
  move_rr_start $name "$port" $conns 3000 || { fail $name "$E2E_MSG"; eval "$MOVE_STOP"; return; }
  local stop="release_watch hostB; $MOVE_STOP"
  out=$(bash $TB move vmA1 hostB 2>&1) || { fail $name "move to hostB: $out"; eval "$stop"; return; }
  vm_vias hostB same-host $conns || { fail $name "on hostB: $E2E_MSG"; eval "$stop"; return; }
  wp=$(watch_port hostB) || { fail $name "hostB's watch connection not found"; eval "$stop"; return; }
  r0=$(counter hostB pair_refused)
  local u0 u1
  u0=$(counter hostB pair_unconfirmed)
  hold_watch hostB "$wp" || { fail $name "nft failed"; eval "$stop"; return; }
  t0=$(date +%s%N)
  out=$(bash $TB move vmA1 hostA 2>&1) || { fail $name "move back to hostA: $out"; eval "$stop"; return; }
  until_true 2 dir_has hostA "$A1" hostA || { fail $name "hostA's own cache does not place $A1 on hostA"; eval "$stop"; return; }
  # hostB's cache is behind: it does not place vmA1 on hostA yet.
  if dir_has hostB "$A1" hostA; then fail $name "hostB's watch was not held (it placed $A1 on hostA)"; eval "$stop"; return; fi
  while [ $((($(date +%s%N) - t0) / 1000000)) -lt 3000 ]; do sleep 0.1; done
  release_watch hostB
  until_true 10 dir_has hostB "$A1" hostA || { fail $name "hostB's cache did not catch up after the watch was released"; eval "$stop"; return; }
  t1=$(date +%s%N)
  vm_vias hostA hostB $conns ||
    { fail $name "back on hostA: $E2E_MSG; hostA has: $(conn_rows hostA "$port" | sort | uniq -c | tr -s ' \n' ' '); hostB refused $(($(counter hostB pair_refused) - r0)) pairing request(s)"; eval "$stop"; return; }
  r1=$(counter hostB pair_refused)
  move_rr_finish $name "$port" $conns || { fail $name "$E2E_MSG"; return; }
  [ "$r1" = "$r0" ] || { fail $name "hostB refused $((r1 - r0)) pairing request(s)"; return; }
  u1=$(counter hostB pair_unconfirmed)
  [ $((u1 - u0)) -ge $conns ] || { fail $name "hostB kept $((u1 - u0)) request(s) for the directory, want $conns"; return; }
  pass "$name (hostB's watch held from before the move back until 3 s after it (caught up $(((t1 - t0) / 1000000)) ms after the move began); $((u1 - u0)) pairing request(s) of hostA's waited at hostB for its directory (pair_unconfirmed), none refused; $conns request/response connections to vmB1 byte-exact, fabric -> same-host -> fabric ($MOVE_OUT))"
}

# hostB's vsocketd killed -9: its lease is not renewed, and its records
# leave hostA's cache when etcd expires it (TTL 10 s; bounded: 25 s); back
# once it restarts and publishes again.
case_etcd_host_death() {
  local name=etcd_dead_host_expires t0 t1
  etcd_bed || { fail $name "$E2E_MSG"; return; }
  until_true 5 dir_has hostA "$B1" hostB || { fail $name "hostA does not place $B1 on hostB to begin with"; return; }
  t0=$(date +%s%N)
  bash $TB kill hostB
  until_true 25 dir_lacks hostA "$B1" hostB || { fail $name "hostB's records still in hostA's cache 25 s after kill -9"; return; }
  t1=$(date +%s%N)
  [ "$(dir_field hostA hosts)" = 1 ] || { fail $name "hostA still counts $(dir_field hostA hosts) hosts"; return; }
  if ! bash $TB restart hostB >"$WORK/etcd_restart.log" 2>&1; then
    fail $name "restart: $(tail -3 "$WORK/etcd_restart.log" | tr '\n' ' ')"
    return
  fi
  until_true 10 dir_has hostA "$B1" hostB || { fail $name "hostB's records not back after its restart"; return; }
  fabric_xfer etcd_after_death vmA1 vmB1 "$B1" 1 1048576 "$(alloc_port)" ||
    { fail $name "not accelerated after hostB came back: $XFER_MSG"; return; }
  pass "$name (hostB's vsocketd killed -9: gone from hostA's directory after $(((t1 - t0) / 1000000)) ms (lease TTL 10 s); restarted, published again and paired: $XFER_MSG)"
}

# Decision 96: neither host has a [peer] section (the bed's
# VSOCKET_TESTBED2_DIRECTORY_PEERS): hostB restarted so accepts hostA from
# the directory alone, then hostA restarted so dials hostB at the
# fabric_address hostB published; connections pair both ways across the
# fabric. hostB killed -9: once its lease expires hostA retires it and
# dials it no more; hostB restarted: listed again, linked, paired. The bed
# gets its [peer] sections back at the end.
# peer_of HOST PEER FIELD: a field of HOST's `vsocketctl links` row for PEER
# ("none" if it has no such row).
peer_of() {
  bash $TB ctl "$1" --json links 2>/dev/null | python3 -c "
import json, sys
d = json.load(sys.stdin)
rows = d.get('links', d) if isinstance(d, dict) else d
print(next((str(r.get('$3')) for r in rows if r.get('peer') == '$2'), 'none'))" 2>/dev/null || echo none
}
peer_state_is() { [ "$(peer_of "$1" "$2" state)" = "$3" ]; }
case_etcd_peers_from_directory() {
  local name=etcd_peers_from_directory h out t0 t1 ab ba
  etcd_bed || { fail $name "$E2E_MSG"; return; }
  local restore="unset VSOCKET_TESTBED2_DIRECTORY_PEERS; bash $TB configure; bash $TB restart hostB >/dev/null 2>&1; bash $TB restart hostA >/dev/null 2>&1"
  export VSOCKET_TESTBED2_DIRECTORY_PEERS="hostA hostB"
  bash $TB configure || { fail $name "configure failed"; eval "$restore"; return; }
  for h in hostA hostB; do
    ! grep -q '^\[peer ' "$VSOCKET_TESTBED2_DIR/$h/vsocketd.conf" || { fail $name "$h still has a [peer] section"; eval "$restore"; return; }
  done
  # hostB first: it accepts hostA (which still has its [peer] section).
  out=$(bash $TB restart hostB 2>&1) || { fail $name "hostB without [peer]: $(tail -3 <<<"$out" | tr '\n' ' ')"; eval "$restore"; return; }
  # Then hostA, which dials hostB found in the directory.
  out=$(bash $TB restart hostA 2>&1) || { fail $name "hostA without [peer]: $(tail -3 <<<"$out" | tr '\n' ' ')"; eval "$restore"; return; }
  ab=$(peer_of hostA hostB address)
  ba=$(peer_of hostB hostA address)
  peer_state_is hostA hostB up && peer_state_is hostB hostA up ||
    { fail $name "links: hostA sees hostB $(peer_of hostA hostB state), hostB sees hostA $(peer_of hostB hostA state)"; eval "$restore"; return; }
  until_true 10 dir_has hostA "$B1" hostB || { fail $name "hostA's cache does not place $B1 on hostB"; eval "$restore"; return; }
  until_true 10 dir_has hostB "$A1" hostA || { fail $name "hostB's cache does not place $A1 on hostA"; eval "$restore"; return; }
  fabric_xfer etcd_dirpeers_ab vmA1 vmB1 "$B1" 2 1048576 "$(alloc_port)" ||
    { fail $name "vmA1 -> vmB1: $XFER_MSG"; eval "$restore"; return; }
  local first=$XFER_MSG
  fabric_xfer etcd_dirpeers_ba vmB1 vmA1 "$A1" 2 1048576 "$(alloc_port)" ||
    { fail $name "vmB1 -> vmA1: $XFER_MSG"; eval "$restore"; return; }
  local second=$XFER_MSG
  # An identity its certificate does not carry: a record for hostC (only
  # etcd's root can write it: RBAC) at hostB's fabric address. hostA dials
  # it and refuses hostB's certificate, which does not name hostC; hostC
  # is retired once its record goes.
  local r0 r1 impostor
  r0=$(counter hostA peers_refused_tls)
  out=$(bash $TB etcdctl put /vsocket/hosts/hostC "{\"fabric_address\":\"$ab\",\"fabrics\":[\"tcp\"]}" 2>&1) ||
    { fail $name "etcdctl put hostC: $out"; eval "$restore"; return; }
  refused_more() { [ "$(counter hostA peers_refused_tls)" -gt "$r0" ]; }
  until_true 10 refused_more || { fail $name "hostA did not refuse hostB's certificate for hostC ($(peer_of hostA hostC state))"; eval "$restore"; return; }
  r1=$(counter hostA peers_refused_tls)
  impostor="$(peer_of hostA hostC state): $(peer_of hostA hostC last_error)"
  [ "$(peer_of hostA hostC state)" != up ] || { fail $name "hostA linked to hostB as hostC"; eval "$restore"; return; }
  bash $TB etcdctl del /vsocket/hosts/hostC >/dev/null
  until_true 5 peer_state_is hostA hostC retired || { fail $name "hostC not retired: $(peer_of hostA hostC state)"; eval "$restore"; return; }
  # hostB dies: its lease expires, hostA retires it and dials it no more.
  t0=$(date +%s%N)
  bash $TB kill hostB
  until_true 25 peer_state_is hostA hostB retired ||
    { fail $name "hostA still has hostB $(peer_of hostA hostB state) 25 s after kill -9"; eval "$restore"; return; }
  t1=$(date +%s%N)
  dir_lacks hostA "$B1" hostB || { fail $name "hostB retired but its VM still in hostA's cache"; eval "$restore"; return; }
  local i
  for ((i = 0; i < 15; i++)); do
    peer_state_is hostA hostB retired || { fail $name "retired hostB went $(peer_of hostA hostB state) while dead"; eval "$restore"; return; }
    sleep 0.2
  done
  out=$(bash $TB restart hostB 2>&1) || { fail $name "hostB back: $(tail -3 <<<"$out" | tr '\n' ' ')"; eval "$restore"; return; }
  until_true 10 dir_has hostA "$B1" hostB || { fail $name "hostB's records not back"; eval "$restore"; return; }
  fabric_xfer etcd_dirpeers_back vmA1 vmB1 "$B1" 1 1048576 "$(alloc_port)" ||
    { fail $name "after hostB came back: $XFER_MSG"; eval "$restore"; return; }
  local third=$XFER_MSG
  eval "$restore"
  pass "$name (no [peer] section on either host: hostA dialled hostB at $ab, hostB accepted hostA ($ba), from the directory alone; vmA1 -> vmB1: $first; vmB1 -> vmA1: $second; a record for hostC at hostB's address: hostA refused hostB's certificate (peers_refused_tls $r0 -> $r1; $impostor), hostC retired once deleted; hostB killed -9: retired by hostA after $(((t1 - t0) / 1000000)) ms and not dialled for 3 s; restarted, linked and paired again: $third)"
}

# One member of a 3-member etcd down changes nothing visible (the bed again
# with VSOCKET_TESTBED2_ETCD_MEMBERS=3; the hosts' locator lists the three):
# member 0, the one both hosts' clients use first, is stopped while two
# accelerated request/response connections run; hostA's watch moves to
# another member and follows a record withdrawn and put back through the
# other two; a new connection pairs across the fabric; both hosts' leases
# outlive the TTL (12 s) with every record in place; the member rejoins.
etcd_cluster_bed() {
  export VSOCKET_TESTBED2_LOCATOR=etcd VSOCKET_TESTBED2_ETCD_MEMBERS=3
  grep -q '^locator = etcds\?://192\.0\.2\.10:2379,192\.0\.2\.10:2479,192\.0\.2\.10:2579$' \
    "$VSOCKET_TESTBED2_DIR/hostA/vsocketd.conf" 2>/dev/null && return 0
  bash $TB down >"$WORK/etcd_cluster_up.log" 2>&1
  if ! bash $TB up >>"$WORK/etcd_cluster_up.log" 2>&1; then
    E2E_MSG="deploy/testbed2.sh up with 3 etcd members: $(tail -3 "$WORK/etcd_cluster_up.log" | tr '\n' ' ')"
    return 1
  fi
}
case_etcd_member_down() {
  local name=etcd_member_down_changes_nothing key=/vsocket/tenants/1/hostB/vmB1 out value lease c0 c1 t0 rr h
  etcd_cluster_bed || { fail $name "$E2E_MSG"; return; }
  until_true 10 dir_has hostA "$B1" hostB || { fail $name "hostA's cache does not place $B1 on hostB"; return; }
  rr=$(alloc_port)
  xfer_bg etcd_member_rr "$rr" 2 4096000 --rounds 400 --gap-ms 20
  conns_accelerated hostA "$rr" 2 || { fail $name "the long-lived connections did not accelerate"; xfer_wait etcd_member_rr; return; }
  c0=$(dir_field hostA connects)
  t0=$SECONDS
  local back="bash $TB etcd-start-member 0 >/dev/null 2>&1"
  bash $TB etcd-stop-member 0 || { fail $name "etcd-stop-member 0 failed"; eval "$back"; xfer_wait etcd_member_rr; return; }
  # The directory still changes, and hostA still follows it.
  out=$(bash $TB etcdctl get "$key" -w json) || { fail $name "etcdctl get with member 0 down: $out"; eval "$back"; xfer_wait etcd_member_rr; return; }
  value=$(python3 -c "import json,sys,base64; print(base64.b64decode(json.load(sys.stdin)['kvs'][0]['value']).decode())" <<<"$out")
  lease=$(python3 -c "import json,sys; print('%x' % json.load(sys.stdin)['kvs'][0]['lease'])" <<<"$out")
  bash $TB etcdctl del "$key" >/dev/null || { fail $name "etcdctl del failed"; eval "$back"; xfer_wait etcd_member_rr; return; }
  until_true 15 dir_lacks hostA "$B1" hostB || { fail $name "hostA did not follow a delete with member 0 down"; eval "$back"; xfer_wait etcd_member_rr; return; }
  out=$(bash $TB etcdctl put "$key" "$value" --lease="$lease" 2>&1) || { fail $name "etcdctl put: $out"; eval "$back"; xfer_wait etcd_member_rr; return; }
  until_true 5 dir_has hostA "$B1" hostB || { fail $name "hostA did not follow the put back"; eval "$back"; xfer_wait etcd_member_rr; return; }
  c1=$(dir_field hostA connects)
  [ "$c1" -gt "$c0" ] && [ "$(dir_field hostA connected)" = True ] ||
    { fail $name "hostA's watch: connects $c0 -> $c1, connected $(dir_field hostA connected)"; eval "$back"; xfer_wait etcd_member_rr; return; }
  # (run_xfer: the fabric's counters carry the long-lived connections too.)
  run_xfer etcd_member_new vmA1 vmB1 "$B1" 1 1048576 "$(alloc_port)" ||
    { fail $name "a new connection with member 0 down: $XFER_MSG"; eval "$back"; xfer_wait etcd_member_rr; return; }
  local fresh=$XFER_MSG
  xfer_wait etcd_member_rr || { fail $name "long-lived connections: $E2E_MSG"; eval "$back"; return; }
  out=$(python3 $CHECK "$WORK/etcd_member_rr.jsonl" --port "$rr" --expect-conns 4 --mode accelerated --reason accelerated) ||
    { fail $name "long-lived connections: $out"; eval "$back"; return; }
  # Past the lease TTL (10 s) the leases live on, renewed through the others.
  while [ $((SECONDS - t0)) -lt 12 ]; do sleep 0.5; done
  for h in hostA hostB; do
    [ "$(dir_field $h published)" = True ] && [ "$(dir_field $h hosts)" = 2 ] ||
      { fail $name "$h $((SECONDS - t0)) s after the stop: published $(dir_field $h published), hosts $(dir_field $h hosts)"; eval "$back"; return; }
  done
  dir_has hostA "$B1" hostB && dir_has hostB "$A1" hostA || { fail $name "records lost $((SECONDS - t0)) s after the stop"; eval "$back"; return; }
  bash $TB etcd-start-member 0 >"$WORK/etcd_member_start.log" 2>&1 || { fail $name "member 0 did not rejoin: $(tail -2 "$WORK/etcd_member_start.log")"; return; }
  out=$(bash $TB etcdctl endpoint health 2>&1) && [ "$(grep -c 'is healthy' <<<"$out")" = 3 ] ||
    { fail $name "after the restart: $(tr '\n' ' ' <<<"$out")"; return; }
  pass "$name (3 members, member 0 stopped: hostA's watch moved (connects $c0 -> $c1) and followed a delete and a put made through the others; 2 accelerated request/response connections went on byte-exact; a new one paired across the fabric ($fresh); $((SECONDS - t0)) s after the stop both hosts still published with every record; member 0 rejoined, 3 of 3 healthy)"
}

register_case etcd_directory_pairs case_etcd_pairs
register_case etcd_watch_scoped_per_tenant case_etcd_watch_scoped
register_case etcd_vm_removed_and_added_at_runtime case_etcd_vm_runtime
register_case etcd_vm_added_and_removed_with_vsocketctl case_etcd_vm_add
register_case etcd_down_keeps_connections_falls_back case_etcd_unavailable
register_case etcd_move_follows case_etcd_move
register_case etcd_move_follows_a_late_watch case_etcd_move_late_watch
register_case etcd_dead_host_expires case_etcd_host_death
register_case etcd_peers_from_directory case_etcd_peers_from_directory
register_case etcd_member_down_changes_nothing case_etcd_member_down
