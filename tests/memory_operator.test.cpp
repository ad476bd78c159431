// Each memory operator on a tree built by hand.
#include <kevo/memory/operators.hpp>

#include <catch2/catch.hpp>

namespace kevo_tests::memory_operator_test {

using namespace kevo;

namespace {
NodeId add(SearchTree& tree, NodeId parent, double speedup, FailureKind failure = FailureKind::none) {
  const NodeId child = tree.add_child(parent);
  tree.record(child, failure, speedup, Bottleneck::compute);
  return child;
}

struct Fixture {
  SearchTree tree;
  NodeId a, b, c, failed, pending, deep;
  Fixture() {
    tree.record(tree.root(), FailureKind::none, 1.0, Bottleneck::memory);
    a = add(tree, tree.root(), 2.0);
    b = add(tree, a, 3.0);
    c = add(tree, a, 4.0);
    failed = add(tree, a, 0, FailureKind::crash);
    pending = tree.add_child(a);
    deep = add(tree, c, 5.0);
  }
};
}  // namespace

TEST_CASE("inherit-trajectory sees the path from the root", "[memory]") {
  Fixture f;
  const MemoryContext ctx = memory::InheritTrajectory{}.context(f.tree, f.deep);
  REQUIRE(ctx.mode == MemoryMode::trajectory);
  REQUIRE(ctx.trajectory == std::vector<NodeId>{f.tree.root(), f.a, f.c, f.deep});
  REQUIRE(ctx.siblings.empty());
  REQUIRE(memory::InheritTrajectory{.limit = 2}.context(f.tree, f.deep).trajectory == std::vector<NodeId>{f.c, f.deep});
}

TEST_CASE("compare-siblings sees finished children, fastest first, failures last", "[memory]") {
  Fixture f;
  const MemoryContext ctx = memory::CompareSiblings{}.context(f.tree, f.a);
  REQUIRE(ctx.mode == MemoryMode::siblings);
  REQUIRE(ctx.siblings == std::vector<NodeId>{f.c, f.b, f.failed});  // the pending child is not shown
  REQUIRE(ctx.trajectory.empty());
}

TEST_CASE("combined sees both, fresh-start sees nothing", "[memory]") {
  Fixture f;
  const MemoryContext both = memory::Combined{}.context(f.tree, f.a);
  REQUIRE(both.mode == MemoryMode::combined);
  REQUIRE(both.trajectory == std::vector<NodeId>{f.tree.root(), f.a});
  REQUIRE(both.siblings.size() == 3);
  const MemoryContext fresh = memory::FreshStart{}.context(f.tree, f.a);
  REQUIRE(fresh.mode == MemoryMode::fresh);
  REQUIRE(fresh.trajectory.empty());
  REQUIRE(fresh.siblings.empty());
}

TEST_CASE("adaptive switches to fresh starts while the search stagnates", "[memory]") {
  Fixture f;  // 6 nodes finished, the last (deep, 5.0) a new best
  memory::Adaptive adaptive{.patience = 3, .fresh_generations = 1};
  REQUIRE(adaptive.context(f.tree, f.deep).mode == MemoryMode::combined);
  for (int i = 0; i < 3; ++i) add(f.tree, f.deep, 1.0);  // three results, none better
  REQUIRE(adaptive.context(f.tree, f.deep).mode == MemoryMode::fresh);
  add(f.tree, f.deep, 1.0);
  REQUIRE(adaptive.context(f.tree, f.deep).mode == MemoryMode::combined);  // one fresh generation per patience window
  add(f.tree, f.deep, 9.0);  // an improvement resets the count
  REQUIRE(adaptive.context(f.tree, f.deep).mode == MemoryMode::combined);
}

}  // namespace kevo_tests::memory_operator_test
