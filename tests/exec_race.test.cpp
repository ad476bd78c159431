// Programs start without the ETXTBSY race (issue 50). exec of a file fails with "Text file busy"
// while any process holds the file open for writing. A thread that writes a program holds such a
// descriptor, and every child that another thread forks meanwhile inherits a copy of it, whether
// or not it is close-on-exec, until that child closes it: started in that window, the freshly
// written program failed. Here 8 threads each write fresh programs and start them at once, while
// the others fork for theirs, thousands of times; no start may fail. And evaluators that prepare one
// problem in one cache at once (ctest -j's test processes) each link their own checker.
#include <kevo/problem_loader.hpp>
#include <kevo/eval/cpu_evaluator.hpp>
#include <kevo/eval/sandbox.hpp>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kevo_tests::exec_race_test {

namespace {

namespace fs = std::filesystem;

/// A private directory under /tmp (mkdtemp), removed at the end of the test.
struct PrivateDirectory {
  fs::path path;
  PrivateDirectory() {
    std::string name = "/tmp/kevo-exec-race.XXXXXX";
    if (::mkdtemp(name.data())) path = name;
  }
  ~PrivateDirectory() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("run_sandboxed: programs written by 8 threads start at once, thousands of times, never Text file busy", "[sandbox][race]") {
  const PrivateDirectory dir;
  REQUIRE(!dir.path.empty());
  const std::string program = read_file("/bin/true");
  REQUIRE(program.size() > 1000);

  constexpr int threads = 8;
  constexpr int runs_per_thread = 200;  // 1,600 starts: 10-20 s on 2 cores
  // Bounded in time too, so that a slow machine still finishes well inside its test timeout.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(25);
  kevo::eval::SandboxLimits limits;
  limits.wall_time = std::chrono::seconds(20);
  limits.isolate = false;  // namespaces change nothing here and cost a few milliseconds a start

  std::atomic<int> started{0}, failed{0};
  std::mutex first_failure_mutex;
  std::string first_failure;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      for (int k = 0; k < runs_per_thread && std::chrono::steady_clock::now() < deadline; ++k) {
        const fs::path path = dir.path / fmt::format("true-{}-{}", t, k);
        {
          // As a linker writes its output: in pieces, the descriptor open across them. std::ofstream
          // opens without O_CLOEXEC, as most writers do.
          std::ofstream out(path, std::ios::binary);
          for (std::size_t at = 0; at < program.size(); at += 256) {
            out.write(program.data() + at, static_cast<std::streamsize>(std::min<std::size_t>(256, program.size() - at)));
            out.flush();
          }
        }
        fs::permissions(path, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec | fs::perms::others_read |
                                  fs::perms::others_exec);
        const kevo::eval::SandboxResult r = kevo::eval::run_sandboxed({path.string()}, limits);
        ++started;
        if (!r.ok()) {
          ++failed;
          std::lock_guard lock(first_failure_mutex);
          if (first_failure.empty())
            first_failure = r.setup_error.empty() ? fmt::format("exit {} signal {}: {}", r.exit_code, r.signal, r.stderr_text) : r.setup_error;
        }
        std::error_code ec;
        fs::remove(path, ec);
      }
    });
  for (auto& w : workers) w.join();

  INFO(failed.load() << " of " << started.load() << " starts failed; the first: " << first_failure);
  CHECK(failed.load() == 0);
  CHECK(started.load() >= 1000);
}

// The race that ctest -j 2 hit (issue 50): two test processes preparing one problem in one shared
// cache linked its checker under one shared name, checker.tmp, at once. The linker (GNU ld) unlinks
// and recreates its output: the first process renamed the second's half-written checker into place
// and started it while the second's linker still held it open for writing: "the reference failed
// while the tolerance was checked: sandbox fexecve failed: Text file busy". Evaluators in threads
// stand for the processes (the names were per process at best, so threads collide as they did).
TEST_CASE("evaluators preparing one problem in one fresh cache at once all prepare, none Text file busy", "[eval][race]") {
  const PrivateDirectory cache;
  REQUIRE(!cache.path.empty());
  auto problem = kevo::load_problem(fs::path(KEVO_TEST_DATA_DIR) / "problems" / "axpy");
  REQUIRE(problem);
  constexpr int evaluators = 4;
  std::barrier start(evaluators);
  std::mutex failure_mutex;
  int failed = 0;
  std::string first_failure;
  std::vector<std::thread> threads;
  for (int t = 0; t < evaluators; ++t)
    threads.emplace_back([&] {
      kevo::eval::CpuEvaluatorOptions options;
      options.cache_dir = cache.path;
      options.warmup = 1;
      options.reference_repetitions = 3;
      kevo::eval::CpuEvaluator evaluator(*problem, options);
      start.arrive_and_wait();
      const auto ready = evaluator.prepare();
      if (!ready) {
        std::lock_guard lock(failure_mutex);
        ++failed;
        if (first_failure.empty()) first_failure = ready.error().message;
      }
    });
  for (auto& t : threads) t.join();
  INFO(failed << " of " << evaluators << " prepares failed; the first: " << first_failure);
  CHECK(failed == 0);
}

}  // namespace kevo_tests::exec_race_test
