// kevo/retrieval/dispatch/index_kernels.cuh: the ad index's updates: ads written into their slots, the clause arena
// compacted, and matching's postings rebuilt (DeviceAdIndex::reindex).
// Thin kernels over the agents (agent/): each maps threads to an agent's work. The pipeline
// (fused_retrieval_pipeline.cuh) and the index (device_ad_index.cuh) launch them.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kevo/retrieval/agent/matching.cuh"
#include "kevo/retrieval/agent/views.cuh"
#include "kevo/retrieval/portability.cuh"
#include "kevo/retrieval/slot_order.hpp"

namespace kevo::retrieval::kernels {

// Every kernel is a template, those with no parameters of their own taking an unused
// `template <class = void>`: a template's host stub may be defined in each translation unit, so two
// .cu files of one program can include this header (a plain __global__ function would be defined
// twice and fail to link). Launch as usual; take an address as `kernel<>`.

// ---- index updates -----------------------------------------------------------------------------

/// Writes a batch of ads into their slots: one warp per ad copies the embedding row and its
/// `scale_words` words of scales (if given).
template <class = void>
__global__ void scatter_ads(std::uint32_t count, const std::uint32_t* slots, const std::uint32_t* ids,
                            const std::uint32_t* targeting, const float* bias, const float* scale,
                            const uint4* rows, int row_vectors, std::uint32_t* index_ids,
                            std::uint32_t* index_targeting, float* index_side, int side_width, int scale_words,
                            uint4* index_embeddings, std::uint8_t* index_headers) {
  const std::uint32_t ad = (blockIdx.x * blockDim.x + threadIdx.x) / gpu_logical_warp_size;
  const int lane = static_cast<int>(threadIdx.x % gpu_logical_warp_size);
  if (ad >= count) return;
  const std::uint32_t slot = slots[ad];
  if (rows)
    for (int i = lane; i < row_vectors; i += gpu_logical_warp_size)
      index_embeddings[static_cast<std::uint64_t>(slot) * row_vectors + i] = rows[static_cast<std::uint64_t>(ad) * row_vectors + i];
  if (lane == 0) {
    if (ids) index_ids[slot] = ids[ad];
    float* side = index_side + static_cast<std::uint64_t>(slot) * side_width;
    if (bias) side[0] = bias[ad];
    if (scale)  // the scale words sit at the record's tail (views.cuh)
      for (int w = 0; w < scale_words; ++w) side[side_width - scale_words + w] = scale[static_cast<std::uint64_t>(ad) * scale_words + w];
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

// ---- slots regrouped by targeting (DeviceAdIndex::regroup) ---------------------------------------

/// Regroup step 1: each slot's targeting_order_key (slot_order.hpp, read off its packed clause run),
/// or ~0 for a slot no live ad holds (no live ad's key is ~0: the sort puts them last, and they are
/// dropped), with the slot itself as the sort's value.
template <class = void>
__global__ void regroup_keys(const std::uint32_t* targeting, const std::uint32_t* clauses, std::uint32_t slots,
                             std::uint64_t* keys, std::uint32_t* slot_of_key) {
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < slots; i += gridDim.x * blockDim.x) {
    const std::uint32_t word = targeting[i];
    std::uint64_t key = ~std::uint64_t{0};
    if (word & targeting_bits::live) {
      TargetingOrderKey order;
      if (word & targeting_bits::has_clauses)
        for_each_clause(clauses, word, [&](std::uint32_t c) {
          order.add((c >> clause_bits::category_shift) & 31u, c & clause_bits::value_mask, (c & clause_bits::exclude) != 0);
        });
      key = order.key();
    }
    keys[i] = key;
    slot_of_key[i] = i;
  }
}

/// Regroup step 2: new slot j takes the ad of old slot from[j], one warp a slot: its row, side
/// record, id and targeting word (its clause run stays where it is in the arena).
template <class = void>
__global__ void regroup_gather(const std::uint32_t* from, std::uint32_t slots, const std::uint32_t* ids,
                               const std::uint32_t* targeting, const float* side, int side_width, const uint4* rows,
                               int row_vectors, std::uint32_t* new_ids, std::uint32_t* new_targeting, float* new_side,
                               uint4* new_rows) {
  const int lane = static_cast<int>(threadIdx.x % gpu_logical_warp_size);
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / gpu_logical_warp_size;
  for (std::uint64_t j = (static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / gpu_logical_warp_size; j < slots; j += warps) {
    const std::uint64_t i = from[j];
    for (int v = lane; v < row_vectors; v += gpu_logical_warp_size) new_rows[j * row_vectors + v] = rows[i * row_vectors + v];
    for (int w = lane; w < side_width; w += gpu_logical_warp_size) new_side[j * side_width + w] = side[i * side_width + w];
    if (lane == 0) {
      new_ids[j] = ids[i];
      new_targeting[j] = targeting[i];
    }
  }
}

}  // namespace kevo::retrieval::kernels
