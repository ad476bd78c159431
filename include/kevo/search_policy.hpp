// kevo/search_policy.hpp: the SearchPolicy concept. A policy picks which node to expand next and
// learns from each result. Models: search/mcts.hpp, search/evolutionary.hpp, search/greedy.hpp,
// search/random.hpp.
//
//   kevo::search::Mcts policy;
//   kevo::Expansion next = policy.select(tree, rng);   // expand next.parent (with next.mate)
//   policy.on_expand(tree, child); ... policy.on_result(tree, child);
#pragma once

#include <kevo/search_tree.hpp>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

namespace kevo {

using Rng = std::mt19937_64;

/// Where the next generation starts: a parent and, for crossover, an optional mate. With `repair`,
/// the parent is a failed node and the generation is asked to fix it (its diagnostics carry the
/// trimmed compile errors or the mismatch) rather than to speed it up. The loop passes a repair on
/// only to a synthesizer that repairs (`synthesizer_repairs`); to any other it is a plain expansion.
struct Expansion {
  NodeId parent = 0;
  NodeId mate = no_node;
  bool repair = false;
};

/// Whether a failure is the candidate's own and its code is there to fix: not a generation that
/// produced nothing, nor a sandbox kevo could not set up.
inline constexpr bool repairable(FailureKind f) {
  return f != FailureKind::none && f != FailureKind::generation_failed && f != FailureKind::sandbox_error;
}

/// The repair moves the shipped policies share: failed nodes wait here, and with probability
/// `share` a selection takes one of them (the oldest still open) for repair. A node gets at most
/// `max_tries` repairs, one at a time, and none once one of them is correct. A repair's own failure
/// is a failed try of its parent, not a new node to repair. Off until the loop says its
/// synthesizer repairs (`enable`), so that without one a policy selects exactly as before.
struct RepairMoves {
  double share = 0.2;
  std::uint32_t max_tries = 2;
  bool enabled = false;
  std::vector<NodeId> waiting;  ///< failed nodes that may still be repaired, oldest first

  void on_result(const SearchTree& tree, NodeId node) {
    const Node& n = tree[node];
    if (n.state != NodeState::failed || !repairable(n.failure)) return;
    if (n.parent != no_node && tree[n.parent].state == NodeState::failed) return;  // a try, not a target
    waiting.push_back(node);
  }

  /// A repair expansion, or nothing (the policy then selects as it would otherwise).
  std::optional<Expansion> select(const SearchTree& tree, Rng& rng) {
    if (!enabled || waiting.empty() || share <= 0) return std::nullopt;
    struct ChildStates {
      bool repaired = false, pending = false;
    };
    auto child_states = [&](NodeId id) {
      ChildStates s;
      tree.for_each_child(id, [&](NodeId c) {
        s.repaired |= tree[c].state == NodeState::evaluated;
        s.pending |= tree[c].state == NodeState::pending;
      });
      return s;
    };
    // Drop nodes that are done: repaired, or out of tries with none in flight.
    std::erase_if(waiting, [&](NodeId id) {
      const ChildStates s = child_states(id);
      return s.repaired || (tree[id].child_count >= max_tries && !s.pending);
    });
    if (waiting.empty() || !std::bernoulli_distribution(std::min(share, 1.0))(rng)) return std::nullopt;
    for (NodeId id : waiting)
      if (!child_states(id).pending && tree[id].child_count < max_tries) return Expansion{id, no_node, true};
    return std::nullopt;  // every open one has a repair in flight
  }

  std::size_t memory_bytes() const { return waiting.capacity() * sizeof(NodeId); }
};

namespace detail {
template <class P>
concept policy_selects = requires(P& p, const SearchTree& t, Rng& rng) {
  { p.select(t, rng) } -> std::same_as<Expansion>;
};
template <class P>
concept policy_hears_expansions = requires(P& p, const SearchTree& t, NodeId n) {
  { p.on_expand(t, n) } -> std::same_as<void>;
};
template <class P>
concept policy_hears_results = requires(P& p, const SearchTree& t, NodeId n) {
  { p.on_result(t, n) } -> std::same_as<void>;
};
}  // namespace detail

/// A search policy. Plain synchronous code: the loop calls it from one thread.
/// - `select(tree, rng) -> Expansion`: the node to expand next (called before each generation);
/// - `on_expand(tree, child)`: `child` was just added, pending (MCTS adds virtual loss here);
/// - `on_result(tree, child)`: `child`'s evaluation is now recorded in `tree`.
/// Optional: `void enable_repairs(bool)`, called once by the loop with whether its synthesizer
/// repairs; a policy that then returns `Expansion{failed_node, no_node, true}` asks for a repair.
/// A policy without it is never told, and works as before.
template <class P>
concept SearchPolicy =
    detail::policy_selects<P> && detail::policy_hears_expansions<P> && detail::policy_hears_results<P>;

/// Names the requirement a would-be policy misses (SearchLoop calls this).
template <class P>
constexpr bool check_search_policy() {
  static_assert(detail::policy_selects<P>, "SearchPolicy: missing `Expansion select(const SearchTree&, Rng&)`");
  static_assert(detail::policy_hears_expansions<P>, "SearchPolicy: missing `void on_expand(const SearchTree&, NodeId)`");
  static_assert(detail::policy_hears_results<P>, "SearchPolicy: missing `void on_result(const SearchTree&, NodeId)`");
  return true;
}

/// Tells `policy` whether repairs are worth asking for, if it listens.
template <class P>
void enable_repairs(P& policy, bool on) {
  if constexpr (requires { policy.enable_repairs(on); }) policy.enable_repairs(on);
}

}  // namespace kevo
