// vsocketctl vm add's settings and the drop-in files that keep the VMs it
// adds across restarts (decision 105).
#include "host-backend/vms_dir.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <gtest/gtest.h>

namespace vsocket::backend {
namespace {

std::vector<std::string> Words(std::initializer_list<const char*> w) { return {w.begin(), w.end()}; }

class VmsDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/vms_dir_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/vms.d";
  }
  void TearDown() override { (void)!system(("rm -rf " + root_).c_str()); }
  void Write(const std::string& name, const std::string& text) {
    mkdir(dir_.c_str(), 0750);
    std::ofstream(dir_ + "/" + name) << text;
  }
  std::string root_, dir_;
};

TEST(VmAdd, TakesEveryVmKeyOfTheFileAsAFlag) {
  auto v = ParseVmAdd(Words({"web-2", "--socket", "/run/v/web2.sock", "--tenant", "7", "--addresses",
                             "198.51.100.21,2001:db8::21", "--group", "kvm", "--prove-sockets", "agent", "--direct",
                             "off"}));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->vm.vm_name, "web-2");
  EXPECT_EQ(v->vm.path, "/run/v/web2.sock");
  EXPECT_EQ(v->vm.tenant_id, 7u);
  ASSERT_EQ(v->vm.addresses.size(), 2u);
  EXPECT_EQ(v->vm.addresses[1].family, 6);
  EXPECT_EQ(v->vm.group, "kvm");
  EXPECT_TRUE(v->vm.proofs_by_agent);
  EXPECT_EQ(v->vm.direct, vhost::PortConfig::Direct::kOff);
  EXPECT_FALSE(v->vm.away);
  // The drop-in is the file's own format, read back the same.
  auto again = ParseConfig(v->text, "again");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_EQ(again->vms.size(), 1u);
  EXPECT_EQ(again->vms[0].vm_name, "web-2");
  EXPECT_EQ(again->vms[0].addresses.size(), 2u);
  EXPECT_TRUE(again->vms[0].proofs_by_agent);
}

TEST(VmAdd, RefusesBadInputSayingWhat) {
  struct Case {
    std::vector<std::string> words;
    const char* fragment;
  } cases[] = {
      {{}, "usage: vm add NAME"},
      {Words({"a/b", "--socket", "/s", "--tenant", "1"}), "'a/b' is not a VM name"},
      {Words({".hidden", "--socket", "/s", "--tenant", "1"}), "is not a VM name"},
      {Words({"a", "--socket", "/s", "--tenant"}), "usage: vm add NAME"},
      {Words({"a", "--tenant", "1"}), "vm add a: --socket PATH is missing"},
      {Words({"a", "--socket", "/s"}), "vm add a: --tenant T (1..4294967295) is missing"},
      {Words({"a", "--socket", "/s", "--tenant", "0"}), "vm add a: tenant must be 1..4294967295"},
      {Words({"a", "--socket", "/s", "--tenant", "x7"}), "vm add a: tenant must be 1..4294967295"},
      {Words({"a", "--socket", "/s", "--tenant", "1", "--addresses", "198.51.100.300"}),
       "vm add a: '198.51.100.300' is not an IPv4 or IPv6 address"},
      {Words({"a", "--socket", "/s", "--tenant", "1", "--colour", "blue"}), "vm add a: unknown key 'colour'"},
      {Words({"a", "--socket", "/s", "--tenant", "1", "--away", "true"}), "--away: a VM added at runtime runs here"},
      {Words({"a", "--socket", "relative.sock", "--tenant", "1"}), "--socket wants an absolute path"},
      {Words({"a", "--socket", "/s#x", "--tenant", "1"}), "may not be empty nor hold '#'"},
  };
  for (const Case& c : cases) {
    auto v = ParseVmAdd(c.words);
    ASSERT_FALSE(v.ok()) << c.fragment;
    EXPECT_NE(v.status().message().find(c.fragment), std::string::npos) << v.status().message();
  }
}

