// kevo/retrieval/tuning/pipeline_bench.cuh: the pipeline under a policy, timed on the device and
// checked, for the search that tunes it (eval/pipeline_evaluator.hpp's PolicyTimer) and for the
// retrieval benchmark. A synthetic pool is built on the GPU from a Workload (targeting drawn on the
// host's cores, embeddings hashed on the device); a policy is timed over requests drawn from a
// seed, and each answer is checked against the default policy's answer to the same request: a
// policy changes the speed, never the answers.
//
//   SyntheticPool pool = build_synthetic_pool(workload, 100'000'000, 99).value();
//   PipelinePolicyTimer timer(std::move(pool), workload, {.requests = 5});
//   PolicyTiming t = timer.time(policy, seed);    // t.outcome, t.seconds (median a search), t.message
//
// nvcc-safe (no fmt): host code reaches it through a .cu file of its own.
#pragma once

#include "kevo/retrieval/answer_comparison.hpp"
#include "kevo/retrieval/dispatch/fused_retrieval_pipeline.cuh"
#include "kevo/retrieval/reference.hpp"
#include "kevo/retrieval/slot_order.hpp"
#include "kevo/retrieval/tuning/policy_timing.hpp"
#include "kevo/retrieval/workload.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

namespace kevo::retrieval {

namespace bench_detail {

/// Counter-hash normal values: the embedding of (ad, k) for a device-filled pool.
__device__ inline float hashed_normal(std::uint64_t seed, std::uint64_t ad, int k) {
  std::uint64_t z = seed ^ (ad * 0x9e3779b97f4a7c15ull) ^ (static_cast<std::uint64_t>(k) * 0xbf58476d1ce4e5b9ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  const float u1 = (static_cast<float>(z >> 40) + 1.0f) * 0x1.0p-24f;
  const float u2 = static_cast<float>((z >> 16) & 0xffffff) * 0x1.0p-24f;
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

/// Fills rows [0, n) with N(0, 1/d) values drawn from each slot's ad id (so an ad's values do not
/// depend on where it sits, nor on which shard holds it): fp16 directly, int8 quantized per row or
/// per group of 32 values as ad_pool.hpp's quantisers do (a warp a row: a group is one pass of the
/// warp). Drawing 100M rows on the host and copying them would take minutes; this takes milliseconds.
/// (A template, as the pipeline's kernels are, so that two .cu files may include this header; an
/// inline __global__ function draws nvcc's warning that the qualifier is ignored.)
template <class = void>
__global__ void fill_embeddings(void* rows, float* side_values, const std::uint32_t* slot_ids, std::uint64_t n, int dim,
                                EmbeddingType type, std::uint64_t seed) {
  constexpr int lanes = gpu_logical_warp_size;
  static_assert(lanes == 32, "an int8_group32 group is one pass of a logical warp");
  const std::uint64_t row = (static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / lanes;
  const int lane = threadIdx.x % lanes;
  if (row >= n) return;
  const std::uint64_t ad = slot_ids[row];
  const float sigma = rsqrtf(static_cast<float>(dim));
  if (type == EmbeddingType::int8_group32) {
    const int side = side_width(type, dim);
    auto* scales = reinterpret_cast<__half*>(side_values + row * side + (side - scale_words(type, dim)));
    for (int k = lane; k < dim; k += lanes) {
      const float a = hashed_normal(seed, ad, k) * sigma;
      float group_max = fabsf(a);
      for (int o = lanes / 2; o > 0; o /= 2) group_max = fmaxf(group_max, gpu_shfl_xor(gpu_all_lanes, group_max, o));
      __half scale = __float2half_rn(group_max / 127.0f);
      if (127.0f * __half2float(scale) > 65504.0f) scale = __ushort_as_half(__half_as_ushort(scale) - 1);
      const float s = __half2float(scale);
      static_cast<std::int8_t*>(rows)[row * dim + k] =
          s > 0.0f ? static_cast<std::int8_t>(fminf(127.f, fmaxf(-127.f, rintf(a / s)))) : std::int8_t{0};
      if (lane == 0) scales[k / lanes] = scale;
    }
    return;
  }
  const bool int8 = type == EmbeddingType::int8;
  float max_abs = 0.0f;
  for (int k = lane; k < dim; k += lanes) max_abs = fmaxf(max_abs, fabsf(hashed_normal(seed, ad, k) * sigma));
  for (int o = lanes / 2; o > 0; o /= 2) max_abs = fmaxf(max_abs, gpu_shfl_xor(gpu_all_lanes, max_abs, o));
  const float scale = max_abs / 127.0f;
  for (int k = lane; k < dim; k += lanes) {
    const float a = hashed_normal(seed, ad, k) * sigma;
    if (int8) static_cast<std::int8_t*>(rows)[row * dim + k] = static_cast<std::int8_t>(fminf(127.f, fmaxf(-127.f, rintf(a / scale))));
    else static_cast<__half*>(rows)[row * dim + k] = __float2half_rn(a);
  }
  if (int8 && lane == 0) side_values[2 * row + 1] = scale;  // {bias, scale}: the upsert wrote the bias
}

}  // namespace bench_detail

/// Targeting, bias and liveness of ads [begin, end) of the workload, drawn on all cores, in `order`.
inline PackedAds generate_targeting(const Workload& w, std::uint64_t begin, std::uint64_t end, SlotOrder order = SlotOrder::by_id) {
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t n = end - begin;
  // Each ad's clauses drawn once, then packed in the order asked for (offset from `begin`).
  std::vector<std::vector<Clause>> drawn(n);
  std::vector<std::uint64_t> keys(order == SlotOrder::by_targeting ? n : 0);
  parallel_for_ranges(n, threads, [&](unsigned, std::size_t b, std::size_t e) {
    for (std::size_t a = b; a < e; ++a) {
      drawn[a] = w.ad_targeting(begin + a);
      if (!keys.empty()) keys[a] = targeting_order_key(drawn[a]);
    }
  });
  std::vector<std::size_t> ad_at(n);  // position -> ad, offset from `begin`
  if (keys.empty()) std::iota(ad_at.begin(), ad_at.end(), std::size_t{0});
  else ad_at = order_by_key(keys);
  std::vector<PackedAds> parts(threads);
  parallel_for_ranges(n, threads, [&](unsigned t, std::size_t b, std::size_t e) {
    PackedAds& p = parts[t];
    for (std::size_t position = b; position < e; ++position) {
      const std::uint64_t i = begin + ad_at[position];
      const std::vector<Clause>& clauses = drawn[ad_at[position]];
      p.ids.push_back(static_cast<std::uint32_t>(i));
      p.bias.push_back(w.ad_bias(i));
      p.live.push_back(w.ad_live(i) ? 1 : 0);
      for (std::size_t c = 0; c < clauses.size(); ++c) p.clauses.push_back(clause_bits::pack(clauses[c], c + 1 == clauses.size()));
      p.clause_begin.push_back(static_cast<std::uint32_t>(p.clauses.size()));
    }
  });
  PackedAds all;
  for (PackedAds& p : parts) {
    const std::uint32_t base = static_cast<std::uint32_t>(all.clauses.size());
    all.ids.insert(all.ids.end(), p.ids.begin(), p.ids.end());
    all.bias.insert(all.bias.end(), p.bias.begin(), p.bias.end());
    all.live.insert(all.live.end(), p.live.begin(), p.live.end());
    all.clauses.insert(all.clauses.end(), p.clauses.begin(), p.clauses.end());
    for (std::size_t i = 1; i < p.clause_begin.size(); ++i) all.clause_begin.push_back(base + p.clause_begin[i]);
  }
  return all;
}

/// A pool of the workload's first `ads` ads on the device, ready to search.
struct SyntheticPool {
  std::unique_ptr<FusedRetrievalPipeline> pipeline;
  std::uint64_t ads = 0;
};

/// Writes every used slot's row (and int8 scale) from its ad's id and `embedding_seed`, after the
/// upserts that placed the ads (their targeting and biases), then reindexes: the last step of
/// building a synthetic pool, on the device that holds `index` (current on this thread).
inline expected<void, Error> fill_synthetic_embeddings(DeviceAdIndex& index, const Workload& w, std::uint64_t embedding_seed) {
  if (auto ok = index.synchronize(); !ok) return ok;  // the upserts land before rows are written beside them
  const std::uint64_t slots = index.slot_count();
  bench_detail::fill_embeddings<><<<static_cast<unsigned>((slots * gpu_logical_warp_size + 255) / 256), 256>>>(
      index.embeddings(), index.side_values(), index.slot_ids(), slots, w.schema().dim, w.schema().embedding_type,
      embedding_seed);
  KEVO_GPU_TRY(gpu_last_error());
  KEVO_GPU_TRY(gpu_device_synchronize());
  return index.reindex();
}

/// Builds the pool in batches of 2^20 ads. `targeting_cache`, where given, keeps each batch's
/// targeting (entry i: ads [i 2^20, (i + 1) 2^20)) for another pool of the same workload.
inline expected<SyntheticPool, Error> build_synthetic_pool(const Workload& w, std::uint64_t ads, std::uint64_t embedding_seed,
                                                            std::vector<PackedAds>* targeting_cache = nullptr,
                                                            std::size_t clauses_per_slot = 8, SlotOrder order = SlotOrder::by_id) {
  std::vector<PackedAds> own;
  std::vector<PackedAds>& cache = targeting_cache ? *targeting_cache : own;
  auto p = FusedRetrievalPipeline::create(w.schema(), w.model(), {.capacity = ads, .clause_capacity = ads * clauses_per_slot});
  if (!p) return unexpected(p.error());
  SyntheticPool pool{std::move(*p), ads};
  const std::uint64_t batch = std::uint64_t{1} << 20;
  for (std::uint64_t b = 0, i = 0; b < ads; b += batch, ++i) {
    const std::uint64_t e = std::min(ads, b + batch);
    if (cache.size() <= i) cache.push_back(generate_targeting(w, b, e, order));
    if (auto ok = pool.pipeline->index().upsert(cache[i]); !ok) return unexpected(ok.error());
    if (!targeting_cache) cache[i] = PackedAds{};  // nobody keeps it: its memory goes back now
  }
  if (auto ok = fill_synthetic_embeddings(pool.pipeline->index(), w, embedding_seed); !ok) return unexpected(ok.error());
  return pool;
}

/// Times policies on one pool: each call sets the policy, checks its answers to the seed's requests
/// against the defaults', then times those requests (one by one, or in batches of `batch`).
class PipelinePolicyTimer {
 public:
  struct Options {
    RequestKind kind = RequestKind::typical;
    int k = 1000;
    int requests = 5;  ///< drawn per seed
    int repeats = 3;   ///< timed passes over them, after one unchecked warm-up pass
    int batch = 1;     ///< 1: search() one by one; more: search_batch() of that many
  };

  PipelinePolicyTimer(SyntheticPool pool, const Workload& workload, Options options)
      : pool_(std::move(pool)), workload_(&workload), options_(options), defaults_(pool_.pipeline->policy()) {}

  FusedRetrievalPipeline& pipeline() { return *pool_.pipeline; }

  PolicyTiming time(const PipelinePolicy& policy, std::uint64_t seed) {
    using Outcome = PolicyTiming::Outcome;
    const std::vector<Request> requests = draw(seed);
    auto expected_answers = reference_answers(requests);
    if (!expected_answers) return {Outcome::device_error, 0, "the default policy failed: " + expected_answers.error().message};
    if (auto ok = pool_.pipeline->set_policy(policy); !ok) return {Outcome::does_not_fit, 0, ok.error().message};
    std::vector<double> per_request;
    for (int pass = 0; pass <= options_.repeats; ++pass) {
      for (std::size_t first = 0; first < requests.size(); first += static_cast<std::size_t>(options_.batch)) {
        const std::size_t n = std::min(requests.size() - first, static_cast<std::size_t>(options_.batch));
        const auto start = std::chrono::steady_clock::now();
        auto answers = search(std::span<const Request>(requests).subspan(first, n));
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (!answers) return {Outcome::device_error, 0, answers.error().message};
        for (std::size_t r = 0; r < n; ++r)
          if (std::string why = answers_differ((*expected_answers)[first + r], (*answers)[r]); !why.empty())
            return {Outcome::wrong_answer, 0, "request " + std::to_string(first + r) + " of seed " + std::to_string(seed) + ": " + why};
        if (pass > 0) per_request.push_back(seconds / static_cast<double>(n));  // pass 0 warms up
      }
    }
    std::sort(per_request.begin(), per_request.end());
    return {Outcome::ok, per_request[per_request.size() / 2], {}};
  }

 private:
  std::vector<Request> draw(std::uint64_t seed) const {
    std::vector<Request> out;
    for (int i = 0; i < options_.requests; ++i)
      out.push_back(workload_->request(seed * static_cast<std::uint64_t>(options_.requests) + static_cast<std::uint64_t>(i), options_.kind,
                                       options_.k));
    return out;
  }

  expected<std::vector<std::vector<ScoredAd>>, Error> search(std::span<const Request> requests) {
    if (requests.size() == 1) {
      auto one = pool_.pipeline->search(requests[0]);
      if (!one) return unexpected(one.error());
      return std::vector<std::vector<ScoredAd>>{std::move(*one)};
    }
    return pool_.pipeline->search_batch(requests);
  }

  // The defaults' answers, searched one by one and kept per seed's requests (a seed comes back in
  // compare(): its answers are not searched twice).
  expected<std::vector<std::vector<ScoredAd>>, Error> reference_answers(const std::vector<Request>& requests) {
    std::vector<std::vector<ScoredAd>> out;
    bool switched = false;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      const std::string key = request_key(requests[i]);
      if (auto it = answers_.find(key); it != answers_.end()) {
        out.push_back(it->second);
        continue;
      }
      if (!switched) {
        if (auto ok = pool_.pipeline->set_policy(defaults_); !ok) return unexpected(ok.error());
        switched = true;
      }
      auto answer = pool_.pipeline->search(requests[i]);
      if (!answer) return unexpected(answer.error());
      out.push_back(answers_[key] = std::move(*answer));
    }
    return out;
  }

  static std::string request_key(const Request& r) {
    std::string key = std::to_string(r.k) + "/" + std::to_string(r.routing);
    for (float f : r.features) key += "," + std::to_string(f);
    for (const CategoryQuery& q : r.query) {
      key += ";" + std::to_string(q.category);
      for (std::uint32_t v : q.values) key += ":" + std::to_string(v);
    }
    return key;
  }

  SyntheticPool pool_;
  const Workload* workload_;
  Options options_;
  PipelinePolicy defaults_;
  std::map<std::string, std::vector<ScoredAd>> answers_;
};

}  // namespace kevo::retrieval
