# libvirt_domain (issue 35): sourced by vm_mode.sh, whose daemon serves the
# port vmq and whose helpers (ctl, stat, pass, fail) it uses.
#
#   libvirt_domain  the domain of deploy/libvirt/vsocket-domain.xml, as an
#                   operator would define it (its vhost-user interface, MAC,
#                   memory backing and qemu:override), plus the test bed's
#                   boot (kernel, initramfs, 9p shares, serial to a file),
#                   started by a real libvirtd (Debian's 9.0, TCG): QEMU's
#                   command line carries every property the override sets,
#                   and in the guest vsocket-guestd finds the function by
#                   itself, opens a session (HELLO) and checks 16 ECHOes,
#                   counted by vsocketd; the link status feature negotiated.
#                   libvirtd runs in a mount namespace of the test's own
#                   (its qemu.conf, state, logs and the libvirt-qemu user it
#                   insists on exist only there): the machine's libvirt
#                   configuration is not touched. The domain's VM is not
#                   vsocketd's before: vSocket's libvirt hook
#                   (deploy/libvirt/vsocket-qemu-hook, in that libvirtd's
#                   hooks/qemu.d) adds it from the domain's metadata when
#                   libvirtd prepares the domain and removes it when the
#                   domain is released (decision 138); called first as
#                   libvirtd calls it at an incoming migration (migrate
#                   begin), it adds the VM incoming and prints nothing.

# libvirt_domain_xml EXAMPLE SOCKET RESULTS: the example, its interface on
# SOCKET, booted as the test bed boots its guests.
libvirt_domain_xml() {
  python3 - "$1" "$2" "$3" "$VM_CACHE" <<'PY'
import sys
import xml.etree.ElementTree as ET
example, sock, results, cache = sys.argv[1:5]
Q = "http://libvirt.org/schemas/domain/qemu/1.0"
ET.register_namespace("qemu", Q)
ET.register_namespace("vsocket", "urn:vsocket:domain:1")
d = ET.parse(example).getroot()
d.set("type", "qemu")  # no KVM on the test machines
d.find("name").text = "vsocket-test-" + str(abs(hash(results)) % 100000)
d.find("memory").text = "512"
d.find("vcpu").text = "1"
d.find("devices/interface/source").set("path", sock)
vm = d.find("metadata/{urn:vsocket:domain:1}vm")
vm.set("tenant", "1")
vm.set("addresses", "203.0.113.31")
os_ = d.find("os")
for tag, text in (("kernel", cache + "/vmlinuz"), ("initrd", cache + "/initramfs.cpio.gz"),
                  ("cmdline", "console=ttyS0 quiet loglevel=3 panic=-1 vsocket.timeout=100")):
    ET.SubElement(os_, tag).text = text
ET.SubElement(d, "on_reboot").text = "destroy"
dev = d.find("devices")
ET.SubElement(dev, "emulator").text = "/usr/bin/qemu-system-x86_64"
for src, tag, ro in (("/", "hostroot", True), (results, "results", False)):
    fs = ET.SubElement(dev, "filesystem", type="mount", accessmode="passthrough", multidevs="remap")
    ET.SubElement(fs, "source", dir=src)
    ET.SubElement(fs, "target", dir=tag)
    if ro:
        ET.SubElement(fs, "readonly")
serial = ET.SubElement(dev, "serial", type="file")
ET.SubElement(serial, "source", path=results + "/console.log")
ET.ElementTree(d).write(sys.stdout, encoding="unicode")
PY
}

