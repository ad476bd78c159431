// The build cache and its compiles, as a new user found them going wrong (issue 22): a `kill -9`
// of kevo left compilers running (cc1plus outlived g++), and the half-built `*.tmp-PID-TID`
// directories of killed runs stayed in the cache for good. Real compilers, real signals.
#include <kevo/problem_loader.hpp>
#include <kevo/eval/cpu_evaluator.hpp>
#include <kevo/eval/sandbox.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace kevo_tests::build_cache_faults_test {

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

const fs::path axpy_dir = fs::path(KEVO_TEST_DATA_DIR) / "problems" / "axpy";

// A marker no other process carries: it is in every path the compilers are given, so their
// command lines name it, even inside the jail's PID namespace.
std::string unique_marker(const char* what) {
  std::random_device entropy;
  return fmt::format("kevo-{}-{}-{:08x}", what, ::getpid(), entropy());
}

// Slow to compile, for as long as anyone waits: gcc evaluates 10^10 steps before it gives up.
const char* slow_source = R"(
constexpr unsigned long long slow() {
  unsigned long long s = 0;
  for (unsigned i = 0; i < 100000; ++i)
    for (unsigned j = 0; j < 100000; ++j) s += i ^ j;
  return s;
}
static_assert(slow() != 1);
)";

struct Process {
  pid_t pid;
  std::string name;  // /proc/PID/comm
};

// Every process whose command line holds `marker`, but not this test's own.
std::vector<Process> processes_marked(const std::string& marker) {
  std::vector<Process> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = std::stoi(name);
    if (pid == ::getpid()) continue;
    std::ifstream cmdline(entry.path() / "cmdline", std::ios::binary);
    std::stringstream text;
    text << cmdline.rdbuf();
    if (text.str().find(marker) == std::string::npos) continue;
    std::ifstream comm(entry.path() / "comm");
    std::string comm_name;
    std::getline(comm, comm_name);
    // A zombie still waiting for its parent is dead already: it holds no CPU and no files.
    std::ifstream stat(entry.path() / "stat");
    std::string stat_line;
    std::getline(stat, stat_line);
    const auto close = stat_line.rfind(')');
    if (close != std::string::npos && close + 2 < stat_line.size() && stat_line[close + 2] == 'Z') continue;
    found.push_back({pid, comm_name});
  }
  return found;
}

bool any_named(const std::vector<Process>& processes, const std::string& name) {
  for (const auto& p : processes)
    if (p.name == name) return true;
  return false;
}

std::string describe(const std::vector<Process>& processes) {
  std::string out;
  for (const auto& p : processes) out += fmt::format("{}{} ({})", out.empty() ? "" : ", ", p.pid, p.name);
  return out.empty() ? "none" : out;
}

// Waits up to `limit` for `done()`.
template <class Done>
bool wait_for(Done done, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(50ms);
  }
  return true;
}

// Runs `work` in a child process, waits until cc1plus carries `marker`, SIGKILLs the child as
// kill -9 would kevo, and returns what is left carrying the marker a moment later.
template <class Work>
std::vector<Process> kill_mid_compile(const std::string& marker, Work work) {
  std::fflush(nullptr);
  const pid_t kevo = ::fork();
  REQUIRE(kevo >= 0);
  if (kevo == 0) {
    work();
    ::_exit(0);
  }
  const bool compiling = wait_for([&] { return any_named(processes_marked(marker), "cc1plus"); }, 20s);
  ::kill(kevo, SIGKILL);
  int status = 0;
  ::waitpid(kevo, &status, 0);
  INFO("the compile was never seen running");
  REQUIRE(compiling);
  std::vector<Process> left;
  wait_for([&] { return (left = processes_marked(marker)).empty(); }, 3s);
  for (const auto& p : left) ::kill(p.pid, SIGKILL);  // the test's own leftovers: not for the next test
  return left;
}

kevo::eval::CpuEvaluatorOptions options_in(const fs::path& cache) {
  kevo::eval::CpuEvaluatorOptions o;
  o.cache_dir = cache;
  o.compile_timeout = 60s;
  o.screen = false;  // the slow source is for the compiler; the screen's clang would give up on it early
  return o;
}

}  // namespace

TEST_CASE("a compiler outside the jail dies with kevo's SIGKILL, its cc1plus too", "[sandbox][kill]") {
  // The roofline probe's compile runs so: g++ under the sandbox alone, cc1plus its child.
  const std::string marker = unique_marker("unjailed");
  const fs::path dir = fs::temp_directory_path() / marker;
  fs::create_directories(dir);
  std::ofstream(dir / "slow.cpp") << slow_source;
  const auto left = kill_mid_compile(marker, [&] {
    kevo::eval::SandboxLimits limits{.wall_time = 60s, .drop_privileges = false, .isolate = false};
    kevo::eval::run_sandboxed({"g++", "-std=c++20", "-c", (dir / "slow.cpp").string(), "-o", (dir / "slow.o").string()}, limits);
  });
  INFO("left running: " << describe(left));
  CHECK(left.empty());
  fs::remove_all(dir);
}

