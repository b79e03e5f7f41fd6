#include "guest/agent/pci_function.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

namespace vsocket::agent {
namespace {

const std::string kDevices = "/sys/bus/pci/devices/";

Result<std::string> ReadLine(const std::string& path) {
  FILE* f = fopen(path.c_str(), "re");
  if (f == nullptr) return Status::FromErrno("open " + path);
  char buf[256] = {};
  bool ok = fgets(buf, sizeof(buf), f) != nullptr;
  fclose(f);
  if (!ok) return Status(Code::kInternal, "empty " + path);
  std::string s(buf);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

Status WriteString(const std::string& path, const std::string& value) {
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno("open " + path);
  ssize_t n = write(fd, value.data(), value.size());
  int err = errno;
  close(fd);
  if (n != static_cast<ssize_t>(value.size())) return Status::FromErrno("write '" + value + "' to " + path, err);
  return Status::Ok();
}

// The driver bound to bdf ("" if none).
std::string DriverOf(const std::string& bdf, const std::string& devices = kDevices) {
  char target[512] = {};
  ssize_t n = readlink((devices + bdf + "/driver").c_str(), target, sizeof(target) - 1);
  if (n <= 0) return "";
  std::string t(target, static_cast<size_t>(n));
  return t.substr(t.rfind('/') + 1);
}

// /dev/uioN of a function bound to uio_pci_generic.
Result<std::string> UioNode(const std::string& bdf) {
  DIR* d = opendir((kDevices + bdf + "/uio").c_str());
  if (d == nullptr) return Status::FromErrno("no uio device under " + kDevices + bdf);
  std::string node;
  while (dirent* e = readdir(d))
    if (strncmp(e->d_name, "uio", 3) == 0) node = std::string("/dev/") + e->d_name;
  closedir(d);
  if (node.empty()) return Status(Code::kNotFound, "no uio device under " + kDevices + bdf);
  return node;
}

}  // namespace

BarMapping& BarMapping::operator=(BarMapping&& o) noexcept {
  if (this != &o) {
    if (base_ != nullptr) munmap(base_, size_);
    base_ = o.base_;
    size_ = o.size_;
    o.base_ = nullptr;
  }
  return *this;
}

BarMapping::~BarMapping() {
  if (base_ != nullptr) munmap(base_, size_);
}

std::vector<std::string> PciFunction::Find(uint16_t vendor, uint16_t device, const std::string& devices) {
  std::vector<std::string> out;
  DIR* d = opendir(devices.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string bdf = e->d_name;
    auto v = ReadLine(devices + bdf + "/vendor");
    auto p = ReadLine(devices + bdf + "/device");
    if (!v.ok() || !p.ok()) continue;
    if (strtoul(v->c_str(), nullptr, 16) == vendor && strtoul(p->c_str(), nullptr, 16) == device) out.push_back(bdf);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

// The driver of the virtio device on a function virtio-pci holds
// (BDF/virtioN/driver: "virtio_net"), "" if none took it.
std::string VirtioDriverOf(const std::string& fn) {
  std::string driver;
  DIR* d = opendir(fn.c_str());
  if (d == nullptr) return driver;
  while (dirent* e = readdir(d)) {
    if (strncmp(e->d_name, "virtio", 6) != 0) continue;
    char target[512] = {};
    ssize_t n = readlink((fn + "/" + e->d_name + "/driver").c_str(), target, sizeof(target) - 1);
    if (n > 0) {
      std::string t(target, static_cast<size_t>(n));
      driver = t.substr(t.rfind('/') + 1);
    }
  }
  closedir(d);
  return driver;
}

// The network interfaces of a function a virtio driver bound:
// BDF/virtioN/net/IFACE/address. {name, mac} pairs.
std::vector<std::pair<std::string, std::string>> NetInterfaces(const std::string& fn) {
  std::vector<std::pair<std::string, std::string>> out;
  DIR* d = opendir(fn.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (strncmp(e->d_name, "virtio", 6) != 0) continue;
    const std::string net = fn + "/" + e->d_name + "/net/";
    DIR* n = opendir(net.c_str());
    if (n == nullptr) continue;
    while (dirent* i = readdir(n)) {
      if (i->d_name[0] == '.') continue;
      auto mac = ReadLine(net + i->d_name + "/address");
      out.emplace_back(i->d_name, mac.ok() ? *mac : "");
    }
    closedir(n);
  }
  closedir(d);
  return out;
}

bool HasPrefix(const std::string& mac, const std::string& prefix) {
  if (mac.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (tolower(static_cast<unsigned char>(mac[i])) != tolower(static_cast<unsigned char>(prefix[i]))) return false;
  return true;
}

}  // namespace

Result<std::vector<std::string>> PciFunction::VsocketFunctions(const std::string& mac_prefix) {
  FunctionChoice choice = FindVsocket(mac_prefix);
  for (const std::string& why : choice.skipped) fprintf(stderr, "vsocket-guestd: left alone: %s\n", why.c_str());
  if (choice.vsocket.empty())
    return Status(Code::kNotFound,
                  "no vSocket function in this guest (a virtio-net-pci function with disable-legacy=on, 1af4:1041, "
                  "that no network driver holds" +
                      (mac_prefix.empty() ? std::string() : " or whose MAC starts with " + mac_prefix) +
                      "; docs/vm-mode.md)");
  return std::move(choice.vsocket);
}

FunctionChoice PciFunction::FindVsocket(const std::string& mac_prefix, const std::string& devices) {
  FunctionChoice c;
  for (const std::string& bdf : Find(0x1af4, 0x1041, devices)) {
    std::string driver = DriverOf(bdf, devices);
    // virtio-pci is only the transport: what holds the function is the
    // driver of its virtio device (virtio_net), if one took it.
    if (driver == "virtio-pci") driver = VirtioDriverOf(devices + bdf);
    if (driver.empty() || driver == "uio_pci_generic" || mac_prefix.empty()) {
      c.vsocket.push_back(bdf);
      continue;
    }
    auto nics = NetInterfaces(devices + bdf);
    if (nics.size() == 1 && HasPrefix(nics[0].second, mac_prefix)) {
      c.vsocket.push_back(bdf);
      continue;
    }
    std::string why = bdf + ": driver " + driver;
    for (const auto& [name, mac] : nics) why += ", interface " + name + " (MAC " + mac + ")";
    why += nics.empty() ? ": another driver's, not taken" : ": the VM's own NIC, not a vSocket function";
    c.skipped.push_back(why + " (a vSocket function's MAC starts with " + mac_prefix + ", docs/vm-mode.md)");
  }
  return c;
}

Result<PciFunction> PciFunction::BindToUio(const std::string& bdf) {
  struct stat st{};
  if (stat("/sys/bus/pci/drivers/uio_pci_generic", &st) != 0)
    return Status(Code::kFailedPrecondition, "uio_pci_generic is not loaded (modprobe uio_pci_generic)");
  std::string driver = DriverOf(bdf);
  if (driver != "uio_pci_generic") {
    if (!driver.empty()) VS_RETURN_IF_ERROR(WriteString(kDevices + bdf + "/driver/unbind", bdf));
    VS_RETURN_IF_ERROR(WriteString(kDevices + bdf + "/driver_override", "uio_pci_generic"));
    VS_RETURN_IF_ERROR(WriteString("/sys/bus/pci/drivers_probe", bdf));
    driver = DriverOf(bdf);
    if (driver != "uio_pci_generic")
      return Status(Code::kFailedPrecondition, bdf + " did not bind to uio_pci_generic (driver now: '" + driver +
                                                   "'; uio_pci_generic needs INTx masking)");
  }
  // devtmpfs makes /dev/uioN as the driver binds; give udev-less guests a
  // moment.
  Result<std::string> node = UioNode(bdf);
  int uio = -1;
  for (int i = 0; i < 100 && node.ok(); ++i) {
    uio = open(node->c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK);  // (read only after poll says so)
    if (uio >= 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!node.ok()) return node.status();
  if (uio < 0) return Status::FromErrno("open " + *node);
  int config = open((kDevices + bdf + "/config").c_str(), O_RDWR | O_CLOEXEC);
  if (config < 0) {
    int err = errno;
    close(uio);
    return Status::FromErrno("open " + kDevices + bdf + "/config", err);
  }
  return PciFunction(bdf, UniqueFd(config), UniqueFd(uio));
}

Result<std::vector<uint8_t>> PciFunction::ReadConfig() const {
  std::vector<uint8_t> cfg(256);
  ssize_t n = pread(config_.get(), cfg.data(), cfg.size(), 0);
  if (n != static_cast<ssize_t>(cfg.size())) return Status::FromErrno("read config space of " + bdf_);
  return cfg;
}

Status PciFunction::WriteConfig16(uint32_t offset, uint16_t value) const {
  if (pwrite(config_.get(), &value, sizeof(value), offset) != sizeof(value))
    return Status::FromErrno("write config space of " + bdf_);
  return Status::Ok();
}

Status PciFunction::EnableMemoryAndBusMaster() const {
  constexpr uint32_t kCommand = 0x04;
  constexpr uint16_t kMemory = 1 << 1, kBusMaster = 1 << 2;
  uint16_t cmd = 0;
  if (pread(config_.get(), &cmd, sizeof(cmd), kCommand) != sizeof(cmd))
    return Status::FromErrno("read command register of " + bdf_);
  return WriteConfig16(kCommand, cmd | kMemory | kBusMaster);
}

Result<BarMapping> PciFunction::MapBar(int bar) const {
  std::string path = kDevices + bdf_ + "/resource" + std::to_string(bar);
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_SYNC);
  if (fd < 0) return Status::FromErrno("open " + path + " (not a memory BAR?)");
  struct stat st{};
  if (fstat(fd, &st) != 0 || st.st_size <= 0) {
    close(fd);
    return Status(Code::kFailedPrecondition, path + " has no size");
  }
  void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) return Status::FromErrno("mmap " + path, err);
  return BarMapping(static_cast<uint8_t*>(p), static_cast<size_t>(st.st_size));
}

Status PciFunction::Unmask() const {
  // uio_pci_generic masks INTx in its handler (the command register's
  // Interrupt Disable bit) and has no irqcontrol: clearing the bit in
  // config space lets the next interrupt through.
  constexpr uint32_t kCommand = 0x04;
  constexpr uint16_t kIntxDisable = 1 << 10;
  uint16_t cmd = 0;
  if (pread(config_.get(), &cmd, sizeof(cmd), kCommand) != sizeof(cmd))
    return Status::FromErrno("read command register of " + bdf_);
  if (!(cmd & kIntxDisable)) return Status::Ok();
  return WriteConfig16(kCommand, static_cast<uint16_t>(cmd & ~kIntxDisable));
}

Result<bool> PciFunction::Wait(int timeout_ms) const {
  pollfd p{uio_.get(), POLLIN, 0};
  int r = poll(&p, 1, timeout_ms);
  if (r < 0) return errno == EINTR ? Result<bool>(false) : Result<bool>(Status::FromErrno("poll uio"));
  if (r == 0) return false;
  uint32_t count = 0;
  if (read(uio_.get(), &count, sizeof(count)) != sizeof(count)) return Status::FromErrno("read uio");
  return true;
}

}  // namespace vsocket::agent
