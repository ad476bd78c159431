// kevo/eval/timing_gate.hpp: keeps timed runs one at a time and never beside a compile.
// Compiles hold the gate shared (many at once); a timed run holds it exclusively. Writer-
// preferring: once a timed run waits, new compiles wait behind it, so timings are not starved.
// Given a lock file, the gate also spans processes (flock: shared for compiles, exclusive for
// timed runs), so several kevo processes on one machine do not time beside each other's compiles.
//
//   kevo::eval::TimingGate gate(cache_dir / "timing.lock");
//   { std::shared_lock compiling(gate); compile(); }
//   { std::unique_lock timing(gate); run_and_time(); }
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <filesystem>
#include <mutex>

namespace kevo::eval {

class TimingGate {
 public:
  TimingGate() = default;
  explicit TimingGate(const std::filesystem::path& lock_file) {
    if (!lock_file.empty()) lock_fd_ = ::open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  }
  ~TimingGate() {
    if (lock_fd_ >= 0) ::close(lock_fd_);
  }
  TimingGate(const TimingGate&) = delete;
  TimingGate& operator=(const TimingGate&) = delete;

  /// A compile (or anything that may overlap other compiles but not a timing).
  void lock_shared() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return !exclusive_held_ && exclusive_waiting_ == 0; });
    // The file lock belongs to this process as a whole: the first holder takes it.
    if (shared_holders_++ == 0) file_lock(LOCK_SH);
  }
  void unlock_shared() {
    std::lock_guard lock(mutex_);
    if (--shared_holders_ == 0) {
      file_lock(LOCK_UN);
      changed_.notify_all();
    }
  }

  /// A timed run: alone on the machine.
  void lock() {
    std::unique_lock lock(mutex_);
    ++exclusive_waiting_;
    changed_.wait(lock, [&] { return !exclusive_held_ && shared_holders_ == 0; });
    --exclusive_waiting_;
    exclusive_held_ = true;
    file_lock(LOCK_EX);
  }
  void unlock() {
    std::lock_guard lock(mutex_);
    file_lock(LOCK_UN);
    exclusive_held_ = false;
    changed_.notify_all();
  }

  /// Timed runs waiting for the compiles in progress to end (new compiles wait behind them).
  int timed_runs_waiting() const {
    std::lock_guard lock(mutex_);
    return exclusive_waiting_;
  }

 private:
  void file_lock(int operation) {
    if (lock_fd_ < 0) return;
    while (::flock(lock_fd_, operation) != 0 && errno == EINTR) {
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  int shared_holders_ = 0;
  int exclusive_waiting_ = 0;
  bool exclusive_held_ = false;
  int lock_fd_ = -1;
};

}  // namespace kevo::eval
