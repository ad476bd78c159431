// The search loop on a synthetic landscape: stop reasons, failures, duplicates, warm starts, and
// resume after SIGKILL from the real SQLite store.
#include <kevo/search/evolutionary.hpp>
#include <kevo/search/greedy.hpp>
#include <kevo/search/mcts.hpp>
#include <kevo/search/random.hpp>
#include <kevo/default_search_loop.hpp>
#include <kevo/eval/any_evaluator.hpp>
#include <kevo/store/sqlite_store.hpp>

#include "support/kill_in_race.hpp"
#include "support/process_temp_dir.hpp"
#include "support/synthetic_evaluator.hpp"

#include <catch2/catch.hpp>

#include <csignal>
#include <filesystem>
#include <thread>
#include <fstream>
#include <sys/wait.h>
#include <unistd.h>

namespace kevo_tests::search_loop_test {

using namespace kevo;
using kevo::testing::SyntheticEvaluator;

namespace {
std::filesystem::path temp_store(const std::string& name) {
  static const kevo::testing::ProcessTempDir stores("kevo-loop-test");
  auto path = stores.path() / name;
  for (auto suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path.string() + suffix);
  return path;
}

template <class Policy>
auto make_loop(const Problem& problem, SyntheticEvaluator& evaluator, store::SqliteStore& store, SearchArguments args) {
  return SearchLoop<synth::TemplateSynthesizer, Policy, memory::Adaptive, SyntheticEvaluator, knowledge::NullRetriever,
                    store::SqliteStore>(problem, synth::TemplateSynthesizer(problem), Policy{}, memory::Adaptive{},
                                        evaluator, knowledge::NullRetriever{}, store, std::move(args));
}
}  // namespace

TEMPLATE_TEST_CASE("every policy improves on the seed within its budget", "[loop]", search::Mcts, search::Evolutionary,
                   search::Greedy, search::Random) {
  const Problem problem = kevo::testing::synthetic_problem();
  SyntheticEvaluator evaluator;
  auto store = store::SqliteStore::open(":memory:").value();
  std::size_t progress_calls = 0;
  auto loop = make_loop<TestType>(problem, evaluator, store,
                                  {.jobs = 3, .max_evaluations = 80, .seed = 42,
                                   .on_progress = [&](const Progress& p) {
                                     ++progress_calls;
                                     REQUIRE(p.evaluation != nullptr);
                                     REQUIRE(p.in_flight <= 3);
                                   }});
  auto result = loop.run(loop.synthesizer().seed());
  REQUIRE(result);
  CHECK(result->stopped_because == StopReason::evaluation_budget);
  CHECK(result->evaluations == 81);  // the seed and 80 children
  CHECK(progress_calls == 81);
  CHECK(result->best_speedup > 4.0);  // the seed (all zeros) scores 1 + (22 - 20) = 3
  CHECK(result->verified);
  CHECK(result->verified_speedup == Approx(result->best_speedup));
  // knob c = 3 fails to compile on this landscape: those failures are counted, and the search went on.
  std::size_t failed = 0;
  for (const auto& node : loop.tree().nodes()) failed += node.state == NodeState::failed;
  CHECK(failed == (result->failures.count(FailureKind::compile_error) ? result->failures.at(FailureKind::compile_error) : 0) +
                      (result->failures.count(FailureKind::generation_failed) ? result->failures.at(FailureKind::generation_failed) : 0));
  // Nothing was evaluated twice: one evaluation per distinct candidate, plus the final re-check.
  CHECK(static_cast<std::size_t>(evaluator.evaluations.load()) == evaluator.evaluated().size() + 1);
}

TEST_CASE("the loop says which condition stopped it", "[loop]") {
  const Problem problem = kevo::testing::synthetic_problem();
  SyntheticEvaluator evaluator;
  auto store = store::SqliteStore::open(":memory:").value();

  SECTION("target reached") {
    auto loop = make_loop<search::Greedy>(problem, evaluator, store, {.max_evaluations = 500, .target_speedup = 6.0});
    auto r = loop.run(loop.synthesizer().seed());
    REQUIRE(r);
    CHECK(r->stopped_because == StopReason::target_reached);
    CHECK(r->best_speedup >= 6.0);
    CHECK(r->evaluations < 500);
  }
  SECTION("stagnation") {
    auto loop = make_loop<search::Random>(problem, evaluator, store, {.jobs = 1, .max_evaluations = 5000, .patience = 5});
    auto r = loop.run(loop.synthesizer().seed());
    REQUIRE(r);
    CHECK(r->stopped_because == StopReason::stagnation);
    CHECK(loop.tree().finished_since_improvement() >= 5);
  }
  SECTION("wall time") {
    evaluator.delay = std::chrono::milliseconds(20);
    auto loop = make_loop<search::Mcts>(problem, evaluator, store, {.max_evaluations = 5000, .max_wall_seconds = 0.3});
    auto r = loop.run(loop.synthesizer().seed());
    REQUIRE(r);
    CHECK(r->stopped_because == StopReason::wall_time);
    CHECK(r->elapsed_seconds < 2.0);
  }
}

TEST_CASE("a seed that fails is a clear error, not a search", "[loop]") {
  const Problem problem = kevo::testing::synthetic_problem();
  SyntheticEvaluator evaluator;
  auto store = store::SqliteStore::open(":memory:").value();
  auto loop = make_loop<search::Mcts>(problem, evaluator, store, {.max_evaluations = 10});
  Candidate broken = loop.synthesizer().seed();
  broken.knobs["c"] = "3";
  broken.source += " broken";
  auto r = loop.run(broken);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("seed candidate failed (compile_error)"));
}

