// Mutexes the thread-safety analysis understands (base/thread_annotations.h).
//
//   Mutex          std::mutex, as a capability: data members say
//                  GUARDED_BY(mu_), functions REQUIRES(mu_)
//   MutexLock      holds a Mutex for its scope (std::lock_guard)
//   UniqueLock     the same, released and taken again at will, and what a
//                  CondVar waits with (std::unique_lock)
//   CondVar        std::condition_variable for a UniqueLock
//   SharedMutex    std::shared_mutex; ReaderMutexLock / WriterMutexLock
//
// A try-lock: clang 14's analysis does not understand a scoped guard whose
// constructor only tries (TRY_ACQUIRE on a SCOPED_CAPABILITY constructor is
// taken as an unconditional acquire, or not at all). Try the Mutex itself,
// then hand the held lock to a guard with kAdoptLock, which REQUIRES it:
//
//   if (!mu_.try_lock()) return;       // TRY_ACQUIRE(true)
//   MutexLock lock(mu_, kAdoptLock);   // released at the end of the scope
//
// A CondVar wait takes no predicate: write the loop, so that the analysis
// sees the condition read with the lock held (a predicate lambda is a
// function of its own, which holds nothing):
//
//   UniqueLock lock(mu_);
//   while (queue_.empty() && !stop_) cv_.Wait(lock);
//
// The types are standard lockables too (lock/unlock/try_lock), so
// std::scoped_lock and std::condition_variable_any take them, but the
// analysis cannot see what those do: code that does so gets a warning for
// every guarded member it touches. Use the guards here.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "base/thread_annotations.h"

namespace vsocket {

// Tag for a guard that takes over a Mutex its caller holds already (as
// std::adopt_lock): the guard releases it.
struct AdoptLockT {
  explicit AdoptLockT() = default;
};
inline constexpr AdoptLockT kAdoptLock{};

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  friend class UniqueLock;
  std::mutex mu_;
};

// Holds `mu` from construction to destruction.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  // Takes over `mu`, held by the caller (a successful try_lock()).
  MutexLock(Mutex& mu, AdoptLockT) REQUIRES(mu) : mu_(mu) {}
  ~MutexLock() RELEASE() { mu_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

// Holds `mu` like MutexLock, but may let go of it and take it again
// (unlock()/lock()); a CondVar waits with it. Released at destruction if
// held then.
class SCOPED_CAPABILITY UniqueLock {
 public:
  explicit UniqueLock(Mutex& mu) ACQUIRE(mu) : lock_(mu.mu_) {}
  // Takes over `mu`, held by the caller (a successful try_lock()).
  UniqueLock(Mutex& mu, AdoptLockT) REQUIRES(mu) : lock_(mu.mu_, std::adopt_lock) {}
  ~UniqueLock() RELEASE() = default;
  UniqueLock(const UniqueLock&) = delete;
  UniqueLock& operator=(const UniqueLock&) = delete;

  void lock() ACQUIRE() { lock_.lock(); }
  void unlock() RELEASE() { lock_.unlock(); }

 private:
  friend class CondVar;
  std::unique_lock<std::mutex> lock_;
};

class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Lets go of the lock's mutex until notified (or woken spuriously: wait
  // in a loop on the condition), then holds it again.
  void Wait(UniqueLock& lock) { cv_.wait(lock.lock_); }
  // The same, for at most `timeout`: false if it ran out.
  template <typename Rep, typename Period>
  bool WaitFor(UniqueLock& lock, std::chrono::duration<Rep, Period> timeout) {
    return cv_.wait_for(lock.lock_, timeout) == std::cv_status::no_timeout;
  }
  void NotifyOne() noexcept { cv_.notify_one(); }
  void NotifyAll() noexcept { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

// Many readers or one writer.
class CAPABILITY("mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  bool try_lock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  void lock_shared() ACQUIRE_SHARED() { mu_.lock_shared(); }
  void unlock_shared() RELEASE_SHARED() { mu_.unlock_shared(); }
  bool try_lock_shared() TRY_ACQUIRE_SHARED(true) { return mu_.try_lock_shared(); }

 private:
  std::shared_mutex mu_;
};

// Holds `mu` shared (reads GUARDED_BY members) for its scope.
class SCOPED_CAPABILITY ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex& mu) ACQUIRE_SHARED(mu) : mu_(mu) { mu_.lock_shared(); }
  ~ReaderMutexLock() RELEASE() { mu_.unlock_shared(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex& mu_;
};

// Holds `mu` exclusively (reads and writes) for its scope.
class SCOPED_CAPABILITY WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~WriterMutexLock() RELEASE() { mu_.unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex& mu_;
};

}  // namespace vsocket
