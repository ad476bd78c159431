// kevo/eval/checked_run.hpp: one evaluation's run, split in two processes. The checker (kevo's
// code and the problem's reference, trusted) owns the inputs, the outputs and the clock; the
// runner (the candidate, linked with kevo's small runner main) runs jailed (jail.hpp) and only
// calls kernel() when told, on tensors the checker shares with it. The verdict is the checker's
// JSON line; nothing the runner prints or writes is taken for it. Every evaluator (CPU, CUDA)
// runs its candidates through here.
//
//   kevo::eval::RunReport r = kevo::eval::run_checked({.checker = dir / "checker", .runner = build, .seed = 7});
//   if (r.failure == kevo::FailureKind::none) fmt::print("{} s\n", r.seconds);
#pragma once

#include <kevo/candidate.hpp>
#include <kevo/eval/jail.hpp>
#include <kevo/eval/sandbox.hpp>

#include <fmt/format.h>
#include <simdjson.h>

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <future>
#include <sstream>
#include <string>
#include <vector>

namespace kevo::eval {

/// What one checked run asks for.
struct CheckedRunRequest {
  std::filesystem::path checker;                 ///< the problem's trusted checker executable
  std::filesystem::path runner;                  ///< the candidate's executable (runner main + kernel)
  std::uint64_t seed = 1;
  int warmup = 2;
  int repetitions = 7;
  bool flush_caches = true;                      ///< before each timed call
  std::chrono::seconds call_timeout{20};         ///< one call of kernel()
  double round_trip_seconds = -1;                ///< the GPU checker's own round trip, taken off each batch (< 0: it measures it)
  SandboxLimits runner_limits = {};              ///< rlimits and the wall clock of the candidate
  SandboxLimits checker_limits = {};
  JailOptions jail = {};                         ///< `program` and `info_pipe` are set here
  bool profile = false;                          ///< one checked call for a profiler (jail.launcher) to see, untimed
  /// A connection to the PyTorch helper that the evaluator keeps running (KernelBench-format problems), which
  /// the checker then uses rather than start one; run_checked owns and closes it. -1: none.
  int torch_helper_fd = -1;
};

/// What a checked run found: a failure with its one-line message, or the timing.
struct RunReport {
  FailureKind failure = FailureKind::none;
  std::string message;
  std::string detail;
  double seconds = 0, min_seconds = 0, bytes = 0, flops = 0;
  double wall_seconds = 0, cpu_seconds = 0;      ///< the medians behind `seconds` (the larger of wall and CPU / cpus)
  double roofline_gbytes_per_s = 0, roofline_gflops = 0;  ///< where the checker measured the roofline in this run (the GPU)
  double round_trip_seconds = 0;                 ///< what the GPU checker took off each timed batch
  double reference_in_process_seconds = 0;       ///< the GPU checker's own CUDA-event timing of the reference (its first run only)
  int samples = 0;
  std::string runner_output;                     ///< a profiled run's: what the launcher (ncu) printed
};

namespace detail {

inline std::string tail(std::string_view text, std::size_t bytes = 800) {
  if (text.size() > bytes) text = text.substr(text.size() - bytes);
  std::string out(text);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

/// The last line of `text` that starts with '{'.
inline std::string last_json_line(const std::string& text) {
  std::string line;
  std::istringstream lines(text);
  for (std::string l; std::getline(lines, l);)
    if (!l.empty() && l.front() == '{') line = std::move(l);
  return line;
}

/// Why the runner's process ended, from what its sandbox saw: the checker only knows it is gone.
inline RunReport runner_ended(const SandboxResult& r, const SandboxLimits& limits, const std::string& when) {
  RunReport report;
  auto fail = [&](FailureKind kind, std::string message) {
    report.failure = kind;
    report.message = std::move(message);
    report.detail = tail(r.stderr_text);
    return report;
  };
  if (!r.started) return fail(FailureKind::sandbox_error, "the candidate's jail could not start: " + r.setup_error);
  if (r.stderr_text.starts_with("bwrap:")) return fail(FailureKind::sandbox_error, "the candidate's jail failed: " + tail(r.stderr_text, 300));
  if (r.output_limit) return fail(FailureKind::output_limit, fmt::format("printed more than {} bytes; its process was killed", limits.output_bytes));
  if (r.timed_out)
    return fail(FailureKind::timeout, fmt::format("ran past the {:.3g} s wall-clock limit; its process was killed",
                                                  std::chrono::duration<double>(limits.wall_time).count()));
  // bwrap exits with 128 + the signal that ended the program.
  const int signal = r.signal != 0 ? r.signal : (r.exited && r.exit_code > 128 && r.exit_code < 128 + 65 ? r.exit_code - 128 : 0);
  // Past the soft CPU limit comes SIGXCPU, past the hard one (a second later) SIGKILL.
  if (signal == SIGXCPU || (signal == SIGKILL && limits.cpu_time.count() > 0 && r.wall.count() >= static_cast<double>(limits.cpu_time.count())))
    return fail(FailureKind::cpu_time_limit, fmt::format("used more than {} s of CPU time", limits.cpu_time.count()));
  if (signal != 0) {
    if (r.stderr_text.find("bad_alloc") != std::string::npos)
      return fail(FailureKind::memory_limit, fmt::format("ran out of memory (limit {} MiB): std::bad_alloc", limits.memory_bytes >> 20));
    return fail(FailureKind::crash, fmt::format("crashed with {} {}", signal_name(signal), when));
  }
  return fail(FailureKind::crash, fmt::format("exited with code {} {}", r.exit_code, when));
}

/// The checker's JSON verdict, with the runner's end where the checker saw it go.
inline RunReport interpret(const SandboxResult& checker, const SandboxResult& runner, const CheckedRunRequest& request) {
  RunReport report;
  auto fail = [&](FailureKind kind, std::string message, std::string detail = {}) {
    report.failure = kind;
    report.message = std::move(message);
    report.detail = std::move(detail);
    return report;
  };
  if (!checker.started) return fail(FailureKind::sandbox_error, "the checker could not start: " + checker.setup_error);
  if (checker.timed_out)
    return fail(FailureKind::timeout, fmt::format("the evaluation ran past its {:.3g} s limit",
                                                  std::chrono::duration<double>(request.checker_limits.wall_time).count()),
                tail(runner.stderr_text));
  const std::string line = last_json_line(checker.stdout_text);
  if (line.empty() || checker.signal != 0)
    return fail(FailureKind::sandbox_error,
                checker.signal != 0 ? fmt::format("the checker was killed by {}", signal_name(checker.signal))
                                    : fmt::format("the checker exited with code {} without a verdict", checker.exit_code),
                tail(checker.stderr_text + checker.stdout_text + "\n" + runner.stderr_text, 6000));

  thread_local simdjson::ondemand::parser parser;
  const simdjson::padded_string input(line);
  simdjson::ondemand::document doc;
  std::string_view status_view;
  if (parser.iterate(input).get(doc) || doc["status"].get_string().get(status_view))
    return fail(FailureKind::sandbox_error, "the checker printed a malformed verdict", tail(line, 300));
  const std::string status(status_view);  // the view dies with the next lookup
  std::string detail;
  if (std::string_view d; !doc["detail"].get_string().get(d)) detail = std::string(d);
  if (status == "ok") {
    double v = 0;
    if (!doc["seconds"].get_double().get(v)) report.seconds = v;
    if (!doc["min_seconds"].get_double().get(v)) report.min_seconds = v;
    if (!doc["bytes"].get_double().get(v)) report.bytes = v;
    if (!doc["flops"].get_double().get(v)) report.flops = v;
    if (!doc["wall_seconds"].get_double().get(v)) report.wall_seconds = v;
    if (!doc["cpu_seconds"].get_double().get(v)) report.cpu_seconds = v;
    if (!doc["roofline_gbytes_per_s"].get_double().get(v)) report.roofline_gbytes_per_s = v;
    if (!doc["roofline_gflops"].get_double().get(v)) report.roofline_gflops = v;
    if (!doc["round_trip_seconds"].get_double().get(v)) report.round_trip_seconds = v;
    if (!doc["reference_in_process_seconds"].get_double().get(v)) report.reference_in_process_seconds = v;
    if (std::int64_t n = 0; !doc["samples"].get_int64().get(n)) report.samples = static_cast<int>(n);
    return report;
  }
  const std::string runner_tail = tail(runner.stderr_text);
  if (status == "runner_exited") return runner_ended(runner, request.runner_limits, detail);
  if (status == "timeout") return fail(FailureKind::timeout, "hung: " + detail, runner_tail);
  if (status == "wrong_answer") return fail(FailureKind::wrong_answer, "wrong answer: " + detail, detail);
  if (status == "unwritten_output") return fail(FailureKind::unwritten_output, "left output unwritten: " + detail, detail);
  if (status == "mutated_input") return fail(FailureKind::mutated_input, "changed its inputs: " + detail, detail);
  if (status == "replayed_output") return fail(FailureKind::replayed_output, "replayed outputs: " + detail, detail);
  if (status == "memory_limit")
    return fail(FailureKind::memory_limit, fmt::format("ran out of memory (limit {} MiB): {}", request.runner_limits.memory_bytes >> 20, detail),
                runner_tail);
  if (status == "crash") return fail(FailureKind::crash, "crashed: " + detail, runner_tail);
  if (status == "bad_report") return fail(FailureKind::bad_report, detail, runner_tail);
  if (status == "sandbox_error") return fail(FailureKind::sandbox_error, detail, runner_tail);
  return fail(FailureKind::sandbox_error, "the checker gave an unknown verdict '" + status + "'", detail);
}

}  // namespace detail

/// Runs the candidate's runner in its jail beside the problem's checker, joined by a socket, and
/// returns the checker's verdict. Thread-safe; the caller keeps timed runs one at a time.
inline RunReport run_checked(CheckedRunRequest request) {
  OwnedFd torch_helper(request.torch_helper_fd);
  RunReport report;
  int control[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, control) != 0) {
    report.failure = FailureKind::sandbox_error;
    report.message = fmt::format("socketpair: {}", std::strerror(errno));
    return report;
  }
  OwnedFd checker_end(control[0]), runner_end(control[1]);
  request.jail.program = request.runner;
  request.jail.info_pipe = true;
  auto jail = make_jail(request.jail);
  if (!jail) {
    report.failure = FailureKind::sandbox_error;
    report.message = jail.error().message;
    return report;
  }
  OwnedFd info(jail->info_read.release());

