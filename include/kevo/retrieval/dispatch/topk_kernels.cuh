// kevo/retrieval/dispatch/topk_kernels.cuh: top-K: a radix select over the scores' keys, then a sort of the candidates (one block's merge sort, or ranks counted over many blocks).
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

/// One level of the radix select by this block: histograms the next digit of the ads that share
/// the resolved prefix, and the block that finishes last resolves the level (no launch of its own:
/// top-K's cost at small pools is mostly launches). `count`: how many positions the keys and
/// `eligible_list` hold. State written by other blocks is read past L1 (gpu_load_past_l1): in one cooperative
/// launch a block reads it again after each grid barrier.
template <int BlockThreads>
__device__ __forceinline__ void refine_level(const IndexView& index, const std::uint32_t* eligible_list,
                                             const std::uint32_t* keys, const std::uint32_t* chunk_max,
                                             std::uint32_t count, TopKState* state, int level, std::uint32_t chunk_size,
                                             std::uint32_t k, std::uint32_t cap) {
  using Select = AgentTopKSelect<BlockThreads>;
  __shared__ std::uint32_t histogram[kTopKBins];
  __shared__ typename Select::TempStorage select_storage;
  __shared__ bool last_block;
  const int rank = static_cast<int>(threadIdx.x);
  for (int i = rank; i < kTopKBins; i += BlockThreads) histogram[i] = 0;
  __syncthreads();
  const unsigned long long prefix = gpu_load_past_l1(&state->prefix);
  const int prefix_shift = topk_level_shift(level - 1), shift = topk_level_shift(level);
  const std::uint64_t digit_mask = (1ull << topk_level_bits(level)) - 1ull;
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

/// This block's share of the compaction: appends the ranking key of every ad at or above the
/// threshold to `candidates`.
template <int BlockThreads>
__device__ __forceinline__ void compact_candidates(const IndexView& index, const std::uint32_t* eligible_list,
                                                   const std::uint32_t* keys, const std::uint32_t* chunk_max,
                                                   std::uint32_t count, TopKState* state, std::uint32_t chunk_size,
                                                   unsigned long long* candidates, std::uint32_t capacity) {
  const unsigned long long threshold = gpu_load_past_l1(&state->threshold);
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

/// One level of the radix select (TopKPolicy::one_launch = 0); returns at once once the threshold is known.
template <int BlockThreads>
__global__ void __launch_bounds__(BlockThreads)
    topk_refine(IndexView index, const std::uint32_t* eligible_list, const std::uint32_t* keys,
                const std::uint32_t* chunk_max, const std::uint32_t* listed, TopKState* state, int level,
                std::uint32_t chunk_size, std::uint32_t k, std::uint32_t cap) {
  gpu_wait_for_prior_grid();  // launched as a programmatic dependent (gpu_launch_after_prior)
  if (state->done) return;
  refine_level<BlockThreads>(index, eligible_list, keys, chunk_max, *listed, state, level, chunk_size, k, cap);
}

/// Appends the ranking key of every ad at or above the threshold to `candidates` (TopKPolicy::one_launch = 0).
template <int BlockThreads>
__global__ void __launch_bounds__(BlockThreads)
    topk_compact(IndexView index, const std::uint32_t* eligible_list, const std::uint32_t* keys,
                 const std::uint32_t* chunk_max, const std::uint32_t* listed, TopKState* state,
                 std::uint32_t chunk_size, unsigned long long* candidates, std::uint32_t capacity) {
  gpu_wait_for_prior_grid();  // launched as a programmatic dependent (gpu_launch_after_prior)
  compact_candidates<BlockThreads>(index, eligible_list, keys, chunk_max, *listed, state, chunk_size, candidates, capacity);
}

/// topk_select, every topk_refine that is needed and topk_compact in one cooperative launch
/// (TopKPolicy::one_launch = 1): a grid barrier where a launch boundary was, and the levels stop
/// at the one that resolves the threshold instead of launching the rest to return at once.
template <int BlockThreads>
__global__ void __launch_bounds__(BlockThreads)
    topk_select_and_compact(IndexView index, const std::uint32_t* eligible_list, const std::uint32_t* keys,
                            const std::uint32_t* chunk_max, const std::uint32_t* listed, TopKState* state,
                            std::uint32_t chunk_size, std::uint32_t k, std::uint32_t cap,
                            unsigned long long* candidates, std::uint32_t capacity) {
  gpu_wait_for_prior_grid();  // launched by gpu_launch_cooperative_after_prior
  using Select = AgentTopKSelect<BlockThreads>;
  __shared__ typename Select::TempStorage select_storage;
  if (blockIdx.x == 0) Select::select(static_cast<int>(threadIdx.x), state, 0, k, cap, select_storage);
  gpu_grid_sync();
  const std::uint32_t count = *listed;
  // Every block reads `done` after the same barrier, so all leave the loop at the same level.
  for (int level = 1; level < kTopKLevels && !gpu_load_past_l1(&state->done); ++level) {
    refine_level<BlockThreads>(index, eligible_list, keys, chunk_max, count, state, level, chunk_size, k, cap);
    gpu_grid_sync();
  }
  compact_candidates<BlockThreads>(index, eligible_list, keys, chunk_max, count, state, chunk_size, candidates, capacity);
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

/// Writes the ad a ranking key names as result `place`: its id (the key's low word holds ~id) and score.
__device__ __forceinline__ void write_result(unsigned long long key, std::uint32_t place, std::uint32_t* out_ids,
                                             float* out_scores) {
  out_ids[place] = ~static_cast<std::uint32_t>(key);
  out_scores[place] = score_from_key(static_cast<std::uint32_t>(key >> 32));
}

/// The answer's count as search() reads it: the number of results, unless the search failed
/// (kCountVectorsOverflowed, kCountCandidatesOverflowed).
__device__ __forceinline__ std::uint32_t answer_count(const TopKState* state, std::uint32_t results) {
  return state->overflow & kOverflowVectors      ? kCountVectorsOverflowed
         : state->overflow & kOverflowCandidates ? kCountCandidatesOverflowed
                                                 : results;
}

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
    if (at < results) write_result(keys[i], at, out_ids, out_scores);
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
    *out_count = answer_count(state, results);
}

/// Threads of a topk_rank block, and how many of them count for one candidate (consecutive lanes).
inline constexpr int kTopKRankThreads = 256;
inline constexpr int kTopKRankLanesPerCandidate = 4;
inline constexpr int kTopKRankCandidatesPerBlock = kTopKRankThreads / kTopKRankLanesPerCandidate;

/// topk_rank's grid for up to `capacity` candidates (blocks past the count return at once), and
/// the shared memory of each block, which holds them all.
__host__ __device__ constexpr std::uint32_t topk_rank_blocks(std::uint32_t capacity) {
  return (capacity + kTopKRankCandidatesPerBlock - 1) / kTopKRankCandidatesPerBlock;
}
inline std::size_t topk_rank_bytes(std::uint32_t capacity) { return (std::size_t{capacity} + 1) / 2 * 16; }

/// The same result as topk_sort (TopKPolicy::sort = 1): a candidate's place is the number of
/// candidates whose ranking key is larger (keys are unique: each holds its ad's id), counted by
/// four lanes over interleaved pairs of keys; the place is written if it is among the first
/// min(K, eligible). Count^2 compares in all, but spread over count / 64 blocks, where one block's
/// merge sort runs its log-depth passes on one SM.
template <class = void>
__global__ void __launch_bounds__(kTopKRankThreads)
    topk_rank(const unsigned long long* candidates, const TopKState* state, std::uint32_t k, std::uint32_t capacity,
              std::uint32_t* out_ids, float* out_scores, std::uint32_t* out_count) {
  gpu_wait_for_prior_grid();  // launched as a programmatic dependent (gpu_launch_after_prior)
  extern __shared__ __align__(16) ulonglong2 pairs[];  // topk_rank_bytes(capacity)
  const std::uint32_t count = min(state->candidate_count, capacity);
  const std::uint32_t results = min(k, state->eligible_count);
  if (blockIdx.x == 0 && threadIdx.x == 0)
    *out_count = answer_count(state, results);
  const std::uint32_t first = blockIdx.x * kTopKRankCandidatesPerBlock;
  if (first >= count) return;
  // Pairs of keys, the odd one out paired with 0, which no candidate's key is below.
  const std::uint32_t pair_count = (count + 1) / 2;
  const auto* from = reinterpret_cast<const ulonglong2*>(candidates);  // the candidate region is 256-byte aligned
  for (std::uint32_t i = threadIdx.x; i < pair_count; i += kTopKRankThreads) {
    ulonglong2 pair = from[i];
    if (2 * i + 1 == count) pair.y = 0;
    pairs[i] = pair;
  }
  __syncthreads();
  const std::uint32_t lane = threadIdx.x % kTopKRankLanesPerCandidate;
  const std::uint32_t mine = first + threadIdx.x / kTopKRankLanesPerCandidate;
  const unsigned long long key = mine < count ? reinterpret_cast<const unsigned long long*>(pairs)[mine] : ~0ull;
  // Lane l reads pairs l, l + 4, ...: the four lanes of a candidate read 64 consecutive bytes.
  std::uint32_t before = 0;
#pragma unroll 4
  for (std::uint32_t i = lane; i < pair_count; i += kTopKRankLanesPerCandidate) {
    const ulonglong2 pair = pairs[i];
    before += (pair.x > key) + (pair.y > key);
  }
#pragma unroll
  for (int offset = kTopKRankLanesPerCandidate / 2; offset > 0; offset /= 2) before += gpu_shfl_xor(gpu_all_lanes, before, offset);
  if (lane == 0 && mine < count && before < results) write_result(key, before, out_ids, out_scores);
}

}  // namespace kevo::retrieval::kernels
