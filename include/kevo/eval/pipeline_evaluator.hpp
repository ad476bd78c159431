// kevo/eval/pipeline_evaluator.hpp: the retrieval pipeline's policies as a search problem, where the
// two halves of kevo meet. A candidate is a policy: one knob per field of every stage, each with the
// domain its PolicyDescription declares. PipelineEvaluator models Evaluator over a PolicyTimer, which
// runs the real pipeline under a policy on the device (retrieval/tuning/pipeline_bench.cuh) and
// checks its answers; a policy that does not fit the GPU is a named failure, never a crash.
// Host code: the timer crosses over from a .cu file, since nvcc cannot compile fmt.
//
//   PipelineEvaluator evaluator(workload, timer, PipelinePolicy{});
//   auto loop = kevo::make_search_loop(evaluator.problem(), evaluator, store, {.max_evaluations = 60});
//   auto best = retrieval::policy_from_knobs(loop.run(loop.synthesizer().seed()).best->candidate.knobs);
#pragma once

#include <kevo/candidate.hpp>
#include <kevo/evaluator.hpp>
#include <kevo/expected.hpp>
#include <kevo/problem.hpp>
#include <kevo/retrieval/tuning/policies.hpp>
#include <kevo/retrieval/tuning/policy_choice.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace kevo::eval {

/// The workload a policy is tuned for: the pool's shape and the requests served.
struct PipelineWorkload {
  retrieval::ShapeClass shape;
  std::uint64_t ads = 100'000'000;
  std::string request_kind = "typical";
  int k = 1000;
};

/// The problem's name in the store: a search resumes only the history of the same workload.
inline std::string workload_name(const PipelineWorkload& w) {
  const bool grouped = w.shape.load_order == retrieval::SlotOrder::by_targeting;  // by id: the name it always had
  return fmt::format("pipeline_d{}_{}_{}_{}_k{}{}", w.shape.dim, retrieval::to_string(w.shape.dtype),
                     retrieval::pool_class_name(w.shape.pool_decade), w.request_kind, w.k, grouped ? "_by_targeting" : "");
}

/// Why a policy has no time: its kind (compile_error where it does not fit the GPU, wrong_answer
/// where its answers differ, crash for a device error) and a line that names it.
struct PolicyFailure {
  FailureKind kind = FailureKind::crash;
  std::string message;
};

/// Runs the pipeline under `policy` on searches drawn from `seed`, checks the answers, and returns
/// the median seconds a search.
using PolicyTimer = std::function<expected<double, PolicyFailure>(const retrieval::PipelinePolicy& policy, std::uint64_t seed)>;

/// The side of the machine a policy field's lever works on, in the search's terms.
constexpr KnobSide knob_side(retrieval::Lever lever) {
  switch (lever) {
    case retrieval::Lever::parallelism: return KnobSide::parallel;
    case retrieval::Lever::memory: return KnobSide::memory;
    case retrieval::Lever::either: return KnobSide::any;
  }
  return KnobSide::any;
}

/// The search problem: every field of every stage a knob, its domain from the policy's description
/// and its default from `defaults`; the "source" of a candidate is its printed policy.
inline Problem pipeline_problem(const PipelineWorkload& w, const retrieval::PipelinePolicy& defaults) {
  Problem p;
  p.name = workload_name(w);
  p.description = fmt::format("The retrieval pipeline's kernel policies for d = {}, {}, {} ads loaded by {}, {} requests, K = {}: "
                              "matching, scoring, top-K and batched scoring. A policy never changes the answers, only the speed.",
                              w.shape.dim, retrieval::to_string(w.shape.dtype), w.ads, retrieval::to_string(w.shape.load_order),
                              w.request_kind, w.k);
  p.target = Target::cuda;
  auto add_stage = [&](const auto& stage) {
    using Stage = std::decay_t<decltype(stage)>;
    const std::string prefix = std::string(retrieval::PolicyDescription<Stage>::name) + ".";
    for (const auto& field : retrieval::PolicyDescription<Stage>::fields) {
      KnobSpec knob;
      knob.name = prefix + std::string(field.name);
      for (int v : field.domain) knob.domain.push_back(std::to_string(v));
      knob.default_value = std::to_string(stage.*field.member);
      knob.side = knob_side(field.lever);
      p.template_source += (p.template_source.empty() ? "" : " ") + knob.name + "=${" + knob.name + "}";
      p.knobs.push_back(std::move(knob));
    }
  };
  add_stage(defaults.matching);
  add_stage(defaults.scoring);
  add_stage(defaults.topk);
  add_stage(defaults.batch_scoring);
  p.manifest_source = p.name + "\n" + p.template_source;  // what identity() hashes: the workload and the knobs
  return p;
}

