#!/usr/bin/env bash
# vSocket two-host test bed: two "hypervisors" as network namespaces, each
# with its own vsocketd and two "VM" namespaces, on one machine.
#
#   underlay (fabric + routed VM traffic)   203.0.113.1 (hostA) <-> 203.0.113.2 (hostB)
#   hostA: bridge 198.51.100.1/28   vmA1 198.51.100.2 (tenant 1)  vmA2 198.51.100.3 (tenant 1)
#   hostB: bridge 198.51.100.17/28  vmB1 198.51.100.18 (tenant 1) vmB2 198.51.100.19 (tenant 2)
#
# VMs on different hosts reach each other over kernel TCP routed through the
# two host namespaces (connection setup and fallback); the two vsocketds
# link over the underlay addresses with TLS 1.3 (certificates from
# deploy/make-certs.sh) and the tcp fabric. See docs/testbed.md.
#
#   deploy/testbed2.sh up | down | status
#   deploy/testbed2.sh exec VM CMD [ARG...]     run in VM's namespace, VSOCKET_SOCKET set
#   deploy/testbed2.sh ctl HOST ARGS...         vsocketctl against HOST's daemon
#   deploy/testbed2.sh addr VM | daemon-pid HOST | restart HOST [TERM|KILL] | kill HOST
#   deploy/testbed2.sh move VM HOST               move VM (its namespace's link, its
#                                                 vsocketd) to HOST, as a migration would
#   deploy/testbed2.sh host VM                    where VM runs now
#   deploy/testbed2.sh configure                  write the daemons' configurations again
#   deploy/testbed2.sh etcd-stop | etcd-start | etcdctl ARGS... | etcdctl-as HOST ARGS...
#                                                 (etcd mode) stop or start the bed's
#                                                 etcd; etcdctl as its root user, or HOST's
#   deploy/testbed2.sh etcd-stop-member I [SIGNAL] | etcd-start-member I
#                                                 (etcd mode) one member of a 3-member etcd
#
# Etcd mode (VSOCKET_TESTBED2_LOCATOR=etcd; VSOCKET_TESTBED2_ETCD_TLS=1 adds
# TLS with client certificates, locator = etcds://...): no locator file; one etcd in a
# namespace of its own (192.0.2.10:2379, routed through hostA: 192.0.2.1)
# with its auth on, each host its etcd user restricted to its own keys
# (docs/multi-host.md "Permissions"), and both vsocketds publish and follow
# the directory there (locator = etcd://192.0.2.10:2379); a VM that moves is
# withdrawn by the host it leaves and published by the one it reaches.
# VSOCKET_TESTBED2_ETCD_MEMBERS=3 (etcd mode, at `up`): a 3-member etcd
# cluster instead of one member, all on 192.0.2.10 (client ports 2379,
# 2479, 2579), and the hosts' locator lists the three.
# VSOCKET_TESTBED2_DIRECTORY_PEERS="hostA hostB" (etcd mode): those hosts'
# configurations have no [peer] section; their peers come from the
# directory (decision 96). `configure` writes the configurations again
# (a daemon reads its own at its next restart).
#
# Environment: VSOCKETD, VSOCKETCTL (binaries), VSOCKET_LOG_LEVEL,
# VSOCKET_TESTBED2_DIR (state, default /run/vsocket-testbed2), VSOCKETD_ARGS,
# VSOCKET_TESTBED2_NS_PREFIX (namespace names, default vs2: a second bed
# with another prefix and state directory can run alongside),
# VSOCKET_TESTBED2_LINKS (links_per_peer, default 1),
# VSOCKET_TESTBED2_LOCATOR (file, the default, or etcd; etcd mode needs
# etcd-server and etcd-client), VSOCKET_TESTBED2_FABRIC (tcp, the default, or rdma), and for rdma
# VSOCKET_TESTBED2_RDMA_DEVICE (default: the first device) and
# VSOCKET_TESTBED2_RDMA_GID_INDEX_HOSTA / _HOSTB (default: automatic).
set -euo pipefail
set +m

SELF=$(readlink -f "${BASH_SOURCE[0]}")
ORIG_PWD=$PWD
cd "$(dirname "$SELF")/.."
REPO_ROOT=$PWD
BED_NAME=testbed2
# shellcheck source=deploy/lib/bed.sh
. deploy/lib/bed.sh # die/warn/say, pid_alive, stop_daemon, ns_exists, ...
STATE=${VSOCKET_TESTBED2_DIR:-/run/vsocket-testbed2}
MARKER=.vsocket-testbed2
HOSTS="hostA hostB"
# vm:host:tenant:address
VMS="vmA1:hostA:1:198.51.100.2 vmA2:hostA:1:198.51.100.3 vmB1:hostB:1:198.51.100.18 vmB2:hostB:2:198.51.100.19"
PEER_PORT=7300

