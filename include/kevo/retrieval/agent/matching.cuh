// kevo/retrieval/agent/matching.cuh: index matching over segmented targeting postings.
//
// An ad is eligible iff it is live and, for every category, (ANY or S ∩ Q ≠ ∅) and X ∩ Q = ∅.
// Testing each ad's clauses one by one costs ~5 clauses of work per ad; instead the pool is cut
// into segments of kSegmentSlots slots, and each segment keeps an inverted index of its ads'
// clauses: for each (category, value) bit that some ad of the segment names, the list of those ads.
// A request then touches only the lists of the values the user holds:
//
//   1. clear one mask byte per ad of the segment (shared memory);
//   2. for each query bit, look up its list in the segment's hash table and OR into each listed
//      ad's byte the bit of that clause: the rank of its category among the ad's restricted
//      categories (0..6), or bit 7 for an exclusion;
//   3. an ad whose header says it is indexed is eligible iff its mask byte equals its need mask
//      (one bit per restricted category; bit 7, an excluded value, never matches).
//
// An ad restricting more than 7 categories is indexed by its first 7 (in category order) and its
// exclusions only: its header says "prefiltered", and only when that byte comes out full is its
// clause run walked for the rest. Ads that are not indexed at all (upserted since the last
// reindex, or with more than 64 clauses) are tested by walking their clause run against the query
// bitmap, as before.
//
//   const SegmentDirectory dir = index.postings.segments[segment];
//   PostingRange r = find_postings(dir, query_bit);   // r.count postings from index.postings.postings[r.begin]
#pragma once

#include <cstdint>

#include "kevo/retrieval/ad_pool.hpp"
#include "kevo/retrieval/agent/views.cuh"