  SandboxLimits runner_limits = request.runner_limits;
  runner_limits.isolate = false;  // bwrap makes the namespaces; the checker must see the runner's pid
  runner_limits.handed_over_fds = jail->release_handed_over_fds();
  const std::vector<std::string> runner_argv = jail->command({"--control", std::to_string(runner_end.get())});
  runner_limits.handed_over_fds.push_back(runner_end.release());
  auto runner = std::async(std::launch::async, [&runner_argv, runner_limits] { return run_sandboxed(runner_argv, runner_limits); });

  SandboxLimits checker_limits = request.checker_limits;
  checker_limits.isolate = false;  // it signals the runner and reads its CPU clock by pid
  checker_limits.drop_privileges = false;
  std::vector<std::string> checker_argv = {request.checker.string(), "--control", std::to_string(checker_end.get()), "--info",
                                                 std::to_string(info.get()), "--seed", std::to_string(request.seed), "--warmup",
                                                 std::to_string(request.warmup), "--repetitions", std::to_string(request.repetitions),
                                                 "--call-timeout", std::to_string(request.call_timeout.count()), "--flush",
                                                 request.flush_caches ? "1" : "0", "--round-trip", fmt::format("{:.9g}", request.round_trip_seconds),
                                                 "--profile", request.profile ? "1" : "0"};
  checker_limits.handed_over_fds = {checker_end.release(), info.release()};
  if (torch_helper.get() >= 0) {
    checker_argv.insert(checker_argv.end(), {"--torch-helper", std::to_string(torch_helper.get())});
    checker_limits.handed_over_fds.push_back(torch_helper.release());
  }
  const SandboxResult checker = run_sandboxed(checker_argv, checker_limits);
  const SandboxResult runner_result = runner.get();
  RunReport verdict = detail::interpret(checker, runner_result, request);
  if (request.profile) verdict.runner_output = runner_result.stdout_text;
  return verdict;
}

}  // namespace kevo::eval
