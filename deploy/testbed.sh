#!/usr/bin/env bash
# vSocket same-host test bed: one vsocketd in the root ("host") network
# namespace, one network namespace per "VM" (own address, own kernel TCP
# stack, own nftables rules), VMs joined by the bridge vsbr0. Guest processes
# run inside a VM namespace and attach to the daemon through that VM's
# vhost-user socket, passed as VSOCKET_SOCKET. See docs/testbed.md.
#
#   deploy/testbed.sh up | down | status
#   deploy/testbed.sh exec VM CMD [ARG...]
#   deploy/testbed.sh fw VM add input|output RULE...  |  fw VM flush  |  fw VM list
#   deploy/testbed.sh addr VM | socket VM | daemon-pid | restart [TERM|KILL|INT] | start
#   deploy/testbed.sh ctl VSOCKETCTL-ARGS...   (drain, undrain, connections, ...)
#
# Environment: VSOCKET_TESTBED_VMS, VSOCKET_TESTBED_DIR, VSOCKETD,
# VSOCKETD_ARGS, VSOCKET_LOG_LEVEL, VSOCKET_TESTBED_PORT_ADDRS,
# VSOCKET_TESTBED_BRIDGE_ADDR (docs/testbed.md).
# shellcheck disable=SC2015  # "A && B || die" is meant: die when A or B fails
set -euo pipefail
set +m # no job control: the daemon is not a group leader, so setsid execs it and $! is its PID

SELF=$(readlink -f "${BASH_SOURCE[0]}")
ORIG_PWD=$PWD
cd "$(dirname "$SELF")/.."
REPO_ROOT=$PWD
BED_NAME=testbed
# shellcheck source=deploy/lib/bed.sh
. deploy/lib/bed.sh # die/warn/say, pid_alive, stop_daemon, ns_exists, ...

DEFAULT_VMS="vm1:1:198.51.100.11 vm2:1:198.51.100.12 vm3:2:198.51.100.13"
BRIDGE=vsbr0
BRIDGE_ADDR=198.51.100.1
NET_PREFIX=198.51.100
PREFIX_LEN=24
NFT_TABLE=vsocket_fw
MARKER=.vsocket-testbed # in the state dir: "created by testbed.sh, safe to remove"
CONF_NAME=testbed.conf  # in the state dir: the VM list the bed was built with
START_TIMEOUT_S=10
# vsocketd's SIGTERM drains for up to drain_timeout_ms (10 s) before it exits.
STOP_TIMEOUT_S=15
LOCK_TIMEOUT_S=60

usage() {
  cat <<'EOF'
usage: deploy/testbed.sh COMMAND
  up                          build the bed (tears down an existing one first)
  down                        remove everything the bed created (idempotent)
  status                      namespaces, addresses, daemon, daemon stats JSON
  exec VM CMD [ARG...]        run CMD in VM's namespace with VSOCKET_SOCKET set
  fw VM add input|output RULE...   add an nftables rule in VM's namespace
  fw VM flush                 remove all rules from VM's table inet vsocket_fw
  fw VM list                  print VM's table inet vsocket_fw
  addr VM                     print VM's IPv4 address
  socket VM                   print VM's vhost-user socket path
  daemon-pid                  print the daemon's PID (fails if not running)
  restart [TERM|KILL|INT]     stop vsocketd with that signal (default TERM) and start it
                              again with the same arguments; VMs and their processes stay
                              (TERM drains first: connections leave the rings cleanly)
  start                       start vsocketd again after it died (a crash, kill -9): same
                              arguments, VMs and their processes stay; fails if it runs
  ctl ARG...                  vsocketctl on the bed's daemon (e.g. ctl drain vm1 --wait 10)
See docs/testbed.md.
EOF
}

# --- state directory --------------------------------------------------------