TEST_CASE("a later run starts from what an earlier run found", "[loop][store]") {
  const Problem problem = kevo::testing::synthetic_problem();
  SyntheticEvaluator evaluator;
  const auto path = temp_store("warm.db");
  auto store = store::SqliteStore::open(path).value();
  auto first = make_loop<search::Greedy>(problem, evaluator, store, {.max_evaluations = 60, .seed = 1});
  auto r1 = first.run(first.synthesizer().seed());
  REQUIRE(r1);

  auto second = make_loop<search::Random>(problem, evaluator, store, {.jobs = 1, .max_evaluations = 4, .seed = 2});
  auto r2 = second.run(second.synthesizer().seed());
  REQUIRE(r2);
  // Its first children are the earlier run's best candidates, so four evaluations reach its best.
  CHECK(r2->best_speedup >= r1->best_speedup);
  CHECK_THAT(second.candidate(1).origin, Catch::Contains("earlier run"));
}

TEST_CASE("a search killed with SIGKILL resumes without losing or repeating an evaluation", "[loop][store][resume]") {
  const Problem problem = kevo::testing::synthetic_problem();
  const auto path = temp_store("resume.db");
  constexpr std::size_t budget = 120;

  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // The doomed search: slow evaluations, so the kill lands in the middle of it.
    SyntheticEvaluator evaluator;
    evaluator.delay = std::chrono::milliseconds(15);
    auto store = store::SqliteStore::open(path).value();
    auto loop = make_loop<search::Mcts>(problem, evaluator, store, {.jobs = 2, .max_evaluations = budget, .seed = 9});
    (void)loop.run(loop.synthesizer().seed());
    ::_exit(0);
  }
  ::usleep(500 * 1000);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE(WIFSIGNALED(status));

  auto store = store::SqliteStore::open(path).value();
  auto run = store.latest_run();
  REQUIRE(run);
  CHECK(run->stopped_because.empty());  // it never finished
  auto before = store.load_nodes(run->id).value();
  std::set<std::uint64_t> finished_before;
  for (const auto& n : before)
    if (n.evaluation && n.settled) finished_before.insert(n.candidate.hash());  // an unsettled figure is raced again
  REQUIRE(finished_before.size() > 5);
  REQUIRE(finished_before.size() < budget);

  SyntheticEvaluator evaluator;
  auto loop = make_loop<search::Mcts>(problem, evaluator, store, {.jobs = 2, .max_evaluations = budget, .seed = 9});
  auto result = loop.resume(run->id);
  REQUIRE(result);
  CHECK(result->stopped_because == StopReason::evaluation_budget);
  CHECK(result->evaluations == budget + 1);

  // Nothing finished before the kill ran again (the final re-check of the best aside).
  std::size_t repeated = 0;
  for (auto h : evaluator.evaluated())
    if (finished_before.count(h) && h != result->best_candidate->hash()) ++repeated;
  CHECK(repeated == 0);
  // And nothing was lost: every evaluation stored before the kill is in the resumed tree.
  auto after = store.load_nodes(run->id).value();
  std::size_t still_there = 0;
  for (const auto& n : after)
    if (n.evaluation && finished_before.count(n.candidate.hash())) ++still_there;
  CHECK(still_there == finished_before.size());
  CHECK(after.size() == budget + 1);
  CHECK(store.find_run(run->id)->stopped_because == "evaluation_budget");
}

