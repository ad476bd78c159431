// kevo/retrieval/dispatch/kernels.cuh: the pipeline's kernels, thin wrappers that map threads to
// the agents' linear ids. Launch them through the pipeline (fused_retrieval_pipeline.cuh).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kevo/retrieval/agent/matching.cuh"
#include "kevo/retrieval/agent/request_vectors.cuh"
#include "kevo/retrieval/agent/scoring.cuh"
#include "kevo/retrieval/agent/topk.cuh"
#include "kevo/retrieval/agent/views.cuh"
#include "kevo/retrieval/portability.cuh"
#include "kevo/retrieval/tuning/policies.hpp"

namespace kevo::retrieval::kernels {

// Every kernel here is a template, those with no parameters of their own taking an unused
// `template <class = void>`: a template's host stub may be defined in each translation unit, so two
// .cu files of one program can include this header (a plain __global__ function would be defined
// twice and fail to link). Launch as usual (`tower_hidden<<<...>>>`); take an address as
// `topk_sort<>`.

// ---- request: user towers, gating keys, query bitmap ------------------------------------------

/// hidden(E, H) = relu(W1 x + c1); one warp per row.
template <class = void>
__global__ void tower_hidden(const float* w1, const float* c1, const float* x, int features, int rows, float* hidden) {
  const int row = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / 32);
  if (row >= rows) return;
  const float dot = warp_dot(w1 + static_cast<std::size_t>(row) * features, x, features, threadIdx.x % 32);
  if (threadIdx.x % 32 == 0) hidden[row] = fmaxf(__fadd_rn(dot, c1[row]), 0.0f);
}

/// u(E, d) = W2_e hidden_e + c2_e.
template <class = void>
__global__ void tower_expert(const float* w2, const float* c2, const float* hidden, int hidden_dim, int dim, int rows,
                             float* u) {
  const int row = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / 32);
  if (row >= rows) return;
  const int e = row / dim;
  const float dot = warp_dot(w2 + static_cast<std::size_t>(row) * hidden_dim,
                             hidden + static_cast<std::size_t>(e) * hidden_dim, hidden_dim, threadIdx.x % 32);
  if (threadIdx.x % 32 == 0) u[row] = __fadd_rn(dot, c2[row]);
}

/// vectors(16, d) fp16: rows 0..7 = u_e, rows 8..15 = g_e = P u_e / sqrt(d); experts >= E are zero.
/// A value past fp16's range flags kOverflowVectors in the request's state (its scores would be NaN).
template <class = void>
__global__ void tower_gate(const float* projection, const float* u, int dim, int experts, __half* vectors,
                           TopKState* state) {
  const int row = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / 32);
  if (row >= kMaxGpuExperts * dim) return;
  const int e = row / dim, j = row % dim;
  const int lane = threadIdx.x % 32;
  if (e >= experts) {
    if (lane == 0) vectors[row] = vectors[kMaxGpuExperts * dim + row] = __float2half_rn(0.0f);
    return;
  }
  const float dot = warp_dot(projection + static_cast<std::size_t>(j) * dim, u + static_cast<std::size_t>(e) * dim,
                             dim, lane);
  if (lane == 0) {
    const __half g = __float2half_rn(__fdiv_rn(dot, __fsqrt_rn(static_cast<float>(dim))));
    const __half expert = __float2half_rn(u[row]);
    vectors[kMaxGpuExperts * dim + row] = g;
    vectors[row] = expert;
    if (__hisinf(g) || __hisnan(g) || __hisinf(expert) || __hisnan(expert)) atomicOr(&state->overflow, kOverflowVectors);
  }
}

/// Threads of prepare_query's one block.
inline constexpr int kPrepareQueryThreads = 1024;