TEST_CASE("a jailed candidate compile dies with kevo's SIGKILL, its cc1plus too", "[sandbox][kill]") {
  const std::string marker = unique_marker("jailed");
  const fs::path cache = fs::temp_directory_path() / marker;
  auto problem = kevo::load_problem(axpy_dir);
  REQUIRE(problem);
  {
    // The problem's own objects first, so that the child's compile is the candidate's.
    kevo::eval::CpuEvaluator evaluator(*problem, options_in(cache));
    const kevo::Evaluation built = evaluator.compile(evaluator.default_candidate());
    INFO(built.diagnostics.message << "\n" << built.diagnostics.detail);
    REQUIRE(built.failure == kevo::FailureKind::none);
  }
  const auto left = kill_mid_compile(marker, [&] {
    kevo::eval::CpuEvaluator evaluator(*problem, options_in(cache));
    evaluator.compile(kevo::Candidate{.source = slow_source});
  });
  INFO("left running: " << describe(left));
  CHECK(left.empty());
  fs::remove_all(cache);
}

TEST_CASE("a compile past its time is killed with its whole group", "[sandbox][kill]") {
  const std::string marker = unique_marker("timeout");
  const fs::path dir = fs::temp_directory_path() / marker;
  fs::create_directories(dir);
  std::ofstream(dir / "slow.cpp") << slow_source;
  kevo::eval::SandboxLimits limits{.wall_time = 2s, .drop_privileges = false, .isolate = false};
  const auto r = kevo::eval::run_sandboxed({"g++", "-std=c++20", "-c", (dir / "slow.cpp").string(), "-o", (dir / "slow.o").string()}, limits);
  CHECK(r.timed_out);
  std::vector<Process> left;
  wait_for([&] { return (left = processes_marked(marker)).empty(); }, 3s);
  for (const auto& p : left) ::kill(p.pid, SIGKILL);
  INFO("left running: " << describe(left));
  CHECK(left.empty());
  fs::remove_all(dir);
}

TEST_CASE("prepare sweeps the temporaries of dead runs, and spares those of live ones", "[cache]") {
  const fs::path cache = fs::temp_directory_path() / unique_marker("sweep");
  auto problem = kevo::load_problem(axpy_dir);
  REQUIRE(problem);
  fs::path problem_dir;
  {
    kevo::eval::CpuEvaluator evaluator(*problem, options_in(cache));
    REQUIRE(evaluator.compile(evaluator.default_candidate()).failure == kevo::FailureKind::none);
    problem_dir = evaluator.build_directory();
  }
  // A PID that is surely dead: a child's, reaped.
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const pid_t live = ::getpid();  // this process: an evaluator of it may be building right now
  const auto long_ago = fs::file_time_type::clock::now() - std::chrono::hours(2);
  auto make_dir = [](const fs::path& dir, fs::file_time_type touched) {
    fs::create_directories(dir);
    std::ofstream(dir / "candidate.cpp") << "// half-built\n";
    fs::last_write_time(dir, touched);
    return dir;
  };
  const fs::path builds = problem_dir / "builds";
  const fs::path dead_build = make_dir(builds / fmt::format("00000000000000aa.tmp-{}-12345", dead), long_ago);
  const fs::path dead_object = problem_dir / fmt::format("reference.o.tmp-{}", dead);
  std::ofstream(dead_object) << "half an object";
  fs::last_write_time(dead_object, long_ago);
  const fs::path live_build = make_dir(builds / fmt::format("00000000000000bb.tmp-{}-12345", live), long_ago);
  // Dead here, but just touched: another machine's build in flight through a shared cache.
  const fs::path fresh_build = make_dir(builds / fmt::format("00000000000000cc.tmp-{}-12345", dead), fs::file_time_type::clock::now());
  const fs::path kept_build = make_dir(builds / "00000000000000dd", long_ago);  // a finished build
  // The checker's body, which the problems of a cache share: a compile of it killed leaves a temporary too.
  fs::path body_dir;
  for (const auto& entry : fs::directory_iterator(cache / "checker-bodies")) body_dir = entry.path();
  REQUIRE(fs::exists(body_dir / "checker_body.o"));
  fs::remove(body_dir / "checker_body.o");
  fs::remove(problem_dir / "checker");
  const fs::path dead_body = body_dir / fmt::format("checker_body.o.tmp-{}-12345", dead);
  std::ofstream(dead_body) << "half an object";
  fs::last_write_time(dead_body, long_ago);

  kevo::eval::CpuEvaluator evaluator(*problem, options_in(cache));
  REQUIRE(evaluator.compile(evaluator.default_candidate()).failure == kevo::FailureKind::none);
  REQUIRE(evaluator.build_directory() == problem_dir);
  CHECK_FALSE(fs::exists(dead_build));
  CHECK_FALSE(fs::exists(dead_object));
  CHECK(fs::exists(live_build / "candidate.cpp"));
  CHECK(fs::exists(fresh_build / "candidate.cpp"));
  CHECK(fs::exists(kept_build / "candidate.cpp"));
  CHECK_FALSE(fs::exists(dead_body));
  CHECK(fs::exists(body_dir / "checker_body.o"));  // compiled again, and the checker linked with it
  CHECK(fs::exists(problem_dir / "checker"));
  fs::remove_all(cache);
}

}  // namespace kevo_tests::build_cache_faults_test
