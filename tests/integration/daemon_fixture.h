// Starts a real vsocketd process for a test, in a private temp directory,
// and reads its counters over the control socket.
#pragma once

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace vsocket::testing {

class Daemon {
 public:
  // vms: names; each gets socket DIR/NAME.sock and tenant index+1, or the
  // tenant (and addresses) after a colon ("name:7,192.0.2.1;192.0.2.2").
  explicit Daemon(std::vector<std::string> vms, std::vector<std::string> extra_args = {})
      : vms_(std::move(vms)), extra_(std::move(extra_args)) {
    char tmpl[] = "/tmp/vsocket-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  ~Daemon() {
    Kill(SIGTERM);
    std::string cmd = "rm -rf '" + dir_ + "'";
    (void)!std::system(cmd.c_str());
  }

  bool Start() {
    std::vector<std::string> args = {Binary(), "--ctl", ctl_path(), "--log-level", "warn"};
    for (size_t i = 0; i < vms_.size(); ++i) {
      std::string name = vms_[i], tenant = std::to_string(i + 1);
      if (size_t colon = name.find(':'); colon != std::string::npos) {
        tenant = name.substr(colon + 1);
        name.resize(colon);
      }
      args.push_back("--port");
      args.push_back(socket_path(name) + "," + name + "," + tenant);
    }
    args.insert(args.end(), extra_.begin(), extra_.end());
    pid_ = fork();
    if (pid_ == 0) {
      // Raw-protocol guests register made-up 4-tuples: their VMs do not ask
      // for socket proofs unless a test says so (prove_sockets()).
      for (const std::string& vm : vms_) {
        std::string name = vm.substr(0, vm.find(':'));
        std::string env;
        for (char ch : name) env += ch == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
        bool prove = prove_vm_.count(name) ? prove_vm_[name] : prove_sockets_;
        const char* value = agent_vms_.count(name) ? "agent" : prove ? "true" : "false";
        setenv(("VSOCKET_VM_" + env + "_PROVE_SOCKETS").c_str(), value, 1);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    // Ready once the control socket answers.
    for (int i = 0; i < 200; ++i) {
      if (!Stats().empty()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return false;
  }

  // Its VMs ask guests to prove the sockets they register (the product's
  // default; off for raw-protocol guests). Before Start().
  void set_prove_sockets(bool on) { prove_sockets_ = on; }
  void set_prove_sockets(const std::string& vm, bool on) { prove_vm_[vm] = on; }
  // prove_sockets = agent (decision 100): the VM's authority attaches at
  // socket_path(vm) + ".agent". Before Start().
  void set_proofs_by_agent(const std::string& vm) { agent_vms_.insert(vm); }

  // True if the process is still running.
  bool Alive() {
    if (pid_ <= 0) return false;
    int status;
    return waitpid(pid_, &status, WNOHANG) == 0;
  }

  // Signals the daemon and reaps it (SIGKILL after 5 s); returns its wait
  // status, or -1 if it was not running.
  int Kill(int sig) {
    if (pid_ <= 0) return -1;
    ::kill(pid_, sig);
    int status = -1;
    for (int i = 0; i < 500; ++i) {
      if (waitpid(pid_, &status, WNOHANG) != 0) {
        pid_ = -1;
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }

  // SIGTERM (what systemd sends); true if the daemon then exited with status
  // 0. For the hostile tests: no attack may leave it unable to stop cleanly.
  bool StopsCleanly() {
    int st = Kill(SIGTERM);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }

  std::string Stats() { return Command("stats"); }

  std::string Command(const std::string& cmd) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, ctl_path().c_str(), sizeof(addr.sun_path) - 1);
    std::string out;
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      std::string line = cmd + "\n";
      (void)!write(fd, line.data(), line.size());
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    }
    close(fd);
    return out;
  }

  // First number following "key": in the JSON (after `after`, if given).
  static long long Number(const std::string& json, const std::string& key, const std::string& after = "") {
    size_t start = after.empty() ? 0 : json.find(after);
    if (start == std::string::npos) return -1;
    size_t p = json.find("\"" + key + "\":", start);
    if (p == std::string::npos) return -1;
    return std::atoll(json.c_str() + p + key.size() + 3);
  }

  std::string socket_path(const std::string& vm) const { return dir_ + "/" + vm + ".sock"; }
  std::string ctl_path() const { return dir_ + "/ctl.sock"; }
  pid_t pid() const { return pid_; }

  static std::string Binary() {
    if (const char* p = std::getenv("VSOCKETD")) return p;
    return "host-backend/vsocketd";  // runfiles-relative
  }

 private:
  std::vector<std::string> vms_;
  std::vector<std::string> extra_;
  std::string dir_;
  pid_t pid_ = -1;
  bool prove_sockets_ = false;
  std::map<std::string, bool> prove_vm_;
  std::set<std::string> agent_vms_;
};

}  // namespace vsocket::testing
