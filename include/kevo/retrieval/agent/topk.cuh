// kevo/retrieval/agent/topk.cuh: block-level pieces of top-K by radix select over 64-bit ranking
// keys (score key << 32 | ~id, so one order gives score descending, then lower id). Scoring fills
// the level-0 histogram of the top 12 bits; each later level refines only the ads whose key shares
// the resolved prefix, and only while the boundary digit is crowded. Chunks whose maximum key is
// below the prefix are skipped whole, so in the usual case these passes read almost nothing.
//
//   AgentTopKSelect<256>::select(thread_rank, state, level, k, cap, scan_storage);
#pragma once

#include <cstdint>

#include "kevo/retrieval/agent/views.cuh"
#include "kevo/retrieval/portability.cuh"

namespace kevo::retrieval {

/// The largest ranking key an element of a chunk can have, from the chunk's largest score key.
__device__ __forceinline__ std::uint64_t chunk_ranking_bound(std::uint32_t chunk_max_key) {
  return (static_cast<std::uint64_t>(chunk_max_key) << 32) | 0xffffffffull;
}

template <int BlockThreads>
struct AgentTopKSelect {
  static_assert(kTopKBins % BlockThreads == 0, "bins split evenly across the block");
  static constexpr int bins_per_thread = kTopKBins / BlockThreads;
  using Scan = gpu_cub::BlockScan<std::uint32_t, BlockThreads>;
  struct TempStorage {
    typename Scan::TempStorage scan;
  };

  /// Finds the digit at `level` that holds the K-th key; marks the state done when the ads at that
  /// digit number at most `cap` (or no level is left). One block runs this. It reads past L1
  /// (gpu_load_past_l1) what other blocks wrote, which in one cooperative launch may be newer than L1's copy.
  __device__ static void select(int thread_rank, TopKState* state, int level, std::uint32_t k, std::uint32_t cap,
                                TempStorage& storage) {
    if (level == 0 && gpu_load_past_l1(&state->eligible_count) <= k) {
      if (thread_rank == 0) {
        state->threshold = 1ull << 32;  // every eligible ad: key >= 1 (a batch's key 0 marks an ad not eligible)
        state->done = 1;
      }
      return;
    }
    const std::uint32_t k_remaining = level == 0 ? k : gpu_load_past_l1(&state->k_remaining);
    const std::uint32_t* histogram = state->histogram[level];
    // Thread 0 takes the highest bins, so an exclusive sum counts the keys above each range.
    const int top_bin = kTopKBins - 1 - thread_rank * bins_per_thread;
    std::uint32_t sum = 0;
    for (int i = 0; i < bins_per_thread; ++i) sum += gpu_load_past_l1(histogram + top_bin - i);
    std::uint32_t above = 0;
    Scan(storage.scan).ExclusiveSum(sum, above);
    if (above < k_remaining && above + sum >= k_remaining) {
      int bin = top_bin;
      std::uint32_t count = gpu_load_past_l1(histogram + bin);
      while (above + count < k_remaining) {
        above += count;
        count = gpu_load_past_l1(histogram + --bin);
      }
      const unsigned long long previous = level == 0 ? 0ull : gpu_load_past_l1(&state->prefix);
      const unsigned long long prefix = (previous << topk_level_bits(level)) | static_cast<unsigned long long>(bin);
      state->prefix = prefix;
      state->k_remaining = k_remaining - above;
      if (count <= cap || level == kTopKLevels - 1) {
        state->threshold = prefix << topk_level_shift(level);
        state->done = 1;
      }
    }
  }
};

}  // namespace kevo::retrieval
