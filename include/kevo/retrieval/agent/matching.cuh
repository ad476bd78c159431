// kevo/retrieval/agent/matching.cuh: index matching for one tile of slots. An ad is eligible iff it
// is live and, for every category, (ANY or S ∩ Q ≠ ∅) and X ∩ Q = ∅. The ad's targeting word says
// whether it has clauses at all; the clause run is read 16 bytes at a time, and membership in Q is
// one bit of the request's bitmap.
//
//   AgentMatching<256, 4> agent{index, query, offsets_in_shared};
//   std::uint32_t eligible_bits = agent.test_tile(thread_rank, tile_base);
#pragma once

#include <cstdint>

#include "kevo/retrieval/agent/views.cuh"
#include "kevo/retrieval/ad_pool.hpp"

namespace kevo::retrieval {

template <int BlockThreads, int AdsPerThread>
struct AgentMatching {
  static constexpr int tile_slots = BlockThreads * AdsPerThread;

  IndexView index;
  const std::uint32_t* bitmap;            // shared memory where it fits, else global
  const std::uint32_t* category_offsets;  // (32) in shared memory

  __device__ __forceinline__ bool in_query(std::uint32_t category, std::uint32_t value) const {
    const std::uint32_t bit = category_offsets[category] + value;
    return (bitmap[bit >> 5] >> (bit & 31u)) & 1u;
  }

  /// Tests the thread's AdsPerThread slots of the tile (striped, so reads coalesce); bit j of the
  /// returned mask is slot tile_base + j * BlockThreads + thread_rank.
  ///
  /// A lane walks the clause runs of its ads back to back, moving to its next ad as soon as a run
  /// ends (or an exclusion rules the ad out), so the warp waits for the longest *sum* of runs over a
  /// lane's ads rather than the longest run of each of them in turn. Runs start on 16-byte
  /// boundaries and are read four clauses at a time; a bitmap test is one shared-memory load.
  __device__ __forceinline__ std::uint32_t test_tile(int thread_rank, std::uint64_t tile_base) const {
    std::uint32_t word[AdsPerThread];
#pragma unroll
    for (int j = 0; j < AdsPerThread; ++j) {
      const std::uint64_t slot = tile_base + static_cast<std::uint64_t>(j) * BlockThreads + thread_rank;
      word[j] = slot < index.slots ? __ldg(index.targeting + slot) : 0u;
    }
    std::uint32_t eligible = 0, pending = 0;  // pending: live ads whose clause run must be walked
#pragma unroll
    for (int j = 0; j < AdsPerThread; ++j) {
      if (!(word[j] & targeting_bits::live)) continue;
      if (word[j] & targeting_bits::has_clauses) pending |= 1u << j;
      else eligible |= 1u << j;
    }
    const uint4* clauses = reinterpret_cast<const uint4*>(index.clauses);
    auto run_of = [&](int j) {  // selected by value: indexing word[] at run time would spill it
      std::uint32_t w = 0;
#pragma unroll
      for (int k = 0; k < AdsPerThread; ++k)
        if (k == j) w = word[k];
      return clauses + (w & targeting_bits::offset_mask);
    };
    int j = pending ? __ffs(pending) - 1 : 0;
    const uint4* run = run_of(j);
    std::uint32_t restricted = 0, satisfied = 0;
    while (pending) {
      const uint4 quad = __ldg(run);
      const std::uint32_t packed[4] = {quad.x, quad.y, quad.z, quad.w};
      bool member[4];
#pragma unroll
      for (int k = 0; k < 4; ++k)  // padding after the last clause reads category 0, value 0: harmless
        member[k] = in_query((packed[k] >> clause_bits::category_shift) & 31u, packed[k] & clause_bits::value_mask);
      bool ended = false, excluded = false;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (ended) break;
        const std::uint32_t category = (packed[k] >> clause_bits::category_shift) & 31u;
        if (packed[k] & clause_bits::exclude) {
          excluded |= member[k];
        } else {
          restricted |= 1u << category;
          satisfied |= static_cast<std::uint32_t>(member[k]) << category;
        }
        ended = packed[k] & clause_bits::last;
      }
      if (ended || excluded) {
        if (!excluded && restricted == satisfied) eligible |= 1u << j;
        pending &= pending - 1u;  // j is always the lowest pending ad
        j = pending ? __ffs(pending) - 1 : 0;
        run = run_of(j);
        restricted = satisfied = 0;
      } else {
        ++run;
      }
    }
    return eligible;
  }
};

}  // namespace kevo::retrieval
