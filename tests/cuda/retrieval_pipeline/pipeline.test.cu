// The whole pipeline against the reference: single searches, bad requests refused with a clear
// error, searches enqueued from several threads on their own streams, and the dispatch alone.
// (One of the files of test_cuda_retrieval_pipeline; its main is main.cu.)
#include <atomic>
#include <thread>

#include "../support/pipeline_fixtures.cuh"

using namespace kevo::retrieval;
using namespace kevo_tests::retrieval_pipeline;

TEST_CASE("the whole pipeline agrees with the reference", "[cuda][pipeline]") {
  const EmbeddingType type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8, EmbeddingType::int8_group32);
  const int n = GENERATE(5000, 250000);
  const std::uint64_t seed = GENERATE(7, 8);
  Loaded pool(small_options(seed, type), n);
  for (RequestKind kind : {RequestKind::typical, RequestKind::broad, RequestKind::narrow}) {
    for (int k : {1, 100, 1000, 4096}) {
      for (int routing : {1, 2, 8}) {
        const Request request = pool.workload.request(seed * 31 + static_cast<std::uint64_t>(k), kind, k, routing);
        auto top = pool.pipeline->search(request);
        REQUIRE(top);
        const RequestVectors v = compute_request_vectors(pool.workload.model(), request.features);
        auto ok = compare_with_reference(pool.host, v, request, *top);
        INFO("type " << to_string(type) << " n " << n << " seed " << seed << " kind " << int(kind) << " k " << k
                     << " routing " << routing << ": " << (ok ? "ok" : ok.error().message));
        REQUIRE(ok);
      }
    }
  }
}

TEST_CASE("bad requests come back as errors", "[cuda][pipeline]") {
  Loaded pool(small_options(5, EmbeddingType::fp16), 100);
  Request r = pool.workload.request(0);
  r.k = 5000;
  auto top = pool.pipeline->search(r);
  REQUIRE(!top);
  CHECK_THAT(top.error().message, Catch::Contains("K out of range"));
  r = pool.workload.request(0);
  r.query.push_back({99, {0}});
  CHECK(!pool.pipeline->search(r));
  r = pool.workload.request(0);
  r.features.resize(3);
  CHECK(!pool.pipeline->search(r));

  // Features so large that u_e or g_e overflow fp16 would score every ad NaN: an error instead, and
  // the next search is unharmed.
  r = pool.workload.request(0);
  r.features.assign(r.features.size(), 1e6f);
  auto overflowing = pool.pipeline->search(r);
  REQUIRE(!overflowing);
  CHECK_THAT(overflowing.error().message, Catch::Contains("overflow fp16"));
  auto in_batch = pool.pipeline->search_batch(std::vector<Request>{pool.workload.request(1), r, pool.workload.request(2)});
  REQUIRE(!in_batch);
  CHECK_THAT(in_batch.error().message, Catch::Contains("overflow fp16"));
  CHECK(pool.pipeline->search(pool.workload.request(0)));

  // A batch names the bad request by its place in the whole batch (not in its group of 8), and
  // runs none of it.
  std::vector<Request> ten;
  for (int i = 0; i < 10; ++i) ten.push_back(pool.workload.request(static_cast<std::uint64_t>(i)));
  ten[9].k = 0;
  auto refused = pool.pipeline->search_batch(ten);
  REQUIRE(!refused);
  CHECK_THAT(refused.error().message, Catch::Contains("request 9 of the batch: K out of range"));

  // Misaligned temp storage is refused before any kernel could fault on it (a fault would end the
  // context); the pipeline keeps searching.
  FusedRetrievalPipeline& p = *pool.pipeline;
  unsigned char* temp = nullptr;
  KEVO_GPU_ASSERT(cudaMalloc(&temp, p.search_temp_bytes() + 256));
  std::uint32_t* out = nullptr;
  KEVO_GPU_ASSERT(cudaMalloc(&out, (2 * kMaxK + 2) * 4));
  const SearchOutput output{out, reinterpret_cast<float*>(out + kMaxK), out + 2 * kMaxK};
  auto misaligned = p.search_async(pool.workload.request(0), temp + 4, p.search_temp_bytes(), output, nullptr);
  REQUIRE(!misaligned);
  CHECK_THAT(misaligned.error().message, Catch::Contains("aligned to 256 bytes"));
  const SearchOutput odd_output{out, reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(out + kMaxK) + 2),
                                out + 2 * kMaxK};
  CHECK(!p.search_async(pool.workload.request(0), temp, p.search_temp_bytes(), odd_output, nullptr));
  REQUIRE(p.search_async(pool.workload.request(0), temp, p.search_temp_bytes(), output, nullptr));
  KEVO_GPU_ASSERT(cudaDeviceSynchronize());
  KEVO_GPU_ASSERT(cudaFree(temp));
  KEVO_GPU_ASSERT(cudaFree(out));
  CHECK(pool.pipeline->search(pool.workload.request(1)));
}

