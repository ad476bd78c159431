// kevo/retrieval/agent/views.cuh: what the kernels see of the ad index and of one request's
// working memory, as plain views over device memory, plus the order-preserving score keys.
//
//   std::uint32_t key = score_key(score);           // larger score -> larger key; 0 never occurs
//   std::uint64_t rank = ranking_key(key, ad_id);   // score descending, then lower id first
#pragma once

#include <cstdint>

#include "kevo/retrieval/device_intrinsics.cuh"
#include "kevo/retrieval/types.hpp"

namespace kevo::retrieval {

/// Each slot's targeting word: live bit, has-clauses bit and the offset of its clause run (16-byte units).
namespace targeting_bits {
inline constexpr std::uint32_t live = 1u << 31;
inline constexpr std::uint32_t has_clauses = 1u << 30;
inline constexpr std::uint32_t offset_mask = (1u << 30) - 1u;
}  // namespace targeting_bits

/// Where one postings segment's lists and hash table live (agent/matching.cuh). A segment that was
/// never indexed has table_size 0.
struct SegmentDirectory {
  std::uint64_t postings_base = 0;        // the segment's first posting
  const std::uint64_t* table = nullptr;  // (table_size) entries, linear probing
  std::uint32_t table_size = 0;
  std::uint32_t pad = 0;
};

/// Matching's inverted index: a header byte per slot, and per segment the lists of its ads by query bit.
struct PostingsView {
  const std::uint8_t* headers = nullptr;       // (slots rounded up to a whole segment) match_header
  const std::uint16_t* postings = nullptr;     // posting_bits, by segment, then by query bit
  const SegmentDirectory* segments = nullptr;  // (capacity in segments)
};

/// The 32-bit words an ad keeps beside its row, interleaved so that one load fetches them (one
/// record costs one sector where separate arrays would cost one each): the bias, then its scale
/// words at the record's tail: none (fp16), the fp32 scale (int8), or the d / 32 fp16 group scales
/// two to a word (int8_group32). Records are a power of two wide (8 to 32 bytes), so that none
/// straddles a sector and the scale words are aligned for one vector load.
__host__ __device__ constexpr int scale_words(EmbeddingType type, int dim) {
  return type == EmbeddingType::fp16 ? 0 : type == EmbeddingType::int8 ? 1 : dim / 64;
}
__host__ __device__ constexpr int side_width(EmbeddingType type, int dim) {
  int width = 1;
  while (width < 1 + scale_words(type, dim)) width *= 2;
  return width;
}

/// The ad index in device memory; slot i of every array belongs to the same ad.
struct IndexView {
  const std::uint32_t* ids = nullptr;        // (slots)
  const std::uint32_t* targeting = nullptr;  // (slots) targeting_bits
  const std::uint32_t* clauses = nullptr;    // (clause capacity) clause_bits; runs 16-byte aligned, ending with `last`
  const void* embeddings = nullptr;          // (slots, dim) __half or int8
  const float* side = nullptr;               // (slots, side_width): the bias, then the scale words
  PostingsView postings{};
  std::uint32_t slots = 0;                   // high-water mark of used slots
};

/// One request's query: a bit for each (category, value) the user holds, categories laid end to end.
struct QueryView {
  const std::uint32_t* bitmap = nullptr;           // (total_bits / 32)
  const std::uint32_t* category_offsets = nullptr; // (categories) first bit of each category
};

/// Radix-select levels over 64-bit ranking keys: 12 bits a level, the last one 4.
inline constexpr int kTopKLevels = 6;
inline constexpr int kTopKBins = 4096;
__host__ __device__ constexpr int topk_level_shift(int level) { return level < 5 ? 52 - 12 * level : 0; }
__host__ __device__ constexpr int topk_level_bits(int level) { return level < 5 ? 12 : 4; }

/// What can go wrong on the device during a search, as bits of TopKState::overflow, and the
/// answer count that reports it in place of a count of results.
inline constexpr std::uint32_t kOverflowCandidates = 1;  // the candidate buffer was too small (a bug)
inline constexpr std::uint32_t kOverflowVectors = 2;     // u_e or g_e overflowed fp16: features too large
inline constexpr std::uint32_t kCountCandidatesOverflowed = ~0u;
inline constexpr std::uint32_t kCountVectorsOverflowed = ~0u - 1;

/// Top-K's state for one request, in the request's temp storage (zeroed before each request).
struct TopKState {
  std::uint32_t eligible_count;
  std::uint32_t done;               // the threshold is known
  std::uint32_t k_remaining;        // how many of the K lie at or below the resolved prefix
  std::uint32_t candidate_count;
  std::uint32_t overflow;           // kOverflowCandidates | kOverflowVectors, as they happened
  std::uint32_t segments_taken;     // matching's queue of segments, past the grid's first (request 0's, in a batch)
  unsigned long long prefix;        // resolved high bits of the K-th ranking key
  unsigned long long threshold;     // candidates are the keys >= threshold
  std::uint32_t blocks_done[kTopKLevels];  // refine blocks finished per level: the last one selects
  std::uint32_t histogram[kTopKLevels][kTopKBins];
};

/// Float to an unsigned key with the same order; finite scores never map to 0.
__host__ __device__ inline std::uint32_t score_key(float score) {
#if defined(__CUDA_ARCH__)
  const std::uint32_t bits = __float_as_uint(score);
#else
  std::uint32_t bits;
  __builtin_memcpy(&bits, &score, 4);
#endif
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}
__host__ __device__ inline float score_from_key(std::uint32_t key) {
  const std::uint32_t bits = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
#endif
}
/// Larger ranking key = ranks earlier: score descending, then lower id.
__host__ __device__ inline std::uint64_t ranking_key(std::uint32_t key, std::uint32_t id) {
  return (static_cast<std::uint64_t>(key) << 32) | static_cast<std::uint32_t>(~id);
}

}  // namespace kevo::retrieval