struct PipelineEvaluatorOptions {
  int compare_rounds = 3;  ///< interleaved timings of each side in compare()
};

class PipelineEvaluator {
 public:
  PipelineEvaluator(PipelineWorkload workload, PolicyTimer timer, retrieval::PipelinePolicy defaults, PipelineEvaluatorOptions options = {})
      : workload_(std::move(workload)), timer_(std::move(timer)), defaults_(defaults), options_(options),
        problem_(pipeline_problem(workload_, defaults_)) {}

  const Problem& problem() const { return problem_; }
  const retrieval::PipelinePolicy& defaults() const { return defaults_; }

  /// Times the defaults: the figure every speedup is over. An error where they fail.
  expected<void, Error> prepare() {
    std::lock_guard lock(mutex_);
    if (reference_seconds_ > 0) return {};
    auto t = timer_(defaults_, 0);
    if (!t) return make_error(fmt::format("{}: the default policy failed: {}", problem_.name, t.error().message));
    reference_seconds_ = *t;
    return {};
  }
  double reference_seconds() const { return reference_seconds_; }

  Evaluation evaluate(const Candidate& candidate, std::uint64_t seed) {
    if (auto ok = prepare(); !ok) return failed(FailureKind::sandbox_error, ok.error().message);
    auto policy = retrieval::policy_from_knobs(candidate.knobs);
    if (!policy) return failed(FailureKind::compile_error, "not a policy: " + policy.error().message);
    std::lock_guard lock(mutex_);  // one timed run at a time: they share the device
    auto t = timer_(*policy, seed);
    if (!t) return failed(t.error().kind, t.error().message);
    Evaluation e;
    e.seconds = *t;
    e.reference_seconds = reference_seconds_;
    e.speedup = e.seconds > 0 ? reference_seconds_ / e.seconds : 0;
    e.diagnostics.bottleneck = Bottleneck::memory;  // scoring streams the eligible ads' rows; matching reads postings
    e.diagnostics.message = fmt::format("{:.4g} ms a search ({:.2f}x the defaults' {:.4g} ms)", e.seconds * 1e3, e.speedup,
                                        reference_seconds_ * 1e3);
    e.diagnostics.detail = retrieval::to_string(*policy);
    return e;
  }

  /// Both policies timed in turns (ABAB...), each on its own fresh searches.
  expected<Comparison, Error> compare(const Candidate& challenger, const Candidate& incumbent, std::uint64_t seed) {
    auto a = retrieval::policy_from_knobs(challenger.knobs);
    auto b = retrieval::policy_from_knobs(incumbent.knobs);
    if (!a) return make_error("challenger: " + a.error().message);
    if (!b) return make_error("incumbent: " + b.error().message);
    std::lock_guard lock(mutex_);
    std::vector<double> as, bs;
    for (int round = 0; round < std::max(1, options_.compare_rounds); ++round) {
      auto ta = timer_(*a, seed + 2 * static_cast<std::uint64_t>(round));
      if (!ta) return Comparison{.challenger_failure = ta.error().kind, .challenger_message = ta.error().message};
      auto tb = timer_(*b, seed + 2 * static_cast<std::uint64_t>(round) + 1);
      if (!tb) return make_error("incumbent failed in the race: " + tb.error().message);
      as.push_back(*ta);
      bs.push_back(*tb);
    }
    return Comparison{.challenger_seconds = median(as), .incumbent_seconds = median(bs)};
  }

 private:
  static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  }
  static Evaluation failed(FailureKind kind, std::string message) {
    Evaluation e;
    e.failure = kind;
    e.diagnostics.message = std::move(message);
    return e;
  }

  PipelineWorkload workload_;
  PolicyTimer timer_;
  retrieval::PipelinePolicy defaults_;
  PipelineEvaluatorOptions options_;
  Problem problem_;
  std::mutex mutex_;
  double reference_seconds_ = 0;
};

static_assert(check_evaluator<PipelineEvaluator>());

}  // namespace kevo::eval
