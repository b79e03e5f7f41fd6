// Memory registrations made off the worker (rdma fabric; issue 17 finding 6).
//
// Registering a guest ring pins its pages (ibv_reg_mr: milliseconds for a
// large ring, tens under load) and dropping one unpins them: on the
// data-path worker, one guest opening many connections with large rings
// would stall every other tenant's traffic. The worker submits a job and
// goes on (the connection's bytes are staged or copied meanwhile); the
// registrar's own thread ("vsocketd-mr") makes the registration and hands
// it back through fd() and Take(); the worker then puts it in use, or gives
// it back to Dispose() if the connection no longer wants it (closed,
// re-paired, its memory remapped). Registrations the worker drops are
// destroyed on the thread too.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "base/unique_fd.h"

namespace vsocket::backend {

// A memory registration made but not (yet, or any more) in use: destroying
// it deregisters the memory. What it is belongs to the fabric.
class MemoryRegistration {
 public:
  virtual ~MemoryRegistration() = default;
};
using Registration = std::unique_ptr<MemoryRegistration>;
// Makes one registration; runs on the registrar's thread, so it must touch
// nothing the worker owns.
using RegisterFn = std::function<Result<Registration>()>;

class Registrar {
 public:
  struct Job {
    uint64_t handle = 0;  // the connection it is for
    uint64_t epoch = 0;   // its ring mapping when asked (BackendConn::map_epoch)
    bool rx = false;      // RX ring (peers write) or TX ring (sends read)
    uint32_t host = 0;
    void* addr = nullptr;
    size_t len = 0;
    RegisterFn fn;
  };
  struct Done {
    Job job;
    Result<Registration> result = Status(Code::kInternal, "not run");
    int64_t ns = 0;  // how long it took
  };

  Registrar();  // the thread starts with the first job
  ~Registrar();  // waits for the job under way; the rest are dropped
  Registrar(const Registrar&) = delete;
  Registrar& operator=(const Registrar&) = delete;

  // Readable while Take() has something (an eventfd: the worker sleeps on it).
  int fd() const { return ready_.get(); }
  void Submit(Job job) EXCLUDES(mu_);
  void Dispose(Registration r) EXCLUDES(mu_);
  // Whether Take() has something (no system call: the worker asks every pass).
  bool HasDone() const { return finished_.load(std::memory_order_acquire) != taken_; }
  // What is done, in the order submitted.
  std::vector<Done> Take() EXCLUDES(mu_);
  // Jobs submitted and not yet taken back.
  size_t outstanding() const { return outstanding_; }

 private:
  void Run() EXCLUDES(mu_);
  void Start();

  UniqueFd ready_;
  std::thread thread_;
  Mutex mu_;
  CondVar cv_;  // a job, something to dispose of, or stop
  bool stop_ GUARDED_BY(mu_) = false;
  std::deque<Job> jobs_ GUARDED_BY(mu_);
  std::vector<Registration> dispose_ GUARDED_BY(mu_);
  std::vector<Done> done_ GUARDED_BY(mu_);
  size_t outstanding_ = 0;             // the submitting thread's own count
  std::atomic<uint64_t> finished_{0};  // jobs done (the thread counts)
  uint64_t taken_ = 0;                 // of those, taken (the submitting thread counts)
};

}  // namespace vsocket::backend
