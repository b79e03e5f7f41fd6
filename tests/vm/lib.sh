# Boots VM-mode test guests: QEMU (TCG) with a virtio-net-pci device
# attached to a vhost-user socket (vsocketd's port), the host root over 9p,
# and a job script. Source it; needs tests/vm/prepare.sh's cache.
#
#   [VM_FUNCTIONS=N] [VM_AGENT_FUNCTION=1] [VM_NIC=NETNS,TAP,MAC] [VM_RAM_MB=512] vm_boot RESULTS SOCKET TIMEOUT [KERNEL_ARGS...]
#       starts QEMU in the background (pid in VM_PID, also added to
#       VM_PIDS); RESULTS/job.sh must exist; the guest writes
#       RESULTS/{stdout,stderr,rc,dmesg,console.log}. VM_NIC: QEMU runs in
#       network namespace NETNS with an ordinary NIC on its tap device TAP
#       (vm_net_up), a transitional virtio-net-pci (1af4:1000) with MAC;
#       give the guest its address with vsocket.nic=ADDR/LEN.
#       VM_AGENT_FUNCTION=1: one more function, on SOCKET.agent: the agent's
#       own, the VM's socket-proof authority (a port with prove_sockets =
#       agent, decision 100). VM_CHARDEV_OPTS: appended to each vSocket
#       function's chardev (",reconnect=1": QEMU reconnects to a vsocketd
#       that restarted).
#   vm_wait TIMEOUT      waits for the last booted one (bounded), kills it
#                        past TIMEOUT; returns the job's exit code (124:
#                        timed out, 125: no exit code)
#   vm_wait_for PID RESULTS TIMEOUT   the same for one of several guests
#   vm_kill              stops the last booted one
#   vm_kill_all          stops every guest booted (the EXIT trap's part)
#   vm_net_up NETNS TAP...  a network namespace with a bridge and a tap
#                        device on it per guest: the guests' ordinary NICs
#                        (their kernel TCP) meet there, and nowhere else
#   vm_net_down NETNS    removes it (the EXIT trap's part)
#   vm_container_up NETNS CNS ADDR/LEN   a process-mode "VM" (a container:
#                        network namespace CNS whose processes speak
#                        vhost-user to vsocketd themselves, as tests/e2e/
#                        does) on NETNS's bridge through a veth, with ADDR
#   vm_container_down CNS  removes it
VM_CACHE=${VSOCKET_VM_CACHE:-/var/cache/vsocket-vm}
VM_PID=""
VM_PIDS=()

