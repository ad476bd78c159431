// kevo/search/mcts.hpp: Monte Carlo tree search over implementations. UCT picks the child to
// descend into; progressive widening decides when a node gets a new child instead; virtual loss
// makes parallel selections spread out rather than pile onto one path.
//
//   kevo::search::Mcts policy({.exploration = 0.25, .widening_constant = 1.5, .widening_exponent = 0.3});
#pragma once

#include <kevo/search_policy.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

namespace kevo::search {

class Mcts {
 public:
  struct Arguments {
    double exploration = 0.25;       ///< UCT's c: higher explores more
    double widening_constant = 1.5;  ///< a node may have ceil(k * visits^alpha) children...
    double widening_exponent = 0.3;  ///< ...so it widens as it proves itself
    bool follow_improvements = true;  ///< widen a node only while none of its subtrees beats it
    double repair_share = 0.2;        ///< selections spent repairing a failed node, when the synthesizer repairs
  };
  Mcts() = default;
  explicit Mcts(Arguments args) : args_(args) { repairs_.share = args.repair_share; }

  void enable_repairs(bool on) { repairs_.enabled = on; }

  Expansion select(const SearchTree& tree, Rng& rng) {
    grow(tree.size());
    if (auto repair = repairs_.select(tree, rng)) return *repair;
    const double best = std::max(tree.best_speedup(), 1e-9);
    NodeId node = tree.root();
    for (;;) {
      const Node& n = tree[node];
      const double visits = stats_[node].visits + stats_[node].virtual_loss;
      const double allowed = std::ceil(args_.widening_constant * std::pow(std::max(visits, 1.0), args_.widening_exponent));
      // A node whose subtree already holds something faster than itself has shown the way: descend
      // there rather than widen. Otherwise widen while progressive widening allows.
      const bool improved_below = args_.follow_improvements && stats_[node].subtree_best > n.speedup;
      // A failed node (a repaired seed, a repaired candidate) is never widened: only its correct
      // repairs lead on.
      if (n.state != NodeState::failed && n.child_count < allowed && !improved_below) return {node};

      // UCT over the children that can be descended into (correct ones, and failed ones whose
      // repairs are correct); a pending child counts
      // as a visit that scored nothing (virtual loss), so concurrent selections diverge.
      NodeId chosen = no_node;
      double chosen_value = -1;
      const double log_parent = std::log(std::max(visits, 1.0));
      tree.for_each_child(node, [&](NodeId c) {
        if (tree[c].state != NodeState::evaluated && !(tree[c].state == NodeState::failed && stats_[c].subtree_best > 0)) return;
        const Stats& s = stats_[c];
        const double n_c = s.visits + s.virtual_loss;
        const double exploitation = (s.subtree_best / best) * (s.visits / n_c);
        const double value = exploitation + args_.exploration * std::sqrt(log_parent / n_c) +
                             1e-9 * std::uniform_real_distribution<double>(0, 1)(rng);  // random tie-break
        if (value > chosen_value) chosen_value = value, chosen = c;
      });
      if (chosen == no_node) {  // every child pending or failed: widen here (or, below a failed node, at the root)
        if (n.state == NodeState::failed && node != tree.root()) return {tree.root()};
        return {node};
      }
      node = chosen;
    }
  }

  void on_expand(const SearchTree& tree, NodeId child) {
    grow(tree.size());
    for (NodeId n = child; n != no_node; n = tree[n].parent) ++stats_[n].virtual_loss;
  }

  void on_result(const SearchTree& tree, NodeId child) {
    grow(tree.size());
    const Node& c = tree[child];
    // Every node but the root came from an expansion (live, or replayed on resume) whose virtual
    // loss its result settles; the root is only evaluated. (Telling them apart by a virtual loss
    // above 0 failed on resume, where the children's expansions are replayed before the root's
    // result: the root then lost one it never had, and wrapped to 2^32 - 1.)
    const bool expanded = child != tree.root();
    for (NodeId n = child; n != no_node; n = tree[n].parent) {
      Stats& s = stats_[n];
      if (expanded) --s.virtual_loss;
      ++s.visits;
      s.subtree_best = std::max(s.subtree_best, c.speedup);
    }
    repairs_.on_result(tree, child);
  }

  std::size_t memory_bytes() const { return stats_.capacity() * sizeof(Stats) + repairs_.memory_bytes(); }

 private:
  struct Stats {
    std::uint32_t visits = 0;
    std::uint32_t virtual_loss = 0;  ///< expansions below this node still in flight
    float subtree_best = 0;          ///< max-backup: this is a search for the best, not the mean
  };
  void grow(std::size_t n) {
    if (stats_.size() < n) stats_.resize(n);
  }

  Arguments args_;
  std::vector<Stats> stats_;
  RepairMoves repairs_;
};

static_assert(SearchPolicy<Mcts>);

}  // namespace kevo::search