STATE=${VSOCKET_TESTBED_DIR:-/run/vsocket-testbed}
case $STATE in
  /*) ;;
  *) STATE="$ORIG_PWD/$STATE" ;;
esac
while [ "${#STATE}" -gt 1 ] && [ "${STATE%/}" != "$STATE" ]; do STATE=${STATE%/}; done
[ "$STATE" != / ] || die "VSOCKET_TESTBED_DIR must not be /"
case $STATE in
  *,* | *\;* | *[[:space:]]*) die "VSOCKET_TESTBED_DIR must not contain ',', ';' or whitespace: $STATE" ;;
esac
CTL_SOCK=$STATE/ctl.sock
PID_FILE=$STATE/vsocketd.pid
LOG_FILE=$STATE/vsocketd.log
ARGS_FILE=$STATE/vsocketd.args
ENV_FILE=$STATE/vsocketd.env  # the VSOCKET_VM_* settings given at up (a VM's group, ...)
CONF_FILE=$STATE/$CONF_NAME

# --- VM list ----------------------------------------------------------------

VM_NAMES=()
declare -A VM_TENANT=() VM_ADDR=()

# parse_vms SPEC: validates "NAME:TENANT:ADDR ..." into VM_NAMES/VM_TENANT/VM_ADDR.
parse_vms() {
  local spec=$1 entry name tenant addr rest last
  local -A seen_addr=()
  VM_NAMES=()
  VM_TENANT=()
  VM_ADDR=()
  for entry in $spec; do
    IFS=: read -r name tenant addr rest <<<"$entry"
    [ -n "$name" ] && [ -n "$tenant" ] && [ -n "$addr" ] && [ -z "$rest" ] ||
      die "bad VM entry '$entry' (want NAME:TENANT:ADDR)"
    # vs + name + h must fit IFNAMSIZ-1 = 15 characters (host-side veth).
    [[ $name =~ ^[a-z][a-z0-9]{0,11}$ ]] ||
      die "bad VM name '$name' (want [a-z][a-z0-9]*, at most 12 characters)"
    [ -z "${VM_TENANT[$name]+x}" ] || die "VM '$name' listed twice"
    [[ $tenant =~ ^[1-9][0-9]{0,9}$ ]] && [ "$tenant" -le 4294967295 ] ||
      die "bad tenant '$tenant' for VM '$name' (want 1..4294967295)"
    [[ $addr =~ ^198\.51\.100\.([1-9][0-9]{0,2})$ ]] ||
      die "bad address '$addr' for VM '$name' (want 198.51.100.2 .. 198.51.100.254)"
    last=${BASH_REMATCH[1]}
    [ "$last" -ge 2 ] && [ "$last" -le 254 ] ||
      die "bad address '$addr' for VM '$name' (want 198.51.100.2 .. 198.51.100.254; .1 is the bridge)"
    [ -z "${seen_addr[$addr]+x}" ] || die "address $addr used twice"
    seen_addr[$addr]=1
    VM_NAMES+=("$name")
    VM_TENANT[$name]=$tenant
    VM_ADDR[$name]=$addr
  done
  [ "${#VM_NAMES[@]}" -ge 1 ] || die "no VMs configured (VSOCKET_TESTBED_VMS is empty)"
}

configured_spec() { echo "${VSOCKET_TESTBED_VMS:-$DEFAULT_VMS}"; }

# The VM list a running bed was built with, or nothing.
recorded_spec() {
  [ -f "$CONF_FILE" ] || return 0
  sed -n 's/^vms=//p' "$CONF_FILE" | head -n 1
}

recorded_flag() { # recorded_flag KEY -> value or empty
  [ -f "$CONF_FILE" ] || return 0
  sed -n "s/^$1=//p" "$CONF_FILE" | head -n 1
}

# For everything but up/down: the recorded list if the bed is up, else the configured one.
load_vms() {
  local rec
  rec=$(recorded_spec)
  if [ -n "$rec" ]; then
    if [ -n "${VSOCKET_TESTBED_VMS:-}" ] && [ "$VSOCKET_TESTBED_VMS" != "$rec" ]; then
      warn "VSOCKET_TESTBED_VMS differs from the running bed's list; using the bed's ($rec)"
    fi
    parse_vms "$rec"
  else
    parse_vms "$(configured_spec)"
  fi
}

need_vm() { # need_vm NAME
  [ -n "${1:-}" ] || die "missing VM name (known: ${VM_NAMES[*]})"
  [ -n "${VM_TENANT[$1]+x}" ] || die "unknown VM '$1' (known: ${VM_NAMES[*]})"
}

ns_of() { echo "vs$1"; }
hostveth_of() { echo "vs$1h"; }
sock_of() { echo "$STATE/$1.sock"; }

# --- preflight --------------------------------------------------------------

preflight() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces, bridge, nftables)"
  command -v ip >/dev/null 2>&1 || die "'ip' (iproute2) not found; apt-get install iproute2"
  command -v nft >/dev/null 2>&1 || die "'nft' not found; apt-get install nftables"
}

take_lock() { # serialise up/down (also across state dirs: bridge and netns names are global)
  command -v flock >/dev/null 2>&1 || return 0
  exec 9<"$SELF"
  flock -w "$LOCK_TIMEOUT_S" 9 || die "another 'testbed.sh up/down' is still running (waited ${LOCK_TIMEOUT_S}s)"
}

# --- daemon -----------------------------------------------------------------

recorded_pid() { read_pid_file "$PID_FILE"; }

# --- down -------------------------------------------------------------------

DID_SOMETHING=0

do_down() {
  local specs name ns hv pids mounted_by_us
  mounted_by_us=$(recorded_flag created_netns_dir)
  if stop_daemon "$PID_FILE" "$CTL_SOCK" TERM "$STOP_TIMEOUT_S"; then DID_SOMETHING=1; fi

  # Namespaces and veths of the recorded list and the configured one.
  specs="$(recorded_spec) $(configured_spec)"
  local -A names=()
  for name in $specs; do
    name=${name%%:*}
    [[ $name =~ ^[a-z][a-z0-9]{0,11}$ ]] && names[$name]=1
  done
  for name in "${!names[@]}"; do
    ns=$(ns_of "$name")
    hv=$(hostveth_of "$name")
    if ns_exists "$ns"; then
      pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ' || true)
      [ -z "${pids// /}" ] ||
        warn "processes still running in $ns (not killed; they keep a detached namespace until they exit): $pids"
      ip netns delete "$ns" || warn "could not delete namespace $ns"
      DID_SOMETHING=1
    elif [ -e "$NETNS_RUN_DIR/$ns" ]; then
      ip netns delete "$ns" 2>/dev/null || rm -f "$NETNS_RUN_DIR/$ns"
      DID_SOMETHING=1
    fi
    # Deleting the namespace normally takes the veth pair with it (unless a
    # process still holds the namespace); delete the host end explicitly.
    if link_exists "$hv"; then
      ip link delete dev "$hv" || warn "could not delete $hv"
      DID_SOMETHING=1
    fi
  done

  if link_exists "$BRIDGE"; then
    ip link delete dev "$BRIDGE" type bridge || warn "could not delete bridge $BRIDGE"
    DID_SOMETHING=1
  fi

  if [ -e "$STATE" ]; then
    if [ -f "$STATE/$MARKER" ]; then
      rm -rf -- "$STATE"
      DID_SOMETHING=1
    else
      warn "not removing $STATE: it was not created by testbed.sh (no $MARKER)"
    fi
  fi

  # iproute2 turns $NETNS_RUN_DIR into a shared bind mount on first use. If
  # this bed created it and nothing else uses it now, undo that too.
  if [ "$mounted_by_us" = 1 ] && [ -d "$NETNS_RUN_DIR" ] && [ -z "$(ls -A "$NETNS_RUN_DIR" 2>/dev/null)" ]; then
    local i
    for i in 1 2 3; do
      mountpoint -q "$NETNS_RUN_DIR" 2>/dev/null || break
      umount -n "$NETNS_RUN_DIR" 2>/dev/null || break # -n: no /run/mount/utab
    done
    mountpoint -q "$NETNS_RUN_DIR" 2>/dev/null || rmdir "$NETNS_RUN_DIR" 2>/dev/null || true
  fi
  # The script itself creates nothing under /dev/shm (vsocketd and the guests
  # use memfds), so there is nothing to remove there.
}

cmd_down() {
  preflight
  take_lock
  do_down
  [ "$DID_SOMETHING" = 0 ] || say "down: test bed removed"
}

# --- up ---------------------------------------------------------------------

UP_OK=0
on_up_exit() {
  local rc=$?
  [ "$UP_OK" = 0 ] || return 0
  trap - EXIT
  set +e
  say "up failed; tearing the partial bed down"
  do_down
  exit $((rc == 0 ? 1 : rc))
}

# tcp_probe FROM_NS ADDR: "reachable" = the peer kernel answers (RST or SYN-ACK).
tcp_probe() {
  local out rc=0
  out=$(ip netns exec "$1" timeout 3 bash -c "exec 3<>/dev/tcp/$2/9" 2>&1) || rc=$?
  [ "$rc" = 0 ] && return 0
  grep -q "Connection refused" <<<"$out"
}

check_connectivity() {
  local first=${VM_NAMES[0]} name ok
  [ "${#VM_NAMES[@]}" -ge 2 ] || return 0
  for name in "${VM_NAMES[@]:1}"; do
    ok=0
    for _ in 1 2 3; do
      if tcp_probe "$(ns_of "$first")" "${VM_ADDR[$name]}"; then
        ok=1
        break
      fi
      sleep 0.2
    done
    if [ "$ok" = 0 ]; then
      local hint=""
      if [ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || echo 0)" = 1 ]; then
        hint="
  br_netfilter is loaded with net.bridge.bridge-nf-call-iptables=1, so bridged IPv4
  passes the root namespace's iptables/nftables forward hooks; a drop policy there
  blocks VM-to-VM traffic. This script does not change the root firewall: accept
  traffic on $BRIDGE there, or set net.bridge.bridge-nf-call-iptables=0, yourself."
      fi
      die "$first (${VM_ADDR[$first]}) cannot reach $name (${VM_ADDR[$name]}) over $BRIDGE.$hint"
    fi
  done
}

dev_sysctl() { # dev_sysctl DEV ipv4|ipv6 KEY VALUE (root namespace, our devices only)
  local f=/proc/sys/net/$2/conf/$1/$3
  if [ -w "$f" ]; then
    echo "$4" >"$f"
  else
    warn "cannot set $f"
  fi
}

nft_table_def() {
  cat <<EOF
table inet $NFT_TABLE {
  chain input { type filter hook input priority 0; policy accept; }
  chain output { type filter hook output priority 0; policy accept; }
}
EOF
}

cmd_up() {
  preflight
  take_lock
  parse_vms "$(configured_spec)"

  local bin
  bin=$(bin_path VSOCKETD bazel-bin/host-backend/vsocketd "bazel build //host-backend:vsocketd")
  [[ $(basename "$bin") == *vsocketd* ]] || die "VSOCKETD must name a vsocketd binary (down identifies the daemon by name): $bin"
  local level=${VSOCKET_LOG_LEVEL:-info}
  local bridge_mode=${VSOCKET_TESTBED_BRIDGE_ADDR:-auto}
  [ "$bridge_mode" = auto ] || [ "$bridge_mode" = none ] || die "VSOCKET_TESTBED_BRIDGE_ADDR must be auto or none"
  local port_addrs=${VSOCKET_TESTBED_PORT_ADDRS:-1}
  [ "$port_addrs" = 0 ] || [ "$port_addrs" = 1 ] || die "VSOCKET_TESTBED_PORT_ADDRS must be 0 or 1"
  command -v timeout >/dev/null 2>&1 || die "'timeout' (coreutils) not found"
  local name
  # STATE/<12-character name>.sock must fit sun_path (108 bytes).
  [ "${#STATE}" -lt 90 ] || die "state dir path too long for Unix socket paths: $STATE"

  [ ! -e "$STATE" ] || [ -f "$STATE/$MARKER" ] ||
    die "$STATE exists and was not created by testbed.sh; remove it or set VSOCKET_TESTBED_DIR"

  # Existing bed (or leftovers): tear it down, then build from scratch.
  if [ -e "$STATE" ] || link_exists "$BRIDGE" || [ -n "$(recorded_spec)" ]; then
    say "tearing down the existing test bed first"
  fi
  do_down
  [ ! -e "$STATE" ] || die "$STATE exists and was not created by testbed.sh; remove it or set VSOCKET_TESTBED_DIR"

  # The bridge gets 198.51.100.1/24 only if the root namespace does not already
  # use 198.51.100.0/24 (e.g. as its own uplink, where .1 may be the default
  # gateway): never shadow an existing network or route. Without the address
  # the bridge is L2 only; VMs still reach each other, the root namespace
  # just cannot reach them over IP (vsocketd needs only the Unix sockets).
  local bridge_addr="$BRIDGE_ADDR/$PREFIX_LEN"
  case $bridge_mode in
    none) bridge_addr=none ;;
    auto)
      if [ -n "$(ip -4 -o addr show to "$NET_PREFIX.0/$PREFIX_LEN" 2>/dev/null)" ] ||
        [ -n "$(ip -4 route show table all root "$NET_PREFIX.0/$PREFIX_LEN" 2>/dev/null)" ]; then
        warn "the root namespace already uses $NET_PREFIX.0/$PREFIX_LEN (addresses/routes); $BRIDGE gets no address (L2 only)"
        bridge_addr=none
      fi
      ;;
  esac

  trap on_up_exit EXIT
  mkdir -p -- "$(dirname "$STATE")"
  mkdir -m 0755 -- "$STATE"
  : >"$STATE/$MARKER"
  local created_netns_dir=0
  [ -e "$NETNS_RUN_DIR" ] || created_netns_dir=1
  {
    echo "# written by deploy/testbed.sh up; read by down, status, exec, fw, addr, socket"
    printf 'vms='
    local first=1
    for name in "${VM_NAMES[@]}"; do
      [ "$first" = 1 ] || printf ' '
      printf '%s:%s:%s' "$name" "${VM_TENANT[$name]}" "${VM_ADDR[$name]}"
      first=0
    done
    printf '\n'
    echo "created_netns_dir=$created_netns_dir"
    echo "bridge_addr=$bridge_addr"
  } >"$CONF_FILE"

  # Bridge in the root namespace. No forwarding to any other network: no
  # routes, firewall rules or global sysctls are changed, and VMs get only
  # their connected /24 (no default route).
  say "bridge $BRIDGE (address: $bridge_addr)"
  ip link add name "$BRIDGE" type bridge stp_state 0 forward_delay 0
  # Keep the root namespace's own stack off the bridge as far as possible,
  # with settings of our own devices only (they go away with them): no IPv6
  # on the root side, ARP answered only for the bridge's own address (none at
  # all when it has none: the root namespace must not answer for, say, its
  # uplink address and then send the replies out of the uplink), and strict
  # reverse-path filtering for anything a VM sends to the root namespace.
  dev_sysctl "$BRIDGE" ipv6 disable_ipv6 1
  dev_sysctl "$BRIDGE" ipv4 rp_filter 1
  if [ "$bridge_addr" = none ]; then
    dev_sysctl "$BRIDGE" ipv4 arp_ignore 8
  else
    dev_sysctl "$BRIDGE" ipv4 arp_ignore 1
    ip addr add "$bridge_addr" dev "$BRIDGE"
  fi
  ip link set dev "$BRIDGE" up

  local ns hv
  for name in "${VM_NAMES[@]}"; do
    ns=$(ns_of "$name")
    hv=$(hostveth_of "$name")
    say "VM $name: namespace $ns, $hv <-> $ns/eth0 ${VM_ADDR[$name]}/$PREFIX_LEN, tenant ${VM_TENANT[$name]}"
    ip netns add "$ns"
    ip link add name "$hv" type veth peer name eth0 netns "$ns"
    dev_sysctl "$hv" ipv6 disable_ipv6 1
    ip link set dev "$hv" master "$BRIDGE"
    ip link set dev "$hv" up
    ip -n "$ns" link set dev lo up
    ip -n "$ns" addr add "${VM_ADDR[$name]}/$PREFIX_LEN" dev eth0
    ip -n "$ns" link set dev eth0 up
    nft_table_def | ip netns exec "$ns" nft -f -
  done
  check_connectivity

  # The daemon, in the root namespace.
  local args=(--ctl "$CTL_SOCK" --log-level "$level")
  local spec
  for name in "${VM_NAMES[@]}"; do
    spec="$(sock_of "$name"),$name,${VM_TENANT[$name]}"
    [ "$port_addrs" = 0 ] || spec+=",${VM_ADDR[$name]}"
    args+=(--port "$spec")
  done
  local extra=()
  [ -z "${VSOCKETD_ARGS:-}" ] || read -r -a extra <<<"$VSOCKETD_ARGS"
  args+=("${extra[@]}")
  printf '%s\n' "$bin" "${args[@]}" >"$ARGS_FILE"
  # VM keys given through the environment at up (VSOCKET_VM_<NAME>_GROUP:
  # who may open the VM's socket) hold for every later start and restart
  # too, whatever that caller's environment says.
  env | grep -E '^VSOCKET_VM_[A-Z0-9_]+=' >"$ENV_FILE" || :
  start_daemon
  # Each VM's network namespace, attested from inside it: socket proofs
  # from any other namespace are refused (docs/security.md, threat 9). The
  # daemon keeps it across restarts ($CTL_SOCK.attested).
  local ctl
  ctl=$(bin_path VSOCKETCTL bazel-bin/host-backend/vsocketctl "bazel build //host-backend:vsocketctl")
  for name in "${VM_NAMES[@]}"; do
    ip netns exec "$(ns_of "$name")" "$ctl" --socket "$CTL_SOCK" attest "$name" >/dev/null ||
      die "vsocketctl attest $name failed"
  done

  UP_OK=1
  trap - EXIT
  say "up: vsocketd PID $(cat "$PID_FILE"), state in $STATE"
  for name in "${VM_NAMES[@]}"; do
    printf '  %-12s ns %-14s tenant %-10s %-15s %s\n' "$name" "$(ns_of "$name")" \
      "${VM_TENANT[$name]}" "${VM_ADDR[$name]}" "$(sock_of "$name")" >&2
  done
}

# start_daemon: starts vsocketd as $ARGS_FILE says (binary, then one
# argument a line), with the VM settings $ENV_FILE recorded at up, and
# waits until its control socket and every VM socket exist.
start_daemon() {
  local args=() bin envs=()
  mapfile -t args <"$ARGS_FILE"
  [ ! -f "$ENV_FILE" ] || mapfile -t envs <"$ENV_FILE"
  bin=${args[0]}
  args=("${args[@]:1}")
  say "starting $bin"
  # Own session (no terminal signals); fd 9 is the up/down lock and must not be inherited.
  local pid
  if command -v setsid >/dev/null 2>&1; then
    env "${envs[@]}" setsid "$bin" "${args[@]}" </dev/null >>"$LOG_FILE" 2>&1 9<&- &
  else
    env "${envs[@]}" nohup "$bin" "${args[@]}" </dev/null >>"$LOG_FILE" 2>&1 9<&- &
  fi
  pid=$!
  echo "$pid" >"$PID_FILE"

  local i ready name
  for ((i = 0; i < START_TIMEOUT_S * 10; i++)); do
    if ! pid_alive "$pid"; then
      log_tail "$LOG_FILE"
      die "vsocketd exited during startup (see log above)"
    fi
    ready=1
    [ -S "$CTL_SOCK" ] || ready=0
    for name in "${VM_NAMES[@]}"; do [ -S "$(sock_of "$name")" ] || ready=0; done
    [ "$ready" = 0 ] || break
    sleep 0.1
  done
  if [ "$ready" = 0 ]; then
    log_tail "$LOG_FILE"
    die "vsocketd did not create $CTL_SOCK and every VM socket within ${START_TIMEOUT_S}s"
  fi
  pid_is_our_daemon "$pid" "$CTL_SOCK" || die "PID $pid is not the vsocketd just started (setsid forked?)"
}

# The bed's lock, and its VMs loaded; dies if there is no bed (restart, start).
take_bed() {
  take_lock
  [ -f "$STATE/$MARKER" ] && [ -f "$ARGS_FILE" ] || die "no test bed in $STATE (run: deploy/testbed.sh up)"
  load_vms
}

# restart [SIGNAL]: stops the bed's vsocketd with SIGNAL (TERM: what
# systemd sends; KILL: a crash) and starts it again with the same
# arguments, leaving the VMs and their processes alone.
cmd_restart() {
  local sig=${1:-TERM}
  case $sig in TERM | KILL | INT) ;; *) die "restart: signal must be TERM, KILL or INT" ;; esac
  take_bed
  stop_daemon "$PID_FILE" "$CTL_SOCK" "$sig" "$STOP_TIMEOUT_S" || die "vsocketd is not running (start brings it back)"
  restart_daemon
  say "restarted: vsocketd PID $(cat "$PID_FILE") (the old one got SIG$sig)"
}

# start: starts the bed's vsocketd again once it is gone (it crashed, or
# someone killed it), with the same arguments; the VMs and their processes
# stay. A running daemon is left alone (restart is for that).
cmd_start() {
  take_bed
  local pid
  if pid=$(recorded_pid) && pid_is_our_daemon "$pid" "$CTL_SOCK"; then
    die "vsocketd is running (PID $pid): use restart"
  fi
  restart_daemon
  say "started: vsocketd PID $(cat "$PID_FILE")"
}

# A killed daemon leaves its sockets behind; the new one creates them again.
restart_daemon() {
  local name
  rm -f -- "$CTL_SOCK"
  for name in "${VM_NAMES[@]}"; do rm -f -- "$(sock_of "$name")"; done
  start_daemon
}

# --- status -----------------------------------------------------------------

query_stats() {
  local py
  py=$(command -v python3 || true)
  [ -n "$py" ] || {
    echo "stats: python3 not found"
    return 1
  }
  "$py" - "$CTL_SOCK" <<'PY'
import json, signal, socket, sys
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(3)
try:
    s.connect(sys.argv[1])
    s.sendall(b"stats\n")
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
except OSError as e:
    print("stats: %s: %s" % (sys.argv[1], e))
    sys.exit(1)
try:
    print(json.dumps(json.loads(data), indent=2))
except ValueError:
    sys.stdout.write(data.decode(errors="replace"))
PY
}

cmd_status() {
  preflight
  load_vms
  local healthy=1 name ns addr sock rules link state
  if [ -f "$STATE/$MARKER" ]; then
    echo "state dir: $STATE"
  else
    echo "state dir: $STATE (absent: bed is down)"
    healthy=0
  fi
  if link_exists "$BRIDGE"; then
    state=$(cat "/sys/class/net/$BRIDGE/operstate" 2>/dev/null || echo "?")
    addr=$(ip -4 -o addr show dev "$BRIDGE" | awk '{print $4}' | tr '\n' ' ')
    echo "bridge: $BRIDGE $state ${addr:-no address}"
  else
    echo "bridge: $BRIDGE absent"
    healthy=0
  fi
  printf '%-12s %-14s %-10s %-18s %-8s %-7s %s\n' VM NAMESPACE TENANT "ADDRESS(eth0)" LINK FWRULES SOCKET
  for name in "${VM_NAMES[@]}"; do
    ns=$(ns_of "$name")
    sock=$(sock_of "$name")
    if ns_exists "$ns"; then
      addr=$(ip -n "$ns" -4 -o addr show dev eth0 2>/dev/null | awk '{print $4}' | tr '\n' ' ')
      link=$(ip -n "$ns" -o link show dev eth0 2>/dev/null | grep -o 'state [A-Z]*' | cut -d' ' -f2 || true)
      # Rules are the handled lines that are not the table or a chain.
      rules=$(ip netns exec "$ns" nft -a list table inet "$NFT_TABLE" 2>/dev/null |
        awk '/# handle/ && $1 != "table" && $1 != "chain" {n++} END {print n + 0}') || rules="?"
    else
      addr="(no namespace)"
      link=-
      rules=-
      healthy=0
    fi
    [ -S "$sock" ] || {
      sock="$sock (missing)"
      healthy=0
    }
    printf '%-12s %-14s %-10s %-18s %-8s %-7s %s\n' "$name" "$ns" "${VM_TENANT[$name]}" "${addr% }" "${link:--}" "$rules" "$sock"
  done
  local pid
  if pid=$(recorded_pid); then
    if pid_is_our_daemon "$pid" "$CTL_SOCK"; then
      echo "daemon: vsocketd PID $pid alive"
      if [ -S "$CTL_SOCK" ]; then
        echo "stats ($CTL_SOCK):"
        query_stats || healthy=0
      else
        echo "stats: $CTL_SOCK missing"
        healthy=0
      fi
    else
      echo "daemon: PID $pid not running (or not this bed's vsocketd)"
      healthy=0
    fi
  else
    echo "daemon: not running (no $PID_FILE)"
    healthy=0
  fi
  [ "$healthy" = 1 ]
}

# --- the rest ---------------------------------------------------------------

cmd_exec() {
  preflight
  load_vms
  local vm=${1:-}
  need_vm "$vm"
  shift
  [ "$#" -ge 1 ] || die "usage: exec VM CMD [ARG...]"
  local ns
  ns=$(ns_of "$vm")
  ns_exists "$ns" || die "namespace $ns does not exist (run: deploy/testbed.sh up)"
  export VSOCKET_SOCKET
  VSOCKET_SOCKET=$(sock_of "$vm")
  # Everything else in the environment (VSOCKET_* included) passes through.
  cd "$ORIG_PWD"
  exec ip netns exec "$ns" "$@"
}

ensure_fw_table() { # idempotent: 'add' leaves existing table/chains and rules alone
  ip netns exec "$1" nft -f - <<EOF
add table inet $NFT_TABLE
add chain inet $NFT_TABLE input { type filter hook input priority 0; policy accept; }
add chain inet $NFT_TABLE output { type filter hook output priority 0; policy accept; }
EOF
}

cmd_fw() {
  preflight
  load_vms
  local vm=${1:-} op=${2:-} ns
  need_vm "$vm"
  ns=$(ns_of "$vm")
  ns_exists "$ns" || die "namespace $ns does not exist (run: deploy/testbed.sh up)"
  shift 2 2>/dev/null || shift $#
  case $op in
    add)
      local chain=${1:-}
      [ "$chain" = input ] || [ "$chain" = output ] || die "usage: fw VM add input|output RULE..."
      shift
      [ "$#" -ge 1 ] || die "usage: fw VM add input|output RULE..."
      ensure_fw_table "$ns"
      ip netns exec "$ns" nft add rule inet "$NFT_TABLE" "$chain" "$@"
      ;;
    flush)
      [ "$#" = 0 ] || die "usage: fw VM flush"
      ensure_fw_table "$ns"
      ip netns exec "$ns" nft flush table inet "$NFT_TABLE"
      ;;
    list)
      [ "$#" = 0 ] || die "usage: fw VM list"
      ensure_fw_table "$ns"
      ip netns exec "$ns" nft list table inet "$NFT_TABLE"
      ;;
    *) die "usage: fw VM add input|output RULE... | fw VM flush | fw VM list" ;;
  esac
}

cmd_daemon_pid() {
  preflight
  local pid
  pid=$(recorded_pid) || die "daemon not running (no $PID_FILE)"
  pid_is_our_daemon "$pid" "$CTL_SOCK" || die "daemon not running (PID $pid is gone or not this bed's vsocketd)"
  echo "$pid"
}

main() {
  local cmd=${1:-}
  [ "$#" = 0 ] || shift
  case $cmd in
    up) [ "$#" = 0 ] || die "usage: up"; cmd_up ;;
    down) [ "$#" = 0 ] || die "usage: down"; cmd_down ;;
    status) [ "$#" = 0 ] || die "usage: status"; cmd_status ;;
    exec) cmd_exec "$@" ;;
    fw) cmd_fw "$@" ;;
    addr)
      preflight
      load_vms
      need_vm "${1:-}"
      echo "${VM_ADDR[$1]}"
      ;;
    socket)
      preflight
      load_vms
      need_vm "${1:-}"
      sock_of "$1"
      ;;
    daemon-pid) cmd_daemon_pid ;;
    ctl)
      local ctl
      ctl=$(bin_path VSOCKETCTL bazel-bin/host-backend/vsocketctl "bazel build //host-backend:vsocketctl")
      exec "$ctl" --socket "$CTL_SOCK" "$@"
      ;;
    restart) [ "$#" -le 1 ] || die "usage: restart [TERM|KILL|INT]"; cmd_restart "$@" ;;
    start) [ "$#" = 0 ] || die "usage: start"; cmd_start ;;
    -h | --help | help) usage ;;
    "") usage >&2; exit 2 ;;
    *) echo "testbed: unknown command '$cmd'" >&2; usage >&2; exit 2 ;;
  esac
}

main "$@"
