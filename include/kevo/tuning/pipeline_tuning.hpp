// kevo/tuning/pipeline_tuning.hpp: a search that tunes the retrieval pipeline, and the tuning file
// the pipeline then serves with. An application of the loop, so it stands above it (tuning/ leans on
// the loop, the store and the pipeline's evaluator; nothing below leans on tuning/). kevo-tune-pipeline (examples/tune_pipeline) runs it over the
// device's timer (retrieval/tuning/pipeline_bench.cuh); tests run it over a stand-in landscape.
//
//   auto tuned = tune_pipeline(workload, policy_timer(device_timing), PipelinePolicy{}, store, {.budget = 40});
//   record_tuning("kevo-tuning.json", device, tuned->entry);   // FusedRetrievalPipeline::Options::choose_policy reads it
#pragma once

#include <kevo/eval/pipeline_evaluator.hpp>
#include <kevo/retrieval/tuning/policy_timing.hpp>
#include <kevo/retrieval/tuning/tuning_file.hpp>
#include <kevo/default_search_loop.hpp>
#include <kevo/store/sqlite_store.hpp>

#include <fmt/format.h>

#include <filesystem>
#include <functional>
#include <utility>

namespace kevo::tuning {

using eval::PipelineEvaluator;
using eval::PipelineWorkload;
using eval::PolicyFailure;
using eval::PolicyTimer;

/// A PolicyTimer over a device timing function: a policy that does not fit is a compile_error, one
/// whose answers differ a wrong_answer, a device error a crash.
inline PolicyTimer policy_timer(std::function<retrieval::PolicyTiming(const retrieval::PipelinePolicy&, std::uint64_t)> time) {
  return [time = std::move(time)](const retrieval::PipelinePolicy& policy, std::uint64_t seed) -> expected<double, PolicyFailure> {
    using Outcome = retrieval::PolicyTiming::Outcome;
    const retrieval::PolicyTiming t = time(policy, seed);
    switch (t.outcome) {
      case Outcome::ok: return t.seconds;
      case Outcome::does_not_fit: return unexpected(PolicyFailure{FailureKind::compile_error, "does not fit this GPU: " + t.message});
      case Outcome::wrong_answer: return unexpected(PolicyFailure{FailureKind::wrong_answer, "answers differ from the defaults': " + t.message});
      case Outcome::device_error: break;
    }
    return unexpected(PolicyFailure{FailureKind::crash, "device error: " + t.message});
  };
}

struct PipelineTuningOptions {
  std::size_t budget = 40;  ///< policies to evaluate
  std::uint64_t seed = 1;
  std::function<void(const Progress&)> on_progress{};
};

struct PipelineTuningResult {
  retrieval::TuningEntry entry;   ///< the best policy, verified against the defaults, or the defaults
  SearchResult search;
};

/// Searches the workload's policies with kevo's loop; the entry holds the verified best (the
/// defaults where nothing beat them once re-timed side by side).
inline expected<PipelineTuningResult, Error> tune_pipeline(const PipelineWorkload& workload, PolicyTimer timer,
                                                            const retrieval::PipelinePolicy& defaults, store::SqliteStore& store,
                                                            const PipelineTuningOptions& options) {
  PipelineEvaluator evaluator(workload, std::move(timer), defaults);
  if (auto ready = evaluator.prepare(); !ready) return unexpected(ready.error());
  // One job: every evaluation holds the one device, and policies are not compiled.
  auto loop = make_search_loop(evaluator.problem(), evaluator, store,
                               {.jobs = 1, .max_evaluations = options.budget, .seed = options.seed, .on_progress = options.on_progress});
  auto result = loop.run(loop.synthesizer().seed());
  if (!result) return unexpected(result.error());
  retrieval::TuningEntry entry{.shape = workload.shape, .policy = defaults, .default_seconds = evaluator.reference_seconds(),
                               .tuned_seconds = evaluator.reference_seconds(), .evaluations = static_cast<int>(result->evaluations)};
  if (result->verified && result->verified_speedup > 1 && result->best_candidate) {
    auto best = retrieval::policy_from_knobs(result->best_candidate->knobs);
    if (!best) return make_error("the best candidate is not a policy: " + best.error().message);
    entry.policy = *best;
    entry.tuned_seconds = evaluator.reference_seconds() / result->verified_speedup;
  }
  return PipelineTuningResult{entry, std::move(*result)};
}

/// Adds `entry` to the tuning file at `path` for `device`, replacing an entry of the same shape;
/// a new file where there is none. A file made on another GPU or CUDA version is refused, naming
/// both: its policies are that device's, and mixing them would serve them here.
inline expected<void, Error> record_tuning(const std::filesystem::path& path, const retrieval::DeviceIdentity& device,
                                           const retrieval::TuningEntry& entry) {
  retrieval::TuningFile file{device.gpu, device.cuda, {}};
  if (std::filesystem::exists(path)) {
    auto existing = retrieval::read_tuning_file(path);
    if (!existing) return unexpected(existing.error());
    if (existing->gpu != device.gpu || existing->cuda != device.cuda)
      return make_error(fmt::format("{} holds policies for {} with CUDA {}, and this is {} with CUDA {}: give another file", path.string(),
                                    existing->gpu, existing->cuda, device.gpu, device.cuda));
    file = std::move(*existing);
  }
  std::erase_if(file.entries, [&](const retrieval::TuningEntry& e) { return e.shape == entry.shape; });
  file.entries.push_back(entry);
  return retrieval::write_tuning_file(path, file);
}

}  // namespace kevo::tuning
