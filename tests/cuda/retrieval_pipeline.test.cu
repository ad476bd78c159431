// The GPU retrieval pipeline against the CPU reference: matching, towers, fused scoring (fp16 and
// int8), top-K, the whole pipeline, and updates during search. Every output buffer is poisoned
// first and every element is checked. Exits 77 (ctest: skipped) where no GPU exists.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <span>
#include <set>
#include <thread>

#include "kevo/retrieval/dispatch/fused_retrieval_pipeline.cuh"
#include "kevo/retrieval/retrieval.hpp"

using namespace kevo::retrieval;

namespace {

WorkloadOptions small_options(std::uint64_t seed, EmbeddingType type, int dim = 128) {
  return {.seed = seed, .dim = dim, .features = 64, .hidden = 64, .embedding_type = type};
}

/// Live ads that a reindex leaves to be walked: more than 64 clauses. (More than 7 restricted
/// categories are prefiltered by their first 7, not walked outright.)
std::size_t too_long_to_index(const HostAdPool& host) {
  std::size_t walked = 0;
  for (std::size_t slot = 0; slot < host.slots(); ++slot)
    walked += host.live(slot) && host.clauses(slot).size() > kMaxIndexedClauses;
  return walked;
}

/// How a test pool's ads reach matching: as the upserts leave them (a reindex each time 65536 ads
/// have been written), all tested by walking their clause runs (never reindexed), or all indexed.
enum class Indexing { automatic, never, after_load };

/// A pool loaded both on the host (for the reference) and on the device.
struct Loaded {
  Workload workload;
  HostAdPool host;
  std::unique_ptr<FusedRetrievalPipeline> pipeline;
  Loaded(WorkloadOptions options, int n, std::optional<PipelinePolicy> policy = std::nullopt,
         Indexing indexing = Indexing::automatic)
      : workload(options), host(workload.schema()) {
    auto p = FusedRetrievalPipeline::create(
        workload.schema(), workload.model(),
        {.capacity = static_cast<std::size_t>(n) + 1024,
         .reindex_after = indexing == Indexing::never ? SIZE_MAX : 0,
         .policy = policy});
    REQUIRE(p);
    pipeline = std::move(*p);
    std::vector<AdRecord> batch;
    for (int i = 0; i < n; ++i) {
      batch.push_back(workload.ad(static_cast<std::uint64_t>(i)));
      REQUIRE(host.upsert(batch.back()));
      if (batch.size() == 20000 || i == n - 1) {
        auto ok = pipeline->index().upsert(batch);
        INFO((ok ? "" : ok.error().message));
        REQUIRE(ok);
        batch.clear();
      }
    }
    if (indexing == Indexing::after_load) REQUIRE(pipeline->index().reindex());
    if (indexing == Indexing::never) REQUIRE(pipeline->index().unindexed_count() == host.live_count());
    if (indexing == Indexing::after_load) REQUIRE(pipeline->index().unindexed_count() == too_long_to_index(host));
  }
};

template <class T>
std::vector<T> download(const void* device, std::size_t count) {
  std::vector<T> host(count);
  if (count) KEVO_GPU_ASSERT(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

struct Stages {
  void* temp = nullptr;
  SearchTempLayout layout{};
  cudaStream_t stream = nullptr;
  explicit Stages(FusedRetrievalPipeline& p) : layout(p.temp_layout()) {
    KEVO_GPU_ASSERT(cudaMalloc(&temp, layout.total));
    KEVO_GPU_ASSERT(cudaMemset(temp, 0xab, layout.total));  // poison everything
    KEVO_GPU_ASSERT(cudaStreamCreate(&stream));
  }
  ~Stages() {
    cudaFree(temp);
    cudaStreamDestroy(stream);
  }
  unsigned char* at(std::size_t offset) const { return static_cast<unsigned char*>(temp) + offset; }
  TopKState state() const { return download<TopKState>(at(layout.state), 1)[0]; }
};

/// The device's fp16 u and g as reference vectors, so that scoring is checked on identical inputs.
RequestVectors device_vectors(const Stages& s, const Model& model) {
  const auto halves = download<std::uint16_t>(s.at(s.layout.vectors), 2ull * kMaxGpuExperts * model.dim);
  RequestVectors v{model.experts, model.dim, {}, {}};
  for (int e = 0; e < model.experts; ++e)
    for (int k = 0; k < model.dim; ++k) {
      v.expert.push_back(half_to_float(halves[static_cast<std::size_t>(e) * model.dim + k]));
      v.gate.push_back(half_to_float(halves[static_cast<std::size_t>(kMaxGpuExperts + e) * model.dim + k]));
    }
  return v;
}

/// The ids of the ads that matching finds eligible for `request` (every list entry distinct).
std::vector<std::uint32_t> device_eligible_ids(FusedRetrievalPipeline& pipeline, const Request& request) {
  Stages s(pipeline);
  auto lock = pipeline.index().search_lock();
  auto view = pipeline.index().before_search(s.stream);
  REQUIRE(view);
  REQUIRE(pipeline.enqueue_prepare(request, s.temp, s.stream));
  REQUIRE(pipeline.enqueue_matching(*view, s.temp, s.stream));
  KEVO_GPU_ASSERT(cudaStreamSynchronize(s.stream));
  REQUIRE(pipeline.index().after_search(s.stream));
  const auto list = download<std::uint32_t>(s.at(s.layout.eligible), s.state().eligible_count);
  const auto ids = download<std::uint32_t>(view->ids, view->slots);
  std::vector<std::uint32_t> out;
  for (std::uint32_t slot : list) {
    REQUIRE(slot < view->slots);
    out.push_back(ids[slot]);
  }
  std::sort(out.begin(), out.end());
  REQUIRE(std::adjacent_find(out.begin(), out.end()) == out.end());
  return out;
}

/// The gap between fp16 values around x: 2^(e - 10) for x in [2^e, 2^(e + 1)), subnormals' 2^-24 below.
float fp16_step(float x) {
  const float magnitude = std::fabs(x);
  if (magnitude < 0x1p-14f) return 0x1p-24f;
  return std::ldexp(1.0f, std::ilogb(magnitude) - 10);
}

std::vector<std::uint32_t> reference_eligible_ids(const HostAdPool& host, const Request& request) {
  const QuerySets q(host.schema().categories(), request.query);
  std::vector<std::uint32_t> out;
  for (std::size_t slot = 0; slot < host.slots(); ++slot)
    if (is_eligible(host, slot, q)) out.push_back(host.id(slot));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("matching and towers agree with the reference", "[cuda][matching]") {
  const int n = GENERATE(1000, 70001, 300000);
  const std::uint64_t seed = GENERATE(1, 2);
  const Indexing indexing = GENERATE(Indexing::automatic, Indexing::never, Indexing::after_load);
  Loaded pool(small_options(seed, EmbeddingType::fp16), n, std::nullopt, indexing);
  for (RequestKind kind : {RequestKind::typical, RequestKind::broad, RequestKind::narrow}) {
    const Request request = pool.workload.request(seed, kind);
    Stages s(*pool.pipeline);
    auto lock = pool.pipeline->index().search_lock();
    auto view = pool.pipeline->index().before_search(s.stream);
    REQUIRE(view);
    REQUIRE(pool.pipeline->enqueue_prepare(request, s.temp, s.stream));
    REQUIRE(pool.pipeline->enqueue_matching(*view, s.temp, s.stream));
    KEVO_GPU_ASSERT(cudaStreamSynchronize(s.stream));
    const TopKState state = s.state();
    const auto list = download<std::uint32_t>(s.at(s.layout.eligible), state.eligible_count);
    const QuerySets q(pool.host.schema().categories(), request.query);
    std::vector<std::uint32_t> expected;
    for (std::size_t slot = 0; slot < pool.host.slots(); ++slot)
      if (is_eligible(pool.host, slot, q)) expected.push_back(static_cast<std::uint32_t>(slot));
    std::vector<std::uint32_t> got(list.begin(), list.end());
    std::sort(got.begin(), got.end());
    INFO("n " << n << " seed " << seed << " indexing " << int(indexing) << " kind " << int(kind) << " eligible "
              << expected.size());
    REQUIRE(got == expected);  // every written entry a distinct eligible slot, none missing
    REQUIRE(!expected.empty());
    if (kind == RequestKind::typical) {
      // Every build and grid of matching the search may sweep lists the same ads ("a policy never
      // changes results"); the default above, the rest here.
      lock.unlock();
      const PipelinePolicy original = pool.pipeline->policy();
      for (int threads : MatchingPolicy::block_threads_domain)
        for (int blocks : MatchingPolicy::blocks_per_sm_domain) {
          PipelinePolicy policy = original;
          policy.matching = {threads, blocks};
          REQUIRE(pool.pipeline->set_policy(policy));
          const std::vector<std::uint32_t> ids = device_eligible_ids(*pool.pipeline, request);
          std::vector<std::uint32_t> expected_ids;
          for (std::uint32_t slot : expected) expected_ids.push_back(pool.host.id(slot));
          std::sort(expected_ids.begin(), expected_ids.end());
          INFO(to_string(policy.matching));
          REQUIRE(ids == expected_ids);
        }
      REQUIRE(pool.pipeline->set_policy(original));
      lock.lock();
    }

    // Towers: each fp16 value within one fp16 rounding step of the reference's (the two sum in
    // different orders in fp32, which may round a value to the neighbouring half; the 1e-6 covers
    // that order's own fp32 error where a sum cancels to almost nothing).
    const RequestVectors ref = compute_request_vectors(pool.workload.model(), request.features);
    const RequestVectors dev = device_vectors(s, pool.workload.model());
    auto within_one_step = [](float device, float reference) {
      return std::fabs(device - reference) <= fp16_step(reference) + 1e-6f;
    };
    for (std::size_t i = 0; i < ref.expert.size(); ++i) {
      INFO("value " << i << ": expert " << dev.expert[i] << " / " << ref.expert[i] << ", gate " << dev.gate[i] << " / "
                    << ref.gate[i]);
      REQUIRE(within_one_step(dev.expert[i], ref.expert[i]));
      REQUIRE(within_one_step(dev.gate[i], ref.gate[i]));
    }
  }
}

TEST_CASE("matching's postings take every clause shape, and stale postings never leak", "[cuda][matching]") {
  Workload w(small_options(21, EmbeddingType::fp16));
  const Request request = w.request(5, RequestKind::typical);
  // A value the user holds, and one they do not, in category c.
  auto held = [&](std::uint32_t c) {
    for (const CategoryQuery& q : request.query)
      if (q.category == c && !q.values.empty()) return q.values[0];
    return ~0u;
  };
  auto not_held = [&](std::uint32_t c, std::uint32_t skip = 0) {  // the skip-th value the user lacks
    for (std::uint32_t v = 0; v < w.schema().category_values[c]; ++v) {
      bool in = false;
      for (const CategoryQuery& q : request.query)
        if (q.category == c) in = in || std::find(q.values.begin(), q.values.end(), v) != q.values.end();
      if (!in && skip-- == 0) return v;
    }
    return ~0u;
  };
  std::vector<std::uint32_t> categories;  // categories where the user holds a value and lacks two
  for (std::uint32_t c = 0; c < static_cast<std::uint32_t>(w.schema().categories()); ++c)
    if (held(c) != ~0u && not_held(c, 1) != ~0u) categories.push_back(c);
  REQUIRE(categories.size() >= 10);
  // Each shape twice: once satisfied by the request (flip = false), once not.
  auto special = [&](int shape, bool flip, std::uint32_t id) {
    AdRecord ad = w.ad(id);
    ad.id = id;
    ad.live = true;
    ad.clauses.clear();
    const std::uint32_t c0 = categories[0];
    switch (shape) {
      case 0:  // 9 restricted categories: prefiltered by the first 7, the ninth unmet (found by the walk)
        for (int k = 0; k < 9; ++k) ad.clauses.push_back({categories[k], flip && k == 8 ? not_held(categories[k]) : held(categories[k])});
        break;
      case 6:  // 8 restricted categories, the third unmet (the prefilter stops it), and an exclusion
        for (int k = 0; k < 8; ++k) ad.clauses.push_back({categories[k], flip && k == 2 ? not_held(categories[k]) : held(categories[k])});
        ad.clauses.push_back({categories[9], not_held(categories[9]), true});
        break;
      case 7:  // 8 restricted categories, all met, but an excluded value held (the prefilter stops it)
        for (int k = 0; k < 8; ++k) ad.clauses.push_back({categories[k], held(categories[k])});
        ad.clauses.push_back({categories[9], flip ? held(categories[9]) : not_held(categories[9]), true});
        break;
      case 1:  // exactly 7 restricted categories: the most that are indexed
        for (int k = 0; k < 7; ++k) ad.clauses.push_back({categories[k], flip && k == 3 ? not_held(categories[k]) : held(categories[k])});
        break;
      case 2:  // 70 clauses in one category: too long to index
        for (std::uint32_t v = 0; v < 70; ++v) ad.clauses.push_back({c0, not_held(c0, v % 2)});
        if (!flip) ad.clauses.push_back({c0, held(c0)});
        break;
      case 3:  // the same value allowed and excluded: excluded wins
        ad.clauses.push_back({c0, held(c0)});
        ad.clauses.push_back({c0, flip ? held(c0) : not_held(c0), true});
        break;
      case 4:  // exclusions only
        ad.clauses.push_back({categories[1], flip ? held(categories[1]) : not_held(categories[1]), true});
        ad.clauses.push_back({categories[2], not_held(categories[2]), true});
        break;
      case 5:  // one clause three times, and a second value of the same category
        for (int k = 0; k < 3; ++k) ad.clauses.push_back({c0, flip ? not_held(c0) : held(c0)});
        ad.clauses.push_back({c0, not_held(c0)});
        break;
      default:  // 8: ANY everywhere
        break;
    }
    return ad;
  };
  constexpr int kShapes = 9;
  // One segment per reindex slice as well as all in one: the slices' tables must join up.
  const std::uint32_t slice_segments = GENERATE(1u, 512u);
  auto p = FusedRetrievalPipeline::create(
      w.schema(), w.model(), {.capacity = 40000, .reindex_after = SIZE_MAX, .reindex_slice_segments = slice_segments});
  REQUIRE(p);
  DeviceAdIndex& index = (*p)->index();
  HostAdPool host(w.schema());
  auto apply = [&](const std::vector<AdRecord>& batch) {
    for (const AdRecord& ad : batch)
      if (ad.live) REQUIRE(host.upsert(ad));
      else host.expire(ad.id);
    REQUIRE(index.upsert(batch));
  };
  auto check = [&](const char* step) {
    const auto expected = reference_eligible_ids(host, request);
    INFO(step << " (slices of " << slice_segments << " segments): " << expected.size() << " eligible of "
              << host.live_count());
    REQUIRE(device_eligible_ids(**p, request) == expected);
  };
  std::vector<AdRecord> batch;
  for (std::uint32_t i = 0; i < 20000; ++i) batch.push_back(w.ad(i));
  for (int shape = 0; shape < kShapes; ++shape)
    for (int copy = 0; copy < 40; ++copy) batch.push_back(special(shape, copy % 2 == 1, 100000 + shape * 100 + copy));
  apply(batch);
  check("all walked");
  REQUIRE(index.reindex());
  REQUIRE(index.unindexed_count() == too_long_to_index(host));
  REQUIRE(too_long_to_index(host) >= 40);  // shape 2's 40 copies
  check("indexed");
  // Flip every special ad (its postings now name the wrong values), expire a tenth of the rest,
  // then reuse their slots for new ads: stale postings must not decide anything.
  batch.clear();
  for (int shape = 0; shape < kShapes; ++shape)
    for (int copy = 0; copy < 40; ++copy) batch.push_back(special(shape, copy % 2 == 0, 100000 + shape * 100 + copy));
  apply(batch);
  check("special ads replaced");
  std::vector<std::uint32_t> gone;
  for (std::uint32_t i = 0; i < 20000; i += 10) gone.push_back(i);
  std::size_t were_live = 0;
  for (std::uint32_t id : gone) were_live += host.expire(id) ? 1 : 0;
  auto expired = index.expire(gone);
  REQUIRE(expired);
  REQUIRE(*expired == were_live);
  check("a tenth expired");
  batch.clear();
  for (std::uint32_t i = 0; i < 2000; ++i) {
    AdRecord ad = w.ad(50000 + i);
    ad.id = 200000 + i;
    ad.live = true;
    batch.push_back(ad);
  }
  apply(batch);
  check("freed slots reused");
  REQUIRE(index.reindex());
  check("indexed again");
}

TEST_CASE("fused scoring agrees with the reference for every eligible ad", "[cuda][scoring]") {
  const EmbeddingType type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8);
  const int dim = GENERATE(64, 128, 256);
  const int routing = GENERATE(1, 2, 8);
  // Register loads (1 or 2 tiles in flight) and cp.async rings of 2-4 stages, including a ring deeper
  // than a chunk's pairs (4 stages, 2 pairs a chunk: the slot list is waited for explicitly).
  const ScoringPolicy scoring = GENERATE(ScoringPolicy{128, 4, 8, 1, 0}, ScoringPolicy{256, 16, 8, 2, 0},
                                         ScoringPolicy{128, 4, 8, 2, 2}, ScoringPolicy{128, 16, 8, 2, 3},
                                         ScoringPolicy{256, 32, 8, 2, 2}, ScoringPolicy{128, 4, 8, 2, 4});
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
  REQUIRE(pool.pipeline->enqueue_prepare(request, s.temp, s.stream));
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

TEST_CASE("the default policy fits every shape, and an explicit one that does not is refused", "[cuda][policy]") {
  for (int dim : {64, 128, 256})
    for (EmbeddingType type : {EmbeddingType::fp16, EmbeddingType::int8}) {
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
      REQUIRE(chosen.batch_scoring.one_pass_from == (type == EmbeddingType::int8 ? 16 : 2));
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

TEST_CASE("the whole pipeline agrees with the reference", "[cuda][pipeline]") {
  const EmbeddingType type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8);
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

TEST_CASE("a batch is matched and scored in one pass, and each answer agrees with the reference", "[cuda][batch]") {
  const EmbeddingType type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8);
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
  const EmbeddingType type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8);
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

// The keys a thread of the sort holds, which the kernel and the host's shared-memory sizing both take from here.
static_assert(kernels::topk_sort_items(0) == 1 && kernels::topk_sort_items(1) == 1 && kernels::topk_sort_items(1024) == 1);
static_assert(kernels::topk_sort_items(1025) == 2 && kernels::topk_sort_items(1000 + 2048) == 4);
static_assert(kernels::topk_sort_items(4096 + 2048) == 8 && kernels::topk_sort_items(4096 + 8192) == 16 &&
              kernels::topk_sort_items(16384) == 16 && kernels::topk_sort_items(16385) == 0);

TEST_CASE("ties are broken by lower id, through every radix-select level", "[cuda][topk]") {
  // 30000 ads with one embedding and bias: every score ties, so the K-th key is resolved in the id bits;
  // with each boundary cap, so that the sort takes from a little over K up to K + cap candidates.
  Workload w(small_options(3, EmbeddingType::fp16));
  PipelinePolicy policy;
  policy.topk.boundary_cap = GENERATE(2048, 4096, 8192);
  auto p = FusedRetrievalPipeline::create(w.schema(), w.model(), {.capacity = 40000, .policy = policy});
  REQUIRE(p);
  AdRecord same = w.ad(0);
  same.clauses.clear();
  same.live = true;
  std::vector<AdRecord> ads;
  for (std::uint32_t i = 0; i < 30000; ++i) {
    same.id = 1000000u - 7u * i;  // ids not in slot order
    ads.push_back(same);
  }
  REQUIRE((*p)->index().upsert(ads));
  for (int k : {1, 777, 4096}) {
    auto top = (*p)->search(w.request(1, RequestKind::typical, k));
    REQUIRE(top);
    REQUIRE(top->size() == static_cast<std::size_t>(k));
    for (int i = 0; i < k; ++i) {
      REQUIRE((*top)[static_cast<std::size_t>(i)].id == 1000000u - 7u * 29999u + 7u * static_cast<std::uint32_t>(i));
      REQUIRE((*top)[static_cast<std::size_t>(i)].score == (*top)[0].score);
    }
  }
}

TEST_CASE("replaced and expired ads' clause runs are reclaimed", "[cuda][updates]") {
  const Workload w(small_options(13, EmbeddingType::fp16));
  HostAdPool host(w.schema());
  constexpr std::uint32_t ads = 3000;
  constexpr std::size_t clause_capacity = 4096 * 8;
  auto p = FusedRetrievalPipeline::create(w.schema(), w.model(), {.capacity = 4096, .clause_capacity = clause_capacity});
  REQUIRE(p);
  DeviceAdIndex& index = (*p)->index();
  std::size_t written = 0;  // packed clauses every batch appended, padded as the arena stores them
  for (int round = 0; round < 10; ++round) {
    std::vector<AdRecord> batch;
    for (std::uint32_t i = 0; i < ads; ++i) {
      AdRecord ad = w.ad(static_cast<std::uint64_t>(round) * 100000 + i);  // new targeting each round
      ad.id = i;
      ad.live = ad.live && !(round % 3 == 2 && i % 3 == 0);  // now and then a third of them expire
      written += (ad.clauses.size() + 3) / 4 * 4;
      batch.push_back(ad);
      if (ad.live) REQUIRE(host.upsert(ad));
      else host.expire(ad.id);
    }
    auto ok = index.upsert(batch);
    INFO("round " << round << ": " << (ok ? "" : ok.error().message));
    REQUIRE(ok);
    REQUIRE(index.clause_arena_used() <= clause_capacity);
    REQUIRE(index.live_count() == host.live_count());
  }
  REQUIRE(written > 2 * clause_capacity);  // without reclaiming, the arena would have overflowed
  for (RequestKind kind : {RequestKind::typical, RequestKind::broad, RequestKind::narrow}) {
    const Request request = w.request(static_cast<std::uint64_t>(kind) + 40, kind, 500);
    auto top = (*p)->search(request);
    REQUIRE(top);
    auto ok = compare_with_reference(host, compute_request_vectors(w.model(), request.features), request, *top);
    INFO((ok ? "" : ok.error().message));
    REQUIRE(ok);
  }
  // Live clauses that cannot fit even after packing: a clear error, and the index is unchanged.
  auto small = FusedRetrievalPipeline::create(w.schema(), w.model(), {.capacity = 4096, .clause_capacity = 64});
  REQUIRE(small);
  std::vector<AdRecord> many;
  for (std::uint32_t i = 0; many.size() < 40; ++i)
    if (AdRecord ad = w.ad(i); !ad.clauses.empty()) many.push_back(ad);
  auto full = (*small)->index().upsert(many);
  REQUIRE(!full);
  CHECK_THAT(full.error().message, Catch::Contains("clause arena is full"));
  REQUIRE((*small)->index().live_count() == 0);
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

TEST_CASE("a PackedAds batch that would mislead matching or scoring is refused whole", "[cuda][updates]") {
  Loaded pool(small_options(6, EmbeddingType::fp16), 100);
  std::vector<AdRecord> three{pool.workload.ad(1000), pool.workload.ad(1001), pool.workload.ad(1002)};
  three[0].clauses = {{0, 0, false}, {1, 0, true}};
  three[1].clauses = {{2, 0, false}};
  auto packed = [&] { return PackedAds::from(three, static_cast<std::size_t>(pool.workload.schema().dim), 1); };
  REQUIRE(packed().clauses.size() >= 2);
  auto refused = [&](PackedAds ads, const char* why) {
    auto ok = pool.pipeline->index().upsert(ads);
    REQUIRE(!ok);
    CHECK_THAT(ok.error().message, Catch::Contains(why));
  };
  PackedAds unflagged = packed();
  unflagged.clauses[1] &= ~clause_bits::last;  // ad 0's run would run on into ad 1's
  refused(unflagged, "flag their last one");
  PackedAds early = packed();
  early.clauses[0] |= clause_bits::last;
  refused(early, "flag their last one");
  PackedAds backwards = packed();
  std::swap(backwards.clause_begin[1], backwards.clause_begin[2]);
  refused(backwards, "clause_begin");
  PackedAds short_end = packed();
  short_end.clause_begin.back() -= 1;
  refused(short_end, "clause_begin must run from 0");
  PackedAds nan_bias = packed();
  nan_bias.bias[2] = std::nanf("");
  refused(nan_bias, "bias must be finite");
  PackedAds wide = packed();
  wide.embeddings[5] = 1e5f;
  refused(wide, "beyond fp16's range");
  CHECK(pool.pipeline->index().live_count() == pool.host.live_count());  // nothing of them went in
  REQUIRE(pool.pipeline->index().upsert(packed()));
}

TEST_CASE("a value listed twice in a query is one value, however often it repeats", "[cuda][matching]") {
  // Few values in all (sum of V_c = 8): repeating one value more often than that must not crowd the
  // others out of the request's bit list.
  Workload w(small_options(31, EmbeddingType::fp16));
  Schema schema = w.schema();
  schema.category_values = {2, 2, 2, 2};
  Model model = w.model();
  auto created = FusedRetrievalPipeline::create(schema, model, {.capacity = 1024});
  REQUIRE(created);
  FusedRetrievalPipeline& p = **created;
  HostAdPool host(schema);
  std::vector<AdRecord> ads;
  for (std::uint32_t i = 0; i < 40; ++i) {
    AdRecord ad = w.ad(i);
    ad.clauses = {{i % 4, (i / 4) % 2, false}};  // each ad needs one (category, value)
    ad.live = true;
    ads.push_back(ad);
    REQUIRE(host.upsert(ad));
  }
  REQUIRE(p.index().upsert(ads));
  Request request = w.request(3);
  request.k = 40;
  request.query = {{0, {0, 0, 0, 0, 0, 0, 0, 0, 0}}, {1, {1, 1}}, {3, {0, 1, 0}}};
  auto top = p.search(request);
  REQUIRE(top);
  auto ok = compare_with_reference(host, compute_request_vectors(model, request.features), request, *top);
  INFO((ok ? "" : ok.error().message));
  REQUIRE(ok);
  CHECK(top->size() == 20);  // category 0 value 0, category 1 value 1, category 3 both values: 5 + 5 + 10 ads
}

TEST_CASE("searches enqueued from several threads on their own streams agree with the reference", "[cuda][pipeline]") {
  // The pipeline's enqueues are serialised by the index's lock, but the streams run at once; each
  // reuses its temp storage round after round, which stream order alone must keep apart.
  const EmbeddingType type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8);
  Loaded pool(small_options(13, type), 60000);
  constexpr int streams = 4, rounds = 3, k = 500;
  FusedRetrievalPipeline& p = *pool.pipeline;
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
      INFO("type " << to_string(type) << " stream " << lane << " round " << round << ": "
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

TEST_CASE("updates during search are never torn and are seen once applied", "[cuda][updates]") {
  const EmbeddingType type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8);
  Loaded pool(small_options(11, type), 20000);
  constexpr int hot = 300, versions = 40;
  const Workload& w = pool.workload;
  const Request request = w.request(2, RequestKind::typical, hot);
  // Versions v % 5 == 2 restrict the hot ads to a value the request lacks (targeting changes), and
  // versions v % 5 == 4 pause them and then expire them (the next version inserts them again): the
  // request then sees none of them. The rest are ANY-targeted and live with bias 20 + v, so that
  // all of them are in its top-K.
  auto hidden = [](int v) { return v % 5 == 2 || v % 5 == 4; };
  const std::uint32_t restricted_category = static_cast<std::uint32_t>(w.schema().categories() - 1);
  std::uint32_t unqueried_value = 0;
  for (const CategoryQuery& q : request.query)
    if (q.category == restricted_category)
      while (std::find(q.values.begin(), q.values.end(), unqueried_value) != q.values.end()) ++unqueried_value;
  REQUIRE(unqueried_value < w.schema().category_values[restricted_category]);
  auto hot_ad = [&](int j, int v) {
    AdRecord ad = w.ad(static_cast<std::uint64_t>(100000 + j * versions + v));
    ad.id = 5000000u + static_cast<std::uint32_t>(j);
    ad.bias = 20.0f + static_cast<float>(v);
    ad.clauses.clear();
    if (v % 5 == 2) ad.clauses.push_back({restricted_category, unqueried_value, false});
    ad.live = v % 5 != 4;
    return ad;
  };
  const RequestVectors vectors = compute_request_vectors(w.model(), request.features);
  std::vector<std::vector<ReferenceScore>> expected(hot, std::vector<ReferenceScore>(versions));
  for (int v = 0; v < versions; ++v) {
    if (hidden(v)) continue;  // (never served: no score to expect)
    HostAdPool version_pool(w.schema());
    for (int j = 0; j < hot; ++j) REQUIRE(version_pool.upsert(hot_ad(j, v)));
    for (int j = 0; j < hot; ++j) expected[j][v] = reference_score(version_pool, static_cast<std::size_t>(j), vectors, 2);
  }
  std::vector<std::uint32_t> hot_ids;
  for (int j = 0; j < hot; ++j) hot_ids.push_back(5000000u + static_cast<std::uint32_t>(j));
  std::atomic<int> committed{-1};
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int v = 0; v < versions; ++v) {
      std::vector<AdRecord> batch;
      for (int j = 0; j < hot; ++j) batch.push_back(hot_ad(j, v));
      if (!pool.pipeline->index().upsert(batch)) break;
      if (v % 5 == 4 && !pool.pipeline->index().expire(hot_ids)) break;  // (the upsert first: v's row, then gone)
      if (v % 8 == 7 && !pool.pipeline->index().reindex()) break;  // a reindex is an update too
      committed = v;
    }
    stop = true;
  });
  // Each search sees every hot ad at one version (an update is ordered whole against a search), no
  // older than the last committed before it began, and no newer than the one after the last
  // committed when it returned: all 300 at a visible version, or none where that version hides them.
  int searches = 0, overlapped = 0, torn = 0, stale = 0, early = 0, mixed = 0, partial = 0, wrongly_hidden = 0;
  while (!stop || searches < 5) {
    const bool writer_active = !stop;
    const int before = committed.load();
    auto top = pool.pipeline->search(request);
    const int after = committed.load();
    REQUIRE(top);
    ++searches;
    if (before < 0) continue;
    overlapped += writer_active && before < versions - 1;
    std::uint64_t common = (1ull << versions) - 1;  // the versions every hot result so far could be
    int hot_results = 0;
    for (const ScoredAd& r : *top) {
      if (r.id < 5000000u || r.id >= 5000000u + hot) continue;
      ++hot_results;
      const int j = static_cast<int>(r.id - 5000000u);
      std::uint64_t could_be = 0;
      for (int v = 0; v < versions; ++v) {
        const ReferenceScore& e = expected[j][v];  // (a near-tie in routing may be scored either way)
        if (!hidden(v) && (std::fabs(r.score - e.score) <= score_tolerance(e.score) ||
                           (e.ambiguous && std::fabs(r.score - e.alternative) <= score_tolerance(e.alternative))))
          could_be |= 1ull << v;
      }
      if (could_be == 0) ++torn;  // no visible version scores this: fields of two versions, or a hidden one served
      else if (std::bit_width(could_be) - 1 < before) ++stale;
      else if (std::countr_zero(could_be) > after + 1) ++early;
      common &= could_be;
    }
    if (hot_results != 0 && hot_results != hot) ++partial;
    if (hot_results == hot && common == 0) ++mixed;
    if (hot_results == 0) {  // then the version seen was a hidden one in [before, after + 1]
      bool possible = false;
      for (int v = before; v <= std::min(after + 1, versions - 1); ++v) possible = possible || hidden(v);
      wrongly_hidden += !possible;
    }
  }
  writer.join();
  INFO("searches " << searches << ", overlapping the writer " << overlapped);
  REQUIRE(committed.load() == versions - 1);
  CHECK(overlapped >= 5);  // the checks below saw searches race the updates
  CHECK(torn == 0);
  CHECK(stale == 0);
  CHECK(early == 0);
  CHECK(mixed == 0);
  CHECK(partial == 0);
  CHECK(wrongly_hidden == 0);
}

int main(int argc, char** argv) {
  if (gpu_device_count() == 0) {
    std::puts("retrieval_pipeline.test: no GPU here, skipping");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
