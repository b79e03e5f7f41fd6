# Boots VM-mode test guests: QEMU (TCG) with a virtio-net-pci device
# attached to a vhost-user socket (vsocketd's port), the host root over 9p,
# and a job script. Source it; needs tests/vm/prepare.sh's cache.
#
#   [VM_FUNCTIONS=N] vm_boot RESULTS SOCKET TIMEOUT [KERNEL_ARGS...]
#       starts QEMU in the background (pid in VM_PID); RESULTS/job.sh must
#       exist; the guest writes RESULTS/{stdout,stderr,rc,dmesg,console.log}
#   vm_wait TIMEOUT      waits for it (bounded), kills it past TIMEOUT;
#                        returns the job's exit code (124: timed out,
#                        125: no exit code)
#   vm_kill              stops it (the EXIT trap's part)
VM_CACHE=${VSOCKET_VM_CACHE:-/var/cache/vsocket-vm}
VM_PID=""

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
# vectors=0 (QEMU 7.2 under TCG segfaults starting vhost with MSI-X).
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
    vs+=(-chardev "socket,id=vs$i,path=$sock" -netdev "vhost-user,id=vsn$i,chardev=vs$i"
         -device "$VM_NET_DEVICE,netdev=vsn$i")
  done
  VM_RESULTS=$results
  rm -f "$results"/{stdout,ready,done,stderr,rc,rc.tmp,boot-error,dmesg,console.log}
  # Guest RAM is a sealed memfd shared with the backend (vsocketd refuses
  # memory that could shrink under it).
  qemu-system-x86_64 \
    -accel tcg,thread=multi -cpu max -smp 1 -m 512 \
    -object memory-backend-memfd,id=mem0,size=512M,share=on -machine memory-backend=mem0 \
    -nographic -monitor none -no-reboot \
    -chardev "file,id=con0,path=$results/console.log" -serial chardev:con0 \
    -kernel "$VM_CACHE/vmlinuz" -initrd "$VM_CACHE/initramfs.cpio.gz" \
    -append "console=ttyS0 quiet loglevel=3 panic=-1 vsocket.timeout=$((timeout - 20)) $*" \
    "${vs[@]}" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -virtfs "local,path=$results,mount_tag=results,security_model=none" \
    </dev/null >"$results/qemu.log" 2>&1 &
  VM_PID=$!
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
