// The sandbox: every way a candidate can misbehave costs one evaluation, with the right
// FailureKind and a message a person can act on; the next good candidate still succeeds.
#include <kevo/problem_loader.hpp>
#include <kevo/eval/cpu_evaluator.hpp>
#include <kevo/eval/sandbox.hpp>

#include <catch2/catch.hpp>

#include "support/require_prepared.hpp"

#include <cstdlib>
#include <filesystem>
#include <string>

#include <sched.h>
#include <seccomp.h>
#include <sys/wait.h>
#include <unistd.h>


namespace kevo_tests::sandbox_test {

namespace {

using kevo::FailureKind;

const std::filesystem::path axpy_dir = std::filesystem::path(KEVO_TEST_DATA_DIR) / "problems" / "axpy";

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

kevo::eval::CpuEvaluatorOptions small_limits() {
  kevo::eval::CpuEvaluatorOptions o;
  o.cache_dir = std::filesystem::temp_directory_path() / "kevo-test-cache";
  o.run_timeout = std::chrono::seconds(2);
  o.compile_timeout = std::chrono::seconds(30);
  o.memory_limit_bytes = std::size_t{512} << 20;
  o.output_limit_bytes = 64 << 10;
  o.max_processes = 32;
  o.warmup = 1;
  o.repetitions = 3;
  o.screen = false;  // these candidates test the sandbox itself, the wall behind the screen
  return o;
}

kevo::eval::CpuEvaluator& axpy_evaluator() {
  static kevo::eval::CpuEvaluator evaluator = [] {
    auto problem = kevo::load_problem(axpy_dir);
    if (!problem) FAIL(problem.error().message);
    return kevo::eval::CpuEvaluator(*problem, small_limits());
  }();
  return evaluator;
}

// A candidate for axpy (out = 2x + y) whose body is `body`, with helpers available.
kevo::Candidate axpy_candidate(const std::string& body) {
  return kevo::Candidate{.source = "#include \"kevo_problem.hpp\"\n"
                                   "#include <cstdio>\n#include <cstdlib>\n#include <cstring>\n#include <new>\n"
                                   "#include <stdexcept>\n#include <unistd.h>\n"
                                   "void kernel(const Shape& shape, const float* x, const float* y, float* out) {\n" +
                                   body + "\n}\n"};
}

const std::string correct_body = "for (long i = 0; i < shape.N; ++i) out[i] = 2.0f * x[i] + y[i];";

void expect_good_candidate_still_succeeds() {
  const kevo::Evaluation e = axpy_evaluator().evaluate(axpy_candidate(correct_body + " // still fine"), 11);
  INFO(e.diagnostics.message << "\n" << e.diagnostics.detail);
  CHECK(e.ok());
  CHECK(e.seconds > 0);
}

kevo::Evaluation evaluate_body(const std::string& body, std::uint64_t seed = 3) {
  auto& evaluator = axpy_evaluator();
  REQUIRE_PREPARED(evaluator);
  const kevo::Evaluation e = evaluator.evaluate(axpy_candidate(body), seed);
  INFO(to_string(e.failure) << ": " << e.diagnostics.message << "\n" << e.diagnostics.detail);
  return e;
}

}  // namespace

TEST_CASE("a correct candidate passes") {
  const kevo::Evaluation e = evaluate_body(correct_body);
  INFO(e.diagnostics.message);
  CHECK(e.ok());
  CHECK(e.speedup > 0);
}

TEST_CASE("a crashing candidate is a crash that names the signal") {
  const kevo::Evaluation e = evaluate_body("volatile int* p = nullptr; *p = 1;");
  CHECK(e.failure == FailureKind::crash);
  CHECK(contains(e.diagnostics.message, "SIGSEGV"));
  expect_good_candidate_still_succeeds();
}

TEST_CASE("a candidate that exits (even with 0) or throws inside kernel() is a crash") {
  CHECK(evaluate_body("std::exit(3);").failure == FailureKind::crash);
  const kevo::Evaluation thrown = evaluate_body("throw std::runtime_error(\"boom\");");
  CHECK(thrown.failure == FailureKind::crash);
  CHECK(contains(thrown.diagnostics.message, "boom"));
  const kevo::Evaluation quiet = evaluate_body("std::exit(0);");
  CHECK(quiet.failure == FailureKind::crash);
  CHECK(contains(quiet.diagnostics.message, "exited with code 0 in kernel()"));
  expect_good_candidate_still_succeeds();
}

TEST_CASE("a hanging candidate is a timeout, killed at the wall-clock limit") {
  const auto t0 = std::chrono::steady_clock::now();
  const kevo::Evaluation e = evaluate_body("for (;;) { asm volatile(\"\"); }");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(e.failure == FailureKind::timeout);
  CHECK(contains(e.diagnostics.message, "no answer within"));
  CHECK(seconds < 10);
  expect_good_candidate_still_succeeds();
}

TEST_CASE("a candidate that burns CPU past its CPU-time limit is a cpu_time_limit") {
  auto problem = kevo::load_problem(axpy_dir);
  REQUIRE(problem);
  auto options = small_limits();
  options.run_timeout = std::chrono::seconds(6);
  options.cpu_time_limit = std::chrono::seconds(1);
  kevo::eval::CpuEvaluator evaluator(*problem, options);
  const kevo::Evaluation e = evaluator.evaluate(axpy_candidate("for (;;) { asm volatile(\"\"); }"), 5);
  INFO(e.diagnostics.message);
  CHECK(e.failure == FailureKind::cpu_time_limit);
  CHECK(contains(e.diagnostics.message, "CPU time"));
}

TEST_CASE("a candidate that allocates without bound hits the memory limit") {
  auto problem = kevo::load_problem(axpy_dir);
  REQUIRE(problem);
  auto options = small_limits();
  options.memory_limit_bytes = std::size_t{256} << 20;
  options.run_timeout = std::chrono::seconds(20);  // touching the pages is slow on a loaded machine
  kevo::eval::CpuEvaluator evaluator(*problem, options);
  const kevo::Evaluation e =
      evaluator.evaluate(axpy_candidate("for (;;) { char* p = new char[1 << 24]; std::memset(p, 1, 1 << 24); }"), 3);
  INFO(e.diagnostics.message);
  CHECK(e.failure == FailureKind::memory_limit);
  CHECK(contains(e.diagnostics.message, "memory"));
  expect_good_candidate_still_succeeds();
}

// Processes whose executable lies under `directory`.
int processes_running_from(const std::filesystem::path& directory) {
  int count = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const auto exe = std::filesystem::read_symlink(entry.path() / "exe", ec);
    if (!ec && exe.string().rfind(directory.string(), 0) == 0) ++count;
  }
  return count;
}