// An address another VM of the same tenant has on this host is refused;
// the same address in another tenant is that tenant's own.
TEST(VmAdd, AnAddressOfAnotherVmOfTheTenantIsRefused) {
  auto have = ParseConfig("[vm a]\nsocket = /a\ntenant = 1\naddresses = 198.51.100.11\n", "f");
  ASSERT_TRUE(have.ok());
  auto same = ParseVmAdd(Words({"b", "--socket", "/b", "--tenant", "1", "--addresses", "198.51.100.12,198.51.100.11"}));
  ASSERT_TRUE(same.ok());
  Status st = CheckAddressesFree(have->vms, same->vm);
  EXPECT_EQ(st.code(), Code::kAlreadyExists);
  EXPECT_NE(st.message().find("address 198.51.100.11 is VM 'a''s (tenant 1)"), std::string::npos) << st.message();
  auto other = ParseVmAdd(Words({"b", "--socket", "/b", "--tenant", "2", "--addresses", "198.51.100.11"}));
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(CheckAddressesFree(have->vms, other->vm).ok());
}

TEST_F(VmsDirTest, WhatVmAddWroteIsReadAtTheNextStartAndGoneOnceRemoved) {
  auto v = ParseVmAdd(Words({"vm9", "--socket", "/run/v/vm9.sock", "--tenant", "3", "--addresses", "203.0.113.9"}));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  ASSERT_TRUE(WriteVmDropIn(dir_, *v).ok());
  EXPECT_TRUE(HasVmDropIn(dir_, "vm9"));
  struct stat st;
  ASSERT_EQ(stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0750u);
  ASSERT_EQ(stat((dir_ + "/vm9.conf").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  EXPECT_NE(access((dir_ + "/vm9.conf.tmp").c_str(), F_OK), 0);  // (renamed into place)

  auto c = ParseConfig("ctl_socket = /run/v/ctl.sock\n[vm a]\nsocket = /a\ntenant = 1\n", "main.conf");
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(LoadVmsDir(dir_, &*c).ok());
  ASSERT_EQ(c->vms.size(), 2u);
  EXPECT_EQ(c->vms[1].vm_name, "vm9");
  EXPECT_EQ(c->vms[1].tenant_id, 3u);
  EXPECT_EQ(c->vms[1].path, "/run/v/vm9.sock");
  ASSERT_TRUE(Validate(&*c).ok());
  EXPECT_EQ(c->vms[1].index, 1u);

  ASSERT_TRUE(RemoveVmDropIn(dir_, "vm9").ok());
  EXPECT_FALSE(HasVmDropIn(dir_, "vm9"));
  EXPECT_EQ(RemoveVmDropIn(dir_, "vm9").code(), Code::kNotFound);
  auto after = ParseConfig("[vm a]\nsocket = /a\ntenant = 1\n", "main.conf");
  ASSERT_TRUE(LoadVmsDir(dir_, &*after).ok());
  EXPECT_EQ(after->vms.size(), 1u);
}

// Decision 139: a VM that left by a live migration is incoming at the next
// start until it runs here again; the mark is no drop-in.
TEST_F(VmsDirTest, AVmThatLeftIsIncomingAtTheNextStartUntilItRunsHereAgain) {
  auto c = ParseConfig("[vm web]\nsocket = /run/v/web.sock\ntenant = 7\n"
                       "[vm db]\nsocket = /run/v/db.sock\ntenant = 7\n"
                       "[vm far]\nsocket = /run/v/far.sock\ntenant = 7\naway = true\n",
                       "test");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(VmLeft(dir_, "web"));
  ASSERT_TRUE(MarkVmLeft(dir_, "web", true).ok());  // (the directory made)
  ASSERT_TRUE(MarkVmLeft(dir_, "far", true).ok());
  EXPECT_TRUE(VmLeft(dir_, "web"));
  ASSERT_TRUE(LoadVmsDir(dir_, &*c).ok()) << "a mark is not a VM added at runtime";
  EXPECT_EQ(c->vms.size(), 3u);
  EXPECT_EQ(ApplyVmsLeft(dir_, &*c), std::vector<std::string>{"web"});
  EXPECT_TRUE(c->vms[0].incoming);
  EXPECT_FALSE(c->vms[1].incoming);
  EXPECT_FALSE(c->vms[2].incoming) << "an away VM arrives by migrate end, not by a device";
  EXPECT_TRUE(Validate(&*c).ok());
  // It ran here again: the next start publishes it from the configuration.
  ASSERT_TRUE(MarkVmLeft(dir_, "web", false).ok());
  EXPECT_TRUE(MarkVmLeft(dir_, "web", false).ok()) << "no mark is no error";
  EXPECT_FALSE(VmLeft(dir_, "web"));
  EXPECT_FALSE(MarkVmLeft(dir_, "../x", true).ok());
}

TEST_F(VmsDirTest, AMissingDirectoryIsNoVmsAndTheDefaultSitsBesideTheControlSocket) {
  DaemonConfig c;
  c.ctl_socket = root_ + "/ctl.sock";
  EXPECT_EQ(VmsDir(c), root_ + "/ctl.sock.vms.d");
  c.vms_dir = "/var/lib/vsocket/vms.d";
  EXPECT_EQ(VmsDir(c), "/var/lib/vsocket/vms.d");
  auto set = ParseConfig("vms_dir = /srv/vms.d\n", "f");
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(set->vms_dir, "/srv/vms.d");
  DaemonConfig none;
  EXPECT_TRUE(LoadVmsDir(dir_, &none).ok());
  EXPECT_TRUE(none.vms.empty());
}

TEST_F(VmsDirTest, ABadDropInStopsTheStartNamingItsFile) {
  struct Case {
    const char* file;
    const char* text;
    const char* fragment;
  } cases[] = {
      {"x.conf", "[vm y]\nsocket = /y\ntenant = 1\n", "x.conf: wants exactly one section, [vm x]"},
      {"x.conf", "[vm x]\nsocket = /x\ntenant = 1\n[vm z]\nsocket = /z\ntenant = 1\n", "wants exactly one section"},
      {"x.conf", "poll_us = 5\n[vm x]\nsocket = /x\ntenant = 1\n", "x.conf: only VM keys"},
      {"x.conf", "[vm x]\nsocket = /x\ntenant = 1\naway = true\n", "away does not belong"},
      {"x.conf", "[vm x]\nsocket = /x\ntenant = 0\n", "x.conf:3: tenant must be"},
      {"a.conf", "[vm a]\nsocket = /a2\ntenant = 1\n", "a.conf: VM 'a' is configured elsewhere too"},
  };
  for (const Case& c : cases) {
    (void)!system(("rm -rf " + dir_).c_str());
    Write(c.file, c.text);
    auto cfg = ParseConfig("[vm a]\nsocket = /a\ntenant = 1\n", "main.conf");
    ASSERT_TRUE(cfg.ok());
    Status st = LoadVmsDir(dir_, &*cfg);
    ASSERT_FALSE(st.ok()) << c.fragment;
    EXPECT_NE(st.message().find(c.fragment), std::string::npos) << st.message();
  }
  // Files not named *.conf are not VMs (an editor's backup, the .tmp of a
  // write that died).
  (void)!system(("rm -rf " + dir_).c_str());
  Write("x.conf.tmp", "garbage");
  Write("x.conf~", "garbage");
  auto cfg = ParseConfig("[vm a]\nsocket = /a\ntenant = 1\n", "main.conf");
  EXPECT_TRUE(LoadVmsDir(dir_, &*cfg).ok());
  EXPECT_EQ(cfg->vms.size(), 1u);
}

}  // namespace
}  // namespace vsocket::backend
