// The retrieval pipeline's policies as a search problem (the halves of kevo meeting): the knobs come
// from the policies' descriptions, a policy that does not fit is a named failure, and kevo's own
// search loop, over a stand-in timer with a known landscape, finds a policy faster than the
// defaults within 60 evaluations. The device's timer (pipeline_bench.cuh) runs on the GPU.
#include <catch2/catch.hpp>

#include <kevo/eval/pipeline_evaluator.hpp>
#include <kevo/tuning/pipeline_tuning.hpp>
#include <kevo/default_search_loop.hpp>
#include <kevo/store/sqlite_store.hpp>

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>

namespace kevo_tests::pipeline_evaluator_test {

using namespace kevo;
using namespace kevo::retrieval;
using kevo::eval::PipelineEvaluator;
using kevo::eval::PolicyFailure;

namespace {

const eval::PipelineWorkload workload{.shape = {128, EmbeddingType::fp16, 8}, .ads = 100'000'000};

/// A landscape with its optimum away from the defaults: 4 blocks an SM and 3 stages for scoring,
/// a cap of 4096 for top-K; rings of 4 stages do not fit (as fp16 at d = 256 does not).
std::atomic<int> timed{0};
expected<double, PolicyFailure> landscape(const PipelinePolicy& p, std::uint64_t) {
  ++timed;
  if (p.scoring.stages == 4) return unexpected(PolicyFailure{FailureKind::compile_error, "does not fit this GPU: needs 240 KB of shared memory"});
  double ms = 2.0;
  ms *= 1 + 0.08 * std::abs(p.scoring.blocks_per_sm - 4);
  ms *= p.scoring.stages == 3 ? 0.9 : 1.0;
  ms *= p.topk.boundary_cap == 4096 ? 0.95 : 1.0;
  ms *= p.matching.block_threads == 256 ? 0.97 : 1.0;
  return ms * 1e-3;
}

}  // namespace

TEST_CASE("every field of every stage is a knob of the pipeline problem, the defaults its seed", "[pipeline][tuning]") {
  const Problem p = eval::pipeline_problem(workload, PipelinePolicy{});
  CHECK(p.name == "pipeline_d128_fp16_100M_typical_k1000");
  CHECK(p.knobs.size() == 16);  // matching 4, scoring 5, top-K 3, batch scoring 4
  const KnobSpec* queue = p.knob("matching.segment_queue");
  REQUIRE(queue);
  CHECK(queue->side == KnobSide::parallel);  // how blocks share the segments: a parallelism choice
  auto seed = policy_from_knobs(p.default_knobs());
  REQUIRE(seed);
  CHECK(*seed == PipelinePolicy{});
  const KnobSpec* stages = p.knob("scoring.stages");
  REQUIRE(stages);
  CHECK(stages->domain == std::vector<std::string>{"0", "2", "3", "4"});
  CHECK(stages->side == KnobSide::memory);  // each knob's side is its field's lever in the description
  const KnobSpec* cap = p.knob("topk.boundary_cap");
  REQUIRE(cap);
  CHECK(cap->side == KnobSide::any);
  Knobs other = p.default_knobs();
  other["scoring.stages"] = "3";
  CHECK(p.render(other) != p.render(p.default_knobs()));  // candidates differ as their policies do
  CHECK(p.render(other).find("scoring.stages=3") != std::string::npos);
}

TEST_CASE("a policy is timed against the defaults, one that does not fit, or is not a policy, is a named failure", "[pipeline][tuning]") {
  PipelineEvaluator evaluator(workload, landscape, PipelinePolicy{});
  REQUIRE(evaluator.prepare());
  CHECK(evaluator.reference_seconds() == Approx(2.0e-3 * 1.32));
  const Problem& p = evaluator.problem();
  Knobs better = p.default_knobs();
  better["scoring.blocks_per_sm"] = "4";
  const Evaluation good = evaluator.evaluate({.source = p.render(better), .knobs = better}, 1);
  REQUIRE(good.ok());
  CHECK(good.speedup == Approx(1.32));
  CHECK_THAT(good.diagnostics.detail, Catch::Contains("blocks_per_sm=4"));
  Knobs too_big = p.default_knobs();
  too_big["scoring.stages"] = "4";
  const Evaluation refused = evaluator.evaluate({.source = p.render(too_big), .knobs = too_big}, 2);
  CHECK(refused.failure == FailureKind::compile_error);
  CHECK_THAT(refused.diagnostics.message, Catch::Contains("does not fit this GPU"));
  Knobs garbled = p.default_knobs();
  garbled["scoring.stages"] = "5";
  const Evaluation not_a_policy = evaluator.evaluate({.source = "x", .knobs = garbled}, 3);
  CHECK(not_a_policy.failure == FailureKind::compile_error);
  CHECK_THAT(not_a_policy.diagnostics.message, Catch::Contains("scoring.stages = '5' is not one of {0, 2, 3, 4}"));
  auto race = evaluator.compare({.source = p.render(better), .knobs = better}, {.source = p.render(p.default_knobs()), .knobs = p.default_knobs()}, 4);
  REQUIRE(race);
  CHECK(race->challenger_seconds < race->incumbent_seconds);
}

TEST_CASE("kevo's search loop tunes the pipeline: faster than the defaults within 60 evaluations", "[pipeline][tuning]") {
  PipelineEvaluator evaluator(workload, landscape, PipelinePolicy{});
  auto store = store::SqliteStore::open(":memory:").value();
  auto loop = make_search_loop(evaluator.problem(), evaluator, store, {.jobs = 1, .max_evaluations = 60, .seed = 7});  // one job: the same run every time
  auto result = loop.run(loop.synthesizer().seed());
  REQUIRE(result);
  REQUIRE(result->best_candidate);
  auto best = policy_from_knobs(result->best_candidate->knobs);
  REQUIRE(best);
  INFO(to_string(*best) << " at " << result->best_speedup << "x");
  CHECK(result->evaluations <= 61);
  CHECK(result->best_speedup > 1.2);  // the blocks_per_sm step alone is 1.32x
  CHECK(is_legal(*best));
  CHECK(best->scoring.stages != 4);  // never a policy that does not fit
}

// The device's timing function, as pipeline_bench.cuh reports it, over the same landscape.
retrieval::PolicyTiming device_landscape(const PipelinePolicy& p, std::uint64_t seed) {
  auto t = landscape(p, seed);
  if (t) return {retrieval::PolicyTiming::Outcome::ok, *t, {}};
  return {retrieval::PolicyTiming::Outcome::does_not_fit, 0, "needs 240 KB of shared memory"};
}

TEST_CASE("tune_pipeline writes the verified best to a tuning file, and the pipeline's chooser serves it", "[pipeline][tuning]") {
  const auto dir = std::filesystem::temp_directory_path() / ("kevo-tuning-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto file = dir / "tuning.json";
  auto store = store::SqliteStore::open(":memory:").value();
  auto tuned = tuning::tune_pipeline(workload, tuning::policy_timer(device_landscape), PipelinePolicy{}, store, {.budget = 40, .seed = 3});
  REQUIRE(tuned);
  INFO(to_string(tuned->entry.policy));
  REQUIRE(tuned->search.verified);
  CHECK(tuned->entry.tuned_seconds < tuned->entry.default_seconds);
  CHECK(tuned->entry.policy.scoring.stages != 4);
  CHECK(tuned->entry.evaluations == static_cast<int>(tuned->search.evaluations));

  const DeviceIdentity h200{"NVIDIA H200", "13.0"};
  REQUIRE(tuning::record_tuning(file, h200, tuned->entry));
  const PolicyChoice chosen = choose_policy(file, h200, workload.shape, PipelinePolicy{});
  CHECK(chosen.tuned);
  CHECK(chosen.policy == tuned->entry.policy);

  // A second record for the same shape replaces the first; another device's file is refused.
  retrieval::TuningEntry again = tuned->entry;
  again.evaluations = 1;
  REQUIRE(tuning::record_tuning(file, h200, again));
  auto read = read_tuning_file(file);
  REQUIRE(read);
  REQUIRE(read->entries.size() == 1);
  CHECK(read->entries[0].evaluations == 1);
  auto other = tuning::record_tuning(file, {"NVIDIA H100 80GB HBM3", "13.0"}, again);
  REQUIRE_FALSE(other);
  CHECK_THAT(other.error().message, Catch::Contains("NVIDIA H200") && Catch::Contains("NVIDIA H100"));

  // A policy whose answers differ, or a device error, is a named failure of that evaluation.
  auto timer = tuning::policy_timer([](const PipelinePolicy&, std::uint64_t) {
    return retrieval::PolicyTiming{retrieval::PolicyTiming::Outcome::wrong_answer, 0, "rank 3 scored 0.5 where the defaults score 0.7"};
  });
  auto failed = timer(PipelinePolicy{}, 1);
  REQUIRE_FALSE(failed);
  CHECK(failed.error().kind == FailureKind::wrong_answer);
  CHECK_THAT(failed.error().message, Catch::Contains("rank 3"));
  std::filesystem::remove_all(dir);
}

}  // namespace kevo_tests::pipeline_evaluator_test
