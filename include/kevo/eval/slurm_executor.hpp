// kevo/eval/slurm_executor.hpp: an Executor (executor.hpp) that runs each checked run as one Slurm
// job step: `srun` of kevo-run-checked (examples/search/run_checked.cpp), which performs
// run_checked on the node and prints the RunReport as one JSON line (checked_run_wire.hpp).
//
// Assumptions and trust:
// - the build cache (the checker, the candidates' builds) and kevo-run-checked sit on a filesystem
//   that every node sees at the same path (on one node it is the same filesystem);
// - a node is trusted for its own evaluation's verdict only: the step's stdout must be exactly one
//   line, this evaluation's report (its id), read strictly; anything else (garbage, nothing, another
//   id) is a sandbox_error naming Slurm, never a crash of the search.
// - Slurm's --time is only accurate to about a minute, so kevo bounds each step with its own clock
//   and cancels it (scancel by the step's unique job name) when it runs past.
// - A step that fails without a verdict (killed, cancelled, its node lost or requeued) is tried
//   again, up to `attempts` times, then it is a named failure. The evaluator sees one RunReport per
//   evaluation either way, so the store never loses nor duplicates an evaluation.
//
//   kevo::eval::SlurmExecutor slurm({.helper = "build/examples/search/kevo-run-checked", .partition = "gpu"});
//   kevo::eval::JailedEvaluator<kevo::eval::CpuToolchain, kevo::eval::SlurmExecutor> evaluator(problem, {}, slurm);
#pragma once