# vm_script_args DEFAULT-CASE... -- ARGS...: a test script's arguments:
# BUILD (0 with --no-build) and CASES (those named, else the defaults);
# --help prints the script's header comment and exits.
vm_script_args() {
  local defaults=() a
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    defaults+=("$1")
    shift
  done
  shift
  BUILD=1
  CASES=()
  for a in "$@"; do
    case "$a" in
      --no-build) BUILD=0 ;;
      -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
      *) CASES+=("$a") ;;
    esac
  done
  [ ${#CASES[@]} -gt 0 ] || CASES=("${defaults[@]}")
}

# The device as docs/vm-mode.md gives it to operators: modern-only
# virtio-net-pci, every offload and control feature off (vsocketd offers
# none; ctrl_rx without ctrl_vq makes a guest's virtio_net refuse it),
# vectors=0 (QEMU 7.2 under TCG segfaults starting vhost with MSI-X); vm_boot
# gives each function a MAC with vSocket's prefix, 02:76:73 (decision 119:
# the agent takes a function virtio_net holds only if its MAC says so).
VM_NET_DEVICE="virtio-net-pci,disable-legacy=on,vectors=0,romfile=,mrg_rxbuf=off,status=off,\
csum=off,guest_csum=off,gso=off,guest_tso4=off,guest_tso6=off,guest_ecn=off,guest_ufo=off,guest_announce=off,\
host_tso4=off,host_tso6=off,host_ecn=off,host_ufo=off,ctrl_vq=off,ctrl_rx=off,ctrl_vlan=off,ctrl_rx_extra=off,\
ctrl_mac_addr=off,ctrl_guest_offloads=off,mq=off,indirect_desc=off"

vm_boot() {
  local results=$1 sock=$2 timeout=$3 i
  shift 3
  # VM_FUNCTIONS vSocket functions on the same port (one vhost-user
  # connection, one vsocketd device each): one per process the agent serves
  # at once.
  local vs=()
  for ((i = 0; i < ${VM_FUNCTIONS:-1}; i++)); do
    vs+=(-chardev "socket,id=vs$i,path=$sock${VM_CHARDEV_OPTS:-}" -netdev "vhost-user,id=vsn$i,chardev=vs$i"
         -device "$VM_NET_DEVICE,netdev=vsn$i,mac=02:76:73:00:00:$(printf %02x "$i")")
  done
  if [ "${VM_AGENT_FUNCTION:-0}" = 1 ]; then
    vs+=(-chardev "socket,id=vsa,path=$sock.agent${VM_CHARDEV_OPTS:-}" -netdev "vhost-user,id=vsna,chardev=vsa"
         -device "$VM_NET_DEVICE,netdev=vsna,mac=02:76:73:00:00:ff")
  fi
  local nic=() ns=()
  if [ "${VM_ORDINARY_NIC:-0}" = 1 ]; then
    # The VM's own NIC as many clouds give it: a modern virtio-net function
    # (1af4:1041, like the vSocket ones) with an ordinary MAC, on a hub
    # port that leads nowhere. The agent must leave it alone (decision 119).
    vs=(-netdev "hubport,id=onic,hubid=0"
        -device "virtio-net-pci,disable-legacy=on,vectors=0,romfile=,netdev=onic,mac=52:54:00:12:34:99" "${vs[@]}")
  fi
  if [ -n "${VM_NIC:-}" ]; then
    local nic_ns nic_tap nic_mac
    IFS=, read -r nic_ns nic_tap nic_mac <<< "$VM_NIC"
    ns=(ip netns exec "$nic_ns")
    nic=(-netdev "tap,id=nic0,ifname=$nic_tap,script=no,downscript=no"
         -device "virtio-net-pci,netdev=nic0,mac=$nic_mac,romfile=")
  fi
  VM_RESULTS=$results
  rm -f "$results"/{stdout,ready,done,stderr,rc,rc.tmp,boot-error,dmesg,console.log}
  # Guest RAM is a sealed memfd shared with the backend (vsocketd refuses
  # memory that could shrink under it).
  "${ns[@]}" qemu-system-x86_64 \
    -accel tcg,thread=multi -cpu max -smp 1 -m "${VM_RAM_MB:-512}" \
    -object "memory-backend-memfd,id=mem0,size=${VM_RAM_MB:-512}M,share=on" -machine memory-backend=mem0 \
    -nographic -monitor none -no-reboot \
    -chardev "file,id=con0,path=$results/console.log" -serial chardev:con0 \
    ${VM_QMP:+-qmp "unix:$VM_QMP,server=on,wait=off"} \
    -kernel "$VM_CACHE/vmlinuz" -initrd "$VM_CACHE/initramfs.cpio.gz" \
    -append "console=ttyS0 quiet loglevel=3 panic=-1 vsocket.timeout=$((timeout - 20)) $*" \
    "${vs[@]}" "${nic[@]}" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -virtfs "local,path=$results,mount_tag=results,security_model=none" \
    </dev/null >"$results/qemu.log" 2>&1 &
  VM_PID=$!
  VM_PIDS+=("$VM_PID")
}

vm_wait_for() {
  local saved_pid=$VM_PID saved_results=$VM_RESULTS rc
  VM_PID=$1 VM_RESULTS=$2
  vm_wait "$3"
  rc=$?
  VM_PID=$saved_pid VM_RESULTS=$saved_results
  [ "$saved_pid" = "$1" ] && VM_PID=""
  return $rc
}

vm_kill_all() {
  # Only this shell's own QEMUs still running (a reaped PID may be
  # another process's by now).
  local p live
  live=" $(jobs -p | tr '\n' ' ') "
  for p in "${VM_PIDS[@]}"; do
    [[ "$live" == *" $p "* ]] || continue
    VM_PID=$p
    vm_kill
  done
  VM_PIDS=()
}

vm_net_up() {
  local ns=$1 tap
  shift
  ip netns add "$ns" || return 1
  ip -n "$ns" link add br0 type bridge || return 1
  ip -n "$ns" link set br0 up || return 1
  for tap in "$@"; do
    ip -n "$ns" tuntap add dev "$tap" mode tap || return 1
    ip -n "$ns" link set "$tap" master br0 up || return 1
  done
}

vm_container_up() {
  local ns=$1 cns=$2 addr=$3 v=vc$$
  ip netns add "$cns" || return 1
  ip link add "${v}b" type veth peer name "${v}c" || return 1
  ip link set "${v}b" netns "$ns" || return 1
  ip link set "${v}c" netns "$cns" || return 1
  ip -n "$ns" link set "${v}b" master br0 up || return 1
  ip -n "$cns" link set lo up || return 1
  ip -n "$cns" addr add "$addr" dev "${v}c" || return 1
  ip -n "$cns" link set "${v}c" up || return 1
}

vm_container_down() {
  ip netns list 2>/dev/null | grep -qw "^$1" || return 0
  ip netns delete "$1"
}

vm_net_down() {
  ip netns list 2>/dev/null | grep -qw "^$1" || return 0
  ip netns delete "$1"
}

vm_wait() {
  local timeout=$1 deadline
  deadline=$(( $(date +%s) + timeout ))
  while kill -0 "$VM_PID" 2>/dev/null; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "vm: guest still running after ${timeout}s; killing QEMU $VM_PID" >&2
      vm_kill
      return 124
    fi
    sleep 0.5
  done
  wait "$VM_PID" 2>/dev/null || true
  VM_PID=""
  local dir=$VM_RESULTS
  [ -f "$dir/rc" ] || { echo "vm: no exit code from the guest: $(cat "$dir/boot-error" 2>/dev/null)" >&2; tail -5 "$dir/qemu.log" >&2; return 125; }
  return "$(cat "$dir/rc")"
}

vm_kill() {
  [ -n "$VM_PID" ] || return 0
  kill "$VM_PID" 2>/dev/null || true
  local i
  for i in 1 2 3 4 5 6; do kill -0 "$VM_PID" 2>/dev/null || break; sleep 0.5; done
  kill -9 "$VM_PID" 2>/dev/null || true
  wait "$VM_PID" 2>/dev/null || true
  VM_PID=""
}
