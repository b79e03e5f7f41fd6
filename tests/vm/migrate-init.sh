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
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1

TIMEOUT=300 HUGEPAGES=24
# shellcheck disable=SC2013  # the kernel command line is words
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    vsocket.timeout=*) TIMEOUT=${arg#*=} ;;
    vsocket.hugepages=*) HUGEPAGES=${arg#*=} ;;
  esac
done

while read -r m; do
  insmod "/lib/modules/$m.ko" || echo "mig: insmod $m failed"
done < /etc/modules.order
echo "$HUGEPAGES" > /proc/sys/vm/nr_hugepages
mkdir -p /run /tmp
mount -t tmpfs -o mode=1777 shm /dev/shm 2>/dev/null || { mkdir -p /dev/shm && mount -t tmpfs -o mode=1777 shm /dev/shm; }

cd /stage && timeout -s KILL "$TIMEOUT" sh /stage/job.sh
echo "mig: job exited with $?"
sync
reboot -f
sleep 5; poweroff -f
