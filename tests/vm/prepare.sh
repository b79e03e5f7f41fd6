#!/usr/bin/env bash
# Builds the VM-mode test guest's initramfs (busybox, virtio-pci, 9p,
# uio_pci_generic, and virtio_net for the foreign-driver case) from the
# Debian kernel tests/rdma/prepare.sh caches (it is run first: it downloads
# the kernel once).
#
# Usage: tests/vm/prepare.sh
# Cache: ${VSOCKET_VM_CACHE:-/var/cache/vsocket-vm}/{vmlinuz,initramfs.cpio.gz,stamp}
# Idempotent: rebuilds only when this script, guest-init.sh or the kernel
# changed.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
RDMA_CACHE=${VSOCKET_RDMA_CACHE:-/var/cache/vsocket-rdma}
CACHE=${VSOCKET_VM_CACHE:-/var/cache/vsocket-vm}
INIT_SRC="$HERE/guest-init.sh"
# Loaded always, in order (dependencies resolved below).
BASE=(virtio_pci 9p 9pnet_virtio uio_pci_generic)
# Loaded only with vsocket.virtio_net=1.
NET=(virtio_net)

die() { echo "vm/prepare.sh: $*" >&2; exit 1; }
"$HERE/../rdma/prepare.sh" || die "tests/rdma/prepare.sh failed (run tests/rdma/install-deps.sh)"
KDIR=$(readlink -f "$RDMA_CACHE/current")
KVER=$(find "$KDIR/root/lib/modules" -mindepth 1 -maxdepth 1 -printf '%f\n' | head -1)
[ -n "$KVER" ] || die "no kernel in $KDIR"

RECIPE=$( (cat "$0" "$INIT_SRC"; echo "$KDIR $KVER") | sha256sum | cut -d' ' -f1)
valid() { [ -f "$CACHE/stamp" ] && [ "$(cat "$CACHE/stamp")" = "$RECIPE" ] && [ -s "$CACHE/initramfs.cpio.gz" ]; }
valid && exit 0
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock -w 300 9 || die "timed out waiting for $CACHE/.lock"
valid && exit 0

STAGE=$(mktemp -d "$CACHE/.stage-XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,newroot,results,lib/modules}
cp /bin/busybox "$STAGE/bin/busybox"
cp "$INIT_SRC" "$STAGE/init"
chmod 755 "$STAGE/init"
mknod -m 600 "$STAGE/dev/console" c 5 1 2>/dev/null || true

declare -A seen=()
# add_modules LISTFILE MODULE...: appends each module and its dependencies,
# in load order, skipping those already listed.
add_modules() {
  local list=$1 m deps kind path name
  shift
  : > "$STAGE/etc/$list"
  for m in "$@"; do
    deps=$(modprobe -d "$KDIR/root" -S "$KVER" --show-depends "$m") || die "modprobe --show-depends $m failed"
    while read -r kind path _; do
      [ "$kind" = "insmod" ] || continue
      name=$(basename "$path"); name=${name%%.ko*}
      [ -n "${seen[$name]:-}" ] && continue
      seen[$name]=1
      case "$path" in
        *.ko.xz)  xz -dc "$path"   > "$STAGE/lib/modules/$name.ko" ;;
        *.ko.zst) zstd -qdc "$path" > "$STAGE/lib/modules/$name.ko" ;;
        *.ko.gz)  gzip -dc "$path" > "$STAGE/lib/modules/$name.ko" ;;
        *)        cp "$path" "$STAGE/lib/modules/$name.ko" ;;
      esac
      echo "$name" >> "$STAGE/etc/$list"
    done <<< "$deps"
  done
}
add_modules modules.order "${BASE[@]}"
add_modules modules.net "${NET[@]}"

(cd "$STAGE" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) | gzip -9 > "$CACHE/initramfs.tmp"
mv "$CACHE/initramfs.tmp" "$CACHE/initramfs.cpio.gz"
cp "$KDIR/vmlinuz" "$CACHE/vmlinuz"
echo "$RECIPE" > "$CACHE/stamp"
echo "vm/prepare.sh: kernel $KVER; modules $(tr '\n' ' ' < "$STAGE/etc/modules.order")+ virtio_net: $(tr '\n' ' ' < "$STAGE/etc/modules.net")" >&2
