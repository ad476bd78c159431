// Repair moves: a policy may expand a failed node with a repair request, the shipped policies spend
// a share of their selections on them, and a broken seed is repaired rather than fatal when the
// synthesizer repairs. Measured against the fake LLM server's break mode
// (tests/support/fake_llm_server.hpp), with the evaluator that judges code without compiling it.
#include <kevo/problem_loader.hpp>
#include <kevo/memory/operators.hpp>
#include <kevo/net/llm_client.hpp>
#include <kevo/search/any_policy.hpp>
#include <kevo/default_search_loop.hpp>
#include <kevo/store/sqlite_store.hpp>
#include <kevo/synth/llm_synthesizer.hpp>
#include <kevo/synth/template_synthesizer.hpp>

#include <catch2/catch.hpp>
#include <support/fake_llm_server.hpp>
#include <support/quick_llm_options.hpp>
#include <support/variant_evaluator.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace kevo_tests::repair_moves_test {

using namespace kevo;
using namespace std::chrono_literals;
using kevo::testing::BreakMode;
using kevo::testing::LoopbackServer;
using kevo::testing::Received;
using kevo::test::VariantEvaluator;

namespace {

constexpr const char* key_variable = "KEVO_TEST_REPAIR_KEY";

net::LlmClientOptions quick_options(const LoopbackServer& server) {
  return kevo::testing::quick_llm_options(server, key_variable, "sk-kevo-repair-test-0123456789");
}

bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

template <class Policy>
using LlmLoop = SearchLoop<synth::LlmSynthesizer<net::BlockingLlmClient>, Policy, memory::Combined, VariantEvaluator,
                           knowledge::NullRetriever, store::SqliteStore>;

/// A fake model that breaks every `break_every`-th candidate (and every `repair_fails_every`-th of
/// its repairs), the LLM client that talks to it, an in-memory store and the code-reading evaluator.
struct BreakingModelRig {
  LoopbackServer server;
  BreakMode model;
  net::BlockingLlmClient llm;
  store::SqliteStore store;
  VariantEvaluator evaluator;

  explicit BreakingModelRig(int break_every, int repair_fails_every = 0)
      : model(break_every, repair_fails_every),
        llm(net::BlockingLlmClient::create(quick_options(server)).value()),
        store(store::SqliteStore::open(":memory:").value()) {
    server.respond_with([this](const Received& r) { return model(r); });
  }

  template <class Policy>
  LlmLoop<Policy> loop(const Problem& problem, Policy policy, SearchArguments args) {
    return LlmLoop<Policy>(problem, synth::LlmSynthesizer(llm), std::move(policy), memory::Combined{}, evaluator,
                           knowledge::NullRetriever{}, store, args);
  }
};

const Problem& scoring() {
  static const Problem p = load_problem(std::string(KEVO_SOURCE_DIR) + "/problems/cpu_scoring").value();
  return p;
}

Candidate seed_of(const Problem& p) { return Candidate{p.render(p.default_knobs()), p.default_knobs(), "template defaults"}; }

Candidate broken_seed_of(const Problem& p) {
  Candidate c = seed_of(p);
  c.source += "\nvoid kevo_seed_total() { scratch_total += 1; }\n";
  c.origin = "a broken seed";
  return c;
}

std::vector<Received> repair_prompts(LoopbackServer& server) {
  std::vector<Received> out;
  for (auto& r : server.received())
    if (!contains(r.body, "\"assistant\"") && contains(testing::first_user_message(r.body), "## Repair")) out.push_back(r);  // not re-asks
  return out;
}

/// Every repair in the tree: a child of a failed node. Counts those evaluated correct.
template <class Loop>
std::pair<std::size_t, std::size_t> repair_children(const Loop& loop) {
  std::size_t all = 0, correct = 0;
  const SearchTree& t = loop.tree();
  for (NodeId id = 1; id < t.size(); ++id) {
    if (t[t[id].parent].state != NodeState::failed) continue;
    ++all;
    correct += t[id].state == NodeState::evaluated;
  }
  return {all, correct};
}

}  // namespace

