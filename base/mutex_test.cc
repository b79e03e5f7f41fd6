// base/mutex.h at run time (thread_safety_violations_test checks what the
// compiler refuses). Compiled with -Wthread-safety like everything else: the
// code here is also the checked example of each type in use.
#include "base/mutex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <thread>
#include <vector>

namespace vsocket {
namespace {

// A queue written the way the daemon's are: fields GUARDED_BY, a helper
// that REQUIRES the lock, a wait written as a loop.
class Queue {
 public:
  void Push(int v) EXCLUDES(mu_) {
    {
      MutexLock lock(mu_);
      items_.push_back(v);
    }
    cv_.NotifyOne();
  }
  void Stop() EXCLUDES(mu_) {
    {
      MutexLock lock(mu_);
      stop_ = true;
    }
    cv_.NotifyAll();
  }
  // Blocks until there is an item (true) or Stop (false).
  bool Pop(int* v) EXCLUDES(mu_) {
    UniqueLock lock(mu_);
    while (items_.empty() && !stop_) cv_.Wait(lock);
    return TakeFront(v);
  }
  size_t size() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return items_.size();
  }

 private:
  bool TakeFront(int* v) REQUIRES(mu_) {
    if (items_.empty()) return false;
    *v = items_.front();
    items_.pop_front();
    return true;
  }

  Mutex mu_;
  CondVar cv_;
  std::deque<int> items_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
};

TEST(Mutex, OneProducerOneConsumerSeeEveryItemInOrder) {
  Queue q;
  std::vector<int> got;
  std::thread consumer([&] {
    for (int v; q.Pop(&v);) got.push_back(v);
  });
  for (int i = 0; i < 10000; ++i) q.Push(i);
  while (q.size() != 0) std::this_thread::yield();
  q.Stop();
  consumer.join();
  ASSERT_EQ(got.size(), 10000u);
  for (int i = 0; i < 10000; ++i) ASSERT_EQ(got[i], i);
}

// An int and the mutex that guards it (GUARDED_BY applies to members, not
// to local variables).
struct Guarded {
  Mutex mu;
  int value GUARDED_BY(mu) = 0;
};

TEST(Mutex, TryLockFailsWhileAnotherThreadHoldsIt) {
  Guarded g;
  MutexLock lock(g.mu);
  g.value = 1;
  bool took = true;
  std::thread([&] {
    if (g.mu.try_lock()) {
      g.mu.unlock();
    } else {
      took = false;
    }
  }).join();
  EXPECT_FALSE(took);
  EXPECT_EQ(g.value, 1);
}

TEST(UniqueLock, LetsGoAndTakesTheMutexAgain) {
  Guarded g;
  UniqueLock lock(g.mu);
  g.value = 1;
  lock.unlock();
  // Not held now: another thread gets it.
  std::thread([&] {
    MutexLock other(g.mu);
    g.value = 2;
  }).join();
  lock.lock();
  EXPECT_EQ(g.value, 2);
}  // (held again: released here)

TEST(UniqueLock, ReleasedAtDestructionOnlyIfHeld) {
  Mutex mu;
  {
    UniqueLock lock(mu);
    lock.unlock();
  }  // (not held: nothing to release)
  if (mu.try_lock()) {
    mu.unlock();
  } else {
    ADD_FAILURE() << "the mutex is still held";
  }
}

// The try-lock pattern (mutex.h): try the Mutex, then a guard adopts it.
// The analysis checks that the guarded value is touched only on the path
// where try_lock() succeeded, and the guard releases the mutex.
bool IncrementIfFree(Guarded& g) EXCLUDES(g.mu) {
  if (!g.mu.try_lock()) return false;
  MutexLock lock(g.mu, kAdoptLock);
  ++g.value;
  return true;
}

TEST(MutexLock, AdoptsATriedLockAndReleasesIt) {
  Guarded g;
  EXPECT_TRUE(IncrementIfFree(g));
  {
    MutexLock lock(g.mu);  // (released by the adopting guard: free again)
    EXPECT_EQ(g.value, 1);
  }
  {
    MutexLock held(g.mu);
    bool took = true;
    std::thread([&] { took = IncrementIfFree(g); }).join();
    EXPECT_FALSE(took);
    EXPECT_EQ(g.value, 1);
  }
  EXPECT_TRUE(IncrementIfFree(g));
  MutexLock lock(g.mu);
  EXPECT_EQ(g.value, 2);
}

TEST(UniqueLock, AdoptsATriedLockLetsGoAndTakesItAgain) {
  Guarded g;
  if (!g.mu.try_lock()) {  // (not ASSERT_TRUE: the analysis needs the branch)
    ADD_FAILURE() << "a free mutex could not be taken";
    return;
  }
  {
    UniqueLock lock(g.mu, kAdoptLock);
    g.value = 1;
    lock.unlock();
    std::thread([&] {
      MutexLock other(g.mu);
      g.value = 2;
    }).join();
    lock.lock();
    EXPECT_EQ(g.value, 2);
  }  // (released here)
  if (g.mu.try_lock()) {
    g.mu.unlock();
  } else {
    ADD_FAILURE() << "the mutex is still held";
  }
}

TEST(CondVar, WaitForReturnsFalseWhenItRunsOut) {
  Mutex mu;
  CondVar cv;
  UniqueLock lock(mu);
  auto start = std::chrono::steady_clock::now();
  bool notified = cv.WaitFor(lock, std::chrono::milliseconds(20));
  EXPECT_FALSE(notified);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(20));
}

struct SharedGuarded {
  SharedMutex mu;
  int value GUARDED_BY(mu) = 0;
};

TEST(SharedMutex, ReadersShareWritersExclude) {
  SharedGuarded s;
  std::atomic<int> readers_in{0};
  std::vector<std::thread> readers;
  {
    WriterMutexLock w(s.mu);  // the readers wait for the writer
    for (int i = 0; i < 4; ++i)
      readers.emplace_back([&] {
        ReaderMutexLock r(s.mu);
        ++readers_in;
        EXPECT_EQ(s.value, 7);
        // Stay until every reader is in: they all hold it at once.
        while (readers_in.load() < 4) std::this_thread::yield();
      });
    s.value = 7;
  }
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(readers_in.load(), 4);
  if (s.mu.try_lock_shared()) {
    s.mu.unlock_shared();
  } else {
    ADD_FAILURE() << "held by a reader";
  }
  if (s.mu.try_lock()) {
    s.mu.unlock();
  } else {
    ADD_FAILURE() << "held";
  }
}

}  // namespace
}  // namespace vsocket
