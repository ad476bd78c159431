// kevo-search: optimize one kernel of a problem directory on this machine's CPU, or its GPU for a
// problem whose target is cuda.
//
// It composes the offline template synthesizer, a search policy, a memory operator, the jailed
// CPU or CUDA evaluator and the SQLite store into a SearchLoop, prints progress as results
// come in, writes the best kernel to disk, and ends with its verified speedup:
//
//   kevo-search problems/cpu_scoring --budget 60 --jobs 2
//   ...
//   best: 7.3x over reference (verified)
//
// A search stopped at any moment (Ctrl-C, or even SIGKILL) continues with --resume. A KernelBench-format
// file is a problem too (`kevo-search 19_ReLU.py --size-scale 0.25`): PyTorch eager is its reference.
#include <kevo/eval/any_evaluator.hpp>
#include <kevo/eval/cpu_evaluator.hpp>
#include <kevo/eval/cuda_evaluator.hpp>
#include <kevo/eval/slurm_executor.hpp>
#include <kevo/memory/any_memory.hpp>
#include <kevo/problem_loader.hpp>
#include <kevo/report/comparison_report.hpp>
#include <kevo/report/html_report.hpp>
#include <kevo/search/any_policy.hpp>
#include <kevo/search_loop.hpp>
#include <kevo/store/sqlite_store.hpp>
#include <kevo/synth/template_synthesizer.hpp>

#include "../common/command_line.hpp"
#include "../common/problem_argument.hpp"
#include "../common/shipped_data.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <simdjson.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;

