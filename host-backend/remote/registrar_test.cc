// The registrar makes registrations on a thread of its own, so that a slow
// one (ibv_reg_mr pinning a large ring) never holds up the worker: the
// worker's calls return at once while a registration is under way, results
// come back through an fd in the order asked, and registrations given back
// are destroyed on that thread too. (Issue 17, finding 6.)
#include "host-backend/remote/registrar.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <future>
#include <thread>

namespace vsocket::backend {
namespace {

// Records the thread that destroys it.
class Recorded : public MemoryRegistration {
 public:
  Recorded(int id, std::thread::id* destroyed_on) : id(id), destroyed_on_(destroyed_on) {}
  ~Recorded() override {
    if (destroyed_on_) *destroyed_on_ = std::this_thread::get_id();
  }
  int id;

 private:
  std::thread::id* destroyed_on_;
};

bool Readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, timeout_ms) == 1;
}

std::vector<Registrar::Done> TakeAll(Registrar& r, size_t n) {
  std::vector<Registrar::Done> all;
  for (int i = 0; i < 100 && all.size() < n; ++i) {
    if (!Readable(r.fd(), 100)) continue;
    for (auto& d : r.Take()) all.push_back(std::move(d));
  }
  return all;
}

Registrar::Job JobFor(uint64_t handle, RegisterFn fn) {
  Registrar::Job j;
  j.handle = handle;
  j.rx = handle % 2 == 0;
  j.host = 3;
  j.fn = std::move(fn);
  return j;
}

TEST(RegistrarTest, RegistersOnItsOwnThreadAndAnswersInOrder) {
  Registrar r;
  const std::thread::id me = std::this_thread::get_id();
  std::vector<std::thread::id> ran_on(3);
  for (int i = 0; i < 3; ++i)
    r.Submit(JobFor(10 + i, [&ran_on, i]() -> Result<Registration> {
      ran_on[i] = std::this_thread::get_id();
      if (i == 1) return Status(Code::kUnavailable, "ibv_reg_mr: Bad address");
      return Registration(std::make_unique<Recorded>(i, nullptr));
    }));
  EXPECT_EQ(r.outstanding(), 3u);
  std::vector<Registrar::Done> done = TakeAll(r, 3);
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(r.outstanding(), 0u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(done[i].job.handle, 10u + i);
    EXPECT_EQ(done[i].job.host, 3u);
    EXPECT_FALSE(done[i].job.fn) << "the job's function is let go of on the thread";
    EXPECT_NE(ran_on[i], me);
    EXPECT_NE(ran_on[i], std::thread::id());
  }
  EXPECT_EQ(ran_on[0], ran_on[2]);
  ASSERT_TRUE(done[0].result.ok());
  EXPECT_EQ(static_cast<Recorded*>(done[0].result.value().get())->id, 0);
  EXPECT_FALSE(done[1].result.ok());
  EXPECT_EQ(done[1].result.status().code(), Code::kUnavailable);
  EXPECT_FALSE(Readable(r.fd(), 0)) << "nothing more to take";
}

// A registration that takes long (the first) holds up neither the caller
// nor what the caller does meanwhile: Submit and Take return at once, and
// the fd stays quiet until something is done.
TEST(RegistrarTest, ASlowRegistrationNeverBlocksTheCaller) {
  Registrar r;
  std::promise<void> release;
  std::shared_future<void> go = release.get_future().share();
  std::atomic<bool> started{false};
  r.Submit(JobFor(1, [go, &started]() -> Result<Registration> {
    started = true;
    go.wait();
    return Registration(std::make_unique<Recorded>(1, nullptr));
  }));
  for (int i = 0; i < 200 && !started; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(started);
  // The worker goes on: more jobs, takes, disposals; none of it waits.
  for (int i = 2; i < 50; ++i) r.Submit(JobFor(i, [] { return Result<Registration>(Registration()); }));
  EXPECT_TRUE(r.Take().empty());
  EXPECT_FALSE(Readable(r.fd(), 20));
  EXPECT_EQ(r.outstanding(), 49u);
  release.set_value();
  std::vector<Registrar::Done> done = TakeAll(r, 49);
  ASSERT_EQ(done.size(), 49u);
  for (size_t i = 0; i < done.size(); ++i) EXPECT_EQ(done[i].job.handle, i + 1);
}

// Registrations the worker no longer wants are destroyed (deregistered,
// unpinned) on the registrar's thread, not the caller's.
TEST(RegistrarTest, DisposedRegistrationsAreDestroyedOnItsThread) {
  std::thread::id destroyed_on;
  {
    Registrar r;
    std::thread::id ran_on;
    r.Submit(JobFor(1, [&ran_on]() -> Result<Registration> {
      ran_on = std::this_thread::get_id();
      return Registration();
    }));
    ASSERT_EQ(TakeAll(r, 1).size(), 1u);
    r.Dispose(std::make_unique<Recorded>(7, &destroyed_on));
    for (int i = 0; i < 200 && destroyed_on == std::thread::id(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(destroyed_on, ran_on);
    EXPECT_NE(destroyed_on, std::this_thread::get_id());
    // One given back as the registrar stops is still destroyed.
    destroyed_on = {};
    r.Dispose(std::make_unique<Recorded>(8, &destroyed_on));
  }
  EXPECT_NE(destroyed_on, std::thread::id());
}

}  // namespace
}  // namespace vsocket::backend