#include <kevo/eval/checked_run.hpp>
#include <kevo/eval/checked_run_wire.hpp>
#include <kevo/eval/executor.hpp>
#include <kevo/eval/sandbox.hpp>
#include <kevo/expected.hpp>

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace kevo::eval {

struct SlurmOptions {
  std::filesystem::path helper;                       ///< kevo-run-checked, at a path the nodes see
  std::string partition = {};                         ///< empty: the cluster's default
  std::string srun = "srun";
  std::string scancel = "scancel";
  int attempts = 3;                                   ///< steps tried per checked run before a named failure
  std::chrono::seconds queue_allowance{120};          ///< beyond the run's own limit: waiting for a node, starting the step
  std::chrono::milliseconds retry_backoff{500};       ///< before the second attempt; doubled for each later one
  bool exclusive = true;                              ///< a whole node per step, so that no other step skews its timing
  /// This machine is one of the nodes (a one-node cluster): its timed runs then take turns with
  /// each other and with compiles here, as local ones do (slurm_nodes_include_this_machine()).
  bool nodes_include_this_machine = false;
  std::vector<std::string> extra_arguments = {};      ///< more srun options (--account, --qos, --constraint)
};

/// What the executor has done so far, shared by its copies (an evaluator keeps one).
struct SlurmStats {
  std::atomic<std::size_t> steps{0};        ///< srun invocations
  std::atomic<std::size_t> retries{0};      ///< steps that were attempts after a failed one
  std::atomic<std::size_t> failures{0};     ///< checked runs given up on, as sandbox_error
};

class SlurmExecutor {
 public:
  explicit SlurmExecutor(SlurmOptions options = {}) : options_(std::move(options)), stats_(std::make_shared<SlurmStats>()) {}

  /// srun and the helper are where they are said to be (here; the nodes must see the helper too).
  expected<void, Error> check() const {
    if (!find_program(options_.srun)) return make_error(fmt::format("--executor slurm: '{}' is not on PATH (install slurm-client)", options_.srun));
    std::error_code ec;
    if (options_.helper.empty() || !std::filesystem::is_regular_file(options_.helper, ec))
      return make_error(fmt::format("--executor slurm: the node helper '{}' does not exist (build kevo-run-checked)", options_.helper.string()));
    return {};
  }

  RunReport run(const CheckedRunRequest& request) const {
    std::string last_error;
    const int attempts = std::max(1, options_.attempts);
    int attempt = 1;
    for (; attempt <= attempts; ++attempt) {
      if (attempt > 1) {
        ++stats_->retries;
        std::this_thread::sleep_for(options_.retry_backoff * (1 << std::min(attempt - 2, 4)));
      }
      Step step = run_step(request);
      if (step.report) return *step.report;
      last_error = std::move(step.error);
      if (!step.retry) break;
    }
    ++stats_->failures;
    RunReport failed;
    failed.failure = FailureKind::sandbox_error;
    failed.message = attempt > attempts ? fmt::format("Slurm: {} attempts failed; the last: {}", attempts, last_error)
                                        : fmt::format("Slurm: {}", last_error);
    return failed;
  }

  bool remote() const { return !options_.nodes_include_this_machine; }
  const SlurmOptions& options() const { return options_; }
  const SlurmStats& stats() const { return *stats_; }

  /// The srun command line of one step (without the helper's request), for tests and `--help`.
  std::vector<std::string> srun_command(const CheckedRunRequest& request, const std::string& job_name) const {
    const auto limit = run_limit(request);
    const auto minutes = std::chrono::duration_cast<std::chrono::minutes>(limit).count() + 1;  // Slurm's own, coarse
    std::vector<std::string> argv = {options_.srun, "--job-name=" + job_name, fmt::format("--time={}", minutes), "--ntasks=1",
                                     "--nodes=1", "--kill-on-bad-exit=1", "--quiet"};
    if (!options_.partition.empty()) argv.push_back("--partition=" + options_.partition);
    if (request.jail.gpu) argv.push_back("--gres=gpu:1");
    if (options_.exclusive) argv.push_back("--exclusive");
    argv.insert(argv.end(), options_.extra_arguments.begin(), options_.extra_arguments.end());
    argv.push_back(options_.helper.string());
    return argv;
  }

 private:
  struct Step {
    std::optional<RunReport> report;
    std::string error;
    bool retry = false;
  };

  /// The run's own bound on the node, plus the time to get there.
  std::chrono::milliseconds run_limit(const CheckedRunRequest& request) const {
    return request.checker_limits.wall_time + std::chrono::duration_cast<std::chrono::milliseconds>(options_.queue_allowance);
  }

  /// A job name naming the problem and the candidate's build, unique to this step (scancel finds it by name).
  static std::string job_name(const CheckedRunRequest& request) {
    static std::atomic<std::uint64_t> counter{0};
    auto clean = [](std::string s) {
      for (char& c : s)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
      return s.substr(0, 60);
    };
    return fmt::format("kevo-{}-{}-{}-{}", clean(request.checker.parent_path().filename().string()),
                       clean(request.runner.parent_path().filename().string()), ::getpid(), ++counter);
  }

  SandboxLimits srun_limits(std::chrono::milliseconds wall) const {
    SandboxLimits l;
    l.wall_time = wall;
    l.drop_privileges = false;
    l.isolate = false;
    l.output_bytes = 1u << 20;
    l.environment.clear();  // srun needs the user's Slurm settings (SLURM_CONF, PATH, HOME)
    for (char** e = environ; e && *e; ++e) l.environment.emplace_back(*e);
    return l;
  }

  Step run_step(const CheckedRunRequest& request) const {
    const std::string name = job_name(request);
    std::vector<std::string> argv = srun_command(request, name);
    argv.push_back("--request");
    argv.push_back(request_to_json(request, name));
    ++stats_->steps;
    const SandboxResult r = run_sandboxed(argv, srun_limits(run_limit(request)));
    Step step;
    if (!r.started) {
      step.error = fmt::format("srun could not start: {}", r.setup_error);
      return step;  // not a passing fault of the cluster
    }
    // Whatever srun's end, the step must not outlive it: a step left running holds a node.
    if (!r.ok()) cancel(name);
    std::string out = r.stdout_text;
    if (!out.empty() && out.back() == '\n') out.pop_back();
    if (r.ok()) {
      auto report = report_from_json(out, name);
      if (report) {
        step.report = std::move(*report);
        return step;
      }
      // The node answered, but not with this evaluation's verdict: its answer is not taken.
      step.error = fmt::format("job {} answered without a valid verdict ({}): {}", name, report.error().message,
                               detail::tail(out.empty() ? r.stderr_text : out, 300));
      return step;
    }
    step.retry = true;
    if (r.timed_out)
      step.error = fmt::format("job {} ran past kevo's {:.0f} s limit and was cancelled", name,
                               std::chrono::duration<double>(run_limit(request)).count());
    else if (r.output_limit)
      step.error = fmt::format("job {} printed more than {} bytes and was cancelled", name, 1u << 20), step.retry = false;
    else
      step.error = fmt::format("job {} ended without a verdict ({}): {}", name,
                               r.signal ? std::string(signal_name(r.signal)) : fmt::format("srun exit code {}", r.exit_code),
                               detail::tail(r.stderr_text, 300));
    return step;
  }

  void cancel(const std::string& name) const {
    SandboxLimits l = srun_limits(std::chrono::seconds(15));
    run_sandboxed({options_.scancel, "--name=" + name, "--full"}, l);
  }

  SlurmOptions options_;
  std::shared_ptr<SlurmStats> stats_;
};

static_assert(Executor<SlurmExecutor>);

/// Whether the partition's nodes (sinfo) include this machine, by its host name or as localhost.
inline bool slurm_nodes_include_this_machine(const SlurmOptions& options) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string short_host(host);
  short_host = short_host.substr(0, short_host.find('.'));
  std::vector<std::string> argv = {"sinfo", "--noheader", "--Node", "--format=%N"};
  if (!options.partition.empty()) argv.push_back("--partition=" + options.partition);
  SandboxLimits limits;
  limits.wall_time = std::chrono::seconds(15);
  limits.drop_privileges = false;
  limits.isolate = false;
  limits.environment.clear();
  for (char** e = environ; e && *e; ++e) limits.environment.emplace_back(*e);
  const SandboxResult r = run_sandboxed(argv, limits);
  std::istringstream lines(r.stdout_text);
  for (std::string node; std::getline(lines, node);)
    if (node == "localhost" || node == short_host || node == host) return true;
  return false;
}

}  // namespace kevo::eval