/// Clears the request's top-K state and query bitmap, then sets its (category, value) bits. One
/// block, so that a barrier orders the clearing before the setting: one launch where two memsets
/// and a kernel were (each costs the host a call and the device a gap, at every pool size).
template <class = void>
__global__ void __launch_bounds__(kPrepareQueryThreads)
    prepare_query(const std::uint32_t* bits, const std::uint32_t* count, std::uint32_t* bitmap,
                  std::uint32_t bitmap_words, TopKState* state) {
  static_assert(sizeof(TopKState) % 4 == 0);
  auto* state_words = reinterpret_cast<std::uint32_t*>(state);
  for (std::uint32_t i = threadIdx.x; i < sizeof(TopKState) / 4; i += blockDim.x) state_words[i] = 0;
  for (std::uint32_t i = threadIdx.x; i < bitmap_words; i += blockDim.x) bitmap[i] = 0;
  __syncthreads();
  for (std::uint32_t i = threadIdx.x; i < *count; i += blockDim.x) atomicOr(bitmap + (bits[i] >> 5), 1u << (bits[i] & 31u));
}

// ---- index matching ----------------------------------------------------------------------------

/// The most requests one batched pass matches and scores together (a request-mask byte per ad).
inline constexpr int kMaxBatchRequests = 8;

/// What matching sees of the requests it serves at once: each one's query bitmap and bit list,
/// and its top-K state (whose eligible_count it fills). One request is a batch of one.
struct MatchingRequests {
  const std::uint32_t* bitmap[kMaxBatchRequests];
  const std::uint32_t* bits[kMaxBatchRequests];
  const std::uint32_t* bit_count[kMaxBatchRequests];
  TopKState* state[kMaxBatchRequests];
  const std::uint32_t* category_offsets;  // shared by every request
  int count;
};