namespace {
/// Re-timing that takes far longer than the test waits: a kill lands in the middle of it. Before
/// the race starts it writes the challenger's hash where the test can see it.
struct SlowRaceEvaluator {
  SyntheticEvaluator truth;
  std::filesystem::path racing_file;
  Evaluation evaluate(const Candidate& c, std::uint64_t seed) { return truth.evaluate(c, seed); }
  expected<Comparison, Error> compare(const Candidate& a, const Candidate& b, std::uint64_t seed) {
    kevo::testing::announce_race_and_hang(racing_file, a.hash());
    return truth.compare(a, b, seed);
  }
};
}  // namespace

TEST_CASE("a search killed while it re-times a new best keeps that best's first measurement", "[loop][store][resume]") {
  const Problem problem = kevo::testing::synthetic_problem();
  const auto path = temp_store("killed_in_race.db");
  const auto racing_file = temp_store("racing.txt");
  const std::uint64_t racing = kevo::testing::kill_during_race(racing_file, [&] {
    SlowRaceEvaluator evaluator{.racing_file = racing_file};
    auto store = store::SqliteStore::open(path).value();
    SearchLoop<synth::TemplateSynthesizer, search::Greedy, memory::Combined, SlowRaceEvaluator, knowledge::NullRetriever,
               store::SqliteStore>
        loop(problem, synth::TemplateSynthesizer(problem), search::Greedy{}, memory::Combined{}, evaluator,
             knowledge::NullRetriever{}, store, {.jobs = 1, .max_evaluations = 40, .seed = 3});
    (void)loop.run(synth::TemplateSynthesizer(problem).seed());
  });
  REQUIRE(racing != 0);
  auto store = store::SqliteStore::open(path).value();
  auto run = store.latest_run();
  REQUIRE(run);
  bool stored = false;
  const auto nodes = store.load_nodes(run->id).value();
  for (const auto& n : nodes) {
    UNSCOPED_INFO("node " << n.key << " hash " << n.candidate.hash() << (n.evaluation ? " evaluated" : " pending"));
    if (n.candidate.hash() == racing) stored = n.evaluation.has_value() && n.evaluation->ok();
  }
  INFO("racing " << racing);
  CHECK(stored);  // its evaluation had finished: the race must not be what loses it
}

namespace {
/// A synthesizer that fails every other generation, as an unreliable LLM might.
struct FlakySynthesizer {
  synth::TemplateSynthesizer inner;
  int calls = 0;
  expected<Candidate, Error> generate(const GenerationRequest& r) {
    if (++calls % 2 == 0) return make_error("the answer held no code block");
    if (calls % 5 == 0) throw std::runtime_error("synthesizer bug");
    return inner.generate(r);
  }
};
}  // namespace

