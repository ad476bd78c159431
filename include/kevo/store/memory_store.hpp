// kevo/store/memory_store.hpp: a SearchStore that keeps everything in this process's memory, for a
// program that embeds the loop on kevo::core alone (no SQLite), and for tests. It records and gives
// back runs as SqliteStore does, so a search in this process can resume or warm-start from it; what it
// cannot do is outlive the process: a search killed with it loses everything (use SqliteStore there).
//
//   auto store = kevo::store::MemoryStore::open();
//   auto loop = kevo::make_search_loop(problem, evaluator, store, {.max_evaluations = 40});
//   auto other = store;  // a second handle on the same store, as a second connection would be
#pragma once

#include <kevo/store.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kevo::store {

class MemoryStore {
 public:
  /// A new, empty store. Copies of it are handles on the same store, safe to use from several threads.
  static expected<MemoryStore, Error> open() { return MemoryStore(); }

  expected<std::int64_t, Error> begin_run(const RunInfo& info) {
    std::lock_guard lock(state_->mutex);
    RunInfo run = info;
    run.id = static_cast<std::int64_t>(state_->runs.size()) + 1;
    run.stopped_because.clear();
    run.best_node = no_key;
    run.verified_speedup = 0;
    state_->runs.push_back(std::move(run));
    return state_->runs.back().id;
  }
  /// Keeps the reference time that the run's speedups are over (a resume reuses it).
  expected<void, Error> set_reference_seconds(std::int64_t run, double seconds) {
    std::lock_guard lock(state_->mutex);
    RunInfo* r = find(run);
    if (!r) return no_run(run);
    r->reference_seconds = seconds;
    return {};
  }
  expected<NodeKey, Error> add_node(std::int64_t run, NodeKey parent, NodeKey mate, const Candidate& c, MemoryMode mode) {
    std::lock_guard lock(state_->mutex);
    if (!find(run)) return no_run(run);
    for (NodeKey k : {parent, mate})
      if (k != no_key && (k < 1 || k > static_cast<NodeKey>(state_->nodes.size())))
        return make_error(fmt::format("memory store: no node {} to be a parent or mate", k));
    Node n;
    n.run = run;
    n.stored = StoredNode{.key = static_cast<NodeKey>(state_->nodes.size()) + 1, .parent = parent, .mate = mate, .candidate = c, .memory_mode = mode};
    state_->nodes.push_back(std::move(n));
    return state_->nodes.back().stored.key;
  }
  /// `settled` is false for a new best's first figure, stored before its race settles it. A node's
  /// second evaluation replaces its first, which keeps its place in the finish order.
  expected<void, Error> add_evaluation(std::int64_t run, NodeKey node, const Evaluation& e, bool settled = true) {
    std::lock_guard lock(state_->mutex);
    if (node < 1 || node > static_cast<NodeKey>(state_->nodes.size()) || state_->nodes[node - 1].run != run)
      return make_error(fmt::format("memory store: run {} has no node {}", run, node));
    StoredNode& n = state_->nodes[node - 1].stored;
    if (!n.evaluation) n.finish_order = ++state_->evaluations;
    n.evaluation = e;
    n.settled = settled;
    return {};
  }
  expected<void, Error> finish_run(std::int64_t run, const std::string& stopped_because, NodeKey best, double verified_speedup) {
    std::lock_guard lock(state_->mutex);
    RunInfo* r = find(run);
    if (!r) return no_run(run);
    r->stopped_because = stopped_because;
    r->best_node = best;
    r->verified_speedup = verified_speedup;
    return {};
  }
  expected<RunInfo, Error> find_run(std::int64_t run) {
    std::lock_guard lock(state_->mutex);
    if (const RunInfo* r = find(run)) return *r;
    return no_run(run);
  }
  expected<RunInfo, Error> latest_run() {
    std::lock_guard lock(state_->mutex);
    if (state_->runs.empty()) return make_error("memory store: holds no run to resume");
    return state_->runs.back();
  }
  /// The latest run of one problem, where a store holds many problems' runs; none: not begun.
  expected<std::optional<RunInfo>, Error> latest_run_of(std::string_view problem) {
    std::lock_guard lock(state_->mutex);
    for (auto r = state_->runs.rbegin(); r != state_->runs.rend(); ++r)
      if (r->problem == problem) return std::optional<RunInfo>(*r);
    return std::optional<RunInfo>();
  }
  /// Every node of a run in creation order, each with its evaluation if it finished.
  expected<std::vector<StoredNode>, Error> load_nodes(std::int64_t run) {
    std::lock_guard lock(state_->mutex);
    std::vector<StoredNode> out;
    for (const Node& n : state_->nodes)
      if (n.run == run) out.push_back(n.stored);
    return out;
  }
  /// The fastest correct candidates that earlier runs of `problem` found (by settled figures), on
  /// whatever target they were measured.
  expected<std::vector<Candidate>, Error> best_of_earlier_runs(const std::string& problem, std::int64_t except_run, std::size_t limit) {
    return best_of_earlier_runs(problem, /*any target:*/ std::string(), except_run, limit);
  }
  /// The same, from runs measured on `target_identity` only; an empty identity takes every target's.
  /// One candidate per source, at its best figure, fastest first (SqliteStore's order).
  expected<std::vector<Candidate>, Error> best_of_earlier_runs(const std::string& problem, const std::string& target_identity,
                                                              std::int64_t except_run, std::size_t limit) {
    std::lock_guard lock(state_->mutex);
    std::map<std::uint64_t, std::pair<double, const Candidate*>> best_by_source;  // by the source's hash, as SQLite's GROUP BY
    for (const Node& n : state_->nodes) {
      const RunInfo& r = state_->runs[n.run - 1];
      const auto& e = n.stored.evaluation;
      if (r.problem != problem || r.id == except_run || !e || !e->ok() || !n.stored.settled) continue;
      if (!target_identity.empty() && r.target_identity != target_identity) continue;
      auto [at, added] = best_by_source.try_emplace(n.stored.candidate.hash(), e->speedup, &n.stored.candidate);
      if (!added && e->speedup > at->second.first) at->second = {e->speedup, &n.stored.candidate};
    }
    std::vector<std::pair<double, const Candidate*>> ranked;
    for (const auto& [hash, best] : best_by_source) ranked.push_back(best);
    std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<Candidate> out;
    for (const auto& [speedup, c] : ranked) {
      if (out.size() == limit) break;
      out.push_back(Candidate{c->source, c->knobs, fmt::format("best of an earlier run ({:.2f}x then)", speedup)});
    }
    return out;
  }

 private:
  struct Node {
    std::int64_t run = 0;
    StoredNode stored;
  };
  struct State {
    std::mutex mutex;
    std::vector<RunInfo> runs;   // run id i at [i - 1]
    std::vector<Node> nodes;     // node key k at [k - 1]
    std::int64_t evaluations = 0;  // the finish order's counter
  };

  MemoryStore() : state_(std::make_shared<State>()) {}
  RunInfo* find(std::int64_t run) {
    return run >= 1 && run <= static_cast<std::int64_t>(state_->runs.size()) ? &state_->runs[run - 1] : nullptr;
  }
  static unexpected<Error> no_run(std::int64_t run) { return make_error(fmt::format("memory store: no run {}", run)); }

  std::shared_ptr<State> state_;
};

static_assert(check_search_store<MemoryStore>());

}  // namespace kevo::store
