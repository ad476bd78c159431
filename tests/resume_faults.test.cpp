// Resuming a stored run, as a new user found it going wrong (issue 22): a run of another problem,
// a new best killed during its race, and a reference re-timed on a loaded machine. Each goes through
// the real SQLite store, with the synthetic landscape standing in for the compiler.
#include <kevo/search/greedy.hpp>
#include <kevo/search/mcts.hpp>
#include <kevo/default_search_loop.hpp>
#include <kevo/store/sqlite_store.hpp>

#include "support/kill_in_race.hpp"
#include "support/synthetic_evaluator.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>
#include <sys/wait.h>
#include <unistd.h>

namespace kevo_tests::resume_faults_test {

using namespace kevo;
using kevo::testing::SyntheticEvaluator;

namespace {
std::filesystem::path temp_path(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / fmt::format("kevo-resume-faults-{}", ::getpid());
  std::filesystem::create_directories(dir);
  auto path = dir / name;
  for (auto suffix : {"", "-wal", "-shm", ".part"}) std::filesystem::remove(path.string() + suffix);
  return path;
}

template <class Eval>
auto make_loop(const Problem& problem, Eval& evaluator, store::SqliteStore& store, SearchArguments args) {
  return SearchLoop<synth::TemplateSynthesizer, search::Greedy, memory::Combined, Eval, knowledge::NullRetriever,
                    store::SqliteStore>(problem, synth::TemplateSynthesizer(problem), search::Greedy{}, memory::Combined{},
                                        evaluator, knowledge::NullRetriever{}, store, std::move(args));
}

/// The synthetic landscape, timed against a reference that takes `reference` seconds here: a
/// loaded machine times the reference slower, and every speedup it measures is off by as much.
struct ScaledReferenceEvaluator {
  SyntheticEvaluator truth;
  double reference = 1.0;
  Evaluation evaluate(const Candidate& c, std::uint64_t seed) {
    Evaluation e = truth.evaluate(c, seed);
    if (e.ok()) {
      e.reference_seconds = reference;
      e.speedup = reference / e.seconds;
    }
    return e;
  }
  expected<Comparison, Error> compare(const Candidate& a, const Candidate& b, std::uint64_t seed) { return truth.compare(a, b, seed); }
  double reference_seconds() const { return reference; }
};
}  // namespace

TEST_CASE("resume refuses a run made on another problem, and names both", "[resume][store]") {
  const Problem problem = kevo::testing::synthetic_problem();
  SyntheticEvaluator evaluator;
  auto store = store::SqliteStore::open(temp_path("other_problem.db")).value();
  auto first = make_loop(problem, evaluator, store, {.jobs = 1, .max_evaluations = 3});
  auto made = first.run(first.synthesizer().seed());
  REQUIRE(made);

  Problem other = kevo::testing::synthetic_problem();
  other.name = "softmax";
  auto wrong = make_loop(other, evaluator, store, {.jobs = 1, .max_evaluations = 6});
  auto resumed = wrong.resume(made->run_id);
  REQUIRE_FALSE(resumed);
  CHECK_THAT(resumed.error().message, Catch::Contains("'synthetic'") && Catch::Contains("'softmax'"));
  CHECK(store.load_nodes(made->run_id)->size() == 4);  // nothing of the other problem was added

  // The same name, but its template changed since: its stored figures are not this problem's.
  Problem changed = kevo::testing::synthetic_problem();
  changed.template_source += " e=1";
  auto stale = make_loop(changed, evaluator, store, {.jobs = 1, .max_evaluations = 6});
  auto refused = stale.resume(made->run_id);
  REQUIRE_FALSE(refused);
  CHECK_THAT(refused.error().message, Catch::Contains("changed"));
  CHECK(store.find_run(made->run_id)->problem_identity == problem.identity());

  // The problem itself still resumes.
  auto same = make_loop(problem, evaluator, store, {.jobs = 1, .max_evaluations = 5});
  CHECK(same.resume(made->run_id));
}

namespace {
/// The synthetic landscape, measured on a named target.
struct EvaluatorOn : SyntheticEvaluator {
  std::string target;
  std::string target_identity() const { return target; }
};
}  // namespace

TEST_CASE("resume refuses a run measured on another target, and names both", "[resume][store]") {
  const Problem problem = kevo::testing::synthetic_problem();
  EvaluatorOn h200{.target = "cuda; gpu: NVIDIA H200, 9.0; nvcc 13.0"};
  auto store = store::SqliteStore::open(temp_path("other_target.db")).value();
  auto first = make_loop(problem, h200, store, {.jobs = 1, .max_evaluations = 3});
  auto made = first.run(first.synthesizer().seed());
  REQUIRE(made);

  EvaluatorOn h100{.target = "cuda; gpu: NVIDIA H100 80GB HBM3, 9.0; nvcc 13.0"};
  auto elsewhere = make_loop(problem, h100, store, {.jobs = 1, .max_evaluations = 6});
  auto refused = elsewhere.resume(made->run_id);
  REQUIRE_FALSE(refused);
  CHECK_THAT(refused.error().message, Catch::Contains("NVIDIA H200") && Catch::Contains("NVIDIA H100") &&
                                          Catch::Contains("--warm-start-any-target"));
  CHECK(store.load_nodes(made->run_id)->size() == 4);  // nothing measured there was added

  // An evaluator that cannot say (not yet prepared) is not refused; the same target resumes.
  EvaluatorOn unknown{.target = ""};
  CHECK(make_loop(problem, unknown, store, {.jobs = 1, .max_evaluations = 5}).resume(made->run_id));
  CHECK(make_loop(problem, h200, store, {.jobs = 1, .max_evaluations = 6}).resume(made->run_id));
}

namespace {
/// Truthful for the seed; every later candidate's first measurement is a hundred times too fast
/// (a lucky timing). Its race, which would expose it, outlasts the test: the test kills it there.
struct LuckyThenKilledEvaluator {
  SyntheticEvaluator truth;
  std::filesystem::path racing_file;
  std::atomic<int> calls{0};
  Evaluation evaluate(const Candidate& c, std::uint64_t seed) {
    Evaluation e = truth.evaluate(c, seed);
    if (calls++ > 0 && e.ok()) e.speedup *= 100, e.seconds /= 100;
    return e;
  }
  expected<Comparison, Error> compare(const Candidate& a, const Candidate& b, std::uint64_t seed) {
    kevo::testing::announce_race_and_hang(racing_file, a.hash());
    return truth.compare(a, b, seed);
  }
};
}  // namespace

TEST_CASE("a new best killed during its race is raced again on resume, not trusted", "[resume][store]") {
  const Problem problem = kevo::testing::synthetic_problem();
  const auto path = temp_path("killed_in_race.db");
  const auto racing_file = temp_path("racing.txt");
  const std::uint64_t racing = kevo::testing::kill_during_race(racing_file, [&] {
    LuckyThenKilledEvaluator evaluator{.racing_file = racing_file};
    auto store = store::SqliteStore::open(path).value();
    auto loop = make_loop(problem, evaluator, store, {.jobs = 1, .max_evaluations = 20, .seed = 4});
    (void)loop.run(loop.synthesizer().seed());
  });
  REQUIRE(racing != 0);

  auto store = store::SqliteStore::open(path).value();
  auto run = store.latest_run();
  REQUIRE(run);
  bool unsettled = false;
  const auto killed = store.load_nodes(run->id).value();
  for (const auto& n : killed)
    if (n.candidate.hash() == racing) unsettled = n.evaluation && !n.settled;
  CHECK(unsettled);  // stored (nothing finished is lost), but marked as not settled by its race

  SyntheticEvaluator evaluator;
  auto loop = make_loop(problem, evaluator, store, {.jobs = 1, .max_evaluations = 6, .seed = 4});
  auto result = loop.resume(run->id);
  REQUIRE(result);
  INFO("best " << result->best_speedup << ", best possible " << SyntheticEvaluator::best_possible());
  CHECK(result->best_speedup <= SyntheticEvaluator::best_possible());  // not the lucky, unraced figure
  const auto after = store.load_nodes(run->id).value();
  for (const auto& n : after) {
    if (n.candidate.hash() != racing) continue;
    REQUIRE(n.evaluation);
    CHECK(n.settled);
    CHECK(n.evaluation->speedup == Approx(SyntheticEvaluator::speedup_of(n.candidate.knobs)));
  }
}

TEST_CASE("a resumed run keeps the reference time stored with it, unless asked to re-time it", "[resume][store]") {
  const Problem problem = kevo::testing::synthetic_problem();
  auto store = store::SqliteStore::open(temp_path("reference.db")).value();
  ScaledReferenceEvaluator quiet_machine{.reference = 1.0};
  auto first = make_loop(problem, quiet_machine, store, {.jobs = 1, .max_evaluations = 4});
  auto made = first.run(first.synthesizer().seed());
  REQUIRE(made);
  CHECK(store.find_run(made->run_id)->reference_seconds == 1.0);

  // The same machine, loaded: the reference now takes twice as long, the candidates do not.
  ScaledReferenceEvaluator loaded_machine{.reference = 2.0};
  auto again = make_loop(problem, loaded_machine, store, {.jobs = 1, .max_evaluations = 10});
  auto resumed = again.resume(made->run_id);
  REQUIRE(resumed);
  CHECK(resumed->reference_from_store);
  CHECK(resumed->reference_seconds == 1.0);
  std::size_t evaluated = 0;
  const auto nodes = store.load_nodes(made->run_id).value();
  for (const auto& n : nodes) {
    if (!n.evaluation || !n.evaluation->ok()) continue;
    ++evaluated;
    INFO("node " << n.key);
    CHECK(n.evaluation->reference_seconds == 1.0);
    CHECK(n.evaluation->speedup == Approx(SyntheticEvaluator::speedup_of(n.candidate.knobs)));  // one scale across segments
  }
  CHECK(evaluated > 5);
  CHECK(resumed->verified_speedup == Approx(SyntheticEvaluator::speedup_of(resumed->best_candidate->knobs)));

  // Asked to re-time, the run takes the new time from here on, and keeps it for later resumes.
  auto retimed = make_loop(problem, loaded_machine, store, {.jobs = 1, .max_evaluations = 14, .retime_reference = true});
  auto later = retimed.resume(made->run_id);
  REQUIRE(later);
  CHECK_FALSE(later->reference_from_store);
  CHECK(store.find_run(made->run_id)->reference_seconds == 2.0);
  CHECK(later->verified_speedup == Approx(2.0 * SyntheticEvaluator::speedup_of(later->best_candidate->knobs)));
}

}  // namespace kevo_tests::resume_faults_test
