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
  Expansion select(const SearchTree& tree, Rng& rng) {
    if (correct_.empty()) return {tree.root()};
    std::uniform_int_distribution<std::size_t> pick(0, correct_.size() - 1);
    return {correct_[pick(rng)]};
  }
  void on_expand(const SearchTree&, NodeId) {}
  void on_result(const SearchTree& tree, NodeId node) {
    if (tree[node].state == NodeState::evaluated) correct_.push_back(node);
  }
  std::size_t memory_bytes() const { return correct_.capacity() * sizeof(NodeId); }

 private:
  std::vector<NodeId> correct_;  // every evaluated, correct node: the population to draw from
};

static_assert(SearchPolicy<Random>);

}  // namespace kevo::search