NS_PREFIX=${VSOCKET_TESTBED2_NS_PREFIX:-vs2}
[[ $NS_PREFIX =~ ^[a-z][a-z0-9]{0,5}$ ]] || die "VSOCKET_TESTBED2_NS_PREFIX must be 1-6 of [a-z0-9]"
ns_of() { echo "$NS_PREFIX$1"; } # vs2hostA, vs2vmA1, ...
FABRIC=${VSOCKET_TESTBED2_FABRIC:-tcp}
case $FABRIC in tcp | rdma) ;; *) die "VSOCKET_TESTBED2_FABRIC must be tcp or rdma" ;; esac
LOCATOR=${VSOCKET_TESTBED2_LOCATOR:-file}
case $LOCATOR in file | etcd) ;; *) die "VSOCKET_TESTBED2_LOCATOR must be file or etcd" ;; esac
ETCD_ADDR=192.0.2.10 # its own namespace, behind hostA (192.0.2.1)
ETCD_TLS=${VSOCKET_TESTBED2_ETCD_TLS:-0}
case $ETCD_TLS in 0 | 1) ;; *) die "VSOCKET_TESTBED2_ETCD_TLS must be 0 or 1" ;; esac
if [ "$ETCD_TLS" = 1 ]; then ETCD_SCHEME=https; else ETCD_SCHEME=http; fi
case ${VSOCKET_TESTBED2_ETCD_MEMBERS:-1} in 1 | 3) ;; *) die "VSOCKET_TESTBED2_ETCD_MEMBERS must be 1 or 3" ;; esac
LINKS=${VSOCKET_TESTBED2_LINKS:-1}
[[ $LINKS =~ ^([1-9]|1[0-6])$ ]] || die "VSOCKET_TESTBED2_LINKS must be 1-16"
underlay_of() { case $1 in hostA) echo 203.0.113.1 ;; hostB) echo 203.0.113.2 ;; esac; }
bridge_addr_of() { case $1 in hostA) echo 198.51.100.1 ;; hostB) echo 198.51.100.17 ;; esac; }
subnet_of() { case $1 in hostA) echo 198.51.100.0/28 ;; hostB) echo 198.51.100.16/28 ;; esac; }
other_of() { case $1 in hostA) echo hostB ;; hostB) echo hostA ;; esac; }
vm_field() { # vm_field VM N (2 host it starts on, 3 tenant, 4 address)
  local v
  for v in $VMS; do
    [ "${v%%:*}" = "$1" ] && { echo "$v" | cut -d: -f"$2"; return 0; }
  done
  die "unknown VM '$1' (VMs: vmA1 vmA2 vmB1 vmB2)"
}
need_host() { case ${1:-} in hostA | hostB) ;; *) die "unknown host '${1:-}' (hostA or hostB)" ;; esac; }
# Where VM runs now (move changes it; the bed starts with VMS's hosts).
host_of() { cat "$STATE/placement/$1" 2>/dev/null || vm_field "$1" 2; }
# A VM's vhost-user socket path, as its guests see it: a link to the port of
# the vsocketd of the host it runs on (what a container's bind mount of
# /run/vsocket would be).
vm_sock() { echo "$STATE/vms/$1.sock"; }
pid_file() { echo "$STATE/$1/vsocketd.pid"; }
ctl_sock() { echo "$STATE/$1/ctl.sock"; }

BUILD_HINT="bazel build //host-backend:vsocketd //host-backend:vsocketctl"
vsocketd_bin() { bin_path VSOCKETD bazel-out/k8-opt/bin/host-backend/vsocketd "$BUILD_HINT"; }
vsocketctl_bin() { bin_path VSOCKETCTL bazel-out/k8-opt/bin/host-backend/vsocketctl "$BUILD_HINT"; }
host_daemon_pid() { daemon_pid "$(pid_file "$1")" "$(ctl_sock "$1")"; } # HOST
# (15 s: SIGTERM drains for up to drain_timeout_ms, 10 s, first.)
stop_host_daemon() { stop_daemon "$(pid_file "$1")" "$(ctl_sock "$1")" "${2:-TERM}" 15 || true; } # HOST [SIGNAL]

