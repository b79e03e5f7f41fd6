#include "host-backend/remote/registrar.h"

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/clock.h"

namespace vsocket::backend {

Registrar::Registrar() : ready_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

Registrar::~Registrar() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

void Registrar::Start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { Run(); });
}

void Registrar::Submit(Job job) {
  Start();
  {
    MutexLock lock(mu_);
    jobs_.push_back(std::move(job));
  }
  ++outstanding_;
  cv_.NotifyOne();
}

void Registrar::Dispose(Registration r) {
  if (!r) return;
  Start();
  {
    MutexLock lock(mu_);
    dispose_.push_back(std::move(r));
  }
  cv_.NotifyOne();
}

std::vector<Registrar::Done> Registrar::Take() {
  std::vector<Done> out;
  {
    // (The thread adds and signals under mu_ too: the fd stays readable
    // exactly while something is there to take.)
    MutexLock lock(mu_);
    uint64_t v;
    (void)!read(ready_.get(), &v, sizeof(v));
    out.swap(done_);
  }
  outstanding_ -= out.size();
  taken_ += out.size();
  return out;
}

void Registrar::Run() {
  pthread_setname_np(pthread_self(), "vsocketd-mr");
  UniqueLock lock(mu_);
  while (true) {
    while (!stop_ && jobs_.empty() && dispose_.empty()) cv_.Wait(lock);
    if (!dispose_.empty()) {
      std::vector<Registration> drop;
      drop.swap(dispose_);
      lock.unlock();
      drop.clear();  // deregisters (unpins) here, not on the worker
      lock.lock();
      continue;
    }
    if (stop_) return;
    Done d;
    d.job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    int64_t t0 = MonotonicNs();
    d.result = d.job.fn ? d.job.fn() : Result<Registration>(Status(Code::kFailedPrecondition, "nothing to register"));
    d.ns = MonotonicNs() - t0;
    d.job.fn = nullptr;  // (it may hold the domain: let go of it here)
    lock.lock();
    done_.push_back(std::move(d));
    finished_.fetch_add(1, std::memory_order_release);
    uint64_t one = 1;
    (void)!write(ready_.get(), &one, sizeof(one));
  }
}

}  // namespace vsocket::backend
