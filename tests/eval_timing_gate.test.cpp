// The timing gate: compiles overlap each other, a timed run overlaps nothing, and a waiting timed
// run goes before compiles that arrive after it.
#include <kevo/eval/timing_gate.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include <stdlib.h>

namespace kevo_tests::eval_timing_gate_test {

using namespace std::chrono_literals;

TEST_CASE("compiles share the gate, a timed run holds it alone") {
  kevo::eval::TimingGate gate;
  std::atomic<int> compiling{0}, timing{0}, max_compiling{0};
  std::atomic<bool> overlap{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        if ((t + i) % 3 == 0) {
          std::unique_lock lock(gate);
          if (++timing != 1 || compiling != 0) overlap = true;
          std::this_thread::sleep_for(200us);
          --timing;
        } else {
          std::shared_lock lock(gate);
          const int now = ++compiling;
          if (timing != 0) overlap = true;
          int seen = max_compiling;
          while (now > seen && !max_compiling.compare_exchange_weak(seen, now)) {
          }
          std::this_thread::sleep_for(300us);
          --compiling;
        }
      }
    });
  for (auto& t : threads) t.join();
  CHECK_FALSE(overlap);
  CHECK(max_compiling >= 2);  // compiles did run side by side
}

TEST_CASE("a waiting timed run goes before compiles that arrive after it") {
  kevo::eval::TimingGate gate;
  std::vector<int> order;
  std::mutex order_mutex;
  auto record = [&](int what) {
    std::lock_guard lock(order_mutex);
    order.push_back(what);
  };
  gate.lock_shared();  // a compile in progress
  std::thread timed([&] {
    std::unique_lock lock(gate);
    record(1);
  });
  while (gate.timed_runs_waiting() == 0) std::this_thread::sleep_for(1ms);  // the timed run is now waiting
  std::thread late_compile([&] {
    std::shared_lock lock(gate);
    record(2);
  });
  std::this_thread::sleep_for(50ms);
  gate.unlock_shared();
  timed.join();
  late_compile.join();
  REQUIRE(order.size() == 2);
  CHECK(order[0] == 1);
  CHECK(order[1] == 2);
}

TEST_CASE("with a lock file, two gates (two processes' worth) still exclude each other") {
  // In a private directory: a fixed name in /tmp would be shared with another build tree's run.
  std::string private_dir = "/tmp/kevo-gate.XXXXXX";
  REQUIRE(::mkdtemp(private_dir.data()));
  const auto lock_file = std::filesystem::path(private_dir) / "timing.lock";
  kevo::eval::TimingGate first(lock_file), second(lock_file);
  first.lock_shared();  // a compile elsewhere
  std::atomic<bool> timed{false};
  std::thread t([&] {
    std::unique_lock lock(second);
    timed = true;
  });
  std::this_thread::sleep_for(100ms);
  CHECK_FALSE(timed);  // still waiting for the other gate's compile
  first.unlock_shared();
  t.join();
  CHECK(timed);
  std::error_code ec;
  std::filesystem::remove_all(private_dir, ec);
}

}  // namespace kevo_tests::eval_timing_gate_test
