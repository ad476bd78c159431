// Policies: the default fits every shape, a chooser's policy is served and its origin told, and
// policies whose rings differ in size can be switched.
// (One of the files of test_cuda_retrieval_pipeline; its main is main.cu.)
#include "../support/pipeline_fixtures.cuh"

using namespace kevo::retrieval;
using namespace kevo_tests::retrieval_pipeline;

TEST_CASE("the default policy fits every shape, and an explicit one that does not is refused", "[cuda][policy]") {
  for (int dim : {64, 128, 256})
    for (EmbeddingType type : {EmbeddingType::fp16, EmbeddingType::int8, EmbeddingType::int8_group32}) {
      const Workload w(small_options(1, type, dim));
      auto by_default = FusedRetrievalPipeline::create(w.schema(), w.model(), {.capacity = 1024});
      INFO("d " << dim << " " << to_string(type));
      REQUIRE(by_default);
      // Only fp16 at d = 256 needs more shared memory for the default ring than a block may have.
      const PipelinePolicy chosen = (*by_default)->policy();
      REQUIRE(chosen.topk == PipelinePolicy{}.topk);  // the default cap's sort (64 KB) is kept
      const bool kept_default = chosen.scoring == PipelinePolicy{}.scoring;
      REQUIRE(kept_default == !(type == EmbeddingType::fp16 && dim == 256));
      // An int8 pool's search_batch goes one by one: its one-pass batches were slower (run 32).
      REQUIRE(chosen.batch_scoring.one_pass_from == (is_int8(type) ? 16 : 2));
      if (!kept_default) REQUIRE((*by_default)->policy().scoring.stages == 0);
      auto explicit_default =
          FusedRetrievalPipeline::create(w.schema(), w.model(), {.capacity = 1024, .policy = PipelinePolicy{}});
      REQUIRE(static_cast<bool>(explicit_default) == kept_default);
      if (!explicit_default)
        REQUIRE(explicit_default.error().message.find("bytes of shared memory per block") != std::string::npos);
    }
}

TEST_CASE("the pipeline serves with the policy its chooser gives for this GPU and pool, and says where each came from", "[cuda][policy]") {
  // (The tuning file behind tuned_policies() is read by host code: tests/retrieval_tuning_file.test.cpp.)
  const Workload w(small_options(2, EmbeddingType::fp16, 128));
  PipelinePolicy tuned;
  tuned.scoring.blocks_per_sm = 6;
  tuned.topk.boundary_cap = 4096;
  DeviceIdentity asked_for;
  ShapeClass asked_shape;
  auto chooser = [&](bool has_entry) {
    return [&, has_entry](const DeviceIdentity& device, const ShapeClass& shape) {
      asked_for = device;
      asked_shape = shape;
      if (!has_entry) return PolicyChoice{PipelinePolicy{}, false, "no entry for this shape", "defaults (no entry for this shape)"};
      return PolicyChoice{tuned, true, {}, "tuned for " + to_string(shape) + ": " + to_string(tuned)};
    };
  };
  auto served = FusedRetrievalPipeline::create(w.schema(), w.model(), {.capacity = 1024, .choose_policy = chooser(true)});
  REQUIRE(served);
  CHECK((*served)->policy() == tuned);
  CHECK((*served)->policy_origin().find("tuned for d = 128, fp16, ~1000 ads") == 0);
  CHECK(asked_for.gpu.find("NVIDIA") == 0);  // the runtime's name for the device
  CHECK(asked_for.cuda.find('.') != std::string::npos);
  CHECK(asked_shape == ShapeClass{128, EmbeddingType::fp16, pool_class(1024)});
  auto fallback = FusedRetrievalPipeline::create(w.schema(), w.model(), {.capacity = 1024, .choose_policy = chooser(false)});
  REQUIRE(fallback);
  CHECK((*fallback)->policy() == PipelinePolicy{});
  CHECK((*fallback)->policy_origin().find("defaults (no entry for this shape): ") == 0);
  auto plain = FusedRetrievalPipeline::create(w.schema(), w.model(), {.capacity = 1024});
  REQUIRE(plain);
  CHECK((*plain)->policy_origin().find("defaults (no tuning file): ") == 0);
}

TEST_CASE("policies whose rings differ in size can be switched back and forth", "[cuda][policy]") {
  // One kernel launched with two ring sizes, by one pipeline and by two: a smaller ring's launch must
  // not lower the shared memory the larger one was allowed (the larger one's next launch then fails).
  Loaded pool(small_options(11, EmbeddingType::fp16), 20000);
  Loaded other(small_options(12, EmbeddingType::fp16), 5000);
  PipelinePolicy small_ring, large_ring;
  small_ring.scoring = {256, 8, 8, 2, 2};
  large_ring.scoring = {256, 32, 8, 2, 2};
  auto search_agrees = [](Loaded& p, const PipelinePolicy& policy) {
    REQUIRE(p.pipeline->set_policy(policy));
    const Request request = p.workload.request(5, RequestKind::typical, 100);
    auto top = p.pipeline->search(request);
    INFO(to_string(policy.scoring) << ": " << (top ? "ok" : top.error().message));
    REQUIRE(top);
    auto ok = compare_with_reference(p.host, compute_request_vectors(p.workload.model(), request.features), request, *top);
    INFO((ok ? "" : ok.error().message));
    REQUIRE(ok);
  };
  for (const PipelinePolicy& policy : {large_ring, small_ring, large_ring, small_ring}) search_agrees(pool, policy);
  search_agrees(pool, large_ring);
  search_agrees(other, small_ring);  // another pipeline, the same kernel, a smaller ring
  search_agrees(pool, large_ring);
}
