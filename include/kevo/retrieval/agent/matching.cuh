// kevo/retrieval/agent/matching.cuh: index matching for one tile of slots. An ad is eligible iff it
// is live and, for every category, (ANY or S ∩ Q ≠ ∅) and X ∩ Q = ∅. The ad's targeting word says
// whether it has clauses at all (most ads restrict one or two categories); the clause run is read
// 16 bytes at a time, and membership in Q is one bit of the request's bitmap.
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

  /// Eligibility from the ad's targeting word and the first 16 bytes of its clause run (already
  /// loaded, so that the loads of all the thread's ads are in flight together). Runs start on 16-byte
  /// boundaries and are read four clauses at a time; the four bitmap tests are independent loads.
  __device__ __forceinline__ bool eligible(std::uint32_t word, uint4 quad) const {
    if (!(word & targeting_bits::live)) return false;
    if (!(word & targeting_bits::has_clauses)) return true;
    const uint4* run = reinterpret_cast<const uint4*>(index.clauses) + (word & targeting_bits::offset_mask);
    std::uint32_t restricted = 0, satisfied = 0;
    for (;;) {
      const std::uint32_t packed[4] = {quad.x, quad.y, quad.z, quad.w};
      bool member[4];
#pragma unroll
      for (int k = 0; k < 4; ++k)  // padding after the last clause reads category 0, value 0: harmless
        member[k] = in_query((packed[k] >> clause_bits::category_shift) & 31u, packed[k] & clause_bits::value_mask);
      bool more = true;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (!more) break;
        const std::uint32_t category = (packed[k] >> clause_bits::category_shift) & 31u;
        if (packed[k] & clause_bits::exclude) {
          if (member[k]) return false;
        } else {
          restricted |= 1u << category;
          satisfied |= static_cast<std::uint32_t>(member[k]) << category;
        }
        more = !(packed[k] & clause_bits::last);
      }
      if (!more) break;
      quad = __ldg(++run);
    }
    return restricted == satisfied;
  }

  /// Tests the thread's AdsPerThread slots of the tile (striped, so reads coalesce); bit j of the
  /// returned mask is slot tile_base + j * BlockThreads + thread_rank.
  __device__ __forceinline__ std::uint32_t test_tile(int thread_rank, std::uint64_t tile_base) const {
    std::uint32_t word[AdsPerThread];
    uint4 first[AdsPerThread];
#pragma unroll
    for (int j = 0; j < AdsPerThread; ++j) {
      const std::uint64_t slot = tile_base + static_cast<std::uint64_t>(j) * BlockThreads + thread_rank;
      word[j] = slot < index.slots ? __ldg(index.targeting + slot) : 0u;
    }
#pragma unroll
    for (int j = 0; j < AdsPerThread; ++j) {
      const bool walk = (word[j] & targeting_bits::live) && (word[j] & targeting_bits::has_clauses);
      first[j] = walk ? __ldg(reinterpret_cast<const uint4*>(index.clauses) + (word[j] & targeting_bits::offset_mask))
                      : make_uint4(0, 0, 0, 0);
    }
    std::uint32_t flags = 0;
#pragma unroll
    for (int j = 0; j < AdsPerThread; ++j)
      if (eligible(word[j], first[j])) flags |= 1u << j;
    return flags;
  }
};

}  // namespace kevo::retrieval
