// kevo/search_policy.hpp: the SearchPolicy concept. A policy picks which node to expand next and
// learns from each result. Models: search/mcts.hpp, search/evolutionary.hpp, search/greedy.hpp,
// search/random.hpp.
//
//   kevo::search::Mcts policy;
//   kevo::Expansion next = policy.select(tree, rng);   // expand next.parent (with next.mate)
//   policy.on_expand(tree, child); ... policy.on_result(tree, child);
#pragma once

#include <kevo/search_tree.hpp>

#include <concepts>
#include <random>

namespace kevo {

using Rng = std::mt19937_64;

/// Where the next generation starts: a parent and, for crossover, an optional mate.
struct Expansion {
  NodeId parent = 0;
  NodeId mate = no_node;
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

}  // namespace kevo