/// Appends every slot eligible for at least one request to `eligible_list` and counts them in
/// `*listed`. A block takes one postings segment at a time (agent/matching.cuh) and, for each
/// request in turn, clears a mask byte per ad, ORs in the postings of each query bit, then
/// compares each ad's mask with the need mask in its header. With MaxRequests > 1 it also writes
/// `request_masks` (bit r: eligible for request r) beside the list and counts each request's
/// eligible ads in its state; a batch of one lists exactly its eligible ads (`listed` is then its
/// state's eligible_count, and no masks are written).
///
/// The postings of all the round's query bits are walked as one list of 16-byte chunks spread
/// evenly over the block (one bit's list may be long, the next empty), each thread holding
/// kChunksInFlight loads at once. The eligible slots of a segment are gathered in shared memory
/// first, so that the list is written in whole lines (scattered 4-byte stores cost more, run 17).
template <int BlockThreads, int MaxRequests = 1>
__global__ void __launch_bounds__(BlockThreads, 1536 / BlockThreads)  // 48 warps resident: it is latency-bound
    matching(IndexView index, MatchingRequests requests, std::uint32_t* eligible_list, std::uint8_t* request_masks,
             std::uint32_t* listed) {
  static_assert(MaxRequests >= 1 && MaxRequests <= kMaxBatchRequests);
  constexpr bool kBatch = MaxRequests > 1;
  constexpr int kAdsPerLoad = 16;  // one uint4 of header bytes
  constexpr int kLoads = static_cast<int>(kSegmentSlots) / (kAdsPerLoad * BlockThreads);
  static_assert(kLoads >= 1 && kSegmentSlots % (kAdsPerLoad * BlockThreads) == 0);
  using Scan = gpu_cub::BlockScan<std::uint32_t, BlockThreads>;
  // One byte per ad while matching; then, once every mask is read, the segment's eligible local slots.
  __shared__ __align__(16) std::uint32_t segment_words[kSegmentSlots / 2];
  std::uint32_t* masks = segment_words;
  auto* found = reinterpret_cast<std::uint16_t*>(segment_words);
  constexpr int kChunksInFlight = 2;
  __shared__ __align__(16) std::uint8_t headers[kSegmentSlots];  // fetched by cp.async behind the postings
  // Batches only: a byte per ad, bit r set once request r finds it eligible.
  __shared__ __align__(16) std::uint8_t request_bytes[kBatch ? kSegmentSlots : 16];
  __shared__ std::uint32_t request_totals[MaxRequests];
  __shared__ PostingRange ranges[BlockThreads];
  __shared__ std::uint32_t chunk_start[BlockThreads + 1];  // first chunk of each range in the round's list
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ std::uint32_t offsets[kMaxCategories];
  __shared__ std::uint32_t block_base;
  const int rank = static_cast<int>(threadIdx.x);
  if (rank < kMaxCategories) offsets[rank] = requests.category_offsets[rank];
  if (rank < MaxRequests) request_totals[rank] = 0;
  const std::uint32_t segments = (index.slots + kSegmentSlots - 1) / kSegmentSlots;
  const auto* header_quads = reinterpret_cast<const uint4*>(index.postings.headers);
  const auto* chunks = reinterpret_cast<const uint4*>(index.postings.postings);  // 8 postings each

  // ORs the postings of request r's query bits into the segment's mask bytes (cleared before).
  auto or_postings = [&](const SegmentDirectory& dir, int r) {
    const std::uint32_t keys = *requests.bit_count[r];
    const std::uint32_t* query_bits = requests.bits[r];
    for (std::uint32_t first = 0; dir.table_size != 0 && first < keys; first += BlockThreads) {
      __syncthreads();  // masks cleared; the previous round's ranges and scan storage consumed
      const PostingRange mine = first + rank < keys ? find_postings(dir, __ldg(query_bits + first + rank)) : PostingRange{};
      ranges[rank] = mine;
      const std::uint32_t my_chunks =
          mine.count ? static_cast<std::uint32_t>((mine.begin + mine.count - 1) / 8 - mine.begin / 8 + 1) : 0u;
      std::uint32_t my_start = 0, total_chunks = 0;
      Scan(scan_storage).ExclusiveSum(my_chunks, my_start, total_chunks);
      chunk_start[rank] = my_start;
      if (rank == 0) chunk_start[BlockThreads] = total_chunks;
      __syncthreads();
      int range = 0;  // the range of this thread's current chunk; chunks are taken in order, so it only grows
      for (std::uint32_t i0 = rank; i0 < total_chunks; i0 += BlockThreads * kChunksInFlight) {
        uint4 data[kChunksInFlight];
        std::uint64_t at[kChunksInFlight];
        int of[kChunksInFlight];
#pragma unroll
        for (int u = 0; u < kChunksInFlight; ++u) {
          const std::uint32_t i = i0 + u * BlockThreads;
          of[u] = -1;
          if (i >= total_chunks) continue;
          while (chunk_start[range + 1] <= i) ++range;
          of[u] = range;
          at[u] = ranges[range].begin / 8 + (i - chunk_start[range]);
          data[u] = __ldg(chunks + at[u]);
        }
#pragma unroll
        for (int u = 0; u < kChunksInFlight; ++u) {
          if (of[u] < 0) continue;
          const PostingRange range_u = ranges[of[u]];
          const std::uint32_t words[4] = {data[u].x, data[u].y, data[u].z, data[u].w};
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            const std::uint64_t e = at[u] * 8 + k;
            if (e < range_u.begin || e >= range_u.begin + range_u.count) continue;  // the chunk's edges
            const std::uint32_t p = (words[k / 2] >> (16 * (k % 2))) & 0xffffu;
            atomicOr(&masks[p >> 5], (1u << (p & 7u)) << (((p >> 3) & 3u) * 8u));
          }
        }
      }
    }
  };

  // Bit j of the result: ad `local + j` is eligible for request r (the masks hold r's postings).
  auto eligible16 = [&](std::uint32_t local, std::uint64_t base, std::uint64_t limit, int r) {
    const uint4 hq = *reinterpret_cast<const uint4*>(headers + local);
    const std::uint32_t h[4] = {hq.x, hq.y, hq.z, hq.w};
    const uint4 mq = *reinterpret_cast<const uint4*>(masks + local / 4);
    const std::uint32_t m[4] = {mq.x, mq.y, mq.z, mq.w};
    std::uint32_t f = 0, walkers = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      f |= indexed_eligible4(h[k], m[k]) << (4 * k);
      walkers |= h[k] & 0x7f7f7f7fu & ~(((h[k] & 0x80808080u) >> 7) * 0x7fu);  // a byte in 1..0x7f
    }
    if (walkers) {  // ads upserted since the last reindex, too long to index, or prefiltered
      for (int j = 0; j < kAdsPerLoad; ++j) {
        const std::uint32_t byte = (h[j / 4] >> (8 * (j % 4))) & 0xffu;
        if (byte == 0 || (byte & match_header::indexed) || local + j >= limit) continue;
        if (byte == match_header::prefiltered && ((m[j / 4] >> (8 * (j % 4))) & 0xffu) != match_header::prefiltered)
          continue;  // one of its first 7 categories unmet, or an excluded value held
        const std::uint64_t slot = base + local + j;
        if (walk_clause_run(index.clauses, __ldg(index.targeting + slot), requests.bitmap[r], offsets)) f |= 1u << j;
      }
    }
    if (local + kAdsPerLoad > limit) f &= limit > local ? (1u << (limit - local)) - 1u : 0u;
    return f;
  };

  for (std::uint32_t segment = blockIdx.x; segment < segments; segment += gridDim.x) {
    const std::uint64_t base = static_cast<std::uint64_t>(segment) * kSegmentSlots;
    const std::uint64_t limit = min(static_cast<std::uint64_t>(kSegmentSlots), index.slots - base);
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      const int quad = l * BlockThreads + rank;
      gpu_copy_async_16(headers + quad * kAdsPerLoad, header_quads + base / kAdsPerLoad + quad, 16);
    }
    gpu_copy_async_commit();
    const SegmentDirectory dir = index.postings.segments[segment];
    std::uint32_t flags[kLoads], total = 0;
    const int request_count = kBatch ? requests.count : 1;
    for (int r = 0; r < request_count; ++r) {
      if (r > 0) __syncthreads();  // the previous request's masks are read
      for (int i = rank; i < static_cast<int>(kSegmentSlots / 4); i += BlockThreads) masks[i] = 0;
      or_postings(dir, r);
      if (r == 0) gpu_copy_async_wait<0>();
      __syncthreads();
      std::uint32_t request_total = 0;
#pragma unroll
      for (int l = 0; l < kLoads; ++l) {
        const std::uint32_t local = static_cast<std::uint32_t>(l * BlockThreads + rank) * kAdsPerLoad;
        const std::uint32_t f = eligible16(local, base, limit, r);
        request_total += __popc(f);
        if constexpr (kBatch) {
          // Spread bit j of f to byte j as bit r, and OR it into this thread's 16 request bytes.
          std::uint32_t spread[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) spread[k] = (((f >> (4 * k)) & 0xfu) * 0x00204081u & 0x01010101u) << r;
          uint4& bytes = *reinterpret_cast<uint4*>(request_bytes + local);
          const uint4 old = r == 0 ? make_uint4(0, 0, 0, 0) : bytes;
          bytes = make_uint4(old.x | spread[0], old.y | spread[1], old.z | spread[2], old.w | spread[3]);
        } else {
          flags[l] = f;
        }
      }
      if constexpr (kBatch) atomicAdd(&request_totals[r], request_total);
      else total = request_total;
    }
    if constexpr (kBatch) {
#pragma unroll
      for (int l = 0; l < kLoads; ++l) {
        const std::uint32_t local = static_cast<std::uint32_t>(l * BlockThreads + rank) * kAdsPerLoad;
        const uint4 bytes = *reinterpret_cast<const uint4*>(request_bytes + local);
        const std::uint32_t b[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
        std::uint32_t f = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) f |= (__vcmpne4(b[k], 0u) & 0x01010101u) * 0x01020408u >> 24 << (4 * k);
        flags[l] = f;
        total += __popc(f);
      }
      __syncthreads();  // every request's total is in
      if (rank < requests.count) {
        atomicAdd(&requests.state[rank]->eligible_count, request_totals[rank]);
        request_totals[rank] = 0;  // (read again only after the barriers below)
      }
    }
    std::uint32_t offset = 0, block_total = 0;
    Scan(scan_storage).ExclusiveSum(total, offset, block_total);
    if (rank == 0) block_base = atomicAdd(listed, block_total);
    __syncthreads();  // every mask read: `found` overwrites them
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      const std::uint32_t local = static_cast<std::uint32_t>(l * BlockThreads + rank) * kAdsPerLoad;
      for (std::uint32_t f = flags[l]; f; f &= f - 1u) found[offset++] = static_cast<std::uint16_t>(local + __ffs(f) - 1);
    }
    __syncthreads();
    for (std::uint32_t i = rank; i < block_total; i += BlockThreads) {
      eligible_list[block_base + i] = static_cast<std::uint32_t>(base + found[i]);
      if constexpr (kBatch) request_masks[block_base + i] = request_bytes[found[i]];
    }
    __syncthreads();  // `found` read before the next segment clears its masks
  }
}

