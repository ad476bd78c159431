// kevo/retrieval/agent/matching.cuh: index matching for one tile of slots. An ad is eligible iff it
// is live and, for every category, (ANY or S ∩ Q ≠ ∅) and X ∩ Q = ∅. The ad's targeting word says
// whether it has clauses at all (most ads restrict one or two categories); the clause run is one
// contiguous read, and membership in Q is one bit of the request's bitmap.
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
  const std::uint32_t* bitmap;
  const std::uint32_t* category_offsets;  // (32) in shared memory

  __device__ __forceinline__ bool in_query(std::uint32_t category, std::uint32_t value) const {
    const std::uint32_t bit = category_offsets[category] + value;
    return (__ldg(bitmap + (bit >> 5)) >> (bit & 31u)) & 1u;
  }

  /// Eligibility from the ad's targeting word and its first clause (already loaded, so that the
  /// loads of all the thread's ads are in flight together).
  __device__ __forceinline__ bool eligible(std::uint32_t word, std::uint32_t first_clause) const {
    if (!(word & targeting_bits::live)) return false;
    if (!(word & targeting_bits::has_clauses)) return true;
    const std::uint32_t* clause = index.clauses + (word & targeting_bits::offset_mask) + 1;
    std::uint32_t restricted = 0, satisfied = 0;
    for (std::uint32_t packed = first_clause;; packed = __ldg(clause++)) {
      const std::uint32_t category = (packed >> clause_bits::category_shift) & 31u;
      const bool member = in_query(category, packed & clause_bits::value_mask);
      if (packed & clause_bits::exclude) {
        if (member) return false;
      } else {
        restricted |= 1u << category;
        satisfied |= static_cast<std::uint32_t>(member) << category;
      }
      if (packed & clause_bits::last) break;
    }
    return restricted == satisfied;
  }

  /// Tests the thread's AdsPerThread slots of the tile (striped, so reads coalesce); bit j of the
  /// returned mask is slot tile_base + j * BlockThreads + thread_rank.
  __device__ __forceinline__ std::uint32_t test_tile(int thread_rank, std::uint64_t tile_base) const {
    std::uint32_t word[AdsPerThread], first[AdsPerThread];
#pragma unroll
    for (int j = 0; j < AdsPerThread; ++j) {
      const std::uint64_t slot = tile_base + static_cast<std::uint64_t>(j) * BlockThreads + thread_rank;
      word[j] = slot < index.slots ? __ldg(index.targeting + slot) : 0u;
    }
#pragma unroll
    for (int j = 0; j < AdsPerThread; ++j) {
      const bool walk = (word[j] & targeting_bits::live) && (word[j] & targeting_bits::has_clauses);
      first[j] = walk ? __ldg(index.clauses + (word[j] & targeting_bits::offset_mask)) : 0u;
    }
    std::uint32_t flags = 0;
#pragma unroll
    for (int j = 0; j < AdsPerThread; ++j)
      if (eligible(word[j], first[j])) flags |= 1u << j;
    return flags;
  }
};

}  // namespace kevo::retrieval
