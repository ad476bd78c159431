// kevo/search_tree.hpp: the tree of candidates a search explores. Node 0 is the root, the seed
// implementation; every other node was generated from its parent (and maybe a mate).
//
//   kevo::SearchTree tree;                       // holds the root
//   auto child = tree.add_child(tree.root());    // pending until its evaluation is recorded
//   tree.record(child, FailureKind::none, 3.2, Bottleneck::memory);
#pragma once

#include <kevo/candidate.hpp>

#include <cassert>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace kevo {

using NodeId = std::uint32_t;
inline constexpr NodeId no_node = std::numeric_limits<NodeId>::max();

enum class NodeState : std::uint8_t { pending, evaluated, failed };

/// One node, kept small (a search may hold millions): children are an intrusive list.
struct Node {
  NodeId parent = no_node;
  NodeId first_child = no_node;
  NodeId next_sibling = no_node;
  std::uint32_t child_count = 0;
  std::uint32_t depth = 0;
  float speedup = 0;                        ///< over the reference; 0 while pending or failed
  NodeState state = NodeState::pending;
  FailureKind failure = FailureKind::none;
  Bottleneck bottleneck = Bottleneck::unknown;
};

class SearchTree {
 public:
  SearchTree() { nodes_.push_back(Node{}); }

  NodeId root() const { return 0; }
  std::size_t size() const { return nodes_.size(); }
  const Node& operator[](NodeId id) const { return nodes_[id]; }

  /// Adds a pending child of `parent` and returns its id (ids are dense, in creation order).
  NodeId add_child(NodeId parent) {
    assert(parent < nodes_.size());
    const auto id = static_cast<NodeId>(nodes_.size());
    Node child;
    child.parent = parent;
    child.depth = nodes_[parent].depth + 1;
    child.next_sibling = nodes_[parent].first_child;
    nodes_.push_back(child);
    nodes_[parent].first_child = id;
    ++nodes_[parent].child_count;
    return id;
  }

  /// Records a finished evaluation. A failed node keeps speedup 0.
  void record(NodeId id, FailureKind failure, double speedup, Bottleneck bottleneck) {
    Node& n = nodes_[id];
    n.failure = failure;
    n.bottleneck = bottleneck;
    n.state = failure == FailureKind::none ? NodeState::evaluated : NodeState::failed;
    n.speedup = failure == FailureKind::none ? static_cast<float>(speedup) : 0.0f;
    ++finished_;
    if (n.state == NodeState::evaluated && n.speedup > nodes_[best_].speedup) {
      best_ = id;
      best_found_at_ = finished_;
    }
  }

  /// The evaluated node with the highest speedup (the root until something beats it).
  NodeId best() const { return best_; }
  double best_speedup() const { return nodes_[best_].speedup; }
  std::size_t finished() const { return finished_; }
  /// Finished nodes since the best was last improved: the stagnation signal.
  std::size_t finished_since_improvement() const { return finished_ - best_found_at_; }

  /// Calls f(child) for each child of `id`, newest first.
  template <class F>
  void for_each_child(NodeId id, F&& f) const {
    for (NodeId c = nodes_[id].first_child; c != no_node; c = nodes_[c].next_sibling) f(c);
  }

  /// The path from the root down to `id`, both included.
  std::vector<NodeId> path_to(NodeId id) const {
    std::vector<NodeId> path;
    for (NodeId n = id; n != no_node; n = nodes_[n].parent) path.push_back(n);
    return {path.rbegin(), path.rend()};
  }

  std::span<const Node> nodes() const { return nodes_; }

  /// Bytes the tree holds, for the benchmark of searches that run for days.
  std::size_t memory_bytes() const { return nodes_.capacity() * sizeof(Node); }

 private:
  std::vector<Node> nodes_;
  NodeId best_ = 0;
  std::size_t finished_ = 0;
  std::size_t best_found_at_ = 0;
};

}  // namespace kevo
