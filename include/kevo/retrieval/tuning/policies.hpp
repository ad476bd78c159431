// kevo/retrieval/tuning/policies.hpp: every knob of the retrieval kernels, one plain aggregate per
// kernel, and beside each a description (PolicyDescription): every field's name, its legal domain,
// and whether it is a compile-time choice (a kernel variant per value) or a run-time one (a launch
// argument). Legality, printing, knobs for kevo's search and the kernel variants the pipeline
// instantiates are all derived from that one table. A policy never changes results, only speed.
// Host-only: no CUDA headers.
//
//   ScoringPolicy p{.block_threads = 128, .tiles_per_chunk = 16, .blocks_per_sm = 4};
//   if (!is_legal(p)) reject(p);
//   store_result(to_string(p), timing);          // the printable form is the key for search results
//   auto q = policy_from_knobs<ScoringPolicy>(knobs);   // {"block_threads": "128", ...}, checked
#pragma once

#include <kevo/candidate.hpp>
#include <kevo/expected.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace kevo::retrieval {

/// Index matching: a block takes one postings segment (8192 slots) at a time; `blocks_per_sm`
/// sets how many run on each multiprocessor at once.
struct MatchingPolicy {
  int block_threads = 128;
  static constexpr std::array<int, 3> block_threads_domain{128, 256, 512};  // compile-time variants
  int blocks_per_sm = 8;  // capped by what is resident at once
  static constexpr std::array<int, 4> blocks_per_sm_domain{2, 4, 8, 16};  // run time (grid size)
  // 0: block b takes segments b, b + grid, ... 1: a block that finishes a segment takes the next
  // one nobody has taken (a counter), from the first; 2: the same from the last. A pool grouped by
  // targeting holds a request's work in few segments, so fixed shares leave blocks idle while
  // others finish; and its last segments, whose ads have the most clauses, are the heaviest.
  int segment_queue = 2;
  static constexpr std::array<int, 3> segment_queue_domain{0, 1, 2};  // run time
  // 1: the request's three tower kernels and matching are each launched as a programmatic
  // dependent of the kernel before it, so that none waits a launch gap; 0: ordinary launches. At
  // small pools a search's launches are a visible share of its time (issue 20): 1 saves 1-4 us of
  // the request's preparation on the H200 (RESULTS run 154).
  int launch_after_prior = 1;
  static constexpr std::array<int, 2> launch_after_prior_domain{0, 1};  // run time
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
/// are sorted in shared memory, which bounds the cap.
struct TopKPolicy {
  int boundary_cap = 2048;  // the smallest: one more level refined costs less than sorting more (run 66)
  static constexpr std::array<int, 3> boundary_cap_domain{2048, 4096, 8192};  // run time
  // 0: one block merge-sorts the survivors; 1: each survivor's place is the count of those that
  // rank before it, counted by a few threads of many blocks (more compares, but over many SMs;
  // faster at every N, K and cap measured, by 2 us at K = 1 to 27 us at K = 4096, run 151).
  int sort = 1;
  static constexpr std::array<int, 2> sort_domain{0, 1};  // run time (another kernel)
  // 0: level 0's select, each later level's refine and the compaction are launches of their own;
  // 1: one cooperative launch runs them all, levels apart by grid barriers, stopping at the level
  // that resolves the threshold (at small pools top-K's time is mostly launches, run 150; one
  // launch saves ~7 us at every N and K measured, run 151).
  int one_launch = 1;
  static constexpr std::array<int, 2> one_launch_domain{0, 1};  // run time (another kernel)
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

/// A compile-time field has one kernel variant per value of its domain; a run-time one is an argument.
enum class Binding { compile_time, run_time };

/// What a field trades on, so that a search answers a diagnosis with the fields that address it:
/// how the work spreads over the GPU (parallelism), how the data moves (memory), or either.
enum class Lever { parallelism, memory, either };

template <class Policy>
struct PolicyField {
  std::string_view name;
  int Policy::*member;
  std::span<const int> domain;
  Binding binding;
  Lever lever;
};

/// Specialized for each policy: its `name` and its `fields`, in declaration order.
template <class Policy>
struct PolicyDescription;

template <>
struct PolicyDescription<MatchingPolicy> {
  static constexpr std::string_view name = "matching";
  static constexpr std::array<PolicyField<MatchingPolicy>, 4> fields{{
      {"block_threads", &MatchingPolicy::block_threads, MatchingPolicy::block_threads_domain, Binding::compile_time, Lever::parallelism},
      {"blocks_per_sm", &MatchingPolicy::blocks_per_sm, MatchingPolicy::blocks_per_sm_domain, Binding::run_time, Lever::parallelism},
      {"segment_queue", &MatchingPolicy::segment_queue, MatchingPolicy::segment_queue_domain, Binding::run_time, Lever::parallelism},
      {"launch_after_prior", &MatchingPolicy::launch_after_prior, MatchingPolicy::launch_after_prior_domain, Binding::run_time, Lever::parallelism},
  }};
};

template <>
struct PolicyDescription<ScoringPolicy> {
  static constexpr std::string_view name = "scoring";
  static constexpr std::array<PolicyField<ScoringPolicy>, 5> fields{{
      {"block_threads", &ScoringPolicy::block_threads, ScoringPolicy::block_threads_domain, Binding::compile_time, Lever::parallelism},
      {"tiles_per_chunk", &ScoringPolicy::tiles_per_chunk, ScoringPolicy::tiles_per_chunk_domain, Binding::run_time, Lever::memory},
      {"blocks_per_sm", &ScoringPolicy::blocks_per_sm, ScoringPolicy::blocks_per_sm_domain, Binding::run_time, Lever::parallelism},
      {"tiles_in_flight", &ScoringPolicy::tiles_in_flight, ScoringPolicy::tiles_in_flight_domain, Binding::compile_time, Lever::memory},
      {"stages", &ScoringPolicy::stages, ScoringPolicy::stages_domain, Binding::compile_time, Lever::memory},
  }};
};

template <>
struct PolicyDescription<TopKPolicy> {
  static constexpr std::string_view name = "topk";
  static constexpr std::array<PolicyField<TopKPolicy>, 3> fields{{
      {"boundary_cap", &TopKPolicy::boundary_cap, TopKPolicy::boundary_cap_domain, Binding::run_time, Lever::either},
      {"sort", &TopKPolicy::sort, TopKPolicy::sort_domain, Binding::run_time, Lever::parallelism},
      {"one_launch", &TopKPolicy::one_launch, TopKPolicy::one_launch_domain, Binding::run_time, Lever::parallelism},
  }};
};

template <>
struct PolicyDescription<BatchScoringPolicy> {
  static constexpr std::string_view name = "batch_scoring";
  static constexpr std::array<PolicyField<BatchScoringPolicy>, 4> fields{{
      {"one_pass_from", &BatchScoringPolicy::one_pass_from, BatchScoringPolicy::one_pass_from_domain, Binding::run_time, Lever::either},
      {"stages", &BatchScoringPolicy::stages, BatchScoringPolicy::stages_domain, Binding::compile_time, Lever::memory},
      {"group", &BatchScoringPolicy::group, BatchScoringPolicy::group_domain, Binding::compile_time, Lever::memory},
      {"blocks_per_sm", &BatchScoringPolicy::blocks_per_sm, BatchScoringPolicy::blocks_per_sm_domain, Binding::run_time, Lever::parallelism},
  }};
};

template <class P>
concept DescribedPolicy = requires { PolicyDescription<P>::fields; };

/// The index of the field called `name` in P's description (a compile error where none is).
template <DescribedPolicy P>
consteval std::size_t field_index(std::string_view name) {
  for (std::size_t i = 0; i < PolicyDescription<P>::fields.size(); ++i)
    if (PolicyDescription<P>::fields[i].name == name) return i;
  throw "no such field in this policy";  // not a constant expression: names the mistake at compile time
}

/// Every policy the description allows: the product of its fields' domains, the last field varying
/// fastest. For benchmarks that sweep a stage (kevo's search samples rather than enumerates).
template <DescribedPolicy P>
std::vector<P> every_policy() {
  std::vector<P> policies{P{}};
  for (const PolicyField<P>& field : PolicyDescription<P>::fields) {
    std::vector<P> widened;
    for (const P& p : policies)
      for (int value : field.domain) {
        widened.push_back(p);
        widened.back().*field.member = value;
      }
    policies = std::move(widened);
  }
  return policies;
}

template <DescribedPolicy P>
bool is_legal(const P& p) {
  return std::all_of(PolicyDescription<P>::fields.begin(), PolicyDescription<P>::fields.end(), [&](const PolicyField<P>& f) {
    return std::find(f.domain.begin(), f.domain.end(), p.*f.member) != f.domain.end();
  });
}
inline bool is_legal(const PipelinePolicy& p) {
  return is_legal(p.matching) && is_legal(p.scoring) && is_legal(p.topk) && is_legal(p.batch_scoring);
}

/// "scoring{block_threads=256,tiles_per_chunk=16,...}": every field, in declaration order.
template <DescribedPolicy P>
std::string to_string(const P& p) {
  std::string out(PolicyDescription<P>::name);
  char sep = '{';
  for (const PolicyField<P>& f : PolicyDescription<P>::fields) {
    out += sep;
    out += f.name;
    out += '=';
    out += std::to_string(p.*f.member);
    sep = ',';
  }
  return out + "}";
}
inline std::string to_string(const PipelinePolicy& p) {
  return to_string(p.matching) + " " + to_string(p.scoring) + " " + to_string(p.topk) + " " + to_string(p.batch_scoring);
}

/// The policy as kevo's search sees it: one knob per field, named `prefix` + the field's name.
template <DescribedPolicy P>
Knobs to_knobs(const P& p, std::string_view prefix = {}) {
  Knobs knobs;
  for (const PolicyField<P>& f : PolicyDescription<P>::fields) knobs[std::string(prefix) + std::string(f.name)] = std::to_string(p.*f.member);
  return knobs;
}

/// The policy from knobs named as to_knobs names them; a field with no knob keeps its default.
/// A value that is not a number in the field's domain is an error that names the field and domain.
template <DescribedPolicy P>
expected<P, Error> policy_from_knobs(const Knobs& knobs, std::string_view prefix = {}) {
  P p{};
  for (const PolicyField<P>& f : PolicyDescription<P>::fields) {
    const auto it = knobs.find(std::string(prefix) + std::string(f.name));
    if (it == knobs.end()) continue;
    std::size_t used = 0;
    int value = 0;
    try {
      value = std::stoi(it->second, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != it->second.size() || std::find(f.domain.begin(), f.domain.end(), value) == f.domain.end()) {
      std::string domain;
      for (int v : f.domain) domain += (domain.empty() ? "" : ", ") + std::to_string(v);
      return make_error(std::string(PolicyDescription<P>::name) + "." + std::string(f.name) + " = '" + it->second +
                        "' is not one of {" + domain + "}");
    }
    p.*f.member = value;
  }
  return p;
}

/// Knobs of every stage, prefixed with the stage's name: "scoring.stages".
inline Knobs to_knobs(const PipelinePolicy& p) {
  Knobs knobs;
  auto add = [&](const auto& stage) {
    knobs.merge(to_knobs(stage, std::string(PolicyDescription<std::decay_t<decltype(stage)>>::name) + "."));
  };
  add(p.matching);
  add(p.scoring);
  add(p.topk);
  add(p.batch_scoring);
  return knobs;
}
/// The pipeline's policy from knobs named as to_knobs(PipelinePolicy) names them; a knob that
/// names no field of any stage is an error, so a misspelt or stale knob is never silently dropped.
inline expected<PipelinePolicy, Error> policy_from_knobs(const Knobs& knobs) {
  const Knobs known = to_knobs(PipelinePolicy{});
  for (const auto& [name, value] : knobs)
    if (!known.contains(name)) return make_error("'" + name + "' is not a knob of the retrieval pipeline's policy");
  PipelinePolicy p;
  auto take = [&](auto& stage) -> expected<void, Error> {
    using Stage = std::decay_t<decltype(stage)>;
    auto parsed = policy_from_knobs<Stage>(knobs, std::string(PolicyDescription<Stage>::name) + ".");
    if (!parsed) return unexpected(parsed.error());
    stage = *parsed;
    return {};
  };
  for (auto result : {take(p.matching), take(p.scoring), take(p.topk), take(p.batch_scoring)})
    if (!result) return unexpected(result.error());
  return p;
}

/// Calls f(std::integral_constant<int, v>{}) for every value v of a compile-time field's domain:
/// the kernel variants the pipeline instantiates for that field.
template <DescribedPolicy P, std::size_t Field, class F>
constexpr void for_each_variant_value(F&& f) {
  constexpr PolicyField<P> field = PolicyDescription<P>::fields[Field];
  static_assert(field.binding == Binding::compile_time, "a run-time field has no kernel variants");
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    (f(std::integral_constant<int, field.domain[K]>{}), ...);
  }(std::make_index_sequence<field.domain.size()>{});
}

/// Calls f(std::integral_constant<int, value>{}) for the variant of a compile-time field that
/// `value` selects; false where `value` is outside the domain (then f is not called).
template <DescribedPolicy P, std::size_t Field, class F>
constexpr bool dispatch_variant(int value, F&& f) {
  bool found = false;
  for_each_variant_value<P, Field>([&](auto v) {
    if (v() == value) {
      found = true;
      f(v);
    }
  });
  return found;
}

}  // namespace kevo::retrieval
