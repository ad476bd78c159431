// kevo/retrieval/dispatch/topk_kernels.cuh: top-K: a radix select over the scores' keys, then one block's sort of the candidates.
// Thin kernels over the agents (agent/): each maps threads to an agent's work. The pipeline
// (fused_retrieval_pipeline.cuh) and the index (device_ad_index.cuh) launch them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kevo/retrieval/agent/topk.cuh"
#include "kevo/retrieval/agent/views.cuh"
#include "kevo/retrieval/portability.cuh"
#include "kevo/retrieval/tuning/policies.hpp"
#include "kevo/retrieval/types.hpp"

namespace kevo::retrieval::kernels {

// Every kernel is a template, those with no parameters of their own taking an unused
// `template <class = void>`: a template's host stub may be defined in each translation unit, so two
// .cu files of one program can include this header (a plain __global__ function would be defined
// twice and fail to link). Launch as usual; take an address as `kernel<>`.

/// Resolves one level of the radix select (one block).
template <int BlockThreads>
__global__ void __launch_bounds__(BlockThreads) topk_select(TopKState* state, int level, std::uint32_t k, std::uint32_t cap) {
  gpu_wait_for_prior_grid();  // launched as a programmatic dependent (gpu_launch_after_prior)
  using Agent = AgentTopKSelect<BlockThreads>;
  __shared__ typename Agent::TempStorage storage;
  if (state->done) return;
  Agent::select(static_cast<int>(threadIdx.x), state, level, k, cap, storage);
}

/// Calls visit(chunk) block-wide (every thread, same chunk) for each chunk whose largest key passes
/// `hot`. Few chunks pass once the threshold is near the K-th key, so each thread tests a different
/// chunk's maximum and only the hot ones are walked. Block b takes chunks b, b + grid, b + 2 grid...
/// so that where many chunks are hot (small pools) they spread evenly over the blocks.
template <int BlockThreads, class Hot, class Visit>
__device__ __forceinline__ void for_each_hot_chunk(const std::uint32_t* chunk_max, std::uint32_t chunks, Hot hot,
                                                   Visit visit) {
  __shared__ std::uint32_t hot_chunks[BlockThreads];
  __shared__ std::uint32_t hot_count;
  const auto rank = static_cast<std::uint32_t>(threadIdx.x);
  for (std::uint32_t base = 0; blockIdx.x + base * gridDim.x < chunks; base += BlockThreads) {
    if (rank == 0) hot_count = 0;
    __syncthreads();
    const std::uint32_t chunk = blockIdx.x + (base + rank) * gridDim.x;
    if (chunk < chunks && hot(chunk_max[chunk])) hot_chunks[atomicAdd(&hot_count, 1u)] = chunk;
    __syncthreads();
    const std::uint32_t count = hot_count;
    for (std::uint32_t i = 0; i < count; ++i) visit(hot_chunks[i]);
    __syncthreads();  // hot_chunks and hot_count are reused by the next batch
  }
}

/// The level-0 histogram of one request's keys, where scoring did not fill it (a batch): every
/// listed position whose key is not 0 (0: not eligible for this request).
template <int BlockThreads>
__global__ void __launch_bounds__(BlockThreads)
    topk_histogram(const std::uint32_t* keys, const std::uint32_t* listed, TopKState* state) {
  __shared__ std::uint32_t histogram[kTopKBins];
  const int rank = static_cast<int>(threadIdx.x);
  for (int i = rank; i < kTopKBins; i += BlockThreads) histogram[i] = 0;
  __syncthreads();
  const std::uint32_t count = *listed;
  const auto* quads = reinterpret_cast<const uint4*>(keys);  // the keys region is 256-byte aligned
  for (std::uint32_t q = blockIdx.x * BlockThreads + rank; q < (count + 3) / 4; q += gridDim.x * BlockThreads) {
    const uint4 v = quads[q];
    const std::uint32_t four[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (4 * q + k < count && four[k] != 0) atomicAdd(&histogram[four[k] >> 20], 1u);
  }
  __syncthreads();
  for (int i = rank; i < kTopKBins; i += BlockThreads)
    if (histogram[i]) atomicAdd(&state->histogram[0][i], histogram[i]);
}

/// Histograms the next digit of the ads that share the resolved prefix (skipped once done), and
/// resolves the level in the block that finishes last (no launch of its own: top-K's cost at small
/// pools is mostly launches). `listed`: how many positions the keys and `eligible_list` hold.
template <int BlockThreads>
__global__ void __launch_bounds__(BlockThreads)
    topk_refine(IndexView index, const std::uint32_t* eligible_list, const std::uint32_t* keys,
                const std::uint32_t* chunk_max, const std::uint32_t* listed, TopKState* state, int level,
                std::uint32_t chunk_size, std::uint32_t k, std::uint32_t cap) {
  gpu_wait_for_prior_grid();  // launched as a programmatic dependent (gpu_launch_after_prior)
  using Select = AgentTopKSelect<BlockThreads>;
  __shared__ std::uint32_t histogram[kTopKBins];
  __shared__ typename Select::TempStorage select_storage;
  __shared__ bool last_block;
  if (state->done) return;
  const int rank = static_cast<int>(threadIdx.x);
  for (int i = rank; i < kTopKBins; i += BlockThreads) histogram[i] = 0;
  __syncthreads();
  const unsigned long long prefix = state->prefix;
  const int prefix_shift = topk_level_shift(level - 1), shift = topk_level_shift(level);
  const std::uint64_t digit_mask = (1ull << topk_level_bits(level)) - 1ull;
  const std::uint32_t count = *listed;
  const std::uint32_t chunks = (count + chunk_size - 1) / chunk_size;
  for_each_hot_chunk<BlockThreads>(
      chunk_max, chunks, [&](std::uint32_t largest) { return (chunk_ranking_bound(largest) >> prefix_shift) >= prefix; },
      [&](std::uint32_t chunk) {
        const std::uint32_t end = min(count, (chunk + 1) * chunk_size);
        for (std::uint32_t pos = chunk * chunk_size + rank; pos < end; pos += BlockThreads) {
          const std::uint32_t key = keys[pos];
          if ((chunk_ranking_bound(key) >> prefix_shift) < prefix) continue;
          const std::uint64_t ranking =
              shift < 32 ? ranking_key(key, index.ids[eligible_list[pos]]) : static_cast<std::uint64_t>(key) << 32;
          if ((ranking >> prefix_shift) == prefix) atomicAdd(&histogram[(ranking >> shift) & digit_mask], 1u);
        }
      });
  for (int i = rank; i < kTopKBins; i += BlockThreads)
    if (histogram[i]) atomicAdd(&state->histogram[level][i], histogram[i]);
  // The last block to finish sees every block's counts (each made them visible before counting itself).
  __threadfence();
  __syncthreads();
  if (rank == 0) last_block = atomicAdd(&state->blocks_done[level], 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  Select::select(rank, state, level, k, cap, select_storage);
}

/// Appends the ranking key of every ad at or above the threshold to `candidates`.
template <int BlockThreads>
__global__ void __launch_bounds__(BlockThreads)
    topk_compact(IndexView index, const std::uint32_t* eligible_list, const std::uint32_t* keys,
                 const std::uint32_t* chunk_max, const std::uint32_t* listed, TopKState* state,
                 std::uint32_t chunk_size, unsigned long long* candidates, std::uint32_t capacity) {
  gpu_wait_for_prior_grid();  // launched as a programmatic dependent (gpu_launch_after_prior)
  const unsigned long long threshold = state->threshold;
  const std::uint32_t count = *listed;
  const std::uint32_t chunks = (count + chunk_size - 1) / chunk_size;
  const auto rank = static_cast<std::uint32_t>(threadIdx.x);
  for_each_hot_chunk<BlockThreads>(
      chunk_max, chunks, [&](std::uint32_t largest) { return chunk_ranking_bound(largest) >= threshold; },
      [&](std::uint32_t chunk) {
        const std::uint32_t end = min(count, (chunk + 1) * chunk_size);
        for (std::uint32_t pos = chunk * chunk_size + rank; pos < end; pos += BlockThreads) {
          const std::uint32_t key = keys[pos];
          if (chunk_ranking_bound(key) < threshold) continue;
          const std::uint64_t ranking = ranking_key(key, index.ids[eligible_list[pos]]);
          if (ranking < threshold) continue;
          const std::uint32_t at = atomicAdd(&state->candidate_count, 1u);
          if (at < capacity) candidates[at] = ranking;
          else atomicOr(&state->overflow, kOverflowCandidates);
        }
      });
}

/// Threads of topk_sort's one block.
inline constexpr int kTopKSortThreads = 1024;

/// The keys a thread of topk_sort may hold: one build of the sort for each.
using TopKSortItemCounts = std::integer_sequence<int, 1, 2, 4, 8, 16>;

/// Keys each thread of topk_sort holds for `count` candidates: the fewest of TopKSortItemCounts
/// that cover them (0: more than one block sorts). One function for the kernel and for the host
/// that sizes its shared memory.
__host__ __device__ constexpr int topk_sort_items(std::uint32_t count) {
  return []<int... Items>(std::uint32_t n, std::integer_sequence<int, Items...>) {
    int fewest = 0;
    ((fewest = fewest == 0 && n <= static_cast<std::uint32_t>(Items) * kTopKSortThreads ? Items : fewest), ...);
    return fewest;
  }(count, TopKSortItemCounts{});
}
static_assert(topk_sort_items(kMaxK + TopKPolicy::boundary_cap_domain.back()) != 0,
              "topk_sort holds the largest candidate buffer");

/// Calls f(std::integral_constant<int, topk_sort_items(count)>{}), so that the host's sizing and
/// the kernel's sort pick their build in one place; false (f not called) past the largest.
template <class F>
__host__ __device__ bool visit_topk_sort_items(std::uint32_t count, F&& f) {
  const int items = topk_sort_items(count);
  return [&]<int... Items>(std::integer_sequence<int, Items...>) {
    return ((items == Items && (f(std::integral_constant<int, Items>{}), true)) || ...);
  }(TopKSortItemCounts{});
}

template <int Items>
using TopKBlockSort = gpu_cub::BlockMergeSort<unsigned long long, kTopKSortThreads, Items>;

/// The shared memory topk_sort needs for up to `capacity` candidates.
inline std::size_t topk_sort_bytes(std::uint32_t capacity) {
  std::size_t bytes = ~std::size_t{0};  // more than any block holds: the launch is refused
  visit_topk_sort_items(capacity, [&](auto items) { bytes = sizeof(typename TopKBlockSort<items()>::TempStorage); });
  return bytes;
}

/// Ranking keys in result order: larger first (score descending, then lower id, as keys hold ~id).
struct RankingFirst {
  __device__ bool operator()(unsigned long long a, unsigned long long b) const { return a > b; }
};

/// Sorts `count` candidates, `Items` a thread (blocked: thread t holds sorted positions t Items ..),
/// and decodes the first `results` into (id, score).
template <int Items>
__device__ __forceinline__ void sort_and_decode(const unsigned long long* candidates, std::uint32_t count,
                                                std::uint32_t results, void* storage, std::uint32_t* out_ids,
                                                float* out_scores) {
  const auto rank = static_cast<std::uint32_t>(threadIdx.x);
  unsigned long long keys[Items];
#pragma unroll
  for (int i = 0; i < Items; ++i) {
    const std::uint32_t at = rank * Items + i;
    keys[i] = at < count ? candidates[at] : 0ull;
  }
  // Positions past `count` take 0, which ranks after every candidate (each is at least 1 << 32).
  TopKBlockSort<Items>(*static_cast<typename TopKBlockSort<Items>::TempStorage*>(storage))
      .Sort(keys, RankingFirst{}, static_cast<int>(count), 0ull);
#pragma unroll
  for (int i = 0; i < Items; ++i) {
    const std::uint32_t at = rank * Items + i;
    if (at < results) {
      out_ids[at] = ~static_cast<std::uint32_t>(keys[i]);
      out_scores[at] = score_from_key(static_cast<std::uint32_t>(keys[i] >> 32));
    }
  }
}

/// Sorts the candidates (ranking keys, larger first) and decodes the first min(K, eligible) into
/// (id, score); count is kCountVectorsOverflowed or kCountCandidatesOverflowed where a search failed. One block, CUB's block merge sort with as few
/// keys a thread as the candidates need, so that its cost follows how many candidates there are
/// (usually a little over K), not the buffer's capacity.
template <class = void>
__global__ void __launch_bounds__(kTopKSortThreads)
    topk_sort(const unsigned long long* candidates, const TopKState* state, std::uint32_t k, std::uint32_t capacity,
              std::uint32_t* out_ids, float* out_scores, std::uint32_t* out_count) {
  gpu_wait_for_prior_grid();  // launched as a programmatic dependent (gpu_launch_after_prior)
  extern __shared__ __align__(16) unsigned char sort_storage[];  // topk_sort_bytes(capacity)
  const std::uint32_t count = min(state->candidate_count, capacity);
  const std::uint32_t results = min(k, state->eligible_count);
  // At most topk_sort_items(capacity), which sized the storage.
  visit_topk_sort_items(count, [&](auto items) {
    sort_and_decode<items()>(candidates, count, results, sort_storage, out_ids, out_scores);
  });
  if (threadIdx.x == 0)
    *out_count = state->overflow & kOverflowVectors       ? kCountVectorsOverflowed
                 : state->overflow & kOverflowCandidates ? kCountCandidatesOverflowed
                                                         : results;
}

}  // namespace kevo::retrieval::kernels
