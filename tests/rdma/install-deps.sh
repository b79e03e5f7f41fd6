#!/usr/bin/env bash
# Installs, from Debian 12 packages, what the Soft-RoCE-in-QEMU harness under
# tests/rdma/ needs on the host. Idempotent and quiet; fails loudly.
#
# Usage: tests/rdma/install-deps.sh        (as root, or via sudo)
#
# Why each package:
#   qemu-system-x86 seabios ipxe-qemu  the TCG guest (BIOS + virtio-net option ROM)
#   busybox-static cpio                 the guest's initramfs (static: no libc needed)
#   kmod                                depmod/modprobe --show-depends on the Debian kernel
#   iproute2                            `rdma link add` (run from the host root in the guest)
#   rdma-core ibverbs-providers         libibverbs + librxe (the rxe userspace provider)
#   ibverbs-utils perftest              ibv_devices/ibv_devinfo/ibv_rc_pingpong, ib_write_*
#   librdmacm1 rdmacm-utils             rdma_cm and rping for tests that use the CM
#   xz-utils zstd                       decompress kernel modules if packaged compressed
#   coreutils                           timeout(1) bounds every guest command
#   libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients
#                                       tests/vm/vm_mode.sh libvirt_domain boots
#                                       docs' libvirt domain (no units shipped)
set -euo pipefail

if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
  exit 0
fi

PACKAGES=(
  qemu-system-x86 seabios ipxe-qemu
  busybox-static cpio kmod
  iproute2
  rdma-core ibverbs-providers libibverbs1
  ibverbs-utils perftest
  librdmacm1 rdmacm-utils
  xz-utils zstd
  coreutils
  libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
LOG=$(mktemp /tmp/vsocket-rdma-apt-XXXXXX.log)
export DEBIAN_FRONTEND=noninteractive
echo "rdma/install-deps: installing ${missing[*]}" >&2
# Try without refreshing the package lists first (fast, offline-friendly); run
# `apt-get update` once only if that fails (stale or missing lists).
if ! $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$LOG" 2>&1; then
  $SUDO apt-get update -qq >>"$LOG" 2>&1 \
    || { echo "rdma/install-deps: apt-get update failed:" >&2; tail -30 "$LOG" >&2; exit 1; }
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$LOG" 2>&1 \
    || { echo "rdma/install-deps: apt-get install failed:" >&2; tail -30 "$LOG" >&2; exit 1; }
fi
rm -f "$LOG"
