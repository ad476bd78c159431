// kevo/search/random.hpp: the baseline policy every other is measured against: expand a node
// drawn uniformly from the correct ones.
//
//   kevo::search::Random policy;
//   kevo::SearchLoop loop(problem, synth, policy, memory, evaluator, retriever, args, store);
#pragma once

#include <kevo/search_policy.hpp>

#include <vector>

namespace kevo::search {

class Random {
 public:
  struct Arguments {
    double repair_share = 0.2;  ///< selections spent repairing a failed node, when the synthesizer repairs
  };
  Random() = default;
  explicit Random(Arguments args) { repairs_.share = args.repair_share; }

  void enable_repairs(bool on) { repairs_.enabled = on; }

  Expansion select(const SearchTree& tree, Rng& rng) {
    if (auto repair = repairs_.select(tree, rng)) return *repair;
    if (correct_.empty()) return {tree.root()};
    std::uniform_int_distribution<std::size_t> pick(0, correct_.size() - 1);
    return {correct_[pick(rng)]};
  }
  void on_expand(const SearchTree&, NodeId) {}
  void on_result(const SearchTree& tree, NodeId node) {
    if (tree[node].state == NodeState::evaluated) correct_.push_back(node);
    repairs_.on_result(tree, node);
  }
  std::size_t memory_bytes() const { return correct_.capacity() * sizeof(NodeId) + repairs_.memory_bytes(); }

 private:
  std::vector<NodeId> correct_;  // every evaluated, correct node: the population to draw from
  RepairMoves repairs_;
};

static_assert(SearchPolicy<Random>);

}  // namespace kevo::search
