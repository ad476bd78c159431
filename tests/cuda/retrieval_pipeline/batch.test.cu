// Batches: matched and scored in one pass, through the async and synchronous paths, at every d and
// with every build of batched scoring.
// (One of the files of test_cuda_retrieval_pipeline; its main is main.cu.)
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "../support/pipeline_fixtures.cuh"

using namespace kevo::retrieval;
using namespace kevo_tests::retrieval_pipeline;

TEST_CASE("a batch is matched and scored in one pass, and each answer agrees with the reference", "[cuda][batch]") {
  const EmbeddingType type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8, EmbeddingType::int8_group32);
  const int n = GENERATE(5000, 250000);
  const std::uint64_t seed = GENERATE(21, 22);
  Loaded pool(small_options(seed, type), n);
  FusedRetrievalPipeline& p = *pool.pipeline;
  // Requests of every kind, K and routing width; the first batch is full, the others are not.
  std::vector<Request> requests;
  const RequestKind kinds[] = {RequestKind::typical, RequestKind::broad, RequestKind::narrow};
  const int ks[] = {1, 100, 1000, 4096};
  for (int i = 0; i < 13; ++i)
    requests.push_back(pool.workload.request(seed * 101 + static_cast<std::uint64_t>(i), kinds[i % 3], ks[i % 4], 1 + i % 8));
  requests[5] = requests[0];  // one request twice in a batch
  requests[6].query.assign(1, CategoryQuery{0, {}});  // an empty query: only the ANY-targeted ads

  // The async path into poisoned buffers: every answer's count and every entry up to it written.
  void* temp = nullptr;
  KEVO_GPU_ASSERT(cudaMalloc(&temp, p.search_batch_temp_bytes()));
  KEVO_GPU_ASSERT(cudaMemset(temp, 0xab, p.search_batch_temp_bytes()));
  constexpr std::size_t batch = kernels::kMaxBatchRequests;
  std::uint32_t* out = nullptr;
  KEVO_GPU_ASSERT(cudaMalloc(&out, batch * (2ull * kMaxK + 1) * 4));
  KEVO_GPU_ASSERT(cudaMemset(out, 0xab, batch * (2ull * kMaxK + 1) * 4));
  std::vector<SearchOutput> outs(batch);
  for (std::size_t r = 0; r < batch; ++r)
    outs[r] = {out + r * kMaxK, reinterpret_cast<float*>(out + (batch + r) * kMaxK), out + 2 * batch * kMaxK + r};
  cudaStream_t stream = nullptr;
  KEVO_GPU_ASSERT(cudaStreamCreate(&stream));
  // A full batch, and a lone request (scored beside itself, its twin's results dropped).
  for (std::size_t size : {batch, std::size_t{1}}) {
    const std::size_t first = batch - size;  // the lone one is a broad request
    KEVO_GPU_ASSERT(cudaMemset(out, 0xab, batch * (2ull * kMaxK + 1) * 4));
    REQUIRE(p.search_batch_async(std::span(requests).subspan(first, size), temp, p.search_batch_temp_bytes(),
                                 std::span(outs).first(size), stream));
    KEVO_GPU_ASSERT(cudaStreamSynchronize(stream));
    const auto all = download<std::uint32_t>(out, batch * (2ull * kMaxK + 1));
    for (std::size_t r = 0; r < size; ++r) {
      const Request& request = requests[first + r];
      const std::uint32_t count = all[2 * batch * kMaxK + r];
      REQUIRE(count <= static_cast<std::uint32_t>(request.k));
      std::vector<ScoredAd> top(count);
      for (std::uint32_t i = 0; i < count; ++i) {
        top[i].id = all[r * kMaxK + i];
        std::memcpy(&top[i].score, &all[(batch + r) * kMaxK + i], 4);
      }
      const RequestVectors v = compute_request_vectors(pool.workload.model(), request.features);
      auto ok = compare_with_reference(pool.host, v, request, top);
      INFO("type " << to_string(type) << " n " << n << " request " << r << ": " << (ok ? "ok" : ok.error().message));
      REQUIRE(ok);
      // What the request gets alone, to rounding (the compiler may contract the two kernels' sums
      // differently): the batch changes the pass, not the arithmetic.
      auto alone = p.search(request);
      REQUIRE(alone);
      REQUIRE(alone->size() == top.size());
      for (std::uint32_t i = 0; i < count; ++i)
        REQUIRE(std::fabs((*alone)[i].score - top[i].score) <= 1e-5f * (1.0f + std::fabs(top[i].score)));
    }
  }
  KEVO_GPU_ASSERT(cudaFree(temp));
  KEVO_GPU_ASSERT(cudaFree(out));
  KEVO_GPU_ASSERT(cudaStreamDestroy(stream));

  // The synchronous path splits 13 requests into batches of 8 and 5; a batch of 2; and a lone
  // request, which takes the single-request path.
  for (std::size_t size : {requests.size(), std::size_t{2}, std::size_t{1}}) {
    const auto some = std::span(requests).subspan(requests.size() - size);
    auto answers = p.search_batch(some);
    REQUIRE(answers);
    REQUIRE(answers->size() == size);
    for (std::size_t r = 0; r < size; ++r) {
      auto ok = compare_with_reference(pool.host, compute_request_vectors(pool.workload.model(), some[r].features),
                                       some[r], (*answers)[r]);
      INFO("search_batch of " << size << ", request " << r << ": " << (ok ? "ok" : ok.error().message));
      REQUIRE(ok);
    }
  }
  // A bad request names its place in the batch, and nothing runs.
  std::vector<Request> bad(requests.begin(), requests.begin() + 3);
  bad[2].k = 0;
  auto refused = p.search_batch(bad);
  REQUIRE(!refused);
  CHECK_THAT(refused.error().message, Catch::Contains("request 2 of the batch"));
}