# The etcd of etcd mode: one member (or three: VSOCKET_TESTBED2_ETCD_MEMBERS,
# kept in $STATE/etcd/members at `up`) in its own namespace, member I's
# client port 2379 + 100 I on 192.0.2.10 (its peer port on loopback, +1),
# its data in $STATE/etcd/data (member 0) or data<I> (kept across
# etcd-stop/etcd-start), killed by its PID.
etcd_members() { cat "$STATE/etcd/members" 2>/dev/null || echo "${VSOCKET_TESTBED2_ETCD_MEMBERS:-1}"; }
etcd_port() { echo $((2379 + 100 * $1)); } # I
etcd_suffix() { [ "$1" = 0 ] || echo "$1"; } # I
etcd_endpoints() { # ADDR:PORT of every member, comma-separated
  local i out=
  for ((i = 0; i < $(etcd_members); i++)); do out+="${out:+,}$ETCD_ADDR:$(etcd_port $i)"; done
  echo "$out"
}
etcd_urls() { etcd_endpoints | sed "s|\([^,]*\)|$ETCD_SCHEME://\1|g"; }
etcd_member_pid() { # I
  local pid
  pid=$(read_pid_file "$STATE/etcd/etcd$(etcd_suffix "$1").pid") || return 1
  pid_alive "$pid" && tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null |
    grep -qxF -- "--data-dir=$STATE/etcd/data$(etcd_suffix "$1")" || return 1
  echo "$pid"
}
etcd_pid() { # the PID of any member running
  local i
  for ((i = 0; i < $(etcd_members); i++)); do etcd_member_pid $i && return 0; done
  return 1
}
# TLS (VSOCKET_TESTBED2_ETCD_TLS=1): a CA of its own, etcd's certificate for
# 192.0.2.10 (server and client use: the gateway calls etcd with it), and one
# client certificate without a CommonName (etcd's gateway refuses one with a
# CN once its auth is on; the hosts are their etcd users by password:
# decision 87), used by the vsocketds and by etcdctl.
ETCD_TLS_FLAGS=()
ETCD_CLIENT_TLS=()
etcd_tls_files() {
  local d=$STATE/etcd/tls
  mkdir -p "$d"
  [ -f "$d/client.crt" ] && return 0
  (
    cd "$d" &&
      openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.crt \
        -subj /CN=vsocket-testbed2-etcd-ca -days 2 &&
      openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key -out server.csr \
        -subj /CN=etcd-server &&
      printf 'subjectAltName=IP:%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$ETCD_ADDR" >server.ext &&
      openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext \
        -out server.crt &&
      openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout client.key -out client.csr \
        -subj /O=vsocket &&
      printf 'extendedKeyUsage=clientAuth\n' >client.ext &&
      openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile client.ext \
        -out client.crt && chmod 600 ./*.key
  ) >/dev/null 2>&1 || die "etcd TLS: openssl failed"
}
etcd_tls_setup() {
  [ "$ETCD_TLS" = 1 ] || return 0
  local d=$STATE/etcd/tls
  ETCD_TLS_FLAGS=(--cert-file="$d/server.crt" --key-file="$d/server.key" --trusted-ca-file="$d/ca.crt"
    --client-cert-auth)
  ETCD_CLIENT_TLS=(--cacert "$d/ca.crt" --cert "$d/client.crt" --key "$d/client.key")
}
etcd_tls_setup

etcd_start_member() { # I: starts member I (if it is not running) without waiting
  local i=$1 cluster= j url sfx
  etcd_member_pid "$i" >/dev/null && return 0
  for ((j = 0; j < $(etcd_members); j++)); do cluster+="${cluster:+,}bed$(etcd_suffix $j)=http://127.0.0.1:$(($(etcd_port $j) + 1))"; done
  url=$ETCD_SCHEME://$ETCD_ADDR:$(etcd_port "$i")
  sfx=$(etcd_suffix "$i")
  ip netns exec "$(ns_of etcd)" setsid etcd --name "bed$sfx" --data-dir="$STATE/etcd/data$sfx" \
    --listen-client-urls "$url" --advertise-client-urls "$url" \
    --listen-peer-urls "http://127.0.0.1:$(($(etcd_port "$i") + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$(($(etcd_port "$i") + 1))" \
    --initial-cluster "$cluster" --logger zap --log-level warn "${ETCD_TLS_FLAGS[@]}" \
    </dev/null >>"$STATE/etcd/etcd$sfx.log" 2>&1 &
  echo $! >"$STATE/etcd/etcd$sfx.pid"
}
etcd_wait_member() { # I: member I answers its health check (the cluster has a leader; 15 s)
  local i code
  for ((i = 0; i < 150; i++)); do
    code=$(ip netns exec "$(ns_of etcd)" curl -s -o /dev/null -m 1 -w '%{http_code}' "${ETCD_CLIENT_TLS[@]}" \
      "$ETCD_SCHEME://$ETCD_ADDR:$(etcd_port "$1")/health" || true)
    [ "${code:-000}" = 200 ] && return 0
    etcd_member_pid "$1" >/dev/null || { log_tail "$STATE/etcd/etcd$(etcd_suffix "$1").log" 20; die "etcd member $1 exited"; }
    sleep 0.1
  done
  log_tail "$STATE/etcd/etcd$(etcd_suffix "$1").log" 20
  die "etcd member $1 not healthy after 15 s"
}
etcd_start() {
  local i
  etcd_pid >/dev/null && die "etcd runs already"
  command -v etcd >/dev/null || die "no etcd (apt-get install etcd-server etcd-client)"
  mkdir -p "$STATE/etcd"
  [ -f "$STATE/etcd/members" ] || echo "${VSOCKET_TESTBED2_ETCD_MEMBERS:-1}" >"$STATE/etcd/members"
  [ "$ETCD_TLS" = 1 ] && etcd_tls_files
  for ((i = 0; i < $(etcd_members); i++)); do etcd_start_member $i; done
  for ((i = 0; i < $(etcd_members); i++)); do etcd_wait_member $i; done
}
etcd_stop_member() { # I [SIGNAL]
  local pid i
  pid=$(etcd_member_pid "$1") || return 0
  kill "-${2:-TERM}" "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    pid_alive "$pid" || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}
etcd_stop() { # etcd_stop [SIGNAL]: every member
  local i
  for ((i = 0; i < $(etcd_members); i++)); do etcd_stop_member $i "${1:-TERM}"; done
}
etcdctl_root() { # etcdctl as root (once auth is on)
  etcdctl_as "root:$(cat "$STATE/etcd/root.pw")" "$@"
}
etcdctl_as() { # etcdctl_as USER:PASSWORD ARGS...
  local user=$1
  shift
  ip netns exec "$(ns_of etcd)" etcdctl --endpoints "$(etcd_urls)" --command-timeout=3s "${ETCD_CLIENT_TLS[@]}" \
    --user "$user" "$@"
}
new_password() { head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
# Auth on, and each host an etcd user whose role writes only its own keys
# (the etcdctl commands of docs/multi-host.md "Permissions").
etcd_provision() {
  local h pw role plain=(ip netns exec "$(ns_of etcd)" etcdctl --endpoints "$(etcd_urls)" --command-timeout=3s
    "${ETCD_CLIENT_TLS[@]}")
  new_password >"$STATE/etcd/root.pw"
  chmod 600 "$STATE/etcd/root.pw"
  { "${plain[@]}" role add root && "${plain[@]}" user add "root:$(cat "$STATE/etcd/root.pw")" &&
    "${plain[@]}" user grant-role root root && "${plain[@]}" auth enable; } >/dev/null || die "etcd: auth enable failed"
  local tenants t
  tenants=$(for v in $VMS; do echo "$v" | cut -d: -f3; done | sort -un)
  for h in $HOSTS; do
    role=vsocket-host-$h
    mkdir -p "$STATE/$h"
    pw=$(new_password)
    (umask 077 && echo "$pw" >"$STATE/$h/etcd.pw")
    { etcdctl_root role add "$role" &&
      etcdctl_root role grant-permission "$role" readwrite "/vsocket/hosts/$h" &&
      etcdctl_root role grant-permission "$role" read --prefix /vsocket/hosts/ &&
      etcdctl_root user add "$h:$pw" && etcdctl_root user grant-role "$h" "$role"; } >/dev/null ||
      die "etcd: user $h failed"
    # The tenants it may serve (every VM is configured on both hosts):
    # its VM records of each, and reading where the tenant's others run
    # (decision 103).
    for t in $tenants; do
      { etcdctl_root role grant-permission "$role" readwrite --prefix "/vsocket/tenants/$t/$h/" &&
        etcdctl_root role grant-permission "$role" read --prefix "/vsocket/tenants/$t/"; } >/dev/null ||
        die "etcd: tenant $t for $h failed"
    done
  done
}
etcd_up() {
  local ns
  ns=$(ns_of etcd)
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip link add vs2eta netns "$ns" type veth peer name vs2etb netns "$(ns_of hostA)"
  ip -n "$ns" addr add "$ETCD_ADDR/24" dev vs2eta
  ip -n "$(ns_of hostA)" addr add 192.0.2.1/24 dev vs2etb
  ip -n "$ns" link set vs2eta up
  ip -n "$(ns_of hostA)" link set vs2etb up
  ip -n "$ns" route add default via 192.0.2.1
  ip -n "$(ns_of hostB)" route add 192.0.2.0/24 via 203.0.113.1
  mkdir -p "$STATE/etcd"
  echo "${VSOCKET_TESTBED2_ETCD_MEMBERS:-1}" >"$STATE/etcd/members"
  etcd_start
  etcd_provision
}

# The locator (shared by both backends; the file mode's) and each host's
# configuration, from where each VM runs now: every VM is configured on
# both hosts (either may become its host), `away = true` where it does not
# run.
write_configs() {
  local h v name host tenant addr
  if [ "$LOCATOR" = file ]; then
    {
      echo "# tenant address host (shared by both backends)"
      for v in $VMS; do
        IFS=: read -r name host tenant addr <<<"$v"
        echo "$tenant $addr $(host_of "$name")"
      done
    } >"$STATE/locator"
  fi
  for h in $HOSTS; do
    mkdir -p "$STATE/$h"
    {
      echo "ctl_socket = $(ctl_sock "$h")"
      echo "log_level = ${VSOCKET_LOG_LEVEL:-info}"
      echo "host_name = $h"
      echo "peer_listen = $(underlay_of "$h"):$PEER_PORT"
      echo "tls_cert = $STATE/certs/$h.crt"
      echo "tls_key = $STATE/certs/$h.key"
      echo "tls_ca = $STATE/certs/ca.crt"
      if [ "$LOCATOR" = etcd ] && [ "$ETCD_TLS" = 1 ]; then
        echo "locator = etcds://$(etcd_endpoints)"
        echo "etcd_ca = $STATE/etcd/tls/ca.crt"
        echo "etcd_cert = $STATE/etcd/tls/client.crt"
        echo "etcd_key = $STATE/etcd/tls/client.key"
      elif [ "$LOCATOR" = etcd ]; then
        echo "locator = etcd://$(etcd_endpoints)"
      fi
      if [ "$LOCATOR" = etcd ]; then
        echo "etcd_user = $h"
        echo "etcd_password_file = $STATE/$h/etcd.pw"
      else
        echo "locator = $STATE/locator"
      fi
      echo "links_per_peer = $LINKS"
      if [ "$FABRIC" = rdma ]; then
        local gid_var="VSOCKET_TESTBED2_RDMA_GID_INDEX_${h^^}"
        echo "fabric = rdma"
        [ -z "${VSOCKET_TESTBED2_RDMA_DEVICE:-}" ] || echo "rdma_device = $VSOCKET_TESTBED2_RDMA_DEVICE"
        [ -z "${!gid_var:-}" ] || echo "rdma_gid_index = ${!gid_var}"
      fi
      if [ "$LOCATOR" = etcd ] && [[ " ${VSOCKET_TESTBED2_DIRECTORY_PEERS:-} " == *" $h "* ]]; then
        echo "# no [peer] section: the peers are the hosts in the directory"
      else
        echo
        echo "[peer $(other_of "$h")]"
        echo "address = $(underlay_of "$(other_of "$h")"):$PEER_PORT"
      fi
      for v in $VMS; do
        IFS=: read -r name host tenant addr <<<"$v"
        echo
        echo "[vm $name]"
        echo "socket = $STATE/$h/$name.sock"
        echo "tenant = $tenant"
        echo "addresses = $addr"
        [ "$(host_of "$name")" = "$h" ] || echo "away = true"
      done
    } >"$STATE/$h/vsocketd.conf"
  done
}

start_daemon() { # start_daemon HOST
  local h=$1 bin i n ready0
  bin=$(vsocketd_bin)
  # (The log is appended to: a restarted daemon is ready at its own line.)
  ready0=$(grep -c "vsocketd: ready" "$STATE/$h/vsocketd.log" 2>/dev/null || true)
  rm -f "$STATE/$h"/*.sock
  # shellcheck disable=SC2086  # VSOCKETD_ARGS is a word list
  ip netns exec "$(ns_of "$h")" setsid "$bin" --config "$STATE/$h/vsocketd.conf" --ctl "$(ctl_sock "$h")" \
    ${VSOCKETD_ARGS:-} </dev/null >>"$STATE/$h/vsocketd.log" 2>&1 &
  echo $! >"$(pid_file "$h")"
  for ((i = 0; i < 100; i++)); do
    n=$(grep -c "vsocketd: ready" "$STATE/$h/vsocketd.log" 2>/dev/null || true)
    [ "${n:-0}" -gt "${ready0:-0}" ] &&
      [ -S "$(ctl_sock "$h")" ] && return 0
    pid_alive "$(cat "$(pid_file "$h")")" || { log_tail "$STATE/$h/vsocketd.log" 20; die "vsocketd on $h exited"; }
    sleep 0.1
  done
  log_tail "$STATE/$h/vsocketd.log" 20
  die "vsocketd on $h not ready after 10 s"
}

wait_links_up() { # both daemons report the link up (20 s: the initiator's
  # reconnect backoff reaches 10 s after repeated losses, and a restart can
  # fall just after an attempt)
  local i ctl
  ctl=$(vsocketctl_bin)
  for ((i = 0; i < 200; i++)); do
    if "$ctl" --socket "$(ctl_sock hostA)" links 2>/dev/null | grep -q " up " &&
      "$ctl" --socket "$(ctl_sock hostB)" links 2>/dev/null | grep -q " up "; then
      return 0
    fi
    sleep 0.1
  done
  "$ctl" --socket "$(ctl_sock hostA)" links >&2 || true
  "$ctl" --socket "$(ctl_sock hostB)" links >&2 || true
  die "fabric link between hostA and hostB did not come up in 20 s"
}

cmd_down() {
  local h v ns
  for h in $HOSTS; do stop_host_daemon "$h"; done
  etcd_stop
  for v in $VMS $HOSTS etcd; do
    ns=$(ns_of "${v%%:*}")
    ns_exists "$ns" && ip netns del "$ns"
  done
  if [ -f "$STATE/$MARKER" ]; then rm -rf "$STATE"; fi
  return 0
}

cmd_up() {
  [ "$(id -u)" -eq 0 ] || die "must run as root"
  [ ! -e "$STATE" ] || [ -f "$STATE/$MARKER" ] || die "$STATE exists and was not made by testbed2.sh"
  cmd_down
  mkdir -p "$STATE"
  touch "$STATE/$MARKER"
  local h v name host tenant addr nsh nsv
  for h in $HOSTS; do
    nsh=$(ns_of "$h")
    ip netns add "$nsh"
    ip -n "$nsh" link set lo up
    ip netns exec "$nsh" sysctl -qw net.ipv4.ip_forward=1
    ip -n "$nsh" link add br0 type bridge
    ip -n "$nsh" addr add "$(bridge_addr_of "$h")/28" dev br0
    ip -n "$nsh" link set br0 up
  done
  # The underlay between the two hosts.
  ip link add vs2ula netns "$(ns_of hostA)" type veth peer name vs2ulb netns "$(ns_of hostB)"
  ip -n "$(ns_of hostA)" addr add 203.0.113.1/24 dev vs2ula
  ip -n "$(ns_of hostB)" addr add 203.0.113.2/24 dev vs2ulb
  ip -n "$(ns_of hostA)" link set vs2ula up
  ip -n "$(ns_of hostB)" link set vs2ulb up
  ip -n "$(ns_of hostA)" route add "$(subnet_of hostB)" via 203.0.113.2
  ip -n "$(ns_of hostB)" route add "$(subnet_of hostA)" via 203.0.113.1
  for v in $VMS; do
    IFS=: read -r name host tenant addr <<<"$v"
    nsv=$(ns_of "$name")
    nsh=$(ns_of "$host")
    ip netns add "$nsv"
    ip -n "$nsv" link set lo up
    # Made under a temporary name, renamed inside the VM's namespace: some
    # kernels refuse "eth0" while the creating namespace has one (the QEMU guest
    # of tests/rdma/cross_host_in_qemu.sh).
    ip link add "t$name" netns "$nsv" type veth peer name "p$name" netns "$nsh"
    ip -n "$nsv" link set "t$name" name eth0
    ip -n "$nsh" link set "p$name" master br0 up
    ip -n "$nsv" addr add "$addr/28" dev eth0
    ip -n "$nsv" link set eth0 up
    ip -n "$nsv" route add default via "$(bridge_addr_of "$host")"
  done
  [ "$LOCATOR" = file ] || etcd_up
  mkdir -p "$STATE/certs" "$STATE/placement" "$STATE/vms"
  bash "$REPO_ROOT/deploy/make-certs.sh" "$STATE/certs" hostA hostB >/dev/null
  for v in $VMS; do
    IFS=: read -r name host tenant addr <<<"$v"
    echo "$host" >"$STATE/placement/$name"
    ln -sfn "../$host/$name.sock" "$(vm_sock "$name")"
  done
  write_configs
  for h in $HOSTS; do start_daemon "$h"; done
  # Each VM's network namespace, attested from inside it on both hosts (it
  # keeps its namespace when it moves): socket proofs from any other
  # namespace are refused (docs/security.md, threat 9); kept across restarts
  # (ctl.sock.attested).
  local ctl
  ctl=$(vsocketctl_bin)
  for v in $VMS; do
    name=${v%%:*}
    for h in $HOSTS; do
      ip netns exec "$(ns_of "$name")" "$ctl" --socket "$(ctl_sock "$h")" attest "$name" >/dev/null ||
        die "$h: vsocketctl attest $name failed"
    done
  done
  wait_links_up
  say "up: hostA (vmA1 vmA2) <-> hostB (vmB1 vmB2), $FABRIC fabric up ($LINKS link(s)), locator: $LOCATOR; state in $STATE"
}

# move VM HOST: what a migration does, in the order that lets every
# connection follow (docs/testbed.md "Moving a VM"):
# 1. the VM's vsocketd lets it go: `migrate begin` (its connections leave
#    the rings with clean fences, then its sessions end);
# 2. its network link moves to HOST's bridge (the two bridges are one L2
#    segment, stretched like a cloud overlay: the VM keeps its address and
#    its kernel TCP connections);
# 3. both locators learn where it runs (`locator set`, and the file; in
#    etcd mode the hosts' records, at detach and at `migrate end`);
# 4. HOST's vsocketd takes it: `migrate end` (its port opens);
# 5. its socket path leads to HOST's port: its libraries connect there
#    (within a second, at their next call) and its connections re-upgrade.
cmd_move() {
  local vm=$1 dst=$2 src name host tenant addr ctl out
  vm_field "$vm" 2 >/dev/null
  need_host "$dst"
  src=$(host_of "$vm")
  [ "$src" != "$dst" ] || die "$vm runs on $dst already"
  tenant=$(vm_field "$vm" 3)
  addr=$(vm_field "$vm" 4)
  ctl=$(vsocketctl_bin)
  out=$("$ctl" --socket "$(ctl_sock "$src")" migrate begin "$vm" --wait "${VSOCKET_TESTBED2_MOVE_WAIT:-10}") ||
    { "$ctl" --socket "$(ctl_sock "$src")" migrate end "$vm" >/dev/null 2>&1; die "$src: migrate begin $vm: $out"; }
  say "$src: $out"
  # A step that fails from here on calls the move off: the link back, the
  # VM taken back by its old host (best effort), then the error.
  undo() {
    ip -n "$(ns_of "$dst")" link show "p$vm" >/dev/null 2>&1 &&
      ip -n "$(ns_of "$dst")" link set "p$vm" netns "$(ns_of "$src")" &&
      ip -n "$(ns_of "$src")" link set "p$vm" master br0 up
    "$ctl" --socket "$(ctl_sock "$dst")" migrate begin "$vm" --wait 1 >/dev/null 2>&1
    "$ctl" --socket "$(ctl_sock "$src")" migrate end "$vm" >/dev/null 2>&1
    for h in $HOSTS; do "$ctl" --socket "$(ctl_sock "$h")" locator set "$tenant" "$addr" "$src" >/dev/null 2>&1; done
    echo "$src" >"$STATE/placement/$vm"
    write_configs
    die "$1"
  }
  if ! ip -n "$(ns_of hostA)" link show vs2sta >/dev/null 2>&1; then
    ip link add vs2sta netns "$(ns_of hostA)" type veth peer name vs2stb netns "$(ns_of hostB)" &&
      ip -n "$(ns_of hostA)" link set vs2sta master br0 up &&
      ip -n "$(ns_of hostB)" link set vs2stb master br0 up || undo "could not join the two bridges"
  fi
  { ip -n "$(ns_of "$src")" link set "p$vm" netns "$(ns_of "$dst")" &&
    ip -n "$(ns_of "$dst")" link set "p$vm" master br0 up; } || undo "could not move $vm's link to $dst"
  # The locators first, then the new host takes the VM (either order works:
  # requests that come before it arrives are kept for it). In etcd mode the
  # directory follows by itself: the old host withdrew the VM's record at
  # detach, the new one publishes it at `migrate end`.
  if [ "$LOCATOR" = file ]; then
    for h in $HOSTS; do
      "$ctl" --socket "$(ctl_sock "$h")" locator set "$tenant" "$addr" "$dst" >/dev/null ||
        undo "$h: locator set $tenant $addr $dst failed"
    done
  fi
  echo "$dst" >"$STATE/placement/$vm"
  write_configs  # (a daemon restarted later keeps the placement)
  out=$("$ctl" --socket "$(ctl_sock "$dst")" migrate end "$vm") || undo "$dst: migrate end $vm: $out"
  say "$dst: $out"
  ln -sfn "../$dst/$vm.sock" "$(vm_sock "$vm")"
  say "$vm moved from $src to $dst"
}

cmd_status() {
  local h ctl
  ctl=$(vsocketctl_bin)
  for h in $HOSTS; do
    echo "== $h (pid $(host_daemon_pid "$h" || echo none))"
    "$ctl" --socket "$(ctl_sock "$h")" links || true
  done
}

main() {
  local cmd=${1:-}
  shift || true
  case $cmd in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    exec)
      local vm=${1:-}
      [ "$#" -ge 2 ] || die "usage: exec VM CMD [ARG...]"
      shift
      export VSOCKET_SOCKET
      VSOCKET_SOCKET=$(vm_sock "$vm")
      cd "$ORIG_PWD"
      exec ip netns exec "$(ns_of "$vm")" "$@"
      ;;
    ctl)
      need_host "${1:-}"
      local h=$1
      shift
      local ctl
      ctl=$(vsocketctl_bin)
      exec "$ctl" --socket "$(ctl_sock "$h")" "$@"
      ;;
    addr) vm_field "${1:-}" 4 ;;
    daemon-pid) need_host "${1:-}"; host_daemon_pid "$1" ;;
    restart) need_host "${1:-}"; stop_host_daemon "$1" "${2:-TERM}"; start_daemon "$1"; wait_links_up ;;
    kill) need_host "${1:-}"; stop_host_daemon "$1" KILL ;;
    configure) write_configs ;;
    move) [ "$#" -eq 2 ] || die "usage: move VM HOST"; cmd_move "$1" "$2" ;;
    host) host_of "${1:-}" ;;
    etcd-stop) [ "$LOCATOR" = etcd ] || die "not in etcd mode"; etcd_stop "${1:-TERM}" ;;
    etcd-start) [ "$LOCATOR" = etcd ] || die "not in etcd mode"; etcd_start ;;
    etcd-stop-member) # etcd-stop-member I [SIGNAL]: one member of the cluster
      [ "$LOCATOR" = etcd ] || die "not in etcd mode"
      [[ ${1:-} =~ ^[0-9]$ ]] && [ "$1" -lt "$(etcd_members)" ] || die "usage: etcd-stop-member I (0..$(($(etcd_members) - 1)))"
      etcd_stop_member "$1" "${2:-TERM}" ;;
    etcd-start-member)
      [ "$LOCATOR" = etcd ] || die "not in etcd mode"
      [[ ${1:-} =~ ^[0-9]$ ]] && [ "$1" -lt "$(etcd_members)" ] || die "usage: etcd-start-member I (0..$(($(etcd_members) - 1)))"
      etcd_start_member "$1"; etcd_wait_member "$1" ;;
    etcdctl) [ "$LOCATOR" = etcd ] || die "not in etcd mode"; etcdctl_root "$@" ;;
    etcdctl-as) # etcdctl-as HOST ARGS...: as HOST's etcd user
      [ "$LOCATOR" = etcd ] || die "not in etcd mode"
      need_host "${1:-}"
      local h=$1
      shift
      etcdctl_as "$h:$(cat "$STATE/$h/etcd.pw")" "$@"
      ;;
    *) sed -n '2,/^[^#]/p' "$SELF" | sed -n 's/^# \{0,1\}//p' >&2; exit 2 ;; # the header comment
  esac
}

main "$@"
