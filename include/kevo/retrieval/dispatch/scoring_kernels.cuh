// kevo/retrieval/dispatch/scoring_kernels.cuh: fused MoE-gated scoring of the eligible ads, one request or a batch.
// A batch's scoring reads the request masks that batched matching writes (matching_kernels.cuh).
// Thin kernels over the agents (agent/): each maps threads to an agent's work. The pipeline
// (fused_retrieval_pipeline.cuh) and the index (device_ad_index.cuh) launch them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kevo/retrieval/agent/scoring.cuh"
#include "kevo/retrieval/agent/topk.cuh"
#include "kevo/retrieval/agent/views.cuh"
#include "kevo/retrieval/dispatch/matching_kernels.cuh"
#include "kevo/retrieval/portability.cuh"

namespace kevo::retrieval::kernels {

// Every kernel is a template, those with no parameters of their own taking an unused
// `template <class = void>`: a template's host stub may be defined in each translation unit, so two
// .cu files of one program can include this header (a plain __global__ function would be defined
// twice and fail to link). Launch as usual; take an address as `kernel<>`.

/// Scores every eligible ad: keys[pos] = score_key(score of eligible_list[pos]); fills the level-0
/// top-K histogram and each chunk's largest key. Each warp takes whole chunks of 16-ad tiles,
/// stages the chunk's slots in shared memory (one coalesced read), and keeps TilesInFlight tiles'
/// loads in flight before scoring them.
inline constexpr int kMaxChunkSlots = 16 * 32;

/// What both scoring kernels do around their tiles: a block-local level-0 histogram of the keys,
/// the request's fragments in shared memory, each scored ad's key recorded, the histogram flushed.
template <int Dim, EmbeddingType Type>
struct ScoringBlock {
  ScoringFragments<Dim> fragments;
  std::uint32_t histogram[kTopKBins];

