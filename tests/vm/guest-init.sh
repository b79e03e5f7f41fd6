#!/bin/busybox sh
# shellcheck shell=dash
# /init of the VM-mode test guest (packed by tests/vm/prepare.sh, booted by
# tests/vm/lib.sh). Not meant to be run on the host.
#
# Loads virtio-pci, 9p and uio_pci_generic (and the kernel's virtio_net
# only when asked: vsocket.virtio_net=1, the foreign-driver case), reserves
# huge pages for vsocket-guestd's rings, chroots into the host root (9p,
# read-only) and runs results/job.sh with the host's bash; its stdout,
# stderr and exit code go to results/{stdout,stderr,rc}. Then powers off.
#
# Kernel command line parameters:
#   vsocket.timeout=SECS   bound on the job inside the guest
#   vsocket.virtio_net=1   load virtio_net (it binds every virtio-net device)
#   vsocket.hugepages=N    2 MiB pages to reserve (default 8)
#   vsocket.nic=ADDR/LEN   the guest's ordinary NIC (a transitional
#                          virtio-net-pci, 1af4:1000) up with ADDR/LEN: the
#                          vSocket functions (1af4:1041) go to
#                          uio_pci_generic first, then virtio_net is loaded
#                          and binds the NIC alone
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1

log() { echo "vm-guest-init: $*"; }
fail() {
  log "FATAL: $*"
  [ -d /results/. ] && echo "$*" > /results/boot-error 2>/dev/null
  sync
  reboot -f
  sleep 5; poweroff -f
}

TIMEOUT=120 VIRTIO_NET=0 HUGEPAGES=8 NIC=
# shellcheck disable=SC2013  # the kernel command line is words
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    vsocket.timeout=*) TIMEOUT=${arg#*=} ;;
    vsocket.virtio_net=*) VIRTIO_NET=${arg#*=} ;;
    vsocket.hugepages=*) HUGEPAGES=${arg#*=} ;;
    vsocket.nic=*) NIC=${arg#*=} ;;
  esac
done

while read -r m; do
  insmod "/lib/modules/$m.ko" || fail "insmod $m failed"
done < /etc/modules.order
if [ -n "$NIC" ]; then
  # virtio_net binds every virtio-net device: hand the vSocket functions
  # to uio_pci_generic before it is loaded (vsocket-guestd finds them
  # bound already), so that it takes only the ordinary NIC.
  for d in /sys/bus/pci/devices/*; do
    [ "$(cat "$d/vendor"):$(cat "$d/device")" = 0x1af4:0x1041 ] || continue
    [ -e "$d/driver" ] && echo "${d##*/}" > "$d/driver/unbind"
    echo uio_pci_generic > "$d/driver_override"
    echo "${d##*/}" > /sys/bus/pci/drivers_probe
  done
fi
if [ "$VIRTIO_NET" = 1 ] || [ -n "$NIC" ]; then
  while read -r m; do
    insmod "/lib/modules/$m.ko" || fail "insmod $m failed"
  done < /etc/modules.net
fi
if [ -n "$NIC" ]; then
  ip link set lo up
  for n in /sys/class/net/*; do
    [ "${n##*/}" = lo ] || nic=${n##*/}
  done
  [ -n "${nic:-}" ] || fail "vsocket.nic: no network device"
  ip addr add "$NIC" dev "$nic" && ip link set "$nic" up || fail "cannot configure $nic with $NIC"
fi

P9="trans=virtio,version=9p2000.L,msize=524288"
mount -t 9p -o "$P9" results /results || fail "cannot mount the results share"
mount -t 9p -o "$P9,ro,cache=loose" hostroot /newroot || fail "cannot mount the hostroot share"
echo "$HUGEPAGES" > /proc/sys/vm/nr_hugepages
[ "$(cat /proc/sys/vm/nr_hugepages)" = "$HUGEPAGES" ] || log "only $(cat /proc/sys/vm/nr_hugepages) huge pages"

R=/newroot
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mount --bind /dev $R/dev
mount -t tmpfs -o mode=1777 shm $R/dev/shm
mount -t tmpfs -o mode=1777 tmp $R/tmp
mount -t tmpfs -o mode=755 run $R/run
[ -d $R/var/tmp ] && mount -t tmpfs -o mode=1777 vartmp $R/var/tmp
mkdir -p $R/run/vsocket-vm
mount --bind /results $R/run/vsocket-vm

chroot $R /usr/bin/env -i \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/tmp TMPDIR=/tmp LANG=C.UTF-8 TERM=dumb \
  /usr/bin/timeout -k 5 "$TIMEOUT" /bin/bash /run/vsocket-vm/job.sh \
  >/results/stdout 2>/results/stderr
rc=$?
dmesg > /results/dmesg 2>/dev/null
echo "$rc" > /results/rc.tmp && mv /results/rc.tmp /results/rc
log "job exited with $rc"
sync
reboot -f
sleep 5; poweroff -f