namespace {

struct Options {
  kevo_examples::ProblemArgument problem;
  std::string policy = "mcts";
  std::string memory = "adaptive";
  std::size_t jobs = 2;
  std::size_t budget = 60;
  double wall_seconds = 0;
  double target = 0;
  std::size_t patience = 0;
  std::uint64_t seed = 1;
  fs::path store;
  fs::path out;
  fs::path json;
  fs::path report;
  fs::path compare_report;  // empty: none
  bool resume = false;
  bool retime_reference = false;  // a resumed run keeps its stored reference time unless asked
  bool warm_start_any_target = false;  // other machines' figures do not rank candidates for this one unless asked
  bool budget_given = false;  // a resumed run keeps its stored budget unless --budget says otherwise
  bool quiet = false;
  // Where the checked runs happen: here (local) or as Slurm job steps (slurm).
  std::string executor = "local";
  std::string slurm_partition;
  fs::path slurm_helper;  // empty: kevo-run-checked beside this program
};

// The command line, with CLI11: --help, unknown flags, missing and bad values are its job.
void describe(CLI::App& app, Options& o) {
  app.description(
      "Searches for a faster, verified implementation of the problem's kernel on this machine's CPU or GPU (the problem's "
      "\"target\": cpu or cuda).");
  kevo_examples::describe_problem_argument(app, o.problem);
  app.add_option("--policy", o.policy, "search policy")->capture_default_str()->check(
      CLI::IsMember({"mcts", "evolutionary", "greedy", "random"}));
  app.add_option("--memory", o.memory, "memory operator")->capture_default_str()->check(
      CLI::IsMember({"adaptive", "combined", "trajectory", "siblings", "fresh"}));
  using kevo_examples::whole_number;  // counts and seeds: digits only, no sign
  app.add_option("--jobs", o.jobs, "generations and evaluations in flight")
      ->capture_default_str()
      ->transform(whole_number)
      ->check(CLI::Range(std::size_t{1}, std::size_t{4096}));
  app.add_option("--budget", o.budget, "candidates to evaluate")->capture_default_str()->transform(whole_number);
  app.add_option("--time", o.wall_seconds, "stop after this much wall time, in seconds")->check(CLI::NonNegativeNumber);
  app.add_option("--target", o.target, "stop once a candidate is this many times faster than the reference")->check(CLI::NonNegativeNumber);
  app.add_option("--patience", o.patience, "stop after this many evaluations without a new best")->transform(whole_number);
  app.add_option("--seed", o.seed, "random seed")->capture_default_str()->transform(whole_number);
  app.add_option("--store", o.store, "SQLite store (default kevo-runs/PROBLEM.db)");
  app.add_flag("--resume", o.resume, "continue the latest run in the store where it stopped");
  app.add_flag("--retime-reference", o.retime_reference, "with --resume: speedups over the reference timed now, not the run's stored time");
  app.add_flag("--warm-start-any-target", o.warm_start_any_target, "warm-start also from earlier runs measured on another device or with another compiler");
  app.add_option("--out", o.out, "where to write the best kernel (default kevo-runs/PROBLEM.best.cpp)");
  app.add_option("--json", o.json, "also write a JSON summary there");
  app.add_option("--report", o.report, "an HTML report: progress plot, tree, best kernels (default kevo-runs/PROBLEM.html)");
  app.add_option("--compare-report", o.compare_report,
                 "also an HTML page comparing every run of this problem in the store (one curve per run, e.g. per policy)");
  app.add_flag("--quiet", o.quiet, "print only the last line");
  app.add_option("--executor", o.executor, "where candidates run: local, or slurm (each run a job step through srun; the build "
                                           "cache must be on a filesystem the nodes share)")
      ->capture_default_str()
      ->check(CLI::IsMember({"local", "slurm"}));
  app.add_option("--slurm-partition", o.slurm_partition, "the partition of --executor slurm's steps (default: the cluster's)");
  app.add_option("--slurm-helper", o.slurm_helper, "kevo-run-checked, as the nodes see it (default: beside kevo-search)");
}

/// The settings a resumed run must keep, as stored with the run.
std::string settings_json(const Options& o) {
  return fmt::format(R"({{"policy":"{}","memory":"{}","seed":{},"budget":{},"jobs":{}}})", o.policy, o.memory, o.seed,
                     o.budget, o.jobs);
}

void restore_settings(std::string_view json, Options& o) {
  simdjson::dom::parser parser;
  simdjson::dom::element e;
  if (parser.parse(json.data(), json.size()).get(e)) return;
  std::string_view s;
  if (!e["policy"].get_string().get(s)) o.policy = s;
  if (!e["memory"].get_string().get(s)) o.memory = s;
  uint64_t n;
  if (!e["seed"].get_uint64().get(n)) o.seed = n;
  if (!o.budget_given && !e["budget"].get_uint64().get(n)) o.budget = n;
}

std::string failures_text(const kevo::FailureCounts& failures) {
  std::string out;
  for (auto [kind, count] : failures) out += fmt::format(" {}={}", kevo::to_string(kind), count);
  return out.empty() ? " none" : out;
}

int fail(std::string_view message, int code = 1) {
  fmt::print(stderr, "kevo-search: {}\n", message);
  return code;
}

}  // namespace

int search_main(int argc, char** argv);

int main(int argc, char** argv) {
  try {
    return search_main(argc, argv);
  } catch (const fs::filesystem_error& e) {  // a place on disk that cannot be used: one line, not an abort
    return fail(e.what(), 2);
  }
}