TEST_CASE("search() reports how many ads matched the request", "[cuda][pipeline]") {
  Loaded pool(small_options(21, EmbeddingType::fp16), 20000);
  for (RequestKind kind : {RequestKind::typical, RequestKind::broad, RequestKind::narrow}) {
    const Request request = pool.workload.request(static_cast<std::uint64_t>(kind) + 5, kind, 100);
    const QuerySets query(pool.workload.schema().categories(), request.query);
    std::uint32_t expected = 0;
    for (std::size_t slot = 0; slot < pool.host.slots(); ++slot) expected += is_eligible(pool.host, slot, query);
    std::uint32_t eligible = 0xdeadbeef;  // poisoned: search() must write it
    auto top = pool.pipeline->search(request, &eligible);
    REQUIRE(top);
    INFO("request kind " << int(kind));
    CHECK(eligible == expected);
    CHECK(top->size() == std::min<std::size_t>(100, expected));
  }
}

TEST_CASE("searches enqueued from several threads on their own streams agree with the reference", "[cuda][pipeline]") {
  // The pipeline's enqueues are serialised by the index's lock, but the streams run at once; each
  // reuses its temp storage round after round, which stream order alone must keep apart.
  // Also with the request's kernels and matching launched after prior, each in each stream's order.
  const EmbeddingType type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8, EmbeddingType::int8_group32);
  const int launch_after_prior = GENERATE(0, 1);
  Loaded pool(small_options(13, type), 60000);
  constexpr int streams = 4, rounds = 3, k = 500;
  FusedRetrievalPipeline& p = *pool.pipeline;
  PipelinePolicy policy = p.policy();
  policy.matching.launch_after_prior = launch_after_prior;
  REQUIRE(p.set_policy(policy));
  struct Lane {
    cudaStream_t stream = nullptr;
    void* temp = nullptr;
    std::uint32_t* ids = nullptr;  // (rounds, k)
    float* scores = nullptr;
    std::uint32_t* counts = nullptr;
  };
  std::vector<Lane> lanes(streams);
  for (Lane& l : lanes) {
    KEVO_GPU_ASSERT(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking));
    KEVO_GPU_ASSERT(cudaMalloc(&l.temp, p.search_temp_bytes()));
    KEVO_GPU_ASSERT(cudaMalloc(&l.ids, rounds * k * 4));
    KEVO_GPU_ASSERT(cudaMalloc(&l.scores, rounds * k * 4));
    KEVO_GPU_ASSERT(cudaMalloc(&l.counts, rounds * 4));
    KEVO_GPU_ASSERT(cudaMemset(l.ids, 0xff, rounds * k * 4));  // poison
    KEVO_GPU_ASSERT(cudaMemset(l.scores, 0xff, rounds * k * 4));
    KEVO_GPU_ASSERT(cudaMemset(l.counts, 0xff, rounds * 4));
  }
  auto request_of = [&](int lane, int round) {
    const RequestKind kind = (lane + round) % 3 == 0 ? RequestKind::broad : RequestKind::typical;
    return pool.workload.request(static_cast<std::uint64_t>(100 + lane * rounds + round), kind, k);
  };
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int lane = 0; lane < streams; ++lane)
    threads.emplace_back([&, lane] {
      const Lane& l = lanes[lane];
      for (int round = 0; round < rounds; ++round)  // no waiting between rounds
        if (!p.search_async(request_of(lane, round), l.temp, p.search_temp_bytes(),
                            {l.ids + round * k, l.scores + round * k, l.counts + round}, l.stream))
          ++failures;
    });
  for (std::thread& t : threads) t.join();
  REQUIRE(failures == 0);
  for (int lane = 0; lane < streams; ++lane) {
    const Lane& l = lanes[lane];
    KEVO_GPU_ASSERT(cudaStreamSynchronize(l.stream));
    const auto counts = download<std::uint32_t>(l.counts, rounds);
    const auto ids = download<std::uint32_t>(l.ids, rounds * k);
    const auto scores = download<float>(l.scores, rounds * k);
    for (int round = 0; round < rounds; ++round) {
      const Request request = request_of(lane, round);
      REQUIRE(counts[round] == static_cast<std::uint32_t>(k));
      std::vector<ScoredAd> top(k);
      for (int i = 0; i < k; ++i) top[i] = {ids[round * k + i], scores[round * k + i]};
      auto ok = compare_with_reference(pool.host, compute_request_vectors(pool.workload.model(), request.features),
                                       request, top);
      INFO("type " << to_string(type) << " launch_after_prior " << launch_after_prior << " stream " << lane << " round "
                   << round << ": "
                   << (ok ? "ok" : ok.error().message));
      REQUIRE(ok);
    }
  }
  for (Lane& l : lanes) {
    cudaFree(l.temp);
    cudaFree(l.ids);
    cudaFree(l.scores);
    cudaFree(l.counts);
    cudaStreamDestroy(l.stream);
  }
}

