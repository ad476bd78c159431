// kevo/retrieval/dispatch/matching_kernels.cuh: index matching: every ad eligible for a request (or a batch of them), listed.
// Thin kernels over the agents (agent/): each maps threads to an agent's work. The pipeline
// (fused_retrieval_pipeline.cuh) and the index (device_ad_index.cuh) launch them.
#pragma once

#include <cstdint>

#include "kevo/retrieval/agent/matching.cuh"
#include "kevo/retrieval/agent/topk.cuh"
#include "kevo/retrieval/agent/views.cuh"

namespace kevo::retrieval::kernels {

// Every kernel is a template, those with no parameters of their own taking an unused
// `template <class = void>`: a template's host stub may be defined in each translation unit, so two
// .cu files of one program can include this header (a plain __global__ function would be defined
// twice and fail to link). Launch as usual; take an address as `kernel<>`.

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
///
/// Block b first takes the b-th segment. With `segment_queue` 0 it then takes the (b + grid)-th,
/// (b + 2 grid)-th, ...; otherwise the next one nobody has taken, from request 0's `segments_taken`
/// (zeroed with its state), asking while it works on the current one. Queue 2 counts from the last:
/// targeting order puts the ads with the most clauses, which carry the most postings, last, and
/// the heaviest segments should not be the ones left for the end.
template <int BlockThreads, int MaxRequests = 1>
__global__ void __launch_bounds__(BlockThreads, 1536 / BlockThreads)  // 48 warps resident: it is latency-bound
    matching(IndexView index, MatchingRequests requests, std::uint32_t* eligible_list, std::uint8_t* request_masks,
             std::uint32_t* listed, int segment_queue) {
  static_assert(MaxRequests >= 1 && MaxRequests <= kMaxBatchRequests);
  gpu_wait_for_prior_grid();  // where launched after prior (MatchingPolicy::launch_after_prior)
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
  __shared__ std::uint32_t next_taken;
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

  // The n-th segment taken, counting from the last one under queue 2 (n >= segments: none left).
  auto nth_segment = [&](std::uint32_t n) { return segment_queue == 2 && n < segments ? segments - 1 - n : n; };
  for (std::uint32_t taken = blockIdx.x; taken < segments;) {
    const std::uint32_t segment = nth_segment(taken);
    // The next segment's claim is in flight while this one is matched; it is published to the
    // block just before a barrier that every thread passes after its last read of the previous one.
    std::uint32_t claimed = taken + gridDim.x;
    if (segment_queue != 0 && rank == 0) claimed = gridDim.x + atomicAdd(&requests.state[0]->segments_taken, 1u);
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
        for (int k = 0; k < 4; ++k) f |= (gpu_bytes_differ(b[k], 0u) & 0x01010101u) * 0x01020408u >> 24 << (4 * k);
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
    if (rank == 0) {
      block_base = atomicAdd(listed, block_total);
      next_taken = claimed;
    }
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
    taken = next_taken;
  }
}

}  // namespace kevo::retrieval::kernels