static_assert(synthesizer_repairs<synth::LlmSynthesizer<synth::detail::CompleterArchetype>>);
static_assert(!synthesizer_repairs<synth::TemplateSynthesizer>);

TEST_CASE("a policy that is not told repairs pay selects as before, told, it spends its share on failed nodes", "[repair]") {
  SearchTree tree;
  search::Greedy off, on({.repair_share = 1.0});
  on.enable_repairs(true);
  Rng rng_off(3), rng_on(3);
  auto add = [&](NodeId parent, FailureKind failure, double speedup) {
    const NodeId child = tree.add_child(parent);
    off.on_expand(tree, child), on.on_expand(tree, child);
    tree.record(child, failure, speedup, Bottleneck::memory);
    off.on_result(tree, child), on.on_result(tree, child);
    return child;
  };
  tree.record(tree.root(), FailureKind::none, 1.0, Bottleneck::memory);
  off.on_result(tree, tree.root()), on.on_result(tree, tree.root());
  add(0, FailureKind::none, 2.0);
  const NodeId broken = add(0, FailureKind::compile_error, 0);
  add(0, FailureKind::generation_failed, 0);  // no code: nothing to repair

  const Expansion plain = off.select(tree, rng_off);
  CHECK_FALSE(plain.repair);
  CHECK(plain.parent == 1);
  Expansion e = on.select(tree, rng_on);
  CHECK(e.repair);
  CHECK(e.parent == broken);
  // One repair at a time: while it is in flight the policy selects as usual.
  const NodeId first_try = tree.add_child(broken);
  on.on_expand(tree, first_try);
  CHECK_FALSE(on.select(tree, rng_on).repair);
  tree.record(first_try, FailureKind::wrong_answer, 0, Bottleneck::unknown);
  on.on_result(tree, first_try);  // a failed try is not a new node to repair
  e = on.select(tree, rng_on);
  CHECK(e.repair);
  CHECK(e.parent == broken);
  const NodeId second_try = tree.add_child(broken);
  on.on_expand(tree, second_try);
  tree.record(second_try, FailureKind::compile_error, 0, Bottleneck::unknown);
  on.on_result(tree, second_try);
  CHECK_FALSE(on.select(tree, rng_on).repair);  // two tries: given up
}

TEST_CASE("an LLM search repairs the candidates the model breaks, from their compile errors, and says how often", "[repair][llm]") {
  const Problem& problem = scoring();
  BreakingModelRig rig(/*break_every=*/2);
  auto loop = rig.loop<search::Greedy>(problem, search::Greedy({.repair_share = 0.4}), {.jobs = 2, .max_evaluations = 40, .warm_start = 0});
  std::size_t repairs_seen = 0;
  auto result = loop.run(seed_of(problem));
  REQUIRE(result);
  const RepairCounts& repairs = result->repairs;
  std::printf("break mode, greedy (repair share 0.4): %s; %zu compile errors in all\n", repairs.summary().c_str(),
              result->failures.count(FailureKind::compile_error) ? result->failures.at(FailureKind::compile_error) : 0);
  CHECK(rig.model.breaks() > 0);
  CHECK(repairs.requested > 0);
  CHECK(repairs.candidates > 0);
  CHECK(repairs.requested >= repairs.candidates);
  CHECK(repairs.requested <= 2 * repairs.candidates);  // at most two tries each
  // Each repair was evaluated and counted: the tree agrees with the summary.
  const auto [all, correct] = repair_children(loop);
  CHECK(all == repairs.requested);
  CHECK(correct == repairs.succeeded);
  // The fake model always repairs what it is asked to: (nearly) every failing candidate tried is
  // repaired within two tries (one may still be in flight when the budget ends).
  CHECK(repairs.fraction() >= 0.9);
  CHECK(contains(repairs.summary(), fmt::format("repaired {} of {} failing candidate", repairs.repaired, repairs.candidates)));
  // The repair prompts said so and carried the compiler's error text, trimmed.
  const auto prompts = repair_prompts(rig.server);
  CHECK(prompts.size() == repairs.requested);
  for (const auto& r : prompts) {
    const std::string prompt = testing::first_user_message(r.body);
    CHECK(contains(prompt, "Repair the current implementation"));
    CHECK(contains(prompt, "does not compile"));
    CHECK(contains(prompt, "Compiler errors (trimmed)"));
    CHECK(contains(prompt, "'scratch_total' was not declared in this scope"));
    ++repairs_seen;
  }
  CHECK(repairs_seen > 0);
}