// ---- fused scoring -----------------------------------------------------------------------------

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
  largest = __reduce_max_sync(0xffffffffu, largest);
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
    for (std::uint32_t i = lane; i < length; i += 32) slots[i] = __ldg(eligible_list + begin + i);
    __syncwarp();
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
    __syncwarp();  // the next chunk overwrites the staged slots
    chunk_done(chunk);
  }
}

template <int BlockThreads, int Dim, EmbeddingType Type, int TilesInFlight>
__global__ void __launch_bounds__(BlockThreads)
    scoring(IndexView index, const __half* vectors, const std::uint32_t* eligible_list, TopKState* state,
            std::uint32_t* keys, std::uint32_t* chunk_max, int routing, int experts, int tiles_per_chunk) {
  gpu_wait_for_prior_grid();  // launched as a programmatic dependent (gpu_launch_after_prior)
  constexpr int warps = BlockThreads / 32;
  using Agent = AgentScoring<Dim, Type>;
  __shared__ ScoringBlock<Dim, Type> block;
  __shared__ std::uint32_t chunk_slots[warps][kMaxChunkSlots];
  const int rank = static_cast<int>(threadIdx.x);
  block.begin(vectors, rank, BlockThreads);

  const Agent agent{index, &block.fragments, routing, experts};
  const int lane = rank % 32, group = lane / 4, quad = lane % 4, warp = rank / 32;
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
    for (std::uint32_t i = 4u * lane; i < length; i += 128u)
      gpu_copy_async_16(buffer + i, eligible_list + begin + i, min(16u, (length - i) * 4u));
  };
  // Issues pair q of the warp's sequence (one commit group, empty past the end).
  auto produce = [&](std::uint32_t q) {
    if (q < total_pairs) {
      const std::uint32_t j = q / pairs_per_chunk, pair = q % pairs_per_chunk;
      if (pair == 0) {
        // Chunk j's slots were fetched with the first pair of chunk j - 1, which the caller's wait
        // already covers when a chunk has at least Stages - 1 pairs; otherwise wait for them here.
        if (pairs_per_chunk + 1 < static_cast<std::uint32_t>(Stages)) gpu_copy_async_wait<0>();
        __syncwarp();
        fetch_slots(j + 1);  // buffer (j + 1) % 2 was last read while issuing chunk j - 1
      }
      agent.stage_pair(lane, ring[q % Stages], slot_buffers + (j & 1u) * chunk_size, pair * 32u, chunk_length(j));
    }
    gpu_copy_async_commit();
  };

  fetch_slots(0);
  gpu_copy_async_commit();
  gpu_copy_async_wait<0>();
  __syncwarp();
