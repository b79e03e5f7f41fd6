// PciFunction::FindVsocket over a fake sysfs tree (decision 119): the VM's
// own virtio-net NIC is never taken; a function no network driver holds, or
// whose interface's MAC carries vSocket's prefix, is.
#include "guest/agent/pci_function.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace vsocket::agent {
namespace {

namespace fs = std::filesystem;

class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pci_function_test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    fs::create_directories(root_ / "devices");
    for (const char* d : {"virtio-pci", "virtio_net", "uio_pci_generic", "vfio-pci"}) fs::create_directories(root_ / "drivers" / d);
  }
  void TearDown() override { fs::remove_all(root_); }

  static void Write(const fs::path& p, const std::string& s) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << s << "\n";
  }
  // A function vendor:device, bound to `driver` ("" none); under
  // virtio-pci, a virtio device virtio_net holds, with a network interface
  // of that MAC, if `mac` is not "".
  void Function(const std::string& bdf, const std::string& vendor, const std::string& device,
                const std::string& driver, const std::string& mac = "") {
    const fs::path fn = root_ / "devices" / bdf;
    Write(fn / "vendor", vendor);
    Write(fn / "device", device);
    if (!driver.empty()) fs::create_directory_symlink(root_ / "drivers" / driver, fn / "driver");
    if (driver == "virtio-pci") fs::create_directories(fn / "virtio3");
    if (!mac.empty()) {
      fs::create_directory_symlink(root_ / "drivers" / "virtio_net", fn / "virtio3" / "driver");
      Write(fn / "virtio3" / "net" / ("eth" + bdf.substr(bdf.size() - 3, 1)) / "address", mac);
    }
  }
  std::string devices() const { return (root_ / "devices").string() + "/"; }

  fs::path root_;
};

TEST_F(FakeSysfs, TheVmsOwnNicIsNeverTaken) {
  Function("0000:00:03.0", "0x1af4", "0x1041", "virtio-pci", "52:54:00:12:34:56");  // the VM's NIC
  Function("0000:00:04.0", "0x1af4", "0x1041", "");                                  // kept from virtio_net
  Function("0000:00:05.0", "0x1af4", "0x1041", "virtio-pci", "02:76:73:00:00:01");  // marked vSocket's
  Function("0000:00:06.0", "0x1af4", "0x1041", "uio_pci_generic");                   // an agent had it
  Function("0000:00:07.0", "0x1af4", "0x1000", "");                                  // legacy virtio-net
  Function("0000:00:08.0", "0x8086", "0x1041", "");                                  // another vendor
  Function("0000:00:0a.0", "0x1af4", "0x1041", "virtio-pci");  // virtio_net not loaded: its device unheld
  FunctionChoice c = PciFunction::FindVsocket(kVsocketMacPrefix, devices());
  EXPECT_EQ(c.vsocket, (std::vector<std::string>{"0000:00:04.0", "0000:00:05.0", "0000:00:06.0", "0000:00:0a.0"}));
  ASSERT_EQ(c.skipped.size(), 1u);
  EXPECT_NE(c.skipped[0].find("0000:00:03.0: driver virtio_net, interface eth3 (MAC 52:54:00:12:34:56)"),
            std::string::npos)
      << c.skipped[0];
  EXPECT_NE(c.skipped[0].find("02:76:73"), std::string::npos) << c.skipped[0];
}

TEST_F(FakeSysfs, ThePrefixIsCaseBlindAndAnyTakesEveryFunction) {
  Function("0000:00:03.0", "0x1af4", "0x1041", "virtio-pci", "52:54:00:12:34:56");
  Function("0000:00:05.0", "0x1af4", "0x1041", "virtio-pci", "0a:bc:de:00:00:01");
  EXPECT_EQ(PciFunction::FindVsocket("0A:BC", devices()).vsocket, (std::vector<std::string>{"0000:00:05.0"}));
  FunctionChoice any = PciFunction::FindVsocket("", devices());
  EXPECT_EQ(any.vsocket, (std::vector<std::string>{"0000:00:03.0", "0000:00:05.0"}));
  EXPECT_TRUE(any.skipped.empty());
}

TEST_F(FakeSysfs, AFunctionAnotherDriverHoldsWithoutANicIsLeftAlone) {
  // vfio-pci (a DPDK application's, say): no interface to read a MAC from.
  Function("0000:00:09.0", "0x1af4", "0x1041", "vfio-pci");
  FunctionChoice c = PciFunction::FindVsocket(kVsocketMacPrefix, devices());
  EXPECT_TRUE(c.vsocket.empty());
  ASSERT_EQ(c.skipped.size(), 1u);
  EXPECT_NE(c.skipped[0].find("0000:00:09.0: driver vfio-pci"), std::string::npos) << c.skipped[0];
}

TEST_F(FakeSysfs, NoSysfsNoFunctions) {
  FunctionChoice c = PciFunction::FindVsocket(kVsocketMacPrefix, (root_ / "nowhere").string() + "/");
  EXPECT_TRUE(c.vsocket.empty());
  EXPECT_TRUE(c.skipped.empty());
}

}  // namespace
}  // namespace vsocket::agent
