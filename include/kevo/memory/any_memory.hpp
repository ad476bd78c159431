// kevo/memory/any_memory.hpp: one of the shipped memory operators, chosen at run time by name.
//
//   auto memory = kevo::memory::make_memory("adaptive");   // expected<AnyMemory, Error>
#pragma once

#include <kevo/expected.hpp>
#include <kevo/memory/operators.hpp>

#include <fmt/format.h>

#include <variant>

namespace kevo::memory {

class AnyMemory {
 public:
  using Variant = std::variant<Adaptive, Combined, InheritTrajectory, CompareSiblings, FreshStart>;
  AnyMemory(Variant memory) : memory_(std::move(memory)) {}

  MemoryContext context(const SearchTree& tree, NodeId parent) const {
    return std::visit([&](const auto& m) { return m.context(tree, parent); }, memory_);
  }

 private:
  Variant memory_;
};

static_assert(MemoryOperator<AnyMemory>);

inline constexpr std::string_view memory_names = "adaptive, combined, trajectory, siblings, fresh";

inline expected<AnyMemory, Error> make_memory(std::string_view name) {
  if (name == "adaptive") return AnyMemory(Adaptive{});
  if (name == "combined") return AnyMemory(Combined{});
  if (name == "trajectory") return AnyMemory(InheritTrajectory{});
  if (name == "siblings") return AnyMemory(CompareSiblings{});
  if (name == "fresh") return AnyMemory(FreshStart{});
  return make_error(fmt::format("unknown memory operator '{}' (choose one of: {})", name, memory_names));
}

}  // namespace kevo::memory