TEST_CASE("a fork bomb is contained: it times out and leaves nothing behind") {
  auto problem = kevo::load_problem(axpy_dir);
  REQUIRE(problem);
  auto options = small_limits();  // a cache of its own: no other test runs candidates from it
  options.cache_dir = std::filesystem::temp_directory_path() / fmt::format("kevo-test-fork-bomb-{}", ::getpid());
  {
    kevo::eval::CpuEvaluator evaluator(*problem, options);
    const kevo::Evaluation e = evaluator.evaluate(axpy_candidate("for (;;) ::fork();"), 3);
    INFO(e.diagnostics.message);
    CHECK((e.failure == FailureKind::timeout || e.failure == FailureKind::crash));
    CHECK(processes_running_from(evaluator.build_directory()) == 0);
    const kevo::Evaluation good = evaluator.evaluate(axpy_candidate(correct_body), 4);
    CHECK(good.ok());
  }
  std::error_code ec;
  std::filesystem::remove_all(options.cache_dir, ec);
}

TEST_CASE("a candidate that prints gigabytes is stopped at the output cap") {
  const kevo::Evaluation e = evaluate_body("static char line[1 << 16]; std::memset(line, 'x', sizeof line); for (;;) std::fwrite(line, 1, sizeof line, stdout);");
  CHECK(e.failure == FailureKind::output_limit);
  CHECK(contains(e.diagnostics.message, "printed more than"));
  expect_good_candidate_still_succeeds();
}

TEST_CASE("a candidate far slower than the reference is timed once, not seven times") {
  const std::string body = correct_body + " if (shape.N == 4096) ::usleep(150000);";
  const kevo::Evaluation e = evaluate_body(body);
  REQUIRE(e.ok());
  CHECK(e.speedup < 0.1);
  CHECK(contains(e.diagnostics.detail, "of 1 timed calls"));
  CHECK(contains(e.diagnostics.detail, "not timed further"));
}

TEST_CASE("a candidate that does not compile is a compile error with the compiler's first error") {
  const kevo::Evaluation e = evaluate_body("return undeclared_variable;");
  CHECK(e.failure == FailureKind::compile_error);
  CHECK(contains(e.diagnostics.message, "candidate.cpp:"));
  CHECK(contains(e.diagnostics.message, "undeclared_variable"));
  CHECK_FALSE(contains(e.diagnostics.detail, "/builds/"));  // build paths are stripped
  // The failure is cached: the same source is not compiled twice.
  const auto before = axpy_evaluator().stats();
  const kevo::Evaluation again = evaluate_body("return undeclared_variable;");
  CHECK(again.failure == FailureKind::compile_error);
  CHECK(axpy_evaluator().stats().compiles == before.compiles);
  expect_good_candidate_still_succeeds();
}

