// kevo/retrieval/tuning/policies.hpp: every knob of the retrieval kernels, one plain aggregate per
// kernel, each knob's legal domain declared beside it so that kevo's search can sweep them. A
// policy never changes results, only speed. Host-only: no CUDA headers.
//
//   ScoringPolicy p{.block_threads = 128, .tiles_per_chunk = 16, .blocks_per_sm = 4};
//   if (!is_legal(p)) reject(p);
//   store_result(to_string(p), timing);   // the printable form is the key for search results
#pragma once

#include <algorithm>
#include <array>
#include <string>

namespace kevo::retrieval {

/// Index matching: a block takes one postings segment (8192 slots) at a time; `blocks_per_sm`
/// sets how many run on each multiprocessor at once.
struct MatchingPolicy {
  int block_threads = 128;
  static constexpr std::array<int, 3> block_threads_domain{128, 256, 512};  // compile-time variants
  int blocks_per_sm = 8;  // capped by what is resident at once
  static constexpr std::array<int, 4> blocks_per_sm_domain{2, 4, 8, 16};  // run time (grid size)
  friend bool operator==(const MatchingPolicy&, const MatchingPolicy&) = default;
};

/// Fused MoE-gated scoring: each warp scores tiles of 16 eligible ads with mma.sync; a chunk of
/// `tiles_per_chunk` tiles shares one maximum that top-K uses to skip whole chunks.
struct ScoringPolicy {
  int block_threads = 256;
  static constexpr std::array<int, 2> block_threads_domain{128, 256};  // compile-time variants
  int tiles_per_chunk = 16;
  static constexpr std::array<int, 4> tiles_per_chunk_domain{4, 8, 16, 32};  // run time
  int blocks_per_sm = 8;  // capped by what is resident at once
  static constexpr std::array<int, 6> blocks_per_sm_domain{1, 2, 3, 4, 6, 8};  // run time (grid size)
  int tiles_in_flight = 2;  // with stages = 0: tiles whose loads a warp holds in registers at once
  static constexpr std::array<int, 2> tiles_in_flight_domain{1, 2};  // compile-time variants
  int stages = 2;  // > 0: pairs of tiles a warp streams into shared memory ahead of scoring (cp.async)
  static constexpr std::array<int, 4> stages_domain{0, 2, 3, 4};  // compile-time variants
  friend bool operator==(const ScoringPolicy&, const ScoringPolicy&) = default;
};

/// Top-K: radix select over (score, id) keys, 12 bits a level; a level is refined only while the
/// boundary digit holds more than `boundary_cap` ads, then the survivors (at most K + boundary_cap)
/// are sorted by one block in shared memory, which bounds the cap.
struct TopKPolicy {
  int boundary_cap = 2048;  // the smallest: one more level refined costs less than sorting more (run 66)
  static constexpr std::array<int, 3> boundary_cap_domain{2048, 4096, 8192};  // run time
  friend bool operator==(const TopKPolicy&, const TopKPolicy&) = default;
};

/// Batched scoring (search_batch_async): a warp scores each pair of tiles against the batch's
/// requests `group` at a time, its rows loaded into registers (`stages` = 0) or streamed through a
/// two-stage cp.async ring (2). Blocks are 128 threads; the batch's fragments take 32 KB of each.
/// search_batch takes the one-pass path for groups of at least `one_pass_from` requests and
/// searches smaller ones one by one (16: never; int8's default, where one pass was slower, run 32).
struct BatchScoringPolicy {
  int one_pass_from = 2;
  static constexpr std::array<int, 4> one_pass_from_domain{2, 4, 8, 16};  // run time
  int stages = 0;
  static constexpr std::array<int, 2> stages_domain{0, 2};  // compile-time variants
  int group = 1;
  static constexpr std::array<int, 2> group_domain{1, 2};  // compile-time variants
  int blocks_per_sm = 8;  // capped by what is resident at once
  static constexpr std::array<int, 4> blocks_per_sm_domain{1, 2, 4, 8};  // run time (grid size)
  friend bool operator==(const BatchScoringPolicy&, const BatchScoringPolicy&) = default;
};

/// All the pipeline's knobs together.
struct PipelinePolicy {
  MatchingPolicy matching{};
  ScoringPolicy scoring{};
  TopKPolicy topk{};
  BatchScoringPolicy batch_scoring{};
  friend bool operator==(const PipelinePolicy&, const PipelinePolicy&) = default;
};

namespace detail {
template <class T, std::size_t N>
bool in_domain(int value, const std::array<T, N>& domain) {
  return std::find(domain.begin(), domain.end(), value) != domain.end();
}
}  // namespace detail

inline bool is_legal(const MatchingPolicy& p) {
  return detail::in_domain(p.block_threads, MatchingPolicy::block_threads_domain) &&
         detail::in_domain(p.blocks_per_sm, MatchingPolicy::blocks_per_sm_domain);
}
inline bool is_legal(const ScoringPolicy& p) {
  return detail::in_domain(p.block_threads, ScoringPolicy::block_threads_domain) &&
         detail::in_domain(p.tiles_per_chunk, ScoringPolicy::tiles_per_chunk_domain) &&
         detail::in_domain(p.blocks_per_sm, ScoringPolicy::blocks_per_sm_domain) &&
         detail::in_domain(p.tiles_in_flight, ScoringPolicy::tiles_in_flight_domain) &&
         detail::in_domain(p.stages, ScoringPolicy::stages_domain);
}
inline bool is_legal(const TopKPolicy& p) { return detail::in_domain(p.boundary_cap, TopKPolicy::boundary_cap_domain); }
inline bool is_legal(const BatchScoringPolicy& p) {
  return detail::in_domain(p.one_pass_from, BatchScoringPolicy::one_pass_from_domain) &&
         detail::in_domain(p.stages, BatchScoringPolicy::stages_domain) &&
         detail::in_domain(p.group, BatchScoringPolicy::group_domain) &&
         detail::in_domain(p.blocks_per_sm, BatchScoringPolicy::blocks_per_sm_domain);
}
inline bool is_legal(const PipelinePolicy& p) {
  return is_legal(p.matching) && is_legal(p.scoring) && is_legal(p.topk) && is_legal(p.batch_scoring);
}

inline std::string to_string(const MatchingPolicy& p) {
  return "matching{block_threads=" + std::to_string(p.block_threads) +
         ",blocks_per_sm=" + std::to_string(p.blocks_per_sm) + "}";
}
inline std::string to_string(const ScoringPolicy& p) {
  return "scoring{block_threads=" + std::to_string(p.block_threads) + ",tiles_per_chunk=" +
         std::to_string(p.tiles_per_chunk) + ",blocks_per_sm=" + std::to_string(p.blocks_per_sm) +
         ",tiles_in_flight=" + std::to_string(p.tiles_in_flight) + ",stages=" + std::to_string(p.stages) + "}";
}
inline std::string to_string(const TopKPolicy& p) {
  return "topk{boundary_cap=" + std::to_string(p.boundary_cap) + "}";
}
inline std::string to_string(const BatchScoringPolicy& p) {
  return "batch_scoring{one_pass_from=" + std::to_string(p.one_pass_from) + ",stages=" + std::to_string(p.stages) +
         ",group=" + std::to_string(p.group) +
         ",blocks_per_sm=" + std::to_string(p.blocks_per_sm) + "}";
}
inline std::string to_string(const PipelinePolicy& p) {
  return to_string(p.matching) + " " + to_string(p.scoring) + " " + to_string(p.topk) + " " + to_string(p.batch_scoring);
}

}  // namespace kevo::retrieval
