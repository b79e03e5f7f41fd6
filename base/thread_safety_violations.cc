// Each CASE_n breaks one lock rule; thread_safety_violations_test.sh
// compiles the file with it (and -Werror=thread-safety, as .bazelrc does)
// and expects the build to fail with the message after "expect:". Without a
// CASE the file keeps the rules and must compile cleanly.
#include "base/mutex.h"

namespace vsocket {

class Account {
 public:
  int Balance() EXCLUDES(mu_) {
#ifdef CASE_1  // expect: reading variable 'balance_' requires holding mutex 'mu_'
    return balance_;
#else
    MutexLock lock(mu_);
    return balance_;
#endif
  }

  void Deposit(int n) EXCLUDES(mu_) {
#ifdef CASE_2  // expect: calling function 'AddLocked' requires holding mutex 'mu_' exclusively
    AddLocked(n);
#else
    MutexLock lock(mu_);
    AddLocked(n);
#endif
  }

  void Audit() EXCLUDES(mu_) {
    MutexLock lock(mu_);
#ifdef CASE_3  // expect: cannot call function 'Deposit' while mutex 'mu_' is held
    Deposit(0);
#endif
  }

  void Refund(int n) EXCLUDES(mu_) {
    UniqueLock lock(mu_);
    lock.unlock();
#ifdef CASE_4  // expect: writing variable 'balance_' requires holding mutex 'mu_' exclusively
    balance_ += n;
#endif
    lock.lock();
    balance_ += n;
  }

  // The try-lock pattern (mutex.h): the guard adopts only a held lock.
  bool TryDeposit(int n) EXCLUDES(mu_) {
#ifdef CASE_6  // expect: calling function 'MutexLock' requires holding mutex 'mu_' exclusively
    mu_.try_lock();
    MutexLock lock(mu_, kAdoptLock);
#else
    if (!mu_.try_lock()) return false;
    MutexLock lock(mu_, kAdoptLock);
#endif
    balance_ += n;
    return true;
  }

  bool TryPeek(int* out) EXCLUDES(mu_) {
    bool held = mu_.try_lock();
#ifdef CASE_7  // expect: reading variable 'balance_' requires holding mutex 'mu_'
    *out = balance_;
#endif
    if (!held) return false;
    MutexLock lock(mu_, kAdoptLock);
    *out = balance_;
    return true;
  }

  int Rate() EXCLUDES(rates_mu_) {
    ReaderMutexLock lock(rates_mu_);
#ifdef CASE_5  // expect: writing variable 'rate_' requires holding mutex 'rates_mu_' exclusively
    rate_ = 2;
#endif
    return rate_;
  }

 private:
  void AddLocked(int n) REQUIRES(mu_) { balance_ += n; }

  Mutex mu_;
  int balance_ GUARDED_BY(mu_) = 0;
  SharedMutex rates_mu_;
  int rate_ GUARDED_BY(rates_mu_) = 1;
};

int UseAccount() {
  Account a;
  a.Deposit(1);
  a.Audit();
  a.Refund(1);
  (void)a.TryDeposit(1);
  int peek = 0;
  (void)a.TryPeek(&peek);
  return a.Balance() + a.Rate();
}

}  // namespace vsocket