int search_main(int argc, char** argv) {
  Options o;
  CLI::App app{"", "kevo-search"};
  describe(app, o);
  if (auto stop = kevo_examples::parse_command_line(app, argc, argv)) return *stop;
  o.budget_given = app.count("--budget") > 0;

  auto problem = kevo_examples::load_problem_argument(o.problem);
  if (!problem) return fail(problem.error().message);
  if (o.problem.describe_only) return fmt::print("{}", kevo_examples::describe_problem(*problem)), 0;
  if (auto why = kevo_examples::unsearchable_target(*problem)) return fail(*why, 2);
  if (problem->torch && problem->torch->family.empty())
    return fail(fmt::format("{}; kevo-llm-search takes it", problem->description), 2);
  // A cuda problem where no GPU is (and the runs stay here, not on Slurm's nodes): a named stop, exit 2, before any work.
  if (problem->target == kevo::Target::cuda && o.executor != "slurm")
    if (auto here = kevo::nvidia_device_present(); !here) return fail(here.error().message, 2);
  if (o.store.empty()) o.store = fs::path("kevo-runs") / (problem->name + ".db");
  if (o.out.empty()) o.out = fs::path("kevo-runs") / (problem->name + ".best.cpp");
  if (o.report.empty()) o.report = fs::path("kevo-runs") / (problem->name + ".html");
  // A place that cannot be created is the user's to fix, said in one line (exit 2, as for a bad
  // argument), before any work.
  for (auto [flag, p] : {std::pair{"--store", o.store}, {"--out", o.out}, {"--json", o.json}, {"--report", o.report}, {"--compare-report", o.compare_report}}) {
    if (!p.has_parent_path()) continue;
    std::error_code ec;
    fs::create_directories(p.parent_path(), ec);
    if (ec || !fs::is_directory(p.parent_path(), ec))
      return fail(fmt::format("{} {}: cannot create the directory {}: {}", flag, p.string(), p.parent_path().string(),
                              ec ? ec.message() : "it is not a directory"),
                  2);
  }

  auto store = kevo::store::SqliteStore::open(o.store);
  if (!store) return fail(store.error().message, 2);
  std::int64_t resume_run = 0;
  kevo::RunInfo resumed;
  if (o.resume) {
    // The latest run of this problem, where a store holds several problems' (kevo-suite's); else the latest of all.
    auto own = store->latest_run_of(problem->name);
    auto run = own && *own ? kevo::expected<kevo::RunInfo, kevo::Error>(**own) : store->latest_run();
    if (!run) return fail(run.error().message);
    if (!run->stopped_because.empty())
      return fail(fmt::format("the latest run in {} already finished ({}); start a new one without --resume",
                              o.store.string(), run->stopped_because));
    if (auto same = kevo::check_resumable(*run, *problem); !same)
      return fail(fmt::format("--resume: {} (store {})", same.error().message, o.store.string()));
    restore_settings(run->settings_json, o);
    resume_run = run->id;
    resumed = *run;
  }

  auto policy = kevo::search::make_policy(o.policy);
  if (!policy) return fail(policy.error().message);
  auto memory = kevo::memory::make_memory(o.memory);
  if (!memory) return fail(memory.error().message);

  // What the candidates' jail really has here: said in one line, and no search where it cannot jail them.
  const kevo::eval::IsolationReport isolation = kevo::eval::inspect_isolation();
  if (!isolation.jail) return fail(isolation.summary());
  if (!o.quiet) fmt::print("kevo-search: {}\n", isolation.summary());

  // The search, over whichever evaluator the problem's target and --executor take: one loop for all four
  // (kevo::eval::AnyEvaluator); `prepare_then_search` below, which knows the evaluator's type, prepares it first.
  double compile_seconds = 0;  // torch.compile's time, where prepare() timed it
  auto search = [&](kevo::eval::AnyEvaluator& evaluator) -> int {
    using Evaluator = kevo::eval::AnyEvaluator;
    kevo::SearchArguments args{.jobs = o.jobs,
                               .max_evaluations = o.budget,
                               .max_wall_seconds = o.wall_seconds,
                               .target_speedup = o.target,
                               .patience = o.patience,
                               .seed = o.seed,
                               .warm_start_any_target = o.warm_start_any_target,
                               .retime_reference = o.retime_reference,
                               .handle_signals = true,
                               .settings_json = settings_json(o)};
    if (!o.quiet)
      args.on_progress = [&](const kevo::Progress& p) {
        const kevo::Evaluation& e = *p.evaluation;
        const std::string outcome = e.ok() ? fmt::format("{:6.2f}x {}-bound", e.speedup, kevo::to_string(e.diagnostics.bottleneck))
                                           : fmt::format("{} ({})", kevo::to_string(e.failure), e.diagnostics.message.substr(0, 60));
        fmt::print("[{:3}/{}] {:4.2f} eval/s  best {:6.2f}x{}  node {:3}: {}  <- {}{}\n", p.evaluations - 1, o.budget,
                   p.evaluations_per_second, p.best_speedup, p.new_best ? " (new)" : "      ", p.node_key, outcome,
                   p.candidate->origin.substr(0, 70), p.failures.empty() ? "" : "  | failures:" + failures_text(p.failures));
        std::fflush(stdout);
      };

    kevo::synth::TemplateSynthesizer synth(*problem);
    kevo::SearchLoop<kevo::synth::TemplateSynthesizer, kevo::search::AnyPolicy, kevo::memory::AnyMemory,
                     Evaluator, kevo::knowledge::NullRetriever, kevo::store::SqliteStore>
        loop(*problem, synth, *policy, *memory, evaluator, kevo::knowledge::NullRetriever{}, *store, args);
    auto result = o.resume ? loop.resume(resume_run) : loop.run(synth.seed());
    if (!result) return fail(result.error().message);

    // torch.compile's time over the best's, where it was timed: the verified speedup rescaled by the peers' times.
    const double over_compile = kevo_examples::speedup_over_compile(*problem, compile_seconds, evaluator.reference_seconds(), result->verified_speedup);
    const std::string over = kevo_examples::reference_name(*problem);
    {
      std::ofstream out(o.out);
      out << "// kevo-search: best kernel for " << problem->name << ", node " << result->best_key
          << " of run " << result->run_id << ", knobs: " << kevo::to_string(result->best_candidate->knobs)
          << "\n// " << fmt::format("{:.2f}x over the {} ({})", result->verified_speedup, over, result->verification_message)
          << "\n" << kevo::eval::standalone_source(*problem, result->best_candidate->source);
      if (!out) fmt::print(stderr, "kevo-search: {}: cannot be written\n", o.out.string());
    }
    if (!o.json.empty()) {
      std::ofstream json(o.json);
      json << fmt::format(
          R"({{"problem":{},"target":"{}","evaluations":{},"best_speedup":{:.4f},"search_speedup":{:.4f},"verified":{},)"
          R"("best_candidate":{{"node":{},"file":{},"knobs":{}}},"stopped_because":"{}","store":{},"run_id":{},"problem_identity":"{}",)"
          R"("policy":"{}","memory":"{}","elapsed_seconds":{:.2f},"failures":{{{}}}{}}})"
          "\n",
          kevo::detail::json_quote(problem->name), kevo::to_string(problem->target), result->evaluations,
          result->verified_speedup, result->best_speedup, result->verified, result->best_key,
          kevo::detail::json_quote(o.out.string()), kevo::detail::knobs_to_json(result->best_candidate->knobs),
          kevo::to_string(result->stopped_because), kevo::detail::json_quote(o.store.string()), result->run_id, problem->identity(), o.policy,
          o.memory, result->elapsed_seconds, [&] {
            std::string f;
            for (auto [kind, count] : result->failures)
              f += fmt::format("{}\"{}\":{}", f.empty() ? "" : ",", kevo::to_string(kind), count);
            return f;
          }(),
          kevo_examples::torch_summary_fields(*problem, result->verified_speedup, over_compile));
    }
    if (auto ok = kevo::report::write_html(*store, result->run_id, o.report); !ok) fmt::print(stderr, "kevo-search: {}\n", ok.error().message);
    if (!o.quiet)
      fmt::print("report: {}\n", o.report.string());
    if (!o.compare_report.empty()) {
      if (auto ok = kevo::report::write_comparison_html(*store, problem->name, o.compare_report); !ok)
        fmt::print(stderr, "kevo-search: {}\n", ok.error().message);
      else if (!o.quiet)
        fmt::print("comparison of this problem's runs: {}\n", o.compare_report.string());
    }
    if (!o.quiet)
      fmt::print("stopped: {} after {} evaluations in {:.1f} s; failures:{}\nbest kernel: {} (node {}, {})\n",
                 kevo::to_string(result->stopped_because), result->evaluations, result->elapsed_seconds,
                 failures_text(result->failures), o.out.string(), result->best_key, kevo::to_string(result->best_candidate->knobs));
    if (result->stopped_because == kevo::StopReason::interrupted) {
      fmt::print("best so far: {:.1f}x over {} (not re-checked: interrupted); --resume continues the run\n", result->best_speedup, over);
      return 130;  // as a shell reports a process ended by SIGINT
    }
    if (!result->verified) {
      fmt::print("best: {:.1f}x over {} (NOT verified: {})\n", result->best_speedup, over, result->verification_message);
      return 3;
    }
    if (over_compile > 0) fmt::print("best against torch.compile: {:.2f}x\n", over_compile);
    fmt::print("best: {:.1f}x over {} (verified)\n", result->verified_speedup, over);
    return 0;
  };
  auto prepare_then_search = [&](auto& evaluator) -> int {
    if (!o.quiet) fmt::print("kevo-search: {} ({}, {}), preparing the reference and the roofline...\n", problem->name, problem->directory.string(),
                             kevo::to_string(problem->target));
    if (auto ready = evaluator.prepare(); !ready) return fail(ready.error().message);
    if (!o.quiet) {
      // A resumed run's speedups stay over the reference time stored with it, so that figures from
      // its segments compare; re-timing it now is only said beside it.
      const bool reuse = o.resume && !o.retime_reference && resumed.reference_seconds > 0;
      const std::string reference =
          reuse ? fmt::format("{:.3f} ms on the timing shape, as stored with run {} (re-timed now: {:.3f} ms; --retime-reference uses that)",
                              resumed.reference_seconds * 1e3, resumed.id, evaluator.reference_seconds() * 1e3)
                : fmt::format("{:.3f} ms on the timing shape", evaluator.reference_seconds() * 1e3);
      fmt::print("reference: {}; policy {}, memory {}, {} jobs, budget {}, store {}\n", reference, o.policy, o.memory, o.jobs,
                 o.budget, o.store.string());
      if constexpr (requires { evaluator.reference_clock_note(); })
        if (!evaluator.reference_clock_note().empty()) fmt::print("reference clock: {}\n", evaluator.reference_clock_note());
      if (problem->torch)
        fmt::print("problem: {}\npeer: {}\n", problem->description, evaluator.torch_peers().compile_seconds > 0
                       ? fmt::format("torch.compile {:.3f} ms", evaluator.torch_peers().compile_seconds * 1e3) : evaluator.torch_peers().compile_note);
    }

    compile_seconds = evaluator.torch_peers().compile_seconds;
    kevo::eval::AnyEvaluator any(evaluator);
    return search(any);
  };
  if (o.executor == "slurm") {
    kevo::eval::SlurmOptions slurm_options{.helper = o.slurm_helper, .partition = o.slurm_partition};
    if (slurm_options.helper.empty()) {
      std::error_code ec;
      slurm_options.helper = fs::read_symlink("/proc/self/exe", ec).parent_path() / "kevo-run-checked";
    }
    kevo::eval::SlurmExecutor slurm(slurm_options);
    if (auto ready = slurm.check(); !ready) return fail(ready.error().message, 2);
    // On a cluster that includes this machine, its timed runs take turns with its compiles, as local ones do.
    slurm_options.nodes_include_this_machine = kevo::eval::slurm_nodes_include_this_machine(slurm_options);
    slurm = kevo::eval::SlurmExecutor(slurm_options);
    if (!o.quiet) fmt::print("kevo-search: each checked run is a Slurm step of {}{}\n", slurm_options.helper.string(),
                             slurm_options.nodes_include_this_machine ? " (this machine is a node: timed runs take turns here)" : "");
    if (problem->target == kevo::Target::cuda) {
      kevo::eval::JailedEvaluator<kevo::eval::CudaToolchain, kevo::eval::SlurmExecutor> evaluator(*problem, {}, slurm);
      return prepare_then_search(evaluator);
    }
    kevo::eval::JailedEvaluator<kevo::eval::CpuToolchain, kevo::eval::SlurmExecutor> evaluator(*problem, {}, slurm);
    return prepare_then_search(evaluator);
  }
  if (problem->target == kevo::Target::cuda) {
    kevo::eval::CudaEvaluator evaluator(*problem);
    return prepare_then_search(evaluator);
  }
  kevo::eval::CpuEvaluator evaluator(*problem);
  return prepare_then_search(evaluator);
}
