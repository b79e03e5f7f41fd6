#!/usr/bin/env bash
# Caches a Debian kernel with Soft-RoCE (rdma_rxe) and a busybox initramfs for
# tests/rdma/run-in-qemu.sh. The development kernel has no RDMA support, so the
# harness boots Debian's stock 6.1 kernel under QEMU TCG instead.
#
# Usage: tests/rdma/prepare.sh [--refresh]
#   --refresh   re-resolve the kernel package from apt (e.g. after a point
#               release) instead of reusing the cached kernel.
#
# Cache: ${VSOCKET_RDMA_CACHE:-/var/cache/vsocket-rdma}
#   <pkg>_<version>/root/     unpacked kernel package, depmod'ed
#   <pkg>_<version>/vmlinuz
#   <pkg>_<version>/initramfs.cpio.gz
#   <pkg>_<version>/stamp     written last; says the directory is complete and
#                             which prepare.sh/guest-init.sh built it
#   current -> <pkg>_<version>
# Idempotent: does nothing when `current` is complete and was built by the
# present prepare.sh + guest-init.sh (editing either rebuilds the initramfs only).
set -euo pipefail

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
REFRESH=0
while [ $# -gt 0 ]; do
  case "$1" in
    --refresh) REFRESH=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "prepare.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${VSOCKET_RDMA_CACHE:-/var/cache/vsocket-rdma}
INIT_SRC="$HERE/guest-init.sh"

# Modules to load, in this order. Dependencies come from the kernel's own
# modules.dep (modprobe --show-depends); what is listed here is what nothing
# depends on but the guest needs:
#   crc32_generic  rxe computes its ICRC through the crypto API by name;
#                  without the module `rdma link add` fails with ENOENT.
#   ib_uverbs      /dev/infiniband/uverbs* for libibverbs.
#   rdma_cm rdma_ucm  /dev/infiniband/rdma_cm for librdmacm users.
#   veth bridge    deploy/testbed2.sh inside the guest (tests/rdma/cross_host_in_qemu.sh).
#   nf_tables nft_reject_inet  nft inside the guest (fault injection on the peering port).
MODULES=(virtio_pci virtio_net 9p 9pnet_virtio crc32_generic
         ib_core ib_uverbs rdma_rxe rdma_cm rdma_ucm veth bridge nf_tables nft_reject_inet)

die() { echo "prepare.sh: $*" >&2; exit 1; }
for tool in apt-get apt-cache dpkg-deb depmod modprobe cpio gzip sha256sum; do
  command -v "$tool" >/dev/null || die "missing $tool; run tests/rdma/install-deps.sh"
done
[ -x /bin/busybox ] || die "missing /bin/busybox; run tests/rdma/install-deps.sh"
# Must be the static busybox: the initramfs has no libc.
if ldd /bin/busybox >/dev/null 2>&1; then die "/bin/busybox is not static (install busybox-static)"; fi
[ -f "$INIT_SRC" ] || die "missing $INIT_SRC"

# What the initramfs is built from; a change rebuilds it.
RECIPE=$(cat "$0" "$INIT_SRC" | sha256sum | cut -d' ' -f1)
cache_valid() {
  [ "$REFRESH" = 0 ] && [ -f "$CACHE/current/stamp" ] &&
    [ "$(cat "$CACHE/current/stamp")" = "$RECIPE" ] &&
    [ -s "$CACHE/current/vmlinuz" ] && [ -s "$CACHE/current/initramfs.cpio.gz" ]
}
# Fast path first, without the lock, so a read-only cache works too.
cache_valid && exit 0

mkdir -p "$CACHE"
# Serialize concurrent prepares (two test runs starting at once), then check
# again: the other one may just have built it.
exec 9>"$CACHE/.lock"
flock -w 600 9 || die "timed out waiting for $CACHE/.lock"
cache_valid && exit 0

# --- kernel package ---------------------------------------------------------
# Reuse the cached kernel unless asked to refresh (keeps runs reproducible and
# offline); otherwise take the versioned package linux-image-amd64 depends on.
KDIR=""
if [ "$REFRESH" = 0 ] && [ -L "$CACHE/current" ] && [ -d "$CACHE/current/root/lib/modules" ]; then
  KDIR=$(readlink -f "$CACHE/current")
