// kevo/search/greedy.hpp: greedy best-first: always expand the fastest correct node that still has
// room for children, so the search digs where the speed is.
//
//   kevo::search::Greedy policy({.max_children = 8});
#pragma once

#include <kevo/search_policy.hpp>

#include <queue>
#include <vector>

namespace kevo::search {

class Greedy {
 public:
  struct Arguments {
    std::uint32_t max_children = 8;  ///< a node this expanded is left for the next best
    double repair_share = 0.2;       ///< selections spent repairing a failed node, when the synthesizer repairs
  };
  Greedy() = default;
  explicit Greedy(Arguments args) : args_(args) { repairs_.share = args.repair_share; }

  void enable_repairs(bool on) { repairs_.enabled = on; }

  Expansion select(const SearchTree& tree, Rng& rng) {
    if (auto repair = repairs_.select(tree, rng)) return *repair;
    // Children only grow, so a node found full is full for good: drop it from the frontier.
    while (!frontier_.empty() && tree[frontier_.top().node].child_count >= args_.max_children) frontier_.pop();
    return {frontier_.empty() ? tree.root() : frontier_.top().node};
  }
  void on_expand(const SearchTree&, NodeId) {}
  void on_result(const SearchTree& tree, NodeId node) {
    if (tree[node].state == NodeState::evaluated) frontier_.push({tree[node].speedup, node});
    repairs_.on_result(tree, node);
  }
  std::size_t memory_bytes() const { return frontier_.size() * sizeof(Entry) + repairs_.memory_bytes(); }

 private:
  struct Entry {
    float speedup;
    NodeId node;
    bool operator<(const Entry& o) const { return speedup < o.speedup || (speedup == o.speedup && node > o.node); }
  };
  Arguments args_;
  std::priority_queue<Entry> frontier_;
  RepairMoves repairs_;
};

static_assert(SearchPolicy<Greedy>);

}  // namespace kevo::search
