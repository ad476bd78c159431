// kevo/search/any_policy.hpp: one of the shipped policies, chosen at run time by name (a command
// line's --policy), without instantiating the loop once per policy.
//
//   auto policy = kevo::search::make_policy("mcts");   // expected<AnyPolicy, Error>
//   SearchLoop<Synth, kevo::search::AnyPolicy, ...> loop(..., *policy, ...);
#pragma once

#include <kevo/expected.hpp>
#include <kevo/search/evolutionary.hpp>
#include <kevo/search/greedy.hpp>
#include <kevo/search/mcts.hpp>
#include <kevo/search/random.hpp>

#include <fmt/format.h>

#include <string_view>
#include <variant>

namespace kevo::search {

class AnyPolicy {
 public:
  using Variant = std::variant<Mcts, Evolutionary, Greedy, Random>;
  AnyPolicy(Variant policy) : policy_(std::move(policy)) {}

  Expansion select(const SearchTree& tree, Rng& rng) {
    return std::visit([&](auto& p) { return p.select(tree, rng); }, policy_);
  }
  void on_expand(const SearchTree& tree, NodeId n) {
    std::visit([&](auto& p) { p.on_expand(tree, n); }, policy_);
  }
  void on_result(const SearchTree& tree, NodeId n) {
    std::visit([&](auto& p) { p.on_result(tree, n); }, policy_);
  }
  void enable_repairs(bool on) {
    std::visit([&](auto& p) { p.enable_repairs(on); }, policy_);
  }
  std::size_t memory_bytes() const {
    return std::visit([](const auto& p) { return p.memory_bytes(); }, policy_);
  }

 private:
  Variant policy_;
};

static_assert(SearchPolicy<AnyPolicy>);

inline constexpr std::string_view policy_names = "mcts, evolutionary, greedy, random";

/// The shipped policy called `name`, with its default arguments.
/// A shipped policy by name, with its defaults except `repair_share`: the selections it spends on
/// repairing failed nodes when the synthesizer repairs (0 to 1).
inline expected<AnyPolicy, Error> make_policy(std::string_view name, double repair_share = 0.2) {
  if (!(repair_share >= 0 && repair_share <= 1)) return make_error(fmt::format("repair share {} is not between 0 and 1", repair_share));
  if (name == "mcts") return AnyPolicy(Mcts({.repair_share = repair_share}));
  if (name == "evolutionary") return AnyPolicy(Evolutionary({.repair_share = repair_share}));
  if (name == "greedy") return AnyPolicy(Greedy({.repair_share = repair_share}));
  if (name == "random") return AnyPolicy(Random({.repair_share = repair_share}));
  return make_error(fmt::format("unknown policy '{}' (choose one of: {})", name, policy_names));
}

}  // namespace kevo::search