TEST_CASE("a RetrievalDispatch alone searches on the caller's stream and temp storage", "[cuda][pipeline]") {
  // The dispatch without the synchronous facade: nothing of its own to search with, so the caller's
  // buffers (poisoned) and stream carry every search, and set_policy's new layout is the caller's to size.
  const Workload w(small_options(21, EmbeddingType::int8_group32));
  HostAdPool host(w.schema());
  auto dispatch = RetrievalDispatch::create(w.schema(), w.model(), {.capacity = 8192});
  REQUIRE(dispatch);
  std::vector<AdRecord> ads;
  for (int i = 0; i < 6000; ++i) ads.push_back(w.ad(static_cast<std::uint64_t>(i)));
  REQUIRE((*dispatch)->index().upsert(ads));
  for (const AdRecord& ad : ads) REQUIRE(host.upsert(ad));
  cudaStream_t stream;
  KEVO_GPU_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  constexpr int k = 300;
  DeviceBuffer<std::uint32_t> ids, counts;
  DeviceBuffer<float> scores;
  KEVO_GPU_ASSERT(gpu_allocate(ids, k * 4));
  KEVO_GPU_ASSERT(gpu_allocate(scores, k * 4));
  KEVO_GPU_ASSERT(gpu_allocate(counts, 4));
  for (const PipelinePolicy& policy : {(*dispatch)->policy(), PipelinePolicy{.scoring = {128, 4, 2, 2, 0}}}) {
    REQUIRE((*dispatch)->set_policy(policy));
    DeviceBuffer<void> temp;
    KEVO_GPU_ASSERT(gpu_allocate(temp, (*dispatch)->search_temp_bytes()));
    KEVO_GPU_ASSERT(cudaMemset(temp.get(), 0xab, (*dispatch)->search_temp_bytes()));
    for (RequestKind kind : {RequestKind::typical, RequestKind::broad}) {
      KEVO_GPU_ASSERT(cudaMemset(ids.get(), 0xff, k * 4));
      KEVO_GPU_ASSERT(cudaMemset(scores.get(), 0xff, k * 4));
      const Request request = w.request(static_cast<std::uint64_t>(kind) + 3, kind, k);
      REQUIRE((*dispatch)->search_async(request, temp.get(), (*dispatch)->search_temp_bytes(),
                                        {ids.get(), scores.get(), counts.get()}, stream));
      KEVO_GPU_ASSERT(cudaStreamSynchronize(stream));
      REQUIRE(download<std::uint32_t>(counts.get(), 1)[0] == static_cast<std::uint32_t>(k));
      const auto got_ids = download<std::uint32_t>(ids.get(), k);
      const auto got_scores = download<float>(scores.get(), k);
      std::vector<ScoredAd> top(k);
      for (int i = 0; i < k; ++i) top[i] = {got_ids[i], got_scores[i]};
      auto ok = compare_with_reference(host, compute_request_vectors(w.model(), request.features), request, top);
      INFO(to_string(policy) << ": " << (ok ? "ok" : ok.error().message));
      REQUIRE(ok);
    }
  }
  // Too little temp storage is refused, not overrun.
  DeviceBuffer<void> small;
  KEVO_GPU_ASSERT(gpu_allocate(small, 256));
  auto refused = (*dispatch)->search_async(w.request(9, RequestKind::typical, k), small.get(), 256,
                                           {ids.get(), scores.get(), counts.get()}, stream);
  REQUIRE(!refused);
  CHECK_THAT(refused.error().message, Catch::Contains("temp storage too small"));
  KEVO_GPU_ASSERT(cudaStreamSynchronize(stream));
  KEVO_GPU_ASSERT(cudaStreamDestroy(stream));
}
