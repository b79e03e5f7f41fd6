// Lock rules the compiler checks: clang's thread-safety analysis reads these
// attributes (.bazelrc: -Wthread-safety -Werror=thread-safety, so a
// violation fails the build); other compilers see nothing. Use them with the
// annotated types of base/mutex.h: the analysis knows nothing about a bare
// std::mutex or std::lock_guard.
//
//   class Queue {
//    public:
//     void Push(int v) EXCLUDES(mu_) { MutexLock lock(mu_); items_.push_back(v); }
//    private:
//     void DropOldest() REQUIRES(mu_);  // the caller holds mu_
//     Mutex mu_;
//     std::deque<int> items_ GUARDED_BY(mu_);
//   };
//
// Reference: https://clang.llvm.org/docs/ThreadSafetyAnalysis.html. Two
// limits to know: the analysis is per function (a lambda is a function of
// its own, holding nothing unless annotated), and ACQUIRED_BEFORE/AFTER are
// checked only under -Wthread-safety-beta (they still document the order).
#pragma once

#if defined(__clang__)
#define VS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define VS_THREAD_ANNOTATION(x)
#endif

// A type that is a capability (a lock): CAPABILITY("mutex").
#define CAPABILITY(name) VS_THREAD_ANNOTATION(capability(name))
// An RAII type that holds the capabilities its constructor acquires until
// it is destroyed (or it releases them earlier).
#define SCOPED_CAPABILITY VS_THREAD_ANNOTATION(scoped_lockable)

// A data member read only with the capability held (shared or exclusive)
// and written only with it held exclusively.
#define GUARDED_BY(x) VS_THREAD_ANNOTATION(guarded_by(x))
// The same for what a pointer member points to (the pointer itself is not
// guarded).
#define PT_GUARDED_BY(x) VS_THREAD_ANNOTATION(pt_guarded_by(x))

// Lock order, at the declaration of a capability: it is taken before
// (after) the ones named, never the other way round.
#define ACQUIRED_BEFORE(...) VS_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) VS_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))

// The caller must hold the capabilities (exclusively / at least shared)
// when it calls, and still holds them after.
#define REQUIRES(...) VS_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) VS_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))

// The function acquires (releases) the capabilities; with no argument on a
// member function, the object itself.
#define ACQUIRE(...) VS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) VS_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) VS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) VS_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
// Releases it however it is held (the destructor of a guard that may hold
// it shared or exclusive).
#define RELEASE_GENERIC(...) VS_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
// Acquires the capability if it returns `ret` (the first argument).
#define TRY_ACQUIRE(...) VS_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define TRY_ACQUIRE_SHARED(...) VS_THREAD_ANNOTATION(try_acquire_shared_capability(__VA_ARGS__))

// The caller must NOT hold the capabilities (the function takes them
// itself, or calls out to code that might).
#define EXCLUDES(...) VS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))

// The function checks at run time that the capability is held, and the
// analysis believes it from then on.
#define ASSERT_CAPABILITY(x) VS_THREAD_ANNOTATION(assert_capability(x))
#define ASSERT_SHARED_CAPABILITY(x) VS_THREAD_ANNOTATION(assert_shared_capability(x))

// The function returns a reference to the capability (an accessor).
#define RETURN_CAPABILITY(x) VS_THREAD_ANNOTATION(lock_returned(x))

// Turns the analysis off for one function: for code whose locking the
// analysis cannot follow. Say why next to every use.
#define NO_THREAD_SAFETY_ANALYSIS VS_THREAD_ANNOTATION(no_thread_safety_analysis)