#pragma unroll
  for (int q = 0; q < Stages - 1; ++q) produce(static_cast<std::uint32_t>(q));
  for (std::uint32_t c = 0; c < total_pairs; ++c) {
    gpu_copy_async_wait<Stages - 2>();  // pair c has landed (the newest commit is pair c + Stages - 2)
    __syncwarp();
    produce(c + Stages - 1);
    const std::uint32_t j = c / pairs_per_chunk, pair = c % pairs_per_chunk;
    const std::uint32_t begin = chunk_begin(j), length = chunk_length(j);
    if (pair * 32u < length) consume(ring[c % Stages], begin, length, pair);
    if (pair + 1 == pairs_per_chunk) chunk_done(begin / chunk_size);
  }
}

/// The same contract as `scoring`, with the rows streamed through a per-warp ring in shared memory
/// (stream_staged_pairs). Rows never pass through registers until they are scored.
template <int BlockThreads, int Dim, EmbeddingType Type, int Stages>
__global__ void __launch_bounds__(BlockThreads)
    scoring_staged(IndexView index, const __half* vectors, const std::uint32_t* eligible_list, TopKState* state,
                   std::uint32_t* keys, std::uint32_t* chunk_max, int routing, int experts, int tiles_per_chunk) {
  gpu_wait_for_prior_grid();  // launched as a programmatic dependent (gpu_launch_after_prior)
  constexpr int warps = BlockThreads / 32;
  using Agent = AgentScoring<Dim, Type>;
  using Stage = StagedPair<Dim, Type>;
  __shared__ ScoringBlock<Dim, Type> block;
  extern __shared__ uint4 staged_shared[];  // scoring_staged_dynamic_bytes
  const int rank = static_cast<int>(threadIdx.x);
  const int lane = rank % 32, warp = rank / 32, group = lane / 4, quad = lane % 4;
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
  constexpr int warps = BlockThreads / 32;
  using Agent = AgentScoring<Dim, Type>;
  using Tile = typename Agent::Tile;
  extern __shared__ uint4 batch_shared[];  // scoring_batch_dynamic_bytes
  const int rank = static_cast<int>(threadIdx.x);
  const int lane = rank % 32, warp = rank / 32, group = lane / 4, quad = lane % 4;
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
      agent.score_tile_pair_group<Group>(lane, first, second, fragments + first_request, widths, score);
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

// ---- top-K -------------------------------------------------------------------------------------

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

// ---- index updates -----------------------------------------------------------------------------

/// Writes a batch of ads into their slots: one warp per ad copies the embedding row (if given).
template <class = void>
__global__ void scatter_ads(std::uint32_t count, const std::uint32_t* slots, const std::uint32_t* ids,
                            const std::uint32_t* targeting, const float* bias, const float* scale,
                            const uint4* rows, int row_vectors, std::uint32_t* index_ids,
                            std::uint32_t* index_targeting, float* index_side, int side_width,
                            uint4* index_embeddings, std::uint8_t* index_headers) {
  const std::uint32_t ad = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (ad >= count) return;
  const std::uint32_t slot = slots[ad];
  if (rows)
    for (int i = lane; i < row_vectors; i += 32)
      index_embeddings[static_cast<std::uint64_t>(slot) * row_vectors + i] = rows[static_cast<std::uint64_t>(ad) * row_vectors + i];
  if (lane == 0) {
    if (ids) index_ids[slot] = ids[ad];
    float* side = index_side + static_cast<std::uint64_t>(slot) * side_width;
    if (bias) side[0] = bias[ad];
    if (scale && side_width > 1) side[1] = scale[ad];
    index_targeting[slot] = targeting[ad];
    // The slot's postings (if any) are stale until the next reindex: test it by walking its run.
    index_headers[slot] = (targeting[ad] & targeting_bits::live) ? match_header::walk : match_header::not_live;
  }
}

/// Clause-arena compaction, step 0: slots a batch is about to overwrite keep their live bit but
/// drop their run (the batch writes their new targeting word before any search sees them).
template <class = void>
__global__ void drop_clause_runs(const std::uint32_t* slots, std::uint32_t count, std::uint32_t* targeting) {
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x)
    targeting[slots[i]] &= targeting_bits::live;
}

