#!/bin/busybox sh
# shellcheck shell=dash
# /init of the Soft-RoCE test guest (packed into the initramfs by prepare.sh;
# started by run-in-qemu.sh). Not meant to be run on the host.
#
# Sets up rdma_rxe on eth0, chroots into the host's root filesystem (9p share
# "hostroot", read-only) and runs the job the host left in the read-write 9p
# share "results": results/job.sh is run with the host's /bin/bash; its
# stdout/stderr/exit code go to results/{stdout,stderr,rc}. Then powers off.
#
# Kernel command line parameters (set by run-in-qemu.sh):
#   vsocket.ip=A.B.C.D/N     address of eth0
#   vsocket.timeout=SECS     bound on the job inside the guest
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1

log() { echo "guest-init: $*"; }
# Leaves the reason where the host looks for it, then powers off. The host
# sees no results/rc and reports a boot failure with this message.
fail() {
  log "FATAL: $*"
  [ -d /results/. ] && echo "$*" > /results/boot-error 2>/dev/null
  sync
  reboot -f   # QEMU runs with -no-reboot: a reboot ends it at once
  sleep 5; poweroff -f
}

IP=203.0.113.10/24
TIMEOUT=240
# shellcheck disable=SC2013  # the kernel command line is words
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    vsocket.ip=*) IP=${arg#*=} ;;
    vsocket.timeout=*) TIMEOUT=${arg#*=} ;;
  esac
done

# Order matters: the list is dependency-ordered by prepare.sh.
while read -r m; do
  insmod "/lib/modules/$m.ko" || fail "insmod $m failed"
done < /etc/modules.order

# 9p: msize well above the 8 KiB default, or every read of a binary from the
# host crawls. The host root is read-only and changes nothing while we run,
# so it can be cached aggressively; results stays uncached (writes go straight
# to the host).
P9="trans=virtio,version=9p2000.L,msize=524288"
mount -t 9p -o "$P9" results /results || fail "cannot mount the results share"
mount -t 9p -o "$P9,ro,cache=loose" hostroot /newroot || fail "cannot mount the hostroot share"

ip link set lo up
ip addr add "$IP" dev eth0 || fail "cannot set $IP on eth0"
ip link set eth0 up || fail "cannot bring eth0 up"

# The chroot: the host root is read-only, so everything that must be writable
# is a guest tmpfs mounted over the (read-only) host directory.
R=/newroot
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mount --bind /dev $R/dev          # includes /dev/infiniband/uverbs0, rdma_cm
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts $R/dev/pts
mount -t tmpfs -o mode=1777 shm $R/dev/shm   # POSIX shm / semaphores
mount -t tmpfs -o mode=1777 tmp $R/tmp
mount -t tmpfs -o mode=755 run $R/run
[ -d $R/var/tmp ] && mount -t tmpfs -o mode=1777 vartmp $R/var/tmp
mkdir -p $R/run/vsocket-rdma
mount --bind /results $R/run/vsocket-rdma   # the job's own view of results

# Soft-RoCE device over eth0 (host's iproute2 `rdma`, run in the chroot).
chroot $R /usr/bin/rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0 failed"

# The GID table fills asynchronously; wait for the RoCEv2 IPv4 GID
# (::ffff:a.b.c.d, index 1 with a single IPv4 address) so the job can use it
# right away.
ADDR=${IP%/*}
WANT=$(echo "$ADDR" | awk -F. '{printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", $1, $2, $3, $4}')
GID_INDEX=""
i=0
while [ $i -lt 100 ]; do
  for g in /sys/class/infiniband/rxe0/ports/1/gids/*; do
    if [ "$(cat "$g" 2>/dev/null)" = "$WANT" ]; then GID_INDEX=${g##*/}; break 2; fi
  done
  i=$((i + 1)); sleep 0.1
done
[ -n "$GID_INDEX" ] || fail "no RoCEv2 GID for $ADDR on rxe0"
log "rxe0 up on eth0 $IP, IPv4 GID index $GID_INDEX"

# Run the job. A clean environment (the job script exports what the caller
# asked for); coreutils timeout kills the job's whole process group, so the
# guest still reports (rc 124) instead of the host having to kill QEMU.
chroot $R /usr/bin/env -i \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/tmp TMPDIR=/tmp LANG=C.UTF-8 TERM=dumb \
  VSOCKET_RDMA_DEV=rxe0 VSOCKET_RDMA_GID_INDEX="$GID_INDEX" \
  VSOCKET_RDMA_IP="$ADDR" VSOCKET_RDMA_OUT=/run/vsocket-rdma/out \
  /usr/bin/timeout -k 5 "$TIMEOUT" /bin/bash /run/vsocket-rdma/job.sh \
  >/results/stdout 2>/results/stderr
rc=$?
echo "$rc" > /results/rc.tmp && mv /results/rc.tmp /results/rc
log "job exited with $rc"
sync
reboot -f
sleep 5; poweroff -f