else
  PKG=$(apt-cache depends linux-image-amd64 2>/dev/null |
        sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | head -1)
  if [ -z "$PKG" ]; then
    apt-get update -qq >/dev/null 2>&1 || true
    PKG=$(apt-cache depends linux-image-amd64 2>/dev/null |
          sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | head -1)
  fi
  [ -n "$PKG" ] || die "cannot resolve the kernel package linux-image-amd64 depends on"
  VER=$(apt-cache policy "$PKG" | sed -n 's/^ *Candidate: //p')
  if [ -z "$VER" ] || [ "$VER" = "(none)" ]; then die "no candidate version for $PKG"; fi
  KDIR="$CACHE/${PKG}_${VER}"
fi

if [ ! -f "$KDIR/root/.unpacked" ]; then
  PKG=${PKG:-$(basename "$KDIR" | cut -d_ -f1)}
  echo "prepare.sh: downloading and unpacking $PKG into $KDIR" >&2
  rm -rf "$KDIR"
  mkdir -p "$KDIR/dl"
  # apt-get download runs as the _apt user unless told otherwise; we are root
  # writing into a root-owned cache, so skip the sandbox (avoids a warning).
  (cd "$KDIR/dl" && apt-get -qq -o APT::Sandbox::User=root download "$PKG") \
    || die "apt-get download $PKG failed"
  dpkg-deb -x "$KDIR"/dl/*.deb "$KDIR/root"
  rm -rf "$KDIR/dl"   # the .deb is 70 MB; the unpacked tree is all we need
  touch "$KDIR/root/.unpacked"
fi

KVER=$(find "$KDIR/root/lib/modules" -mindepth 1 -maxdepth 1 -printf '%f\n' | head -1)
if [ -z "$KVER" ] || [ ! -f "$KDIR/root/boot/vmlinuz-$KVER" ]; then die "bad kernel tree in $KDIR"; fi
# The package ships no modules.dep (the postinst makes it); build it.
[ -s "$KDIR/root/lib/modules/$KVER/modules.dep" ] || depmod -b "$KDIR/root" "$KVER"

# --- initramfs --------------------------------------------------------------
STAGE=$(mktemp -d "$CACHE/.stage-XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,newroot,results,lib/modules}
cp /bin/busybox "$STAGE/bin/busybox"
cp "$INIT_SRC" "$STAGE/init"
chmod 755 "$STAGE/init"
# The kernel opens /dev/console for init before anything is mounted; without
# the node init starts with no stdin/stdout.
mknod -m 600 "$STAGE/dev/console" c 5 1 2>/dev/null || true
echo "$KVER" > "$STAGE/etc/kernel-version"

# Resolve each module's dependencies, in load order, without duplicates.
: > "$STAGE/etc/modules.order"
declare -A seen=()
for m in "${MODULES[@]}"; do
  deps=$(modprobe -d "$KDIR/root" -S "$KVER" --show-depends "$m") \
    || die "modprobe --show-depends $m failed"
  while read -r kind path _; do
    [ "$kind" = "insmod" ] || continue   # "builtin X" needs nothing
    name=$(basename "$path"); name=${name%%.ko*}
    [ -n "${seen[$name]:-}" ] && continue
    seen[$name]=1
    case "$path" in   # decompress if the kernel ships compressed modules
      *.ko.xz)  xz -dc "$path"   > "$STAGE/lib/modules/$name.ko" ;;
      *.ko.zst) zstd -qdc "$path" > "$STAGE/lib/modules/$name.ko" ;;
      *.ko.gz)  gzip -dc "$path" > "$STAGE/lib/modules/$name.ko" ;;
      *)        cp "$path" "$STAGE/lib/modules/$name.ko" ;;
    esac
    echo "$name" >> "$STAGE/etc/modules.order"
  done <<< "$deps"
done

(cd "$STAGE" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) |
  gzip -9 > "$KDIR/initramfs.cpio.gz.tmp"
mv "$KDIR/initramfs.cpio.gz.tmp" "$KDIR/initramfs.cpio.gz"
cp "$KDIR/root/boot/vmlinuz-$KVER" "$KDIR/vmlinuz"
echo "$RECIPE" > "$KDIR/stamp"
ln -sfn "$(basename "$KDIR")" "$CACHE/current.tmp"
mv -T "$CACHE/current.tmp" "$CACHE/current"
echo "prepare.sh: kernel $KVER, initramfs with $(wc -l < "$STAGE/etc/modules.order") modules: $(tr '\n' ' ' < "$STAGE/etc/modules.order")" >&2