/// Clause-arena compaction, step 1: the length in 16-byte quads of each live slot's clause run (0
/// where the slot has none or is not live). A run ends in the quad that holds its `last` clause.
template <class = void>
__global__ void arena_run_quads(const std::uint32_t* targeting, const uint4* arena, std::uint32_t slots,
                                std::uint32_t* quads) {
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < slots; i += gridDim.x * blockDim.x) {
    const std::uint32_t word = targeting[i];
    std::uint32_t length = 0;
    if ((word & targeting_bits::live) && (word & targeting_bits::has_clauses)) {
      const uint4* run = arena + (word & targeting_bits::offset_mask);
      for (;;) {
        const uint4 quad = run[length++];
        if ((quad.x | quad.y | quad.z | quad.w) & clause_bits::last) break;  // padding words are zero
      }
    }
    quads[i] = length;
  }
}

/// Step 2: copies each kept run to its offset in the new arena and points the slot at it; slots
/// whose run is dropped lose their has-clauses bit.
template <class = void>
__global__ void arena_move_runs(std::uint32_t* targeting, const uint4* old_arena, uint4* new_arena,
                                const std::uint32_t* quads, const std::uint32_t* offsets, std::uint32_t slots) {
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < slots; i += gridDim.x * blockDim.x) {
    const std::uint32_t word = targeting[i], length = quads[i];
    if (length == 0) {
      targeting[i] = word & ~(targeting_bits::has_clauses | targeting_bits::offset_mask);
      continue;
    }
    const uint4* from = old_arena + (word & targeting_bits::offset_mask);
    for (std::uint32_t q = 0; q < length; ++q) new_arena[offsets[i] + q] = from[q];
    targeting[i] = (word & ~targeting_bits::offset_mask) | offsets[i];
  }
}