namespace kevo::retrieval {

/// Slots per postings segment: one mask byte each fits shared memory, a local slot fits 13 bits.
inline constexpr std::uint32_t kSegmentSlots = 8192;
/// Restricted categories an indexed ad may have (bit 7 of its mask byte marks an exclusion).
inline constexpr int kMaxIndexedCategories = 7;
/// Clauses an indexed ad may have (bounds each segment's postings below 2^21).
inline constexpr int kMaxIndexedClauses = 64;

/// One byte per slot that matching reads first. 0: not live. Bit 7 set: live and indexed, and the
/// low 7 bits are the need mask. `walk`: live, tested by walking its clause run. `prefiltered`:
/// live, more than 7 restricted categories; its first 7 and its exclusions are indexed, and its run
/// is walked only if their mask byte comes out as `prefiltered` (all 7 met, nothing excluded).
namespace match_header {
inline constexpr std::uint8_t not_live = 0;
inline constexpr std::uint8_t indexed = 0x80;
inline constexpr std::uint8_t walk = 0x01;
inline constexpr std::uint8_t prefiltered = (1u << kMaxIndexedCategories) - 1u;
}  // namespace match_header

/// One posting: the ad's slot within its segment (13 bits) and the mask bit it sets (3 bits).
namespace posting_bits {
inline constexpr std::uint16_t exclusion_rank = 7;
/// The mask bit of an ad's clause: its category's rank among the ad's restricted categories
/// (`allowed`, a bit per category), or exclusion_rank. A rank of 7 or more has no bit: a
/// prefiltered ad's later categories get no postings.
__host__ __device__ inline std::uint32_t rank_of(bool exclude, std::uint32_t category, std::uint32_t allowed) {
#ifdef __CUDA_ARCH__
  return exclude ? exclusion_rank : static_cast<std::uint32_t>(__popc(allowed & ((1u << category) - 1u)));
#else
  return exclude ? exclusion_rank : static_cast<std::uint32_t>(__builtin_popcount(allowed & ((1u << category) - 1u)));
#endif
}
__host__ __device__ inline bool has_posting(bool exclude, std::uint32_t category, std::uint32_t allowed) {
  return exclude || rank_of(false, category, allowed) < exclusion_rank;
}
__host__ __device__ inline std::uint16_t pack(std::uint32_t local_slot, std::uint32_t rank) {
  return static_cast<std::uint16_t>((local_slot << 3) | rank);
}
}  // namespace posting_bits

/// A hash-table entry: query bit (22 bits), start within the segment's postings (21), count (21).
/// 0 is an empty entry (a real one has count >= 1).
namespace table_entry {
__host__ __device__ inline std::uint64_t pack(std::uint32_t bit, std::uint32_t start, std::uint32_t count) {
  return (static_cast<std::uint64_t>(bit) << 42) | (static_cast<std::uint64_t>(start) << 21) | count;
}
__host__ __device__ inline std::uint32_t bit(std::uint64_t e) { return static_cast<std::uint32_t>(e >> 42); }
__host__ __device__ inline std::uint32_t start(std::uint64_t e) { return static_cast<std::uint32_t>(e >> 21) & 0x1fffffu; }
__host__ __device__ inline std::uint32_t count(std::uint64_t e) { return static_cast<std::uint32_t>(e) & 0x1fffffu; }
/// The home position of `bit` in a table of `size` entries (multiplicative hash, then a range map).
__host__ __device__ inline std::uint32_t home(std::uint32_t bit, std::uint32_t size) {
  return static_cast<std::uint32_t>((static_cast<std::uint64_t>(bit * 0x9E3779B1u) * size) >> 32);
}
}  // namespace table_entry

/// No default member initializers: the matching kernel keeps an array of these in shared memory,
/// which clang (HIP) allows only for trivially constructible types; `{}` still zeroes one.
struct PostingRange {
  std::uint64_t begin;
  std::uint32_t count;
};

/// The postings of `bit` in one segment (count 0 where none). A table is under half full, so a
/// probe ends at an empty entry within a few reads.
__device__ __forceinline__ PostingRange find_postings(const SegmentDirectory& dir, std::uint32_t bit) {
  if (dir.table_size == 0) return {};
  std::uint32_t at = table_entry::home(bit, dir.table_size);
  for (;;) {
    const std::uint64_t e = __ldg(reinterpret_cast<const unsigned long long*>(dir.table) + at);
    if (e == 0) return {};
    if (table_entry::bit(e) == bit) return {dir.postings_base + table_entry::start(e), table_entry::count(e)};
    at = at + 1 == dir.table_size ? 0u : at + 1;
  }
}

/// The old way, for ads that are not indexed: walks one ad's clause run (16-byte aligned, ending
/// with `last`) against the query bitmap.
__device__ __forceinline__ bool walk_clause_run(const std::uint32_t* clauses, std::uint32_t targeting,
                                                const std::uint32_t* bitmap, const std::uint32_t* category_offsets) {
  if (!(targeting & targeting_bits::live)) return false;
  if (!(targeting & targeting_bits::has_clauses)) return true;
  const uint4* run = reinterpret_cast<const uint4*>(clauses) + (targeting & targeting_bits::offset_mask);
  std::uint32_t restricted = 0, satisfied = 0;
  for (;; ++run) {
    const uint4 quad = __ldg(run);
    const std::uint32_t packed[4] = {quad.x, quad.y, quad.z, quad.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const std::uint32_t category = (packed[k] >> clause_bits::category_shift) & 31u;
      const std::uint32_t bit = category_offsets[category] + (packed[k] & clause_bits::value_mask);
      const bool member = (__ldg(bitmap + (bit >> 5)) >> (bit & 31u)) & 1u;
      if (packed[k] & clause_bits::exclude) {
        if (member) return false;
      } else {
        restricted |= 1u << category;
        satisfied |= static_cast<std::uint32_t>(member) << category;
      }
      if (packed[k] & clause_bits::last) return restricted == satisfied;
    }
  }
}

/// Four ads' eligibility from their header and mask bytes: bit j is ad j's (indexed ads only).
__device__ __forceinline__ std::uint32_t indexed_eligible4(std::uint32_t headers, std::uint32_t masks) {
  // Byte j equals 0x80 exactly when the ad is indexed and mask == need (need < 0x80, so an
  // exclusion's bit 7 in the mask never matches).
  const std::uint32_t equal = gpu_bytes_equal(headers ^ 0x80808080u, masks) & headers & 0x80808080u;
  return ((equal >> 7) * 0x01020408u) >> 24 & 0xfu;  // gathers bit 7 of byte j into bit j
}

}  // namespace kevo::retrieval