TEST_CASE("failed generations cost one attempt each and the search goes on", "[loop]") {
  const Problem problem = kevo::testing::synthetic_problem();
  SyntheticEvaluator evaluator;
  auto store = store::SqliteStore::open(":memory:").value();
  SearchLoop<FlakySynthesizer, search::Mcts, memory::Combined, SyntheticEvaluator, knowledge::NullRetriever, store::SqliteStore>
      loop(problem, FlakySynthesizer{synth::TemplateSynthesizer(problem)}, search::Mcts{}, memory::Combined{}, evaluator,
           knowledge::NullRetriever{}, store, {.max_evaluations = 40});
  auto r = loop.run(synth::TemplateSynthesizer(problem).seed());
  REQUIRE(r);
  CHECK(r->evaluations == 41);
  REQUIRE(r->failures.count(FailureKind::generation_failed));
  CHECK(r->failures.at(FailureKind::generation_failed) >= 20);
  CHECK(r->best_speedup > 3.0);
  bool saw_throw = false;
  for (NodeId n = 1; n < loop.tree().size(); ++n)
    saw_throw |= loop.evaluation(n).diagnostics.message.find("threw: synthesizer bug") != std::string::npos;
  CHECK(saw_throw);
}

namespace {
/// An evaluator whose first measurement lies (3x too fast for odd b), as noise on a busy machine
/// can; side-by-side re-timing tells the truth.
struct NoisyEvaluator {
  SyntheticEvaluator truth;
  Evaluation evaluate(const Candidate& c, std::uint64_t seed) {
    Evaluation e = truth.evaluate(c, seed);
    if (e.ok() && std::stoi(c.knobs.at("b")) % 2 == 1) e.speedup *= 3;
    return e;
  }
  expected<Comparison, Error> compare(const Candidate& a, const Candidate& b, std::uint64_t seed) {
    return truth.compare(a, b, seed);
  }
  expected<Comparison, Error> compare_with_reference(const Candidate& c, std::uint64_t) {
    return Comparison{1.0 / SyntheticEvaluator::speedup_of(c.knobs), 1.0};
  }
};
}  // namespace

TEST_CASE("a new best is re-timed side by side, so a lucky measurement cannot win", "[loop]") {
  const Problem problem = kevo::testing::synthetic_problem();
  NoisyEvaluator evaluator;
  auto store = store::SqliteStore::open(":memory:").value();
  SearchLoop<synth::TemplateSynthesizer, search::Greedy, memory::Combined, NoisyEvaluator, knowledge::NullRetriever, store::SqliteStore>
      loop(problem, synth::TemplateSynthesizer(problem), search::Greedy{}, memory::Combined{}, evaluator,
           knowledge::NullRetriever{}, store, {.jobs = 1, .max_evaluations = 60, .seed = 4});  // one job: the same run every time
  auto r = loop.run(synth::TemplateSynthesizer(problem).seed());
  REQUIRE(r);
  const double truth = SyntheticEvaluator::speedup_of(r->best_candidate->knobs);
  CHECK(r->best_speedup == Approx(truth));
  CHECK(r->verified_speedup == Approx(truth));
  std::size_t retimed = 0;
  for (NodeId n = 1; n < loop.tree().size(); ++n)
    retimed += loop.evaluation(n).diagnostics.message.find("re-timed:") != std::string::npos;
  CHECK(retimed > 0);
}

namespace {
/// NoisyEvaluator with every optional hook, each call counted: one that eval::AnyEvaluator dropped would show.
struct HookedEvaluator : NoisyEvaluator {
  std::atomic<int> reference_asked{0}, identity_asked{0}, reference_races{0};
  double reference_seconds() {
    ++reference_asked;
    return 1.0;
  }
  std::string target_identity() {
    ++identity_asked;
    return "synthetic: every hook";
  }
  expected<Comparison, Error> compare_with_reference(const Candidate& c, std::uint64_t seed) {
    ++reference_races;
    return NoisyEvaluator::compare_with_reference(c, seed);
  }
};
}  // namespace