// ---- matching's postings (DeviceAdIndex::reindex) ------------------------------------------------

/// Calls f(packed clause) for each clause of a run, in order.
template <class F>
__device__ __forceinline__ void for_each_clause(const std::uint32_t* clauses, std::uint32_t targeting, F&& f) {
  const uint4* run = reinterpret_cast<const uint4*>(clauses) + (targeting & targeting_bits::offset_mask);
  for (;; ++run) {
    const uint4 quad = *run;
    const std::uint32_t packed[4] = {quad.x, quad.y, quad.z, quad.w};
    for (int k = 0; k < 4; ++k) {
      f(packed[k]);
      if (packed[k] & clause_bits::last) return;
    }
  }
}

/// What an ad's header byte and its postings' ranks are built from: the categories it restricts
/// with allow-sets (a bit per category) and how many clauses it has.
struct ClauseSummary {
  std::uint32_t allowed = 0;
  std::uint32_t clauses = 0;
};
__device__ __forceinline__ ClauseSummary summarize_clauses(const std::uint32_t* clauses, std::uint32_t targeting) {
  ClauseSummary summary;
  for_each_clause(clauses, targeting, [&](std::uint32_t c) {
    ++summary.clauses;
    if (!(c & clause_bits::exclude)) summary.allowed |= 1u << ((c >> clause_bits::category_shift) & 31u);
  });
  return summary;
}

/// How many of an ad's clauses get a posting (all but a prefiltered ad's later categories).
__device__ __forceinline__ std::uint32_t posting_count(const std::uint32_t* clauses, std::uint32_t targeting,
                                                       std::uint32_t allowed) {
  std::uint32_t count = 0;
  for_each_clause(clauses, targeting, [&](std::uint32_t c) {
    count += posting_bits::has_posting(c & clause_bits::exclude, (c >> clause_bits::category_shift) & 31u, allowed);
  });
  return count;
}

/// Reindex step 1: each slot's match header, and how many postings it contributes (0 unless indexed
/// or prefiltered). `walked` counts the ads left to walk: those with more clauses than a segment holds.
template <class = void>
__global__ void postings_count(const std::uint32_t* targeting, const std::uint32_t* clauses, std::uint32_t slots,
                               std::uint8_t* headers, std::uint32_t* counts, std::uint32_t* walked) {
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < slots; i += gridDim.x * blockDim.x) {
    const std::uint32_t word = targeting[i];
    std::uint8_t header = match_header::not_live;
    std::uint32_t count = 0;
    if (word & targeting_bits::live) {
      const ClauseSummary summary = (word & targeting_bits::has_clauses) ? summarize_clauses(clauses, word) : ClauseSummary{};
      const std::uint32_t allowed = summary.allowed, n = summary.clauses;
      const int restricted = __popc(allowed);
      if (n > static_cast<std::uint32_t>(kMaxIndexedClauses)) {
        header = match_header::walk;
        atomicAdd(walked, 1u);  // rare: more clauses than a segment's postings are sized for
      } else if (restricted <= kMaxIndexedCategories) {
        header = static_cast<std::uint8_t>(match_header::indexed | ((1u << restricted) - 1u));
        count = n;
      } else {
        header = match_header::prefiltered;
        count = posting_count(clauses, word, allowed);
      }
    }
    headers[i] = header;
    counts[i] = count;
  }
}

