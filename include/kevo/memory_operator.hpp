// kevo/memory_operator.hpp: the MemoryOperator concept. A memory operator decides what a new
// generation sees of the tree: its parent's trajectory, its siblings, both, or nothing.
// Models: memory/operators.hpp.
//
//   kevo::memory::CompareSiblings memory;
//   kevo::MemoryContext ctx = memory.context(tree, parent);
#pragma once

#include <kevo/search_tree.hpp>

#include <concepts>
#include <string_view>
#include <vector>

namespace kevo {

enum class MemoryMode : std::uint8_t { trajectory, siblings, combined, fresh };

inline constexpr std::string_view to_string(MemoryMode m) {
  switch (m) {
    case MemoryMode::trajectory: return "trajectory";
    case MemoryMode::siblings: return "siblings";
    case MemoryMode::combined: return "combined";
    case MemoryMode::fresh: return "fresh";
  }
  return "?";
}

/// What of the tree a generation sees, as node ids; the loop resolves them into attempts.
struct MemoryContext {
  MemoryMode mode = MemoryMode::fresh;
  std::vector<NodeId> trajectory;  ///< root .. parent, oldest first
  std::vector<NodeId> siblings;    ///< finished children of the parent, fastest first
};

namespace detail {
template <class M>
concept memory_gives_context = requires(M& m, const SearchTree& t, NodeId parent) {
  { m.context(t, parent) } -> std::same_as<MemoryContext>;
};
}  // namespace detail

/// A memory operator: `context(tree, parent) -> MemoryContext`, plain synchronous code.
template <class M>
concept MemoryOperator = detail::memory_gives_context<M>;

template <class M>
constexpr bool check_memory_operator() {
  static_assert(detail::memory_gives_context<M>,
                "MemoryOperator: missing `MemoryContext context(const SearchTree&, NodeId parent)`");
  return true;
}

}  // namespace kevo