TEST_CASE("eval::AnyEvaluator runs the loop as the evaluator it refers to would, every hook included", "[loop]") {
  const Problem problem = kevo::testing::synthetic_problem();
  HookedEvaluator hooked;
  eval::AnyEvaluator evaluator(hooked);
  auto store = store::SqliteStore::open(":memory:").value();
  SearchLoop<synth::TemplateSynthesizer, search::Greedy, memory::Combined, eval::AnyEvaluator, knowledge::NullRetriever, store::SqliteStore>
      loop(problem, synth::TemplateSynthesizer(problem), search::Greedy{}, memory::Combined{}, evaluator,
           knowledge::NullRetriever{}, store, {.jobs = 1, .max_evaluations = 60, .seed = 4});
  auto r = loop.run(synth::TemplateSynthesizer(problem).seed());
  REQUIRE(r);
  // The lucky first measurements are raced against the reference, through the hook, and lose.
  const double truth = SyntheticEvaluator::speedup_of(r->best_candidate->knobs);
  CHECK(r->verified_speedup == Approx(truth));
  CHECK(hooked.reference_races > 0);
  CHECK(hooked.reference_asked > 0);
  CHECK(hooked.identity_asked > 0);
  auto run = store.find_run(r->run_id);
  REQUIRE(run);
  CHECK(run->target_identity == "synthetic: every hook");
  CHECK(run->reference_seconds == 1.0);
}

namespace {
/// An evaluator whose odd-b candidates pass their first check but give wrong answers on the race's
/// other inputs (as a kernel with a data race may): they must not be kept as correct, nor best.
struct OnceCorrectEvaluator {
  SyntheticEvaluator truth;
  static bool flaky(const Candidate& c) { return c.knobs.count("b") && std::stoi(c.knobs.at("b")) % 2 == 1; }
  Evaluation evaluate(const Candidate& c, std::uint64_t seed) { return truth.evaluate(c, seed); }
  expected<Comparison, Error> compare(const Candidate& a, const Candidate& b, std::uint64_t seed) {
    if (flaky(a)) return Comparison{.challenger_failure = FailureKind::wrong_answer, .challenger_message = "element 3 differs"};
    return truth.compare(a, b, seed);
  }
};
}  // namespace

TEST_CASE("a new best that gives a wrong answer when re-checked is recorded as wrong, not kept", "[loop]") {
  const Problem problem = kevo::testing::synthetic_problem();
  OnceCorrectEvaluator evaluator;
  auto store = store::SqliteStore::open(":memory:").value();
  SearchLoop<synth::TemplateSynthesizer, search::Greedy, memory::Combined, OnceCorrectEvaluator, knowledge::NullRetriever,
             store::SqliteStore>
      loop(problem, synth::TemplateSynthesizer(problem), search::Greedy{}, memory::Combined{}, evaluator,
           knowledge::NullRetriever{}, store, {.jobs = 1, .max_evaluations = 60, .seed = 4});  // one job: the same run every time
  auto r = loop.run(synth::TemplateSynthesizer(problem).seed());
  REQUIRE(r);
  CHECK(!OnceCorrectEvaluator::flaky(*r->best_candidate));
  std::size_t demoted = 0;
  for (NodeId n = 1; n < loop.tree().size(); ++n) {
    const Evaluation& e = loop.evaluation(n);
    if (e.diagnostics.message.find("failed when re-checked") == std::string::npos) continue;
    ++demoted;
    CHECK(e.failure == FailureKind::wrong_answer);
    CHECK(loop.tree()[n].state == NodeState::failed);
    CHECK_THAT(e.diagnostics.message, Catch::Contains("element 3 differs"));
  }
  CHECK(demoted > 0);  // the search did meet flaky challengers
  auto stored = store.load_nodes(r->run_id);
  REQUIRE(stored);
  for (const auto& node : *stored)
    if (node.evaluation && OnceCorrectEvaluator::flaky(node.candidate) &&
        node.evaluation->diagnostics.message.find("failed when re-checked") != std::string::npos)
      CHECK(node.evaluation->failure == FailureKind::wrong_answer);  // and so in the store, which seeds later runs
}

