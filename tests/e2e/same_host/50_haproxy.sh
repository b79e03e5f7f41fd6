# haproxy forwarding with splice (decision 69): client -> haproxy (vm2, `option
# splice-request/-response`) -> server, two connections of 16 MiB each way,
# every byte checked by xfer, under the default policy (the first bytes go
# by the kernel's own splice while the connections are held, counted for the
# fence; the rest through the rings) and with every connection accelerated
# at once. Proves haproxy's splices into upgraded connections took the rings
# (strace counts the tee our emulation makes for each), and
# that all four of haproxy's connections ended accelerated with nothing on
# kernel TCP after their upgrade.
# app: HAProxy, splice (`option splice-request/-response`) | two connections of 16 MiB each way through the proxy | every byte (xfer); the splices took the rings | haproxy_splice
case_haproxy_splice() {
  local name policy=$1 port rep cfg
  port=$(alloc_port 2)
  name=haproxy_splice_$policy rep=$WORK/hap-$policy.jsonl cfg=$WORK/hap-$policy.cfg
  command -v haproxy >/dev/null || { fail $name "haproxy not installed (deploy/install-deps.sh)"; return; }
  cat >"$cfg" <<CFG
global
    maxconn 64
    nbthread 1
defaults
    mode tcp
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    option splice-request
    option splice-response
listen fwd
    bind $A2:$port
    server back $A2:$((port + 1))
CFG
  local saved=$VSOCKET_UPGRADE
  export VSOCKET_UPGRADE=$policy
  vm_bg vm2 preload "$rep" "$WORK/hap-$policy.srv" "$XFER" server "$A2" $((port + 1)) --conns 2
  local srv=$BG
  vm_bg vm2 preload "$rep.hap" "$WORK/hap-$policy.log" strace -f -qq -c -e trace=splice,tee -o "$WORK/hap-$policy.strace" \
    haproxy -f "$cfg" -db
  local hap=$BG
  wait_listen vm2 $port
  local rc=0
  vm_run vm1 preload "$rep" "$XFER" client "$A2" $port --conns 2 --bytes 16777216 >"$WORK/hap-$policy.cli" 2>&1 || rc=$?
  wait "$srv" 2>/dev/null || rc=$((rc + 100))
  sleep 0.3
  # haproxy itself (strace, its parent, then exits with it and writes its counts)
  local hpid
  hpid=$(pgrep -f "^haproxy -f $cfg")
  [ -n "$hpid" ] && kill $hpid 2>/dev/null
  wait "$hap" 2>/dev/null
  export VSOCKET_UPGRADE=$saved
  if [ $rc -ne 0 ]; then
    fail $name "xfer rc $rc: $(tail -2 "$WORK/hap-$policy.cli" | tr '\n' ' ') $(tail -2 "$WORK/hap-$policy.srv" | tr '\n' ' ')"
    return
  fi
  local out
  if ! out=$(python3 - "$rep.hap" "$WORK/hap-$policy.strace" "$policy" <<'PY'
import json, re, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
calls = {m.group(2): int(m.group(1)) for m in re.finditer(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", open(sys.argv[2]).read(), re.M)}
big = [l for l in lines if l["accel_tx"] + l["accel_rx"] + l["kernel_tx"] + l["kernel_rx"] > 1 << 20]
bad = [l for l in big if l["mode"] != "accelerated" or l["kernel_tx_after_upgrade"] or l["kernel_rx_after_upgrade"]]
accel = sum(l["accel_tx"] + l["accel_rx"] for l in big)
kern = sum(l["kernel_tx"] + l["kernel_rx"] for l in big)
if len(big) != 4 or bad or calls.get("tee", 0) == 0:
    print(f"{len(big)} of haproxy's connections carried data (want 4), {len(bad)} not accelerated or with kernel "
          f"bytes after the upgrade, syscalls {calls}; " + " ".join(json.dumps(l) for l in bad[:2]))
    sys.exit(1)
print(f"haproxy's 4 connections accelerated, {accel >> 20} MiB by the rings, {kern >> 10} KiB by kernel TCP before "
      f"the upgrade; syscalls under haproxy: splice {calls.get('splice', 0)} (the kernel's, held, and our emulation's "
      f"into a blocking pipe), tee {calls['tee']} (our emulation's, one per splice into an upgraded connection)")
PY
  ); then
    fail $name "$out"
    return
  fi
  pass "$name (2 x 16 MiB each way through haproxy, xfer-verified; $out)"
}

register_case haproxy_splice_auto case_haproxy_splice auto
register_case haproxy_splice_always case_haproxy_splice always
