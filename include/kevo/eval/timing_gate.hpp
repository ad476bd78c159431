// kevo/eval/timing_gate.hpp: keeps timed runs one at a time and never beside a compile.
// Compiles hold the gate shared (many at once); a timed run holds it exclusively. Writer-
// preferring: once a timed run waits, new compiles wait behind it, so timings are not starved.
//
//   kevo::eval::TimingGate gate;
//   { std::shared_lock compiling(gate); compile(); }
//   { std::unique_lock timing(gate); run_and_time(); }
#pragma once

#include <condition_variable>
#include <mutex>

namespace kevo::eval {

class TimingGate {
 public:
  /// A compile (or anything that may overlap other compiles but not a timing).
  void lock_shared() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return !exclusive_held_ && exclusive_waiting_ == 0; });
    ++shared_holders_;
  }
  void unlock_shared() {
    std::lock_guard lock(mutex_);
    if (--shared_holders_ == 0) changed_.notify_all();
  }

  /// A timed run: alone on the machine.
  void lock() {
    std::unique_lock lock(mutex_);
    ++exclusive_waiting_;
    changed_.wait(lock, [&] { return !exclusive_held_ && shared_holders_ == 0; });
    --exclusive_waiting_;
    exclusive_held_ = true;
  }
  void unlock() {
    std::lock_guard lock(mutex_);
    exclusive_held_ = false;
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int shared_holders_ = 0;
  int exclusive_waiting_ = 0;
  bool exclusive_held_ = false;
};

}  // namespace kevo::eval
