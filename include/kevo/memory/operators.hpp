// kevo/memory/operators.hpp: the memory operators that ship: what each new generation sees.
//
//   kevo::memory::InheritTrajectory  the path from the root to the parent: how we got here
//   kevo::memory::CompareSiblings    the parent's other children, fastest first: what worked beside
//   kevo::memory::Combined           both
//   kevo::memory::FreshStart         nothing: a clean slate
//   kevo::memory::Adaptive           combined, switching to fresh starts while the search stagnates
#pragma once

#include <kevo/memory_operator.hpp>

#include <algorithm>

namespace kevo::memory {

namespace detail {
/// The last `limit` nodes of the path root .. parent, oldest first.
inline std::vector<NodeId> trajectory(const SearchTree& tree, NodeId parent, std::size_t limit) {
  auto path = tree.path_to(parent);
  if (path.size() > limit) path.erase(path.begin(), path.end() - static_cast<std::ptrdiff_t>(limit));
  return path;
}

/// The parent's finished children: correct ones fastest first, then failures (worth avoiding).
inline std::vector<NodeId> siblings(const SearchTree& tree, NodeId parent, std::size_t limit) {
  std::vector<NodeId> out;
  tree.for_each_child(parent, [&](NodeId c) {
    if (tree[c].state != NodeState::pending) out.push_back(c);
  });
  std::stable_sort(out.begin(), out.end(), [&](NodeId a, NodeId b) { return tree[a].speedup > tree[b].speedup; });
  if (out.size() > limit) out.resize(limit);
  return out;
}
}  // namespace detail

struct InheritTrajectory {
  std::size_t limit = 8;
  MemoryContext context(const SearchTree& tree, NodeId parent) const {
    return {MemoryMode::trajectory, detail::trajectory(tree, parent, limit), {}};
  }
};

struct CompareSiblings {
  std::size_t limit = 8;
  MemoryContext context(const SearchTree& tree, NodeId parent) const {
    return {MemoryMode::siblings, {}, detail::siblings(tree, parent, limit)};
  }
};

struct Combined {
  std::size_t trajectory_limit = 8;
  std::size_t sibling_limit = 8;
  MemoryContext context(const SearchTree& tree, NodeId parent) const {
    return {MemoryMode::combined, detail::trajectory(tree, parent, trajectory_limit),
            detail::siblings(tree, parent, sibling_limit)};
  }
};

struct FreshStart {
  MemoryContext context(const SearchTree&, NodeId) const { return {MemoryMode::fresh, {}, {}}; }
};

/// Combined memory while the search improves; once `patience` results pass without a new best,
/// `fresh_generations` fresh starts in every `patience` results, to escape the local optimum.
/// patience = 0: never fresh (Combined alone).
struct Adaptive {
  std::size_t patience = 12;
  std::size_t fresh_generations = 4;
  Combined combined{};

  MemoryContext context(const SearchTree& tree, NodeId parent) const {
    const std::size_t stale = tree.finished_since_improvement();
    if (patience > 0 && stale >= patience && (stale - patience) % patience < fresh_generations)
      return FreshStart{}.context(tree, parent);
    return combined.context(tree, parent);
  }
};

static_assert(MemoryOperator<InheritTrajectory>);
static_assert(MemoryOperator<CompareSiblings>);
static_assert(MemoryOperator<Combined>);
static_assert(MemoryOperator<FreshStart>);
static_assert(MemoryOperator<Adaptive>);

}  // namespace kevo::memory