TEST_CASE("d = 64 and 256 end to end, and every build of batched scoring, agree with the reference", "[cuda][pipeline][batch]") {
  const EmbeddingType type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8, EmbeddingType::int8_group32);
  const int dim = GENERATE(64, 128, 256);
  Loaded pool(small_options(static_cast<std::uint64_t>(40 + dim), type, dim), 60000);
  FusedRetrievalPipeline& p = *pool.pipeline;
  auto agrees = [&](const Request& request, const std::vector<ScoredAd>& top, std::string_view how) {
    auto ok = compare_with_reference(pool.host, compute_request_vectors(pool.workload.model(), request.features), request, top);
    INFO(to_string(type) << " d " << dim << " " << how << " k " << request.k << " routing " << request.routing << ": "
                         << (ok ? "ok" : ok.error().message));
    REQUIRE(ok);
  };
  std::vector<Request> requests;
  const RequestKind kinds[] = {RequestKind::typical, RequestKind::broad, RequestKind::narrow};
  const int ks[] = {1, 1000, 4096, 100};
  for (int i = 0; i < 8; ++i)
    requests.push_back(pool.workload.request(static_cast<std::uint64_t>(500 + i), kinds[i % 3], ks[i % 4], 1 + (i * 3) % 8));
  if (dim != 128)  // d = 128 is the other tests' shape; here its search() only as a baseline for the batches
    for (const Request& request : requests) {
      auto top = p.search(request);
      REQUIRE(top);
      agrees(request, *top, "search");
    }
  // Batched scoring's compile-time builds (ring or registers, one or two requests side by side), each
  // forced to run by one_pass_from = 2; d = 256 fp16 has no ring that fits, and is refused with the reason.
  const PipelinePolicy original = p.policy();
  for (int stages : BatchScoringPolicy::stages_domain)
    for (int group : BatchScoringPolicy::group_domain) {
      PipelinePolicy policy = original;
      policy.batch_scoring = {.one_pass_from = 2, .stages = stages, .group = group, .blocks_per_sm = 8};
      auto set = p.set_policy(policy);
      const std::string how = "search_batch stages " + std::to_string(stages) + " group " + std::to_string(group);
      if (!set) {
        INFO(how << ": " << set.error().message);
        REQUIRE(stages > 0);
        REQUIRE(set.error().message.find("bytes of shared memory per block") != std::string::npos);
        continue;
      }
      auto answers = p.search_batch(requests);
      REQUIRE(answers);
      REQUIRE(answers->size() == requests.size());
      for (std::size_t r = 0; r < requests.size(); ++r) agrees(requests[r], (*answers)[r], how);
    }
  REQUIRE(p.set_policy(original));
}