  __device__ void begin(const __half* vectors, int rank, int threads) {
    for (int i = rank; i < kTopKBins; i += threads) histogram[i] = 0;
    load_scoring_fragments<Dim, Type>(fragments, vectors, rank, threads);
    __syncthreads();
  }
  /// Stores the key of one scored ad at keys[at] and counts it; `largest` tracks the chunk's maximum.
  __device__ __forceinline__ void record(float score, std::uint32_t* keys, std::uint32_t at, std::uint32_t& largest) {
    const std::uint32_t key = score_key(score);
    keys[at] = key;
    atomicAdd(&histogram[key >> 20], 1u);  // (warp-aggregating by bin with match_any measured slower)
    largest = max(largest, key);
  }
  __device__ void flush(TopKState* state, int rank, int threads) {
    __syncthreads();
    for (int i = rank; i < kTopKBins; i += threads)
      if (histogram[i]) atomicAdd(&state->histogram[0][i], histogram[i]);
  }
};

/// Ends a warp's chunk: the largest key any lane recorded in it goes to chunk_max[chunk] (top-K
/// skips chunks by it), and `largest` starts again.
__device__ __forceinline__ void finish_chunk(std::uint32_t& largest, std::uint32_t* chunk_max, std::uint32_t chunk,
                                             int lane) {
  largest = gpu_reduce_max(gpu_all_lanes, largest);
  if (lane == 0) chunk_max[chunk] = largest;
  largest = 0;
}

/// One warp's walk over its chunks of the eligible list (chunks first_chunk, + stride, ...), with
/// the rows loaded straight into registers: the chunk's slots are staged in `slots` (the warp's
/// chunk_size words of shared memory) by one coalesced read, then its tiles are loaded
/// TilesInFlight at a time. Calls consume(loaded, begin, length, tile) for the tiles of rows
/// begin + tile .. + 16 TilesInFlight - 1 of the list (those at or past `length` zero), then
/// chunk_done(chunk) after a chunk's last.
template <int TilesInFlight, int Dim, EmbeddingType Type, class Consume, class ChunkDone>
__device__ __forceinline__ void stream_loaded_tiles(const AgentScoring<Dim, Type>& agent, std::uint32_t* slots,
                                                    const std::uint32_t* eligible_list, std::uint32_t count,
                                                    std::uint32_t chunk_size, std::uint32_t first_chunk,
                                                    std::uint32_t stride, int lane, Consume&& consume,
                                                    ChunkDone&& chunk_done) {
  const int group = lane / 4;
  const std::uint32_t chunks = (count + chunk_size - 1) / chunk_size;
  for (std::uint32_t chunk = first_chunk; chunk < chunks; chunk += stride) {
    const std::uint32_t begin = chunk * chunk_size, length = min(count - begin, chunk_size);
    for (std::uint32_t i = lane; i < length; i += gpu_logical_warp_size) slots[i] = __ldg(eligible_list + begin + i);
    gpu_sync_lanes(gpu_all_lanes);
    for (std::uint32_t tile = 0; tile < length; tile += 16 * TilesInFlight) {
      typename AgentScoring<Dim, Type>::Tile loaded[TilesInFlight];
#pragma unroll
      for (int p = 0; p < TilesInFlight; ++p) {
        const std::uint32_t lo = tile + 16 * p + group, hi = lo + 8;
        loaded[p] = agent.load_tile(lane, lo < length ? slots[lo] : 0u, hi < length ? slots[hi] : 0u, lo < length,
                                    hi < length);
      }
      consume(loaded, begin, length, tile);
    }
    gpu_sync_lanes(gpu_all_lanes);  // the next chunk overwrites the staged slots
    chunk_done(chunk);
  }
}

template <int BlockThreads, int Dim, EmbeddingType Type, int TilesInFlight>
__global__ void __launch_bounds__(BlockThreads)
    scoring(IndexView index, const __half* vectors, const std::uint32_t* eligible_list, TopKState* state,
            std::uint32_t* keys, std::uint32_t* chunk_max, int routing, int experts, int tiles_per_chunk) {
  gpu_wait_for_prior_grid();  // launched as a programmatic dependent (gpu_launch_after_prior)
  constexpr int warps = BlockThreads / gpu_logical_warp_size;
  using Agent = AgentScoring<Dim, Type>;
  __shared__ ScoringBlock<Dim, Type> block;
  __shared__ std::uint32_t chunk_slots[warps][kMaxChunkSlots];
  const int rank = static_cast<int>(threadIdx.x);
  block.begin(vectors, rank, BlockThreads);

  const Agent agent{index, &block.fragments, routing, experts};
  const int lane = rank % gpu_logical_warp_size, group = lane / 4, quad = lane % 4, warp = rank / gpu_logical_warp_size;
  std::uint32_t largest = 0;
  stream_loaded_tiles<TilesInFlight>(
      agent, chunk_slots[warp], eligible_list, state->eligible_count, 16u * static_cast<std::uint32_t>(tiles_per_chunk),
      blockIdx.x * warps + warp, gridDim.x * warps, lane,
      [&](const typename Agent::Tile(&loaded)[TilesInFlight], std::uint32_t begin, std::uint32_t length,
          std::uint32_t tile) {
        auto record = [&](float score, std::uint32_t local, bool owner) {
          if (owner && local < length) block.record(score, keys, begin + local, largest);
        };
        const std::uint32_t row = group + ((quad & 1) ? 8u : 0u);
        if constexpr (TilesInFlight == 2) {
          // Every lane owns one row of one of the two tiles.
          record(agent.score_tile_pair(lane, loaded[0], loaded[1]), tile + 16u * (quad >> 1) + row, true);
        } else {
#pragma unroll
          for (int p = 0; p < TilesInFlight; ++p)
            record(agent.score_tile(lane, loaded[p]), tile + 16u * p + row, quad < 2);
        }
      },
      [&](std::uint32_t chunk) { finish_chunk(largest, chunk_max, chunk, lane); });
  block.flush(state, rank, BlockThreads);
}

/// The dynamic shared memory of scoring_staged: per warp, its ring of stages and two chunk-slot buffers.
template <int Dim, EmbeddingType Type>
constexpr std::size_t scoring_staged_dynamic_bytes(int warps, int stages, std::uint32_t chunk_size) {
  return static_cast<std::size_t>(warps) * (stages * sizeof(StagedPair<Dim, Type>) + 2 * chunk_size * 4);
}

/// Where stream_staged_pairs' producer or consumer stands: pair `pair` of the warp's chunk `chunk`,
/// the `sequence`-th pair of its walk, in ring stage `stage`. Stepped one pair at a time rather
/// than derived from the sequence number: that division by the run-time chunk size cost about 50
/// instructions a pair, a tenth of the loop (run 138's ncu of d = 64 int8).
template <int Stages>
struct StagedCursor {
  std::uint32_t chunk = 0, pair = 0, sequence = 0;
  int stage = 0;
  __device__ __forceinline__ void step(std::uint32_t pairs_per_chunk) {
    ++sequence;
    stage = stage + 1 == Stages ? 0 : stage + 1;
    if (++pair == pairs_per_chunk) pair = 0, ++chunk;
  }
};

/// One warp's walk over its chunks of the eligible list (chunks first_chunk, + stride, ...), with
/// the rows streamed by cp.async into its ring of `Stages` pairs of tiles in shared memory: while
/// the warp consumes pair c, pairs c + 1 .. c + Stages - 1 are in flight, and the slot list of its
/// next chunk is fetched the same way one chunk ahead, so the warp never stops issuing loads to
/// wait for its own compute, nor computes while waiting on a slot list. Calls
/// consume(stage, chunk, begin, length, pair) for each pair of 16-ad tiles as it lands (rows
/// begin + 32 pair .. + 31 of the list, those at or past `length` zero), then chunk_done(chunk)
/// after a chunk's last pair. `ring` and `slot_buffers` (2 chunk_size words) are the warp's own.
template <int Stages, int Dim, EmbeddingType Type, class Consume, class ChunkDone>
__device__ __forceinline__ void stream_staged_pairs(const AgentScoring<Dim, Type>& agent, StagedPair<Dim, Type>* ring,
                                                    std::uint32_t* slot_buffers, const std::uint32_t* eligible_list,
                                                    std::uint32_t count, std::uint32_t chunk_size,
                                                    std::uint32_t first_chunk, std::uint32_t stride, int lane,
                                                    Consume&& consume, ChunkDone&& chunk_done) {
  static_assert(Stages >= 2, "one stage computing, at least one in flight");
  const std::uint32_t pairs_per_chunk = chunk_size / 32;
  const std::uint32_t chunks = (count + chunk_size - 1) / chunk_size;
  const std::uint32_t my_chunks = first_chunk < chunks ? (chunks - first_chunk + stride - 1) / stride : 0u;
  const std::uint32_t total_pairs = my_chunks * pairs_per_chunk;
  auto chunk_begin = [&](std::uint32_t j) { return (first_chunk + j * stride) * chunk_size; };
  auto chunk_length = [&](std::uint32_t j) { return min(count - chunk_begin(j), chunk_size); };
  // The slot list of the warp's j-th chunk, 16 bytes a copy, into buffer j % 2.
  auto fetch_slots = [&](std::uint32_t j) {
    if (j >= my_chunks) return;
    const std::uint32_t begin = chunk_begin(j), length = chunk_length(j);
    std::uint32_t* buffer = slot_buffers + (j & 1u) * chunk_size;
    for (std::uint32_t i = 4u * lane; i < length; i += 4u * gpu_logical_warp_size)
      gpu_copy_async_16(buffer + i, eligible_list + begin + i, min(16u, (length - i) * 4u));
  };
  // Issues the producer's pair (one commit group, empty past the end), then steps it.
  auto produce = [&](StagedCursor<Stages>& at) {
    if (at.sequence < total_pairs) {
      if (at.pair == 0) {
        // Chunk j's slots were fetched with the first pair of chunk j - 1, which the caller's wait
        // already covers when a chunk has at least Stages - 1 pairs; otherwise wait for them here.
        if (pairs_per_chunk + 1 < static_cast<std::uint32_t>(Stages)) gpu_copy_async_wait<0>();
        gpu_sync_lanes(gpu_all_lanes);
        fetch_slots(at.chunk + 1);  // buffer (j + 1) % 2 was last read while issuing chunk j - 1
      }
      agent.stage_pair(lane, ring[at.stage], slot_buffers + (at.chunk & 1u) * chunk_size, at.pair * 32u,
                       chunk_length(at.chunk));
    }
    gpu_copy_async_commit();
    at.step(pairs_per_chunk);
  };

  fetch_slots(0);
  gpu_copy_async_commit();
  gpu_copy_async_wait<0>();
  gpu_sync_lanes(gpu_all_lanes);
  StagedCursor<Stages> producer, consumer;
#pragma unroll
  for (int q = 0; q < Stages - 1; ++q) produce(producer);
  for (; consumer.sequence < total_pairs; consumer.step(pairs_per_chunk)) {
    gpu_copy_async_wait<Stages - 2>();  // the consumer's pair has landed (the newest commit is Stages - 2 later)
    gpu_sync_lanes(gpu_all_lanes);
    produce(producer);
    const std::uint32_t begin = chunk_begin(consumer.chunk), length = chunk_length(consumer.chunk);
    if (consumer.pair * 32u < length) consume(ring[consumer.stage], begin, length, consumer.pair);
    if (consumer.pair + 1 == pairs_per_chunk) chunk_done(first_chunk + consumer.chunk * stride);
  }
}

/// The same contract as `scoring`, with the rows streamed through a per-warp ring in shared memory
/// (stream_staged_pairs). Rows never pass through registers until they are scored.
template <int BlockThreads, int Dim, EmbeddingType Type, int Stages>
__global__ void __launch_bounds__(BlockThreads)
    scoring_staged(IndexView index, const __half* vectors, const std::uint32_t* eligible_list, TopKState* state,
                   std::uint32_t* keys, std::uint32_t* chunk_max, int routing, int experts, int tiles_per_chunk) {
  gpu_wait_for_prior_grid();  // launched as a programmatic dependent (gpu_launch_after_prior)
  constexpr int warps = BlockThreads / gpu_logical_warp_size;
  using Agent = AgentScoring<Dim, Type>;
  using Stage = StagedPair<Dim, Type>;
  __shared__ ScoringBlock<Dim, Type> block;
  extern __shared__ uint4 staged_shared[];  // scoring_staged_dynamic_bytes
  const int rank = static_cast<int>(threadIdx.x);
  const int lane = rank % gpu_logical_warp_size, warp = rank / gpu_logical_warp_size, group = lane / 4, quad = lane % 4;
  const std::uint32_t chunk_size = 16u * static_cast<std::uint32_t>(tiles_per_chunk);
  Stage* ring = reinterpret_cast<Stage*>(staged_shared) + warp * Stages;
  std::uint32_t* slot_buffers =
      reinterpret_cast<std::uint32_t*>(reinterpret_cast<Stage*>(staged_shared) + warps * Stages) + warp * 2 * chunk_size;
  block.begin(vectors, rank, BlockThreads);

  const Agent agent{index, &block.fragments, routing, experts};
  std::uint32_t largest = 0;
  stream_staged_pairs<Stages>(
      agent, ring, slot_buffers, eligible_list, state->eligible_count, chunk_size, blockIdx.x * warps + warp,
      gridDim.x * warps, lane,
      [&](const Stage& stage, std::uint32_t begin, std::uint32_t length, std::uint32_t pair) {
        const float score = agent.score_tile_pair(lane, agent.staged_tile(lane, stage, 0), agent.staged_tile(lane, stage, 1));
        const std::uint32_t local = pair * 32u + 16u * (quad >> 1) + group + ((quad & 1) ? 8u : 0u);
        if (local < length) block.record(score, keys, begin + local, largest);
      },
      [&](std::uint32_t chunk) { finish_chunk(largest, chunk_max, chunk, lane); });
  block.flush(state, rank, BlockThreads);
}

/// What batched scoring writes for each request of a batch: its routing width, its fp16 vectors
/// (16, d) and its keys and chunk maxima, both indexed like the batch's (union) eligible list.
struct ScoringRequests {
  const __half* vectors[kMaxBatchRequests];
  std::uint32_t* keys[kMaxBatchRequests];
  std::uint32_t* chunk_max[kMaxBatchRequests];
  int routing[kMaxBatchRequests];
  int count;
};

/// The dynamic shared memory of scoring_batch: every request's fragments, then scoring_staged's
/// ring and slot buffers (Stages > 0) or one chunk-slot buffer per warp (Stages = 0).
template <int Dim, EmbeddingType Type>
constexpr std::size_t scoring_batch_dynamic_bytes(int warps, int stages, std::uint32_t chunk_size) {
  return kMaxBatchRequests * sizeof(ScoringFragments<Dim>) +
         (stages > 0 ? scoring_staged_dynamic_bytes<Dim, Type>(warps, stages, chunk_size)
                     : static_cast<std::size_t>(warps) * chunk_size * 4);
}

/// Scores a batch of requests over the union of their eligible ads, reading each row once: each
/// pair of 16-ad tiles is scored against the requests `Group` at a time (with 2, their mma chains
/// and routings side by side, so that one's latency hides behind the other's), and request r's key
/// is written where `request_masks` says the ad is eligible for it, 0 (no finite score's key)
/// elsewhere. A group past the batch's last request repeats that request, and its results are
/// dropped. Rows come through a two-stage cp.async ring (Stages = 2, as scoring_staged) or straight
/// into registers (Stages = 0: no ring in shared memory, so more warps fit, and this kernel is
/// bound by its arithmetic, not by memory). Level-0 histograms are left to topk_histogram (one per
/// request would not fit shared memory).
template <int BlockThreads, int Dim, EmbeddingType Type, int Stages, int Group>
__global__ void __launch_bounds__(BlockThreads)
    scoring_batch(IndexView index, ScoringRequests requests, const std::uint32_t* eligible_list,
                  const std::uint8_t* request_masks, const std::uint32_t* listed, int experts, int tiles_per_chunk) {
  static_assert(kMaxBatchRequests % Group == 0 && (Stages == 0 || Stages == 2));
  constexpr int warps = BlockThreads / gpu_logical_warp_size;
  using Agent = AgentScoring<Dim, Type>;
  using Tile = typename Agent::Tile;
  extern __shared__ uint4 batch_shared[];  // scoring_batch_dynamic_bytes
  const int rank = static_cast<int>(threadIdx.x);
  const int lane = rank % gpu_logical_warp_size, warp = rank / gpu_logical_warp_size, group = lane / 4, quad = lane % 4;
  const std::uint32_t chunk_size = 16u * static_cast<std::uint32_t>(tiles_per_chunk);
  auto* fragments = reinterpret_cast<ScoringFragments<Dim>*>(batch_shared);
  const int last = requests.count - 1;
  for (int r = 0; r < (requests.count + Group - 1) / Group * Group; ++r)
    load_scoring_fragments<Dim, Type>(fragments[r], requests.vectors[min(r, last)], rank, BlockThreads);
  __syncthreads();

  std::uint32_t largest[kMaxBatchRequests] = {};
  const Agent agent{index, fragments, 0, experts};
  // Rows begin + 32 pair .. + 31 of the list, loaded: every request's key of the row this lane owns.
  auto score_pair = [&](const Tile& first, const Tile& second, std::uint32_t begin, std::uint32_t length,
                        std::uint32_t pair) {
    const std::uint32_t local = pair * 32u + 16u * (quad >> 1) + group + ((quad & 1) ? 8u : 0u);
    const bool listed_row = local < length;
    const std::uint32_t mask = listed_row ? __ldg(request_masks + begin + local) : 0u;
#pragma unroll
    for (int first_request = 0; first_request < kMaxBatchRequests; first_request += Group) {
      if (first_request > last) break;
      int widths[Group];
#pragma unroll
      for (int i = 0; i < Group; ++i) widths[i] = requests.routing[min(first_request + i, last)];
      float score[Group];
      agent.template score_tile_pair_group<Group>(lane, first, second, fragments + first_request, widths, score);
#pragma unroll
      for (int i = 0; i < Group; ++i) {
        const int r = first_request + i;
        if (r > last) break;
        const std::uint32_t key = (mask >> r) & 1u ? score_key(score[i]) : 0u;
        if (listed_row) requests.keys[r][begin + local] = key;
        largest[r] = max(largest[r], key);
      }
    }
  };
  auto chunk_done = [&](std::uint32_t chunk) {
#pragma unroll
    for (int r = 0; r < kMaxBatchRequests; ++r) {
      if (r > last) break;
      finish_chunk(largest[r], requests.chunk_max[r], chunk, lane);
    }
  };
  const std::uint32_t count = *listed, first_chunk = blockIdx.x * warps + warp, stride = gridDim.x * warps;
  if constexpr (Stages > 0) {
    using Stage = StagedPair<Dim, Type>;
    auto* staged = reinterpret_cast<Stage*>(fragments + kMaxBatchRequests);
    std::uint32_t* slot_buffers = reinterpret_cast<std::uint32_t*>(staged + warps * Stages) + warp * 2 * chunk_size;
    stream_staged_pairs<Stages>(
        agent, staged + warp * Stages, slot_buffers, eligible_list, count, chunk_size, first_chunk, stride, lane,
        [&](const Stage& stage, std::uint32_t begin, std::uint32_t length, std::uint32_t pair) {
          score_pair(agent.staged_tile(lane, stage, 0), agent.staged_tile(lane, stage, 1), begin, length, pair);
        },
        chunk_done);
  } else {
    stream_loaded_tiles<2>(
        agent, reinterpret_cast<std::uint32_t*>(fragments + kMaxBatchRequests) + warp * chunk_size, eligible_list, count,
        chunk_size, first_chunk, stride, lane,
        [&](const Tile(&loaded)[2], std::uint32_t begin, std::uint32_t length, std::uint32_t tile) {
          score_pair(loaded[0], loaded[1], begin, length, tile / 32);
        },
        chunk_done);
  }
}

}  // namespace kevo::retrieval::kernels
