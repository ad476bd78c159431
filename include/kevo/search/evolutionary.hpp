// kevo/search/evolutionary.hpp: an island-model evolutionary search. Each island keeps a small
// elite population; parents come from tournaments, a mate for crossover now and then, and the
// islands swap their best every so often so good ideas spread without collapsing diversity.
//
//   kevo::search::Evolutionary policy({.islands = 4, .population = 8, .crossover_rate = 0.3});  // long runs
#pragma once

#include <kevo/search_policy.hpp>

#include <algorithm>
#include <vector>

namespace kevo::search {

class Evolutionary {
 public:
  struct Arguments {
    // The defaults suit budgets of tens of evaluations (benchmarks/RESULTS.md); long searches
    // gain from more islands and larger populations.
    std::uint32_t islands = 2;
    std::uint32_t population = 4;         ///< elite kept per island
    std::uint32_t tournament = 3;
    double crossover_rate = 0.3;          ///< chance that a selection also names a mate
    std::uint32_t migration_interval = 16;  ///< results between migrations (0: islands never migrate)
    double repair_share = 0.2;            ///< selections spent repairing a failed node, when the synthesizer repairs
  };
  Evolutionary() : Evolutionary(Arguments{}) {}
  explicit Evolutionary(Arguments args) : args_(args), islands_(std::max<std::uint32_t>(args.islands, 1)) {
    repairs_.share = args.repair_share;
  }

  void enable_repairs(bool on) { repairs_.enabled = on; }

  Expansion select(const SearchTree& tree, Rng& rng) {
    if (auto repair = repairs_.select(tree, rng)) return *repair;
    next_island_ = (next_island_ + 1) % islands_.size();
    const auto& island = islands_[next_island_];
    if (island.empty()) return {tree.root()};
    Expansion e{tournament(tree, island, rng)};
    if (island.size() > 1 && std::bernoulli_distribution(args_.crossover_rate)(rng)) {
      NodeId mate = tournament(tree, island, rng);
      if (mate != e.parent) e.mate = mate;
    }
    return e;
  }

  void on_expand(const SearchTree& tree, NodeId child) {
    if (island_of_.size() < tree.size()) island_of_.resize(tree.size(), 0);
    island_of_[child] = static_cast<std::uint8_t>(next_island_);
  }

  void on_result(const SearchTree& tree, NodeId node) {
    if (island_of_.size() < tree.size()) island_of_.resize(tree.size(), 0);
    if (tree[node].state == NodeState::evaluated) {
      // The seed starts every island; so does a repair of a broken seed, the first correct node.
      const bool starts_all = node == tree.root() || (tree[node].parent == tree.root() && tree[tree.root()].state == NodeState::failed);
      if (starts_all)
        for (auto& island : islands_) admit(tree, island, node);
      else
        admit(tree, islands_[island_of_[node]], node);
    }
    ++results_;
    if (args_.migration_interval > 0 && results_ % args_.migration_interval == 0) migrate(tree);
    repairs_.on_result(tree, node);
  }

  std::size_t memory_bytes() const {
    return island_of_.capacity() + islands_.size() * args_.population * sizeof(NodeId) + repairs_.memory_bytes();
  }

 private:
  using Island = std::vector<NodeId>;

  NodeId tournament(const SearchTree& tree, const Island& island, Rng& rng) const {
    std::uniform_int_distribution<std::size_t> pick(0, island.size() - 1);
    NodeId winner = island[pick(rng)];
    for (std::uint32_t i = 1; i < args_.tournament; ++i) {
      NodeId rival = island[pick(rng)];
      if (tree[rival].speedup > tree[winner].speedup) winner = rival;
    }
    return winner;
  }

  void admit(const SearchTree& tree, Island& island, NodeId node) const {
    if (std::find(island.begin(), island.end(), node) != island.end()) return;
    island.push_back(node);
    if (island.size() > args_.population) {
      auto worst = std::min_element(island.begin(), island.end(),
                                    [&](NodeId a, NodeId b) { return tree[a].speedup < tree[b].speedup; });
      island.erase(worst);
    }
  }

  void migrate(const SearchTree& tree) {
    // Ring migration: each island's best joins the next island.
    std::vector<NodeId> emigrants;
    for (const auto& island : islands_) {
      if (island.empty()) { emigrants.push_back(no_node); continue; }
      emigrants.push_back(*std::max_element(island.begin(), island.end(),
                                            [&](NodeId a, NodeId b) { return tree[a].speedup < tree[b].speedup; }));
    }
    for (std::size_t i = 0; i < islands_.size(); ++i)
      if (emigrants[i] != no_node) admit(tree, islands_[(i + 1) % islands_.size()], emigrants[i]);
  }

  Arguments args_;
  std::vector<Island> islands_;
  std::vector<std::uint8_t> island_of_;  // the island each node was bred on
  std::size_t next_island_ = 0;
  std::size_t results_ = 0;
  RepairMoves repairs_;
};

static_assert(SearchPolicy<Evolutionary>);

}  // namespace kevo::search
