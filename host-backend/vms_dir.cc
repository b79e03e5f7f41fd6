#include "host-backend/vms_dir.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>

#include "base/unique_fd.h"

namespace vsocket::backend {
namespace {

constexpr char kSuffix[] = ".conf";
constexpr char kLeftSuffix[] = ".left";  // a VM that left by a migration (MarkVmLeft)

std::string AddressText(const vhost::VmAddress& a) {
  char buf[INET6_ADDRSTRLEN] = "";
  inet_ntop(a.family == 6 ? AF_INET6 : AF_INET, a.addr.data(), buf, sizeof(buf));
  return buf;
}

Status Invalid(const std::string& what) { return Status(Code::kInvalidArgument, what); }

std::string ReadAll(const std::string& path, bool* ok) {
  std::string text;
  std::FILE* f = std::fopen(path.c_str(), "re");
  *ok = f != nullptr;
  if (f == nullptr) return text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) text.append(buf, n);
  *ok = !std::ferror(f);
  std::fclose(f);
  return text;
}

// A daemon key before the first section: a drop-in holds VM keys only.
bool HasKeysBeforeSection(const std::string& text) {
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    std::string line = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    line = line.substr(0, line.find('#'));
    size_t b = line.find_first_not_of(" \t\r");
    if (b != std::string::npos) return line[b] != '[';
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return false;
}

}  // namespace

std::string VmsDir(const DaemonConfig& config) {
  return config.vms_dir.empty() ? config.ctl_socket + ".vms.d" : config.vms_dir;
}

bool IsVmName(const std::string& name) {
  if (name.empty() || name.size() > 64 || name[0] == '.' || name[0] == '-') return false;
  return std::all_of(name.begin(), name.end(), [](unsigned char ch) {
    return std::isalnum(ch) || ch == '_' || ch == '-' || ch == '.';
  });
}

Result<VmDropIn> ParseVmAdd(const std::vector<std::string>& words) {
  static const char kUsage[] =
      "usage: vm add NAME --socket PATH --tenant T [--addresses A[,B...]] [--group G] "
      "[--prove-sockets true|false|agent] [--direct off|same-tenant|same-vm] [--incoming true]";
  if (words.empty() || words[0].rfind("--", 0) == 0) return Invalid(kUsage);
  const std::string& name = words[0];
  if (!IsVmName(name))
    return Invalid("'" + name + "' is not a VM name vm add takes (1-64 of A-Z a-z 0-9 _ . -, not starting with . or -)");
  if ((words.size() - 1) % 2 != 0) return Invalid(kUsage);
  VmDropIn out;
  out.text = "[vm " + name + "]\n";
  for (size_t i = 1; i + 1 < words.size(); i += 2) {
    const std::string& flag = words[i];
    const std::string& value = words[i + 1];
    if (flag.size() < 3 || flag.rfind("--", 0) != 0) return Invalid("'" + flag + "': " + kUsage);
    std::string key = flag.substr(2);
    std::replace(key.begin(), key.end(), '-', '_');
    if (key == "away")
      return Invalid("--away: a VM added at runtime runs here (add it on the host it runs on, or use migrate)");
    if (value.empty() || value.find_first_of("#\n\r") != std::string::npos)
      return Invalid(flag + ": the value may not be empty nor hold '#' or a line break");
    out.text += key + " = " + value + "\n";
  }
  // The settings are read as the file's would be: every VM key, checked as
  // there (what the file would refuse, vm add refuses, in the same words).
  auto parsed = ParseConfig(out.text, "vm add " + name);
  if (!parsed.ok()) {
    // "vm add NAME:N: what" -> "vm add NAME: what" (N counts lines of the
    // text made from the flags, not the operator's).
    std::string msg = parsed.status().message(), head = "vm add " + name + ":";
    if (msg.rfind(head, 0) == 0) {
      size_t i = head.size();
      while (i < msg.size() && std::isdigit(static_cast<unsigned char>(msg[i]))) ++i;
      if (i < msg.size() && msg[i] == ':') msg = head + msg.substr(i + 1);
    }
    return Status(parsed.status().code(), msg);
  }
  if (parsed->vms.size() != 1) return Invalid(kUsage);
  out.vm = parsed->vms[0];
  if (out.vm.path.empty()) return Invalid("vm add " + name + ": --socket PATH is missing");
  if (out.vm.tenant_id == 0) return Invalid("vm add " + name + ": --tenant T (1..4294967295) is missing");
  if (out.vm.path[0] != '/') return Invalid("vm add " + name + ": --socket wants an absolute path");
  return out;
}

Status CheckAddressesFree(const std::vector<vhost::PortConfig>& vms, const vhost::PortConfig& vm) {
  for (const vhost::PortConfig& other : vms) {
    if (other.tenant_id != vm.tenant_id || other.vm_name == vm.vm_name) continue;
    for (const vhost::VmAddress& a : vm.addresses)
      for (const vhost::VmAddress& b : other.addresses)
        if (a.family == b.family && a.addr == b.addr)
          return Status(Code::kAlreadyExists, "address " + AddressText(a) + " is VM '" + other.vm_name +
                                                  "''s (tenant " + std::to_string(vm.tenant_id) + ") on this host");
  }
  return Status::Ok();
}

