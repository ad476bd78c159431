// kevo/store.hpp: the SearchStore concept: where trees, candidates, evaluations and run settings
// persist, so a search killed at any moment resumes without losing a finished evaluation.
// Models: store/sqlite_store.hpp (one file, the default), store/postgres_store.hpp (a history
// shared on a PostgreSQL server), store/memory_store.hpp (this process only, no dependency).
//
//   auto store = kevo::store::SqliteStore::open("search.db");
//   auto run = store->begin_run({.problem = "cpu_scoring", .settings_json = "{}"});
//   auto key = store->add_node(*run, parent_key, no_key, candidate, MemoryMode::combined);
#pragma once

#include <kevo/candidate.hpp>
#include <kevo/detail/member_named.hpp>
#include <kevo/expected.hpp>
#include <kevo/memory_operator.hpp>

#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

KEVO_DETAIL_MEMBER_NAMED(set_reference_seconds)

namespace kevo {

/// A store's own key for a node (stable across resumes, unlike tree ids).
using NodeKey = std::int64_t;
inline constexpr NodeKey no_key = 0;

struct RunInfo {
  std::int64_t id = 0;
  std::string problem;          ///< the problem's name
  std::string problem_dir;      ///< where it was loaded from
  std::string settings_json;    ///< the run's settings, as the caller wrote them
  std::string stopped_because;  ///< empty while the run is unfinished
  std::string problem_identity = {};  ///< Problem::identity() when it began; empty in stores older than it
  double reference_seconds = 0;       ///< the reference's time that the run's speedups are over; 0: not stored
  NodeKey best_node = no_key;         ///< once finished: the best node, whose figure was verified
  double verified_speedup = 0;        ///< once finished: the best's figure, re-checked and re-timed
  /// What the figures were measured on: the target, the device and the compiler, as the evaluator's
  /// `target_identity()` says ("cuda; gpu: NVIDIA H200, 9.0; nvcc ..."); empty: unknown (older stores).
  std::string target_identity = {};
};

/// A node as stored: its candidate, and its evaluation once finished.
struct StoredNode {
  NodeKey key = no_key;
  NodeKey parent = no_key;      ///< no_key for the root
  NodeKey mate = no_key;
  Candidate candidate;
  MemoryMode memory_mode = MemoryMode::fresh;
  std::optional<Evaluation> evaluation;
  std::int64_t finish_order = 0;  ///< evaluations replay in the order they finished
  /// False for a new best's first figure while its side-by-side race had not settled it (a kill
  /// during the race): resume does not trust that figure, and races the node again.
  bool settled = true;
};

namespace detail {
// One concept a member, so that check_search_store() names the one that is missing.
template <class S>
concept store_begins_runs = requires(S& s, const RunInfo& info) {
  { s.begin_run(info) } -> std::same_as<expected<std::int64_t, Error>>;
};
template <class S>
concept store_adds_nodes = requires(S& s, std::int64_t run, NodeKey key, const Candidate& c) {
  { s.add_node(run, key, key, c, MemoryMode::fresh) } -> std::same_as<expected<NodeKey, Error>>;
};
template <class S>
concept store_adds_evaluations = requires(S& s, std::int64_t run, NodeKey key, const Evaluation& e) {
  { s.add_evaluation(run, key, e) } -> std::same_as<expected<void, Error>>;
};
template <class S>
concept store_finishes_runs = requires(S& s, std::int64_t run, NodeKey key, const std::string& text) {
  { s.finish_run(run, text, key, 1.0) } -> std::same_as<expected<void, Error>>;
};
template <class S>
concept store_finds_runs = requires(S& s, std::int64_t run) {
  { s.find_run(run) } -> std::same_as<expected<RunInfo, Error>>;
  { s.latest_run() } -> std::same_as<expected<RunInfo, Error>>;
};
template <class S>
concept store_loads_nodes = requires(S& s, std::int64_t run) {
  { s.load_nodes(run) } -> std::same_as<expected<std::vector<StoredNode>, Error>>;
};
template <class S>
concept store_warm_starts = requires(S& s, std::int64_t run, const std::string& text) {
  { s.best_of_earlier_runs(text, run, std::size_t{}) } -> std::same_as<expected<std::vector<Candidate>, Error>>;
};
// The optional forms, each as the loop calls it.
template <class S>
concept store_keeps_reference_seconds = requires(S& s, std::int64_t run) {
  { s.set_reference_seconds(run, 1.0) } -> std::same_as<expected<void, Error>>;
};
template <class S>
concept store_marks_unsettled = requires(S& s, std::int64_t run, NodeKey key, const Evaluation& e) {
  { s.add_evaluation(run, key, e, false) } -> std::same_as<expected<void, Error>>;
};
template <class S>
concept store_warm_starts_by_target = requires(S& s, std::int64_t run, const std::string& text) {
  { s.best_of_earlier_runs(text, text, run, std::size_t{}) } -> std::same_as<expected<std::vector<Candidate>, Error>>;
};
template <class S>
concept store_records = store_begins_runs<S> && store_adds_nodes<S> && store_adds_evaluations<S> && store_finishes_runs<S>;
template <class S>
concept store_resumes = store_finds_runs<S> && store_loads_nodes<S> && store_warm_starts<S>;
}  // namespace detail

/// Records a run as it goes (`begin_run`, `add_node`, `add_evaluation`, `finish_run`) and gives it
/// back to resume it (`find_run`, `latest_run`, `load_nodes`) or to warm-start a later run
/// (`best_of_earlier_runs`). Every call is durable when it returns. `add_evaluation` for a node
/// that already has one replaces it, keeping its place in the finish order: a new best is stored
/// as first measured, then again once re-timed side by side.
///
/// Optional, where a model has them (the loop uses the forms below, detail::store_keeps_reference_seconds
/// and its neighbours; a `set_reference_seconds` of another shape fails check_search_store, naming it):
/// - `expected<void, Error> add_evaluation(run, key, e, bool settled)`, which marks a figure not yet
///   settled by its race;
/// - `expected<void, Error> set_reference_seconds(std::int64_t run, double seconds)`, which keeps the
///   reference time a run's speedups are over;
/// - `best_of_earlier_runs(problem, target_identity, run, count)`, which warm-starts only from runs
///   measured on that target (an empty identity: any target, as the three-argument form always does).
template <class S>
concept SearchStore = detail::store_records<S> && detail::store_resumes<S>;

template <class S>
constexpr bool check_search_store() {
  static_assert(detail::store_begins_runs<S>, "SearchStore: missing `expected<std::int64_t, Error> begin_run(const RunInfo&)`");
  static_assert(detail::store_adds_nodes<S>,
                "SearchStore: missing `expected<NodeKey, Error> add_node(std::int64_t run, NodeKey parent, NodeKey mate, const Candidate&, MemoryMode)`");
  static_assert(detail::store_adds_evaluations<S>,
                "SearchStore: missing `expected<void, Error> add_evaluation(std::int64_t run, NodeKey, const Evaluation&)`");
  static_assert(detail::store_finishes_runs<S>,
                "SearchStore: missing `expected<void, Error> finish_run(std::int64_t run, const std::string& why, NodeKey best, double verified_speedup)`");
  static_assert(detail::store_finds_runs<S>,
                "SearchStore: missing `expected<RunInfo, Error> find_run(std::int64_t)` or `expected<RunInfo, Error> latest_run()`");
  static_assert(detail::store_loads_nodes<S>, "SearchStore: missing `expected<std::vector<StoredNode>, Error> load_nodes(std::int64_t run)`");
  static_assert(detail::store_warm_starts<S>,
                "SearchStore: missing `expected<std::vector<Candidate>, Error> best_of_earlier_runs(const std::string& problem, std::int64_t run, std::size_t count)`");
  static_assert(!detail::has_member_named_set_reference_seconds<S> || detail::store_keeps_reference_seconds<S>,
                "SearchStore: the optional hook `set_reference_seconds` must be `expected<void, Error> "
                "set_reference_seconds(std::int64_t run, double seconds)`: this one has another shape, and the loop would never call it");
  return true;
}

}  // namespace kevo