TEST_CASE("a resumed run's summary counts the repairs made before the resume too", "[repair][llm]") {
  const Problem& problem = scoring();
  BreakingModelRig rig(/*break_every=*/2);
  RepairCounts before;
  std::int64_t run_id = 0;
  {
    auto first = rig.loop<search::Greedy>(problem, search::Greedy({.repair_share = 0.4}), {.jobs = 1, .max_evaluations = 16, .warm_start = 0});
    auto result = first.run(seed_of(problem));
    REQUIRE(result);
    before = result->repairs;
    run_id = result->run_id;
  }
  REQUIRE(before.requested > 0);
  auto second = rig.loop<search::Greedy>(problem, search::Greedy({.repair_share = 0.4}), {.jobs = 1, .max_evaluations = 30, .warm_start = 0});
  auto resumed = second.resume(run_id);
  REQUIRE(resumed);
  const RepairCounts& after = resumed->repairs;
  std::printf("before the resume: %s; the whole run: %s\n", before.summary().c_str(), after.summary().c_str());
  CHECK(after.requested >= before.requested);
  CHECK(after.candidates >= before.candidates);
  CHECK(after.repaired >= before.repaired);
  // The summary agrees with the whole tree, the first process's repairs included.
  const auto [all, correct] = repair_children(second);
  CHECK(all == after.requested);
  CHECK(correct == after.succeeded);
}

TEST_CASE("a repair that fails gets a second try, and the fraction counts within two tries", "[repair][llm]") {
  const Problem& problem = scoring();
  BreakingModelRig rig(/*break_every=*/2, /*repair_fails_every=*/2);  // every other repair is broken again
  auto loop = rig.loop<search::Mcts>(problem, search::Mcts({.repair_share = 0.5}), {.jobs = 1, .max_evaluations = 40, .warm_start = 0});
  auto result = loop.run(seed_of(problem));
  REQUIRE(result);
  const RepairCounts& repairs = result->repairs;
  std::printf("break mode, half the repairs fail, mcts (repair share 0.5): %s\n", repairs.summary().c_str());
  CHECK(repairs.requested > repairs.candidates);  // some needed a second try
  CHECK(repairs.succeeded < repairs.requested);
  CHECK(repairs.fraction() >= 0.7);
  // A second try is told that the first one failed.
  bool second_try_told = false;
  for (const auto& r : repair_prompts(rig.server))
    second_try_told |= contains(testing::first_user_message(r.body), "This is repair attempt 2");
  CHECK(second_try_told);
}

TEST_CASE("every shipped policy spends its default share on repairs when the synthesizer repairs", "[repair][llm]") {
  const Problem& problem = scoring();
  for (const char* name : {"mcts", "evolutionary", "greedy", "random"}) {
    CAPTURE(name);
    BreakingModelRig rig(/*break_every=*/2);
    auto loop = rig.loop<search::AnyPolicy>(problem, search::make_policy(name).value(),
                                            {.jobs = 1, .max_evaluations = 30, .seed = 5, .warm_start = 0});
    auto result = loop.run(seed_of(problem));
    REQUIRE(result);
    std::printf("break mode, %s (default share): %s\n", name, result->repairs.summary().c_str());
    CHECK(result->repairs.requested > 0);
    CHECK(result->repairs.requested < 30);  // a share, not the whole budget
    CHECK(result->repairs.fraction() >= 0.9);
  }
}