Status LoadVmsDir(const std::string& dir, DaemonConfig* config) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) return Status::Ok();
    return Status::FromErrno("VMs directory " + dir);
  }
  std::vector<std::string> files;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.size() > sizeof(kSuffix) - 1 && n.compare(n.size() - (sizeof(kSuffix) - 1), std::string::npos, kSuffix) == 0)
      files.push_back(n);
  }
  closedir(d);
  std::sort(files.begin(), files.end());
  for (const std::string& f : files) {
    std::string path = dir + "/" + f, name = f.substr(0, f.size() - (sizeof(kSuffix) - 1));
    bool ok = false;
    std::string text = ReadAll(path, &ok);
    if (!ok) return Status::FromErrno("cannot read " + path);
    auto parsed = ParseConfig(text, path);
    if (!parsed.ok()) return parsed.status();
    if (parsed->vms.size() != 1 || !parsed->peers.empty() || parsed->vms[0].vm_name != name)
      return Invalid(path + ": wants exactly one section, [vm " + name + "], and nothing else");
    if (HasKeysBeforeSection(text)) return Invalid(path + ": only VM keys, inside [vm " + name + "]");
    for (const vhost::PortConfig& vm : config->vms)
      if (vm.vm_name == name) return Invalid(path + ": VM '" + name + "' is configured elsewhere too");
    if (parsed->vms[0].away) return Invalid(path + ": away does not belong in a VM added at runtime");
    config->vms.push_back(parsed->vms[0]);
  }
  return Status::Ok();
}

Status WriteVmDropIn(const std::string& dir, const VmDropIn& vm) {
  if (mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST) return Status::FromErrno("cannot make " + dir);
  const std::string path = dir + "/" + vm.vm.vm_name + kSuffix, tmp = path + ".tmp";
  {
    UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640));
    if (!fd) return Status::FromErrno("cannot write " + tmp);
    std::string text = "# Added by vsocketctl vm add; vsocketctl vm remove " + vm.vm.vm_name + " deletes it.\n" + vm.text;
    for (size_t done = 0; done < text.size();) {
      ssize_t n = write(fd.get(), text.data() + done, text.size() - done);
      if (n <= 0) {
        Status st = Status::FromErrno("cannot write " + tmp);
        unlink(tmp.c_str());
        return st;
      }
      done += static_cast<size_t>(n);
    }
    if (fsync(fd.get()) != 0) {
      Status st = Status::FromErrno("cannot write " + tmp);
      unlink(tmp.c_str());
      return st;
    }
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    Status st = Status::FromErrno("cannot rename " + tmp + " to " + path);
    unlink(tmp.c_str());
    return st;
  }
  return Status::Ok();
}

Status RemoveVmDropIn(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name + kSuffix;
  if (unlink(path.c_str()) != 0)
    return errno == ENOENT ? Status(Code::kNotFound, "no " + path) : Status::FromErrno("cannot remove " + path);
  return Status::Ok();
}

bool HasVmDropIn(const std::string& dir, const std::string& name) {
  if (!IsVmName(name)) return false;
  struct stat st;
  return stat((dir + "/" + name + kSuffix).c_str(), &st) == 0;
}

Status MarkVmLeft(const std::string& dir, const std::string& name, bool left) {
  if (!IsVmName(name)) return Status(Code::kInvalidArgument, "not a VM name for a file: " + name);
  const std::string path = dir + "/" + name + kLeftSuffix;
  if (!left) {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) return Status::FromErrno("cannot remove " + path);
    return Status::Ok();
  }
  if (mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST) return Status::FromErrno("cannot make " + dir);
  UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640));
  if (!fd) return Status::FromErrno("cannot write " + path);
  static constexpr char kText[] =
      "# vsocketd: this VM left by a live migration's switchover; until a device of it starts here again,\n"
      "# a vsocketd started here takes it as incoming (not published in the directory).\n";
  if (write(fd.get(), kText, sizeof(kText) - 1) != static_cast<ssize_t>(sizeof(kText) - 1))
    return Status::FromErrno("cannot write " + path);
  return Status::Ok();
}

bool VmLeft(const std::string& dir, const std::string& name) {
  if (!IsVmName(name)) return false;
  struct stat st;
  return stat((dir + "/" + name + kLeftSuffix).c_str(), &st) == 0;
}

std::vector<std::string> ApplyVmsLeft(const std::string& dir, DaemonConfig* config) {
  std::vector<std::string> names;
  for (vhost::PortConfig& vm : config->vms) {
    if (vm.away || !VmLeft(dir, vm.vm_name)) continue;
    vm.incoming = true;
    names.push_back(vm.vm_name);
  }
  return names;
}

}  // namespace vsocket::backend