TEST_CASE("zero as a policy's or memory's interval means never, not a division by zero", "[loop]") {
  const Problem problem = kevo::testing::synthetic_problem();
  SyntheticEvaluator evaluator;
  auto store = store::SqliteStore::open(":memory:").value();
  SearchLoop<synth::TemplateSynthesizer, search::Evolutionary, memory::Adaptive, SyntheticEvaluator, knowledge::NullRetriever,
             store::SqliteStore>
      loop(problem, synth::TemplateSynthesizer(problem), search::Evolutionary({.migration_interval = 0}),
           memory::Adaptive{.patience = 0}, evaluator, knowledge::NullRetriever{}, store, {.max_evaluations = 40, .seed = 2});
  auto r = loop.run(synth::TemplateSynthesizer(problem).seed());
  REQUIRE(r);
  CHECK(r->evaluations == 41);
  auto stored = store.load_nodes(r->run_id);
  REQUIRE(stored);
  for (const auto& node : *stored)
    if (node.parent != no_key) CHECK(node.memory_mode == MemoryMode::combined);  // patience 0: never fresh
}

namespace {
/// A user's policy with a bug: it expands the node it was just told about, still being generated.
struct ExpandsPendingNodes {
  NodeId newest = 0;
  Expansion select(const SearchTree&, Rng&) { return {newest}; }
  void on_expand(const SearchTree&, NodeId n) { newest = n; }
  void on_result(const SearchTree&, NodeId) {}
};
}  // namespace

TEST_CASE("a policy that names an unfinished node stops the search with an error that says so", "[loop]") {
  const Problem problem = kevo::testing::synthetic_problem();
  SyntheticEvaluator evaluator;
  auto store = store::SqliteStore::open(":memory:").value();
  SearchLoop<synth::TemplateSynthesizer, ExpandsPendingNodes, memory::Combined, SyntheticEvaluator, knowledge::NullRetriever,
             store::SqliteStore>
      loop(problem, synth::TemplateSynthesizer(problem), ExpandsPendingNodes{}, memory::Combined{}, evaluator,
           knowledge::NullRetriever{}, store, {.jobs = 2, .max_evaluations = 20});
  auto r = loop.run(synth::TemplateSynthesizer(problem).seed());
  REQUIRE(!r);
  CHECK_THAT(r.error().message, Catch::Contains("select() must name finished nodes"));
}

namespace {
/// A store whose disk fills up after a few evaluations.
struct FillingStore {
  store::SqliteStore inner = store::SqliteStore::open(":memory:").value();
  int evaluations_left = 5;
  auto begin_run(const RunInfo& i) { return inner.begin_run(i); }
  auto add_node(std::int64_t r, NodeKey p, NodeKey m, const Candidate& c, MemoryMode mode) { return inner.add_node(r, p, m, c, mode); }
  expected<void, Error> add_evaluation(std::int64_t r, NodeKey n, const Evaluation& e) {
    if (--evaluations_left < 0) return make_error("database or disk is full");
    return inner.add_evaluation(r, n, e);
  }
  auto finish_run(std::int64_t r, const std::string& s, NodeKey k, double v) { return inner.finish_run(r, s, k, v); }
  auto find_run(std::int64_t r) { return inner.find_run(r); }
  auto latest_run() { return inner.latest_run(); }
  auto load_nodes(std::int64_t r) { return inner.load_nodes(r); }
  auto best_of_earlier_runs(const std::string& p, std::int64_t r, std::size_t n) { return inner.best_of_earlier_runs(p, r, n); }
};
static_assert(SearchStore<FillingStore>);
}  // namespace

TEST_CASE("a store that fails stops the search with its error, after in-flight work settles", "[loop][store]") {
  const Problem problem = kevo::testing::synthetic_problem();
  SyntheticEvaluator evaluator;
  evaluator.delay = std::chrono::milliseconds(5);
  FillingStore store;
  SearchLoop<synth::TemplateSynthesizer, search::Mcts, memory::Adaptive, SyntheticEvaluator, knowledge::NullRetriever, FillingStore>
      loop(problem, synth::TemplateSynthesizer(problem), search::Mcts{}, memory::Adaptive{}, evaluator,
           knowledge::NullRetriever{}, store, {.jobs = 3, .max_evaluations = 50});
  auto r = loop.run(synth::TemplateSynthesizer(problem).seed());
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("disk is full"));
  CHECK(evaluator.evaluations.load() < 15);  // it stopped launching at once
}

}  // namespace kevo_tests::search_loop_test
