#!/bin/busybox sh
# shellcheck shell=dash
# /init of the live-migration test guest (tests/vm/migrate.sh appends it,
# with the job and its binaries, to tests/vm/prepare.sh's initramfs). Not
# meant to be run on the host.
#
# Unlike guest-init.sh it mounts no 9p share: QEMU refuses to migrate a VM
# with a mounted virtfs export. Everything the job needs is in the
# initramfs (/stage: job.sh, the binaries, their libraries at their host
# paths); the job reports on the serial console, lines starting "mig: ".
#
# Kernel command line parameters:
#   vsocket.timeout=SECS   bound on the job
#   vsocket.hugepages=N    2 MiB pages to reserve (default 24)
#   mig.nic=ADDR/LEN       an ordinary NIC (a transitional virtio-net-pci on
#                          a tap, tests/vm/migrate_hosts.sh): the vSocket
#                          functions (1af4:1041) go to uio_pci_generic
#                          first, then virtio_net is loaded and the NIC
#                          gets ADDR/LEN (as guest-init.sh's vsocket.nic)
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1

TIMEOUT=300 HUGEPAGES=24 NIC=""
# shellcheck disable=SC2013  # the kernel command line is words
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    vsocket.timeout=*) TIMEOUT=${arg#*=} ;;
    vsocket.hugepages=*) HUGEPAGES=${arg#*=} ;;
    mig.nic=*) NIC=${arg#*=} ;;
  esac
done

while read -r m; do
  insmod "/lib/modules/$m.ko" || echo "mig: insmod $m failed"
done < /etc/modules.order
if [ -n "$NIC" ]; then
  # virtio_net binds every virtio-net device: the vSocket functions go to
  # uio_pci_generic before it loads (vsocket-guestd finds them bound).
  for d in /sys/bus/pci/devices/*; do
    [ "$(cat "$d/vendor"):$(cat "$d/device")" = 0x1af4:0x1041 ] || continue
    [ -e "$d/driver" ] && echo "${d##*/}" > "$d/driver/unbind"
    echo uio_pci_generic > "$d/driver_override"
    echo "${d##*/}" > /sys/bus/pci/drivers_probe
  done
  while read -r m; do
    insmod "/lib/modules/$m.ko" || echo "mig: insmod $m failed"
  done < /etc/modules.net
  ip link set lo up
  nic=""
  for n in /sys/class/net/*; do
    [ "${n##*/}" = lo ] || nic=${n##*/}
  done
  { [ -n "$nic" ] && ip addr add "$NIC" dev "$nic" && ip link set "$nic" up; } || echo "mig: cannot configure the NIC ($NIC)"
fi
echo "$HUGEPAGES" > /proc/sys/vm/nr_hugepages
mkdir -p /run /tmp
mount -t tmpfs -o mode=1777 shm /dev/shm 2>/dev/null || { mkdir -p /dev/shm && mount -t tmpfs -o mode=1777 shm /dev/shm; }

cd /stage && timeout -s KILL "$TIMEOUT" sh /stage/job.sh
echo "mig: job exited with $?"
sync
reboot -f
sleep 5; poweroff -f
