// Fused scoring (fp16, int8 and int8_group32) against the reference for every eligible ad, with every build of
// the scoring kernel: its keys, its histogram and its chunk maxima.
// (One of the files of test_cuda_retrieval_pipeline; its main is main.cu.)
#include "../support/pipeline_fixtures.cuh"

using namespace kevo::retrieval;
using namespace kevo_tests::retrieval_pipeline;

TEST_CASE("fused scoring agrees with the reference for every eligible ad", "[cuda][scoring]") {
  const EmbeddingType type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8, EmbeddingType::int8_group32);
  const int dim = GENERATE(64, 128, 256);
  const int routing = GENERATE(1, 2, 8);
  // Register loads (1 or 2 tiles in flight) and cp.async rings of 2-4 stages, including a ring deeper
  // than a chunk's pairs (4 stages, 2 pairs a chunk: the slot list is waited for explicitly), and
  // the register policy on a small grid that scores 1M ads fastest (RESULTS runs 167-169).
  const ScoringPolicy scoring = GENERATE(ScoringPolicy{128, 4, 8, 1, 0}, ScoringPolicy{256, 16, 8, 2, 0},
                                         ScoringPolicy{128, 4, 8, 2, 2}, ScoringPolicy{128, 16, 8, 2, 3},
                                         ScoringPolicy{256, 32, 8, 2, 2}, ScoringPolicy{128, 4, 8, 2, 4},
                                         ScoringPolicy{256, 4, 2, 1, 0});
  PipelinePolicy policy;
  policy.scoring = scoring;
  WorkloadOptions options = small_options(static_cast<std::uint64_t>(dim + routing), type, dim);
  auto created = FusedRetrievalPipeline::create(Workload(options).schema(), Workload(options).model(),
                                                {.capacity = 1024, .policy = policy});
  if (!created) {  // a ring too deep for this d: refused up front, with the reason
    INFO(created.error().message);
    REQUIRE(created.error().message.find("bytes of shared memory per block") != std::string::npos);
    REQUIRE(scoring.stages > 0);
    return;
  }
  Loaded pool(options, 40000, policy);
  const Request request = pool.workload.request(3, RequestKind::broad, 100, routing);
  Stages s(*pool.pipeline);
  KEVO_GPU_ASSERT(cudaMemset(s.at(s.layout.keys), 0, pool.pipeline->index().capacity() * 4));  // key 0 never occurs
  auto lock = pool.pipeline->index().search_lock();
  auto view = pool.pipeline->index().before_search(s.stream);
  REQUIRE(view);
  REQUIRE(pool.pipeline->enqueue_prepare(check_request(pool.pipeline->schema(), pool.pipeline->model(), request).value(), s.temp, s.stream));
  REQUIRE(pool.pipeline->enqueue_matching(*view, s.temp, s.stream));
  REQUIRE(pool.pipeline->enqueue_scoring(*view, s.temp, routing, s.stream));
  KEVO_GPU_ASSERT(cudaStreamSynchronize(s.stream));
  const TopKState state = s.state();
  const auto list = download<std::uint32_t>(s.at(s.layout.eligible), state.eligible_count);
  const auto keys = download<std::uint32_t>(s.at(s.layout.keys), state.eligible_count);
  const RequestVectors v = device_vectors(s, pool.workload.model());
  INFO("type " << to_string(type) << " d " << dim << " routing " << routing << " " << to_string(scoring));
  REQUIRE(state.eligible_count > 30000u);
  std::vector<std::uint32_t> histogram(kTopKBins, 0);
  for (std::size_t pos = 0; pos < list.size(); ++pos) {
    REQUIRE(keys[pos] != 0u);
    const float score = score_from_key(keys[pos]);
    const ReferenceScore ref = reference_score(pool.host, list[pos], v, routing);
    const bool close = std::fabs(score - ref.score) <= score_tolerance(ref.score) ||
                       (ref.ambiguous && std::fabs(score - ref.alternative) <= score_tolerance(ref.alternative));
    INFO("slot " << list[pos] << " score " << score << " reference " << ref.score);
    REQUIRE(close);
    ++histogram[keys[pos] >> 20];
  }
  for (int b = 0; b < kTopKBins; ++b) REQUIRE(state.histogram[0][b] == histogram[static_cast<std::size_t>(b)]);
  const std::uint32_t chunk = s.layout.chunk_size;
  const auto chunk_max = download<std::uint32_t>(s.at(s.layout.chunk_max), (list.size() + chunk - 1) / chunk);
  for (std::size_t c = 0; c < chunk_max.size(); ++c) {
    const auto begin = keys.begin() + static_cast<std::ptrdiff_t>(c * chunk);
    const auto end = keys.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(keys.size(), (c + 1) * chunk));
    REQUIRE(chunk_max[c] == *std::max_element(begin, end));
  }
}