/// Reindex step 2: the postings of slots [first, end) at their offsets (less `first_offset`), each
/// keyed by (segment - first / kSegmentSlots) << 22 | query bit, so that one sort groups a slice's
/// postings by segment, then by bit, in slot order within a bit.
template <class = void>
__global__ void postings_emit(const std::uint32_t* targeting, const std::uint32_t* clauses,
                              const std::uint32_t* category_offsets, const std::uint32_t* offsets, std::uint32_t first,
                              std::uint32_t end, std::uint32_t* keys, std::uint16_t* values) {
  const std::uint32_t first_offset = offsets[first];
  for (std::uint32_t i = first + blockIdx.x * blockDim.x + threadIdx.x; i < end; i += gridDim.x * blockDim.x) {
    std::uint32_t at = offsets[i] - first_offset;
    if (offsets[i + 1] - offsets[i] == 0) continue;
    const std::uint32_t word = targeting[i];
    const std::uint32_t allowed = summarize_clauses(clauses, word).allowed;
    const std::uint32_t segment_key = (i / kSegmentSlots - first / kSegmentSlots) << 22;
    for_each_clause(clauses, word, [&](std::uint32_t c) {
      const std::uint32_t category = (c >> clause_bits::category_shift) & 31u;
      const bool exclude = c & clause_bits::exclude;
      if (!posting_bits::has_posting(exclude, category, allowed)) return;
      const std::uint32_t rank = posting_bits::rank_of(exclude, category, allowed);
      keys[at] = segment_key | (category_offsets[category] + (c & clause_bits::value_mask));
      values[at] = posting_bits::pack(i % kSegmentSlots, rank);
      ++at;
    });
  }
}

/// Reindex step 3: how many distinct query bits each segment of the slice lists.
template <class = void>
__global__ void postings_count_bits(const std::uint32_t* unique_keys, const std::uint32_t* runs,
                                    std::uint32_t* segment_bits) {
  for (std::uint32_t u = blockIdx.x * blockDim.x + threadIdx.x; u < *runs; u += gridDim.x * blockDim.x)
    atomicAdd(&segment_bits[unique_keys[u] >> 22], 1u);
}

/// Reindex step 4: inserts each distinct (segment, bit) of the slice into its segment's table.
/// `run_starts` count from the slice's first posting, `segment_starts` likewise.
template <class = void>
__global__ void postings_fill_tables(const std::uint32_t* unique_keys, const std::uint32_t* run_counts,
                                     const std::uint32_t* run_starts, const std::uint32_t* runs,
                                     const std::uint32_t* segment_starts, const std::uint32_t* table_offsets,
                                     const std::uint32_t* table_sizes, unsigned long long* tables) {
  for (std::uint32_t u = blockIdx.x * blockDim.x + threadIdx.x; u < *runs; u += gridDim.x * blockDim.x) {
    const std::uint32_t segment = unique_keys[u] >> 22, bit = unique_keys[u] & ((1u << 22) - 1u);
    const std::uint32_t size = table_sizes[segment];
    unsigned long long* table = tables + table_offsets[segment];
    const unsigned long long entry = table_entry::pack(bit, run_starts[u] - segment_starts[segment], run_counts[u]);
    std::uint32_t at = table_entry::home(bit, size);
    while (atomicCAS(table + at, 0ull, entry) != 0ull) at = at + 1 == size ? 0u : at + 1;
  }
}

/// Reindex: the first posting of each segment (offsets at segment starts, the last one the total).
template <class = void>
__global__ void postings_segment_starts(const std::uint32_t* offsets, std::uint32_t slots, std::uint32_t segments,
                                        std::uint32_t* starts) {
  for (std::uint32_t s = blockIdx.x * blockDim.x + threadIdx.x; s <= segments; s += gridDim.x * blockDim.x)
    starts[s] = offsets[min(static_cast<std::uint64_t>(s) * kSegmentSlots, static_cast<std::uint64_t>(slots))];
}

}  // namespace kevo::retrieval::kernels