TEST_CASE("a wrong answer is reported with a summary of the mismatch") {
  const kevo::Evaluation e = evaluate_body("for (long i = 0; i < shape.N; ++i) out[i] = 2.0f * x[i] + y[i] + (i == 5 ? 1.0f : 0.0f);");
  CHECK(e.failure == FailureKind::wrong_answer);
  CHECK(contains(e.diagnostics.message, "out: 1 of"));
  CHECK(contains(e.diagnostics.message, "first at index 5"));
  CHECK(contains(e.diagnostics.message, "expected"));
  CHECK(contains(e.diagnostics.message, "got"));
  expect_good_candidate_still_succeeds();
}

TEST_CASE("inputs are fresh random numbers: a candidate that ignores its inputs is wrong") {
  const kevo::Evaluation e = evaluate_body("for (long i = 0; i < shape.N; ++i) out[i] = 0.0f;");
  CHECK(e.failure == FailureKind::wrong_answer);
}

TEST_CASE("a candidate that replays an earlier call's results is caught") {
  // Computes once per input buffer, then copies out what it computed before.
  const kevo::Evaluation e = evaluate_body(
      "static const float* seen_x = nullptr; static long seen_n = 0; static float saved[1 << 16];\n"
      "if (x == seen_x && shape.N == seen_n) { std::memcpy(out, saved, shape.N * sizeof(float)); return; }\n"
      "for (long i = 0; i < shape.N; ++i) saved[i] = out[i] = 2.0f * x[i] + y[i];\n"
      "seen_x = x; seen_n = shape.N;");
  // Named a replay where the checker knows the earlier call's outputs (the second call of a pair at
  // one address), else a wrong answer.
  CHECK((e.failure == FailureKind::replayed_output || e.failure == FailureKind::wrong_answer));
}

TEST_CASE("an output left partly unwritten is unwritten_output") {
  const kevo::Evaluation e = evaluate_body("for (long i = 0; i + 1 < shape.N; ++i) out[i] = 2.0f * x[i] + y[i];");
  CHECK(e.failure == FailureKind::unwritten_output);
  CHECK(contains(e.diagnostics.message, "unwritten"));
  expect_good_candidate_still_succeeds();
}

TEST_CASE("a write past the end of an output is a wrong answer") {
  const kevo::Evaluation e = evaluate_body(correct_body + " out[shape.N] = 1.0f;");
  CHECK(e.failure == FailureKind::wrong_answer);
  CHECK(contains(e.diagnostics.message, "past its end"));
}

TEST_CASE("the parent's secrets are not in the candidate's environment") {
  ::setenv("KEVO_TEST_SECRET", "hunter2", 1);
  ::setenv("OPENAI_API_KEY", "sk-test-secret", 1);
  // The candidate answers wrongly if it can see any secret.
  const kevo::Evaluation e = evaluate_body(
      "extern char** environ; bool leaked = std::getenv(\"KEVO_TEST_SECRET\") || std::getenv(\"OPENAI_API_KEY\") || std::getenv(\"HOME\");\n"
      "for (char** v = environ; *v; ++v) leaked = leaked || std::strstr(*v, \"hunter2\") || std::strstr(*v, \"sk-test\");\n"
      "for (long i = 0; i < shape.N; ++i) out[i] = 2.0f * x[i] + y[i] + (leaked ? 1.0f : 0.0f);");
  CHECK(e.ok());
}

TEST_CASE("run_sandboxed: scrubbed environment, /dev/null stdin, no network, unprivileged") {
  ::setenv("KEVO_TEST_SECRET", "hunter2", 1);
  kevo::eval::SandboxLimits limits;
  limits.wall_time = std::chrono::seconds(5);
  const auto r = kevo::eval::run_sandboxed({"/bin/sh", "-c", "env; echo uid=$(id -u); cat; wc -l < /proc/net/dev"}, limits);
  INFO(r.stdout_text << r.stderr_text << r.setup_error);
  REQUIRE(r.started);
  CHECK(r.exited);
  CHECK_FALSE(contains(r.stdout_text, "hunter2"));
  CHECK_FALSE(contains(r.stdout_text, "KEVO_TEST_SECRET"));
  CHECK(contains(r.stdout_text, "PATH="));
  if (::geteuid() == 0) {
    CHECK_FALSE(contains(r.stdout_text, "uid=0\n"));
    CHECK(r.isolated);
    CHECK(contains(r.stdout_text, "\n3\n"));  // only the loopback device: header lines + lo
  }
}