case_libvirt_domain() {
  local R=$WORK/libvirt t0=$SECONDS L=$WORK/libvirt-ns
  if ! command -v libvirtd >/dev/null 2>&1 || ! command -v virsh >/dev/null 2>&1; then
    fail libvirt_domain "libvirtd or virsh missing (tests/rdma/install-deps.sh installs them)"
    return
  fi
  mkdir -p "$R" "$L"
  cp "$BIN/guest/agent/vsocket-guestd" "$R/"
  cat > "$R/job.sh" <<'JOB'
cd /run/vsocket-vm
./vsocket-guestd --echo 16 > agent.out 2>&1
echo "agent exit $?"
JOB
  libvirt_domain_xml deploy/libvirt/vsocket-domain.xml "$WORK/lv.sock" "$R" > "$R/domain.xml" ||
    { fail libvirt_domain "could not make the domain from deploy/libvirt/vsocket-domain.xml"; return; }
  local hellos0 echoes0 name kept out
  hellos0=$(stat hellos) echoes0=$(stat echoes)
  name=$(sed -n 's:.*<name>\(.*\)</name>.*:\1:p' "$R/domain.xml")
  kept=$WORK/ctl.sock.vms.d/$name.conf
  # The hook, as libvirtd calls it on a migration's destination (its XML
  # on stdin, its output taken for a new XML if any), then on release.
  printf 'VSOCKETCTL=%s\nVSOCKET_CTL_SOCKET=%s\n' "$BIN/host-backend/vsocketctl" "$WORK/ctl.sock" > "$L/hook.conf"
  out=$(VSOCKET_HOOK_CONF=$L/hook.conf deploy/libvirt/vsocket-qemu-hook "$name" migrate begin - < "$R/domain.xml" 2>"$R/hook.err")
  [ -z "$out" ] || { fail libvirt_domain "the hook printed at migrate begin (libvirt takes it for the domain's XML): $out"; return; }
  grep -qx "incoming = true" "$kept" 2>/dev/null ||
    { fail libvirt_domain "migrate begin: vsocketd did not keep $name as incoming ($(cat "$R/hook.err" "$kept" 2>&1 | tr '\n' ' '))"; return; }
  VSOCKET_HOOK_CONF=$L/hook.conf deploy/libvirt/vsocket-qemu-hook "$name" release end - < "$R/domain.xml" 2>>"$R/hook.err"
  [ ! -e "$kept" ] || { fail libvirt_domain "release end: $name still kept by vsocketd ($(cat "$R/hook.err"))"; return; }
  grep -q "operator: vm add $name (tenant 1," "$WORK/vsocketd.log" && grep -q "operator: vm remove $name" "$WORK/vsocketd.log" ||
    { fail libvirt_domain "the hook's add and remove are not in vsocketd's log: $(cat "$R/hook.err")"; return; }
  local adds0
  adds0=$(grep -c "operator: vm add $name " "$WORK/vsocketd.log")
  # libvirtd's directories exist once its package is installed; the
  # namespace mounts its own over them.
  mkdir -p /run/libvirt /var/lib/libvirt /var/log/libvirt /var/cache/libvirt
  timeout -k 5 180 unshare -m --propagation private bash -s "$L" "$R" > "$R/libvirt.out" 2>&1 <<'LIBVIRT_NS'
L=$1 R=$2
set -u
for d in /run/libvirt /var/lib/libvirt /var/log/libvirt /var/cache/libvirt; do mount -t tmpfs -o mode=755 none "$d" || exit 1; done
mkdir -p "$L/etc"
cp -r /etc/libvirt/. "$L/etc/"
# vSocket's hook, installed as the operator guide says, and its settings.
mkdir -p "$L/etc/hooks/qemu.d"
install -m 0755 deploy/libvirt/vsocket-qemu-hook "$L/etc/hooks/qemu.d/vsocket"
cp "$L/hook.conf" "$L/etc/hooks/vsocket.conf"
printf '%s\n' 'user = "root"' 'group = "root"' 'dynamic_ownership = 0' 'security_driver = "none"' \
  'stdio_handler = "file"' > "$L/etc/qemu.conf"
mount --bind "$L/etc" /etc/libvirt || exit 1
# libvirt's QEMU driver fails to start unless its default user exists.
for f in passwd group; do cp "/etc/$f" "$L/$f"; done
getent passwd libvirt-qemu >/dev/null || echo "libvirt-qemu:x:64055:64055::/nonexistent:/usr/sbin/nologin" >> "$L/passwd"
getent group libvirt-qemu >/dev/null || echo "libvirt-qemu:x:64055:" >> "$L/group"
getent group libvirt >/dev/null || echo "libvirt:x:64056:" >> "$L/group"
mount --bind "$L/passwd" /etc/passwd && mount --bind "$L/group" /etc/group || exit 1
libvirtd > "$L/libvirtd.log" 2>&1 &
lpid=$!
V="virsh -c qemu:///system"
name=$(sed -n 's:.*<name>\(.*\)</name>.*:\1:p' "$R/domain.xml")
# Bounded from outside (timeout): the domain and libvirtd go with this shell.
trap '$V destroy "$name" >/dev/null 2>&1; kill "$lpid" 2>/dev/null' EXIT
trap 'exit 1' TERM INT
for _ in $(seq 100); do $V version >/dev/null 2>&1 && break; sleep 0.1; done
$V version | tail -2
if $V create "$R/domain.xml"; then
  for _ in $(seq 1200); do [ -f "$R/rc" ] && break; $V domstate "$name" 2>/dev/null | grep -q running || break; sleep 0.1; done
  $V destroy "$name" >/dev/null 2>&1
fi
cp "/var/log/libvirt/qemu/$name.log" "$R/qemu-libvirt.log" 2>/dev/null
kill "$lpid"; wait "$lpid"
echo "libvirtd done"
LIBVIRT_NS
  local hellos echoes
  hellos=$(stat hellos) echoes=$(stat echoes)
  echo "  libvirt: $(tr '\n' ' ' < "$R/libvirt.out")"
  echo "  agent: $(tr '\n' ' ' < "$R/agent.out" 2>/dev/null)"
  echo "  vsocketd: hellos $hellos0 -> $hellos, echoes $echoes0 -> $echoes"
  grep -q "libvirtd done" "$R/libvirt.out" || { fail libvirt_domain "libvirtd's namespace did not finish"; return; }
  grep -q "created from" "$R/libvirt.out" || { fail libvirt_domain "virsh create failed: $(tail -3 "$R/libvirt.out")"; return; }
  local p missing=""
  for p in '"driver":"virtio-net-pci-non-transitional"' '"mac":"02:76:73:00:00:01"' '"vectors":0' '"status":true' \
      '"ctrl_vq":false' '"ctrl_rx":false' '"mq":false' '"mrg_rxbuf":false' '"type":"vhost-user"' \
      '"qom-type":"memory-backend-memfd"' '"share":true' 'reconnect'; do
    grep -qF "$p" "$R/qemu-libvirt.log" 2>/dev/null || missing+=" $p"
  done
  [ -z "$missing" ] || { fail libvirt_domain "QEMU's command line from libvirt lacks:$missing"; return; }
  grep -q "agent exit 0" "$R/stdout" 2>/dev/null || { fail libvirt_domain "the agent failed: $(cat "$R/agent.out" 2>/dev/null)"; return; }
  grep -q "16 ECHOes of 4096 bytes checked" "$R/agent.out" || { fail libvirt_domain "no ECHOes checked"; return; }
  # The link status feature (bit 16): status=on came through the override.
  local feat
  feat=$(sed -n 's/.*features \(0x[0-9a-f]*\),.*/\1/p' "$R/agent.out" | head -1)
  [ -n "$feat" ] && [ $((feat & 0x10000)) -ne 0 ] || { fail libvirt_domain "features $feat: no link status"; return; }
  [ "$hellos" -gt "$hellos0" ] && [ $((echoes - echoes0)) -ge 16 ] ||
    { fail libvirt_domain "vsocketd counted hellos $hellos0 -> $hellos, echoes $echoes0 -> $echoes"; return; }
  # libvirtd's own calls of the hook: the VM added at prepare (its port is
  # what the guest reached), removed at release.
  [ "$(grep -c "operator: vm add $name " "$WORK/vsocketd.log")" -gt "$adds0" ] ||
    { fail libvirt_domain "libvirtd's hook did not add $name at vsocketd (the domain reached a port nobody added?)"; return; }
  [ "$(grep -c "operator: vm remove $name" "$WORK/vsocketd.log")" -ge 2 ] && [ ! -e "$kept" ] ||
    { fail libvirt_domain "libvirtd's hook did not remove $name when the domain was released"; return; }
  echo "  hook: migrate begin added $name incoming (nothing printed), release end removed it; libvirtd's prepare added it, its release removed it"
  pass libvirt_domain $((SECONDS - t0))
}
