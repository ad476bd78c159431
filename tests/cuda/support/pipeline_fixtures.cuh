// Shared by the retrieval pipeline's device tests (tests/cuda/retrieval_pipeline/*.test.cu): pools
// loaded both on the host (for the CPU reference) and on the device, a search's temp storage
// (poisoned) for running its stages one at a time, and the device's results read back for the
// checks. Every function here is inline or a template, so any number of test files may include it.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kevo/retrieval/dispatch/fused_retrieval_pipeline.cuh"
#include "kevo/retrieval/retrieval.hpp"

namespace kevo_tests::retrieval_pipeline {

using namespace kevo::retrieval;

inline WorkloadOptions small_options(std::uint64_t seed, EmbeddingType type, int dim = 128) {
  return {.seed = seed, .dim = dim, .features = 64, .hidden = 64, .embedding_type = type};
}

/// Live ads that a reindex leaves to be walked: more than 64 clauses. (More than 7 restricted
/// categories are prefiltered by their first 7, not walked outright.)
inline std::size_t too_long_to_index(const HostAdPool& host) {
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
inline RequestVectors device_vectors(const Stages& s, const Model& model) {
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
inline std::vector<std::uint32_t> device_eligible_ids(FusedRetrievalPipeline& pipeline, const Request& request) {
  Stages s(pipeline);
  auto lock = pipeline.index().search_lock();
  auto view = pipeline.index().before_search(s.stream);
  REQUIRE(view);
  REQUIRE(pipeline.enqueue_prepare(check_request(pipeline.schema(), pipeline.model(), request).value(), s.temp, s.stream));
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
inline float fp16_step(float x) {
  const float magnitude = std::fabs(x);
  if (magnitude < 0x1p-14f) return 0x1p-24f;
  return std::ldexp(1.0f, std::ilogb(magnitude) - 10);
}

inline std::vector<std::uint32_t> reference_eligible_ids(const HostAdPool& host, const Request& request) {
  const QuerySets q(host.schema().categories(), request.query);
  std::vector<std::uint32_t> out;
  for (std::size_t slot = 0; slot < host.slots(); ++slot)
    if (is_eligible(host, slot, q)) out.push_back(host.id(slot));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace kevo_tests::retrieval_pipeline