TEST_CASE("run_sandboxed: the process limit applies only to a run with a uid of its own") {
  // RLIMIT_NPROC counts all of a uid's processes: under the caller's own uid it would count the
  // caller's other processes too, and fail a threaded candidate on a busy desktop.
  kevo::eval::SandboxLimits limits;
  limits.wall_time = std::chrono::seconds(5);
  limits.max_processes = 37;
  limits.drop_privileges = false;
  const std::vector<std::string> show_limit{"/bin/sh", "-c", "grep 'Max processes' /proc/self/limits"};
  const auto own = kevo::eval::run_sandboxed(show_limit, limits);
  INFO(own.stdout_text << own.stderr_text << own.setup_error);
  REQUIRE(own.ok());
  CHECK(contains(own.stdout_text, "Max processes"));
  CHECK_FALSE(contains(own.stdout_text, " 37 "));
  if (::geteuid() == 0) {  // only root can drop to a uid of the run's own
    limits.drop_privileges = true;
    const auto dropped = kevo::eval::run_sandboxed(show_limit, limits);
    INFO(dropped.stdout_text << dropped.stderr_text << dropped.setup_error);
    REQUIRE(dropped.ok());
    CHECK(contains(dropped.stdout_text, " 37 "));
  }
}

TEST_CASE("run_sandboxed: a timeout kills the whole process group, grandchildren included") {
  kevo::eval::SandboxLimits limits;
  limits.wall_time = std::chrono::milliseconds(500);
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = kevo::eval::run_sandboxed({"/bin/sh", "-c", "sleep 30 & sleep 30 & wait"}, limits);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(r.timed_out);
  CHECK(seconds < 3);
}

TEST_CASE("run_sandboxed: the exit code, the signal and a missing program are reported") {
  kevo::eval::SandboxLimits limits;
  limits.wall_time = std::chrono::seconds(5);
  const auto exited = kevo::eval::run_sandboxed({"/bin/sh", "-c", "echo out; echo err >&2; exit 7"}, limits);
  CHECK(exited.exited);
  CHECK(exited.exit_code == 7);
  CHECK(exited.stdout_text == "out\n");
  CHECK(exited.stderr_text == "err\n");
  const auto killed = kevo::eval::run_sandboxed({"/bin/sh", "-c", "kill -ABRT $$"}, limits);
  CHECK(killed.signal == SIGABRT);
  CHECK(kevo::eval::signal_name(SIGABRT).rfind("SIGABRT", 0) == 0);
  const auto missing = kevo::eval::run_sandboxed({"/no/such/program"}, limits);
  CHECK_FALSE(missing.started);
  CHECK(contains(missing.setup_error, "/no/such/program"));
}

TEST_CASE("the jail's layers are checked, not assumed: all of them here, and a clear refusal where namespaces are blocked") {
  const kevo::eval::IsolationReport here = kevo::eval::inspect_isolation();
  INFO(here.summary() << " / " << here.problem);
  CHECK(here.complete());
  CHECK_THAT(here.summary(), Catch::StartsWith("isolation: candidates run jailed (namespaces"));

  // As under Docker's default seccomp profile: no new namespaces for this process or its children.
  int report_pipe[2];
  REQUIRE(::pipe(report_pipe) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(report_pipe[0]);
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(unshare), 0);
    seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER));
    seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
    if (seccomp_load(ctx) != 0) ::_exit(3);
    const kevo::eval::IsolationReport blocked = kevo::eval::inspect_isolation();
    const std::string line = std::string(blocked.jail ? "jailed " : "refused ") + blocked.summary();
    (void)!::write(report_pipe[1], line.data(), line.size());
    ::_exit(0);
  }
  ::close(report_pipe[1]);
  std::string line;
  char buffer[512];
  for (ssize_t n; (n = ::read(report_pipe[0], buffer, sizeof buffer)) > 0;) line.append(buffer, static_cast<std::size_t>(n));
  ::close(report_pipe[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  INFO(line);
  CHECK(WIFEXITED(status));
  CHECK_THAT(line, Catch::StartsWith("refused isolation: MISSING, candidates cannot be jailed here ("));
  CHECK_THAT(line, Catch::Contains("kevo will not run them"));
}

}  // namespace kevo_tests::sandbox_test