TEST_CASE("a repair share of 0 turns repairs off (kevo-llm-search --repair-share), and one outside 0..1 is refused", "[repair][llm]") {
  const Problem& problem = scoring();
  BreakingModelRig rig(/*break_every=*/2);
  auto loop = rig.loop<search::AnyPolicy>(problem, search::make_policy("greedy", 0.0).value(),
                                          {.jobs = 1, .max_evaluations = 16, .seed = 5, .warm_start = 0});
  auto result = loop.run(seed_of(problem));
  REQUIRE(result);
  CHECK(rig.model.breaks() > 0);
  CHECK(result->failures.count(FailureKind::compile_error) > 0);
  CHECK(result->repairs.requested == 0);
  CHECK(rig.model.repair_prompts() == 0);
  for (double share : {-0.1, 1.5}) {
    auto refused = search::make_policy("mcts", share);
    REQUIRE_FALSE(refused);
    CHECK_THAT(refused.error().message, Catch::Contains("is not between 0 and 1"));
  }
}

TEST_CASE("a broken seed is repaired when an LLM is configured, and the search goes on", "[repair][llm]") {
  const Problem& problem = scoring();
  BreakingModelRig rig(/*break_every=*/3);
  auto loop = rig.loop<search::Mcts>(problem, search::Mcts{}, {.jobs = 2, .max_evaluations = 12, .warm_start = 0});
  auto result = loop.run(broken_seed_of(problem));
  REQUIRE(result);
  CHECK(loop.tree()[0].state == NodeState::failed);
  CHECK(result->evaluations == 13);  // the seed and the whole budget
  CHECK(result->best_speedup > 0);
  CHECK(result->repairs.candidates >= 1);
  CHECK(result->repairs.repaired >= 1);
  // The first request was the seed's repair, with its compile error.
  const auto received = rig.server.received();
  REQUIRE_FALSE(received.empty());
  const std::string first = testing::first_user_message(received.front().body);
  CHECK(contains(first, "## Repair"));
  CHECK(contains(first, "'scratch_total' was not declared in this scope"));
  // The repair is the seed's child, correct, and the search built on it.
  bool repaired_child = false;
  loop.tree().for_each_child(0, [&](NodeId c) { repaired_child |= loop.tree()[c].state == NodeState::evaluated; });
  CHECK(repaired_child);
  std::size_t below = 0;
  for (NodeId id = 1; id < loop.tree().size(); ++id) below += loop.tree()[id].depth >= 2;
  CHECK(below > 0);
}

TEST_CASE("a broken seed no repair fixes is still the clear error, after two tries", "[repair][llm]") {
  const Problem& problem = scoring();
  BreakingModelRig rig(/*break_every=*/1, /*repair_fails_every=*/1);  // every repair stays broken
  auto loop = rig.loop<search::Greedy>(problem, search::Greedy{}, {.jobs = 2, .max_evaluations = 12, .warm_start = 0});
  auto r = loop.run(broken_seed_of(problem));
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("seed candidate failed (compile_error)"));
  CHECK_THAT(r.error().message, Catch::Contains("2 repairs of it failed too"));
  CHECK(rig.model.repair_prompts() == 2);
  CHECK(loop.tree().size() == 3);  // the seed and its two tries, nothing else
}

TEST_CASE("without a synthesizer that repairs, a broken seed ends the run as before", "[repair]") {
  const Problem& problem = scoring();
  VariantEvaluator evaluator;
  auto store = store::SqliteStore::open(":memory:");
  REQUIRE(store);
  SearchLoop<synth::TemplateSynthesizer, search::Greedy, memory::Combined, VariantEvaluator, knowledge::NullRetriever,
             store::SqliteStore>
      loop(problem, synth::TemplateSynthesizer(problem), search::Greedy({.repair_share = 1.0}), memory::Combined{}, evaluator,
           knowledge::NullRetriever{}, *store, {.jobs = 2, .max_evaluations = 12, .warm_start = 0});
  auto r = loop.run(broken_seed_of(problem));
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("seed candidate failed (compile_error)"));
  CHECK_FALSE(contains(r.error().message, "repair"));
  CHECK(loop.tree().size() == 1);
}

}  // namespace kevo_tests::repair_moves_test
