// kevo/retrieval/fair_mutex.hpp: locks that do not let one kind of waiter starve another: a mutex
// that goes to its waiters in the order they asked for it, and a shared mutex whose writers do not
// wait behind readers that came after them.
//
// std::mutex promises no order: a thread that unlocks and locks again at once may keep it while
// others wait. Eight threads searching one pipeline through a std::mutex saw a p99 latency of 2 s
// against a median of 3 ms (benchmarks/RESULTS.md, run 40). Suited to locks held for milliseconds
// (a search), not to hot short sections: every unlock wakes all waiters to check their ticket.
//
//   FairMutex m;
//   std::lock_guard lock(m);
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace kevo::retrieval {

class FairMutex {
 public:
  void lock() {
    std::unique_lock guard(mutex_);
    const std::uint64_t ticket = next_ticket_++;
    turn_.wait(guard, [&] { return now_serving_ == ticket; });
  }
  void unlock() {
    {
      std::lock_guard guard(mutex_);
      ++now_serving_;
    }
    turn_.notify_all();
  }
  /// Threads waiting for the lock now (not counting its holder).
  std::uint64_t waiting() const {
    std::lock_guard guard(mutex_);
    return next_ticket_ - now_serving_ - (next_ticket_ > now_serving_ ? 1 : 0);
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable turn_;
  std::uint64_t next_ticket_ = 0, now_serving_ = 0;
};

/// A shared mutex where a waiting writer goes before the readers that come after it. glibc's
/// std::shared_mutex lets readers in while a writer waits, so a stream of overlapping readers can
/// hold a writer off for as long as it lasts: one upsert waited over 10 s behind four threads
/// searching the CPU backend back to back. Readers that hold it when a writer arrives finish first.
//
//   WriterFirstSharedMutex m;
//   std::shared_lock reading(m);   // or std::unique_lock writing(m);
class WriterFirstSharedMutex {
 public:
  void lock() {
    std::unique_lock guard(mutex_);
    ++writers_waiting_;
    turn_.wait(guard, [&] { return !writing_ && readers_ == 0; });
    --writers_waiting_;
    writing_ = true;
  }
  void unlock() {
    {
      std::lock_guard guard(mutex_);
      writing_ = false;
    }
    turn_.notify_all();
  }
  void lock_shared() {
    std::unique_lock guard(mutex_);
    turn_.wait(guard, [&] { return !writing_ && writers_waiting_ == 0; });
    ++readers_;
  }
  void unlock_shared() {
    bool last = false;
    {
      std::lock_guard guard(mutex_);
      last = --readers_ == 0;
    }
    if (last) turn_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable turn_;
  std::uint64_t readers_ = 0, writers_waiting_ = 0;
  bool writing_ = false;
};

}  // namespace kevo::retrieval
