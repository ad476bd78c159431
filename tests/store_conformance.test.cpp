// One suite over every SearchStore model: SqliteStore, MemoryStore, and PostgresStore against the real server
// that ctest's `postgres` fixture starts (tests/support/postgres_server.sh) and names in
// KEVO_TEST_POSTGRES. Each test works in its own store (a file, or a schema of its own), so the
// tests run in parallel.
#include <kevo/default_search_loop.hpp>
#include <kevo/store/memory_store.hpp>
#include <kevo/store/sqlite_store.hpp>
#if KEVO_TEST_HAVE_POSTGRES
#include <kevo/store/postgres_store.hpp>
#endif

#include "support/synthetic_evaluator.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <thread>
#include <unistd.h>

namespace kevo_tests::store_conformance_test {

using namespace kevo;

namespace {
std::atomic<int> stores_made{0};

/// A fresh, empty store of one kind, gone when the test ends. `open()` gives a new connection to it
/// each time, as another process would have.
template <class Store>
struct FreshStore;

template <>
struct FreshStore<store::SqliteStore> {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               fmt::format("kevo-conformance-{}-{}.db", ::getpid(), stores_made++);
  FreshStore() { remove(); }
  ~FreshStore() { remove(); }
  bool available() const { return true; }
  expected<store::SqliteStore, Error> open() const { return store::SqliteStore::open(path); }
  /// Turns the store into one written before runs kept their target identity.
  void forget_target_identities() const {
    auto db = detail::SqliteHandle::open(path.string());
    REQUIRE(db);
    REQUIRE(db->exec("ALTER TABLE runs DROP COLUMN target_identity"));
  }
  void remove() const {
    for (auto suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path.string() + suffix);
  }
};

/// The memory store: every open() is another handle on the one store, as another connection would be.
/// It passes every test here but the one about older files' formats, which it never had.
template <>
struct FreshStore<store::MemoryStore> {
  store::MemoryStore store = store::MemoryStore::open().value();
  bool available() const { return true; }
  expected<store::MemoryStore, Error> open() const { return store; }
};

#if KEVO_TEST_HAVE_POSTGRES
/// The fixture's server, or empty (with the reason printed) where the tests run outside ctest.
std::string postgres_conninfo() {
  const char* conninfo = std::getenv("KEVO_TEST_POSTGRES");
  if (conninfo && *conninfo) return conninfo;
  WARN("KEVO_TEST_POSTGRES is unset: the PostgreSQL half of this test is skipped (ctest starts a server and sets it)");
  return {};
}

template <>
struct FreshStore<store::PostgresStore> {
  std::string server = postgres_conninfo();
  std::string schema = fmt::format("kevo_conformance_{}_{}", ::getpid(), stores_made++);
  std::optional<detail::PgConnection> admin;

  FreshStore() {
    if (server.empty()) return;
    admin.emplace(detail::PgConnection::connect(server).value());
    run(fmt::format("DROP SCHEMA IF EXISTS {} CASCADE; CREATE SCHEMA {}", quoted(), quoted()));
  }
  ~FreshStore() {
    if (admin) admin->exec(fmt::format("DROP SCHEMA IF EXISTS {} CASCADE", quoted()).c_str());
  }
  bool available() const { return !server.empty(); }
  /// The store's tables go to the connection's search_path: this test's schema.
  std::string conninfo() const { return fmt::format("{} options='-csearch_path={}'", server, schema); }
  expected<store::PostgresStore, Error> open() const { return store::PostgresStore::open(conninfo()); }
  /// Turns the store into one written before runs kept their target identity: schema version 1.
  void forget_target_identities() {
    run(fmt::format("ALTER TABLE {0}.runs DROP COLUMN target_identity; UPDATE {0}.kevo_schema SET version = 1", quoted()));
  }

  std::string quoted() const {
    char* q = PQescapeIdentifier(admin->get(), schema.c_str(), schema.size());
    std::string out = q;
    PQfreemem(q);
    return out;
  }
  void run(const std::string& sql) {
    auto r = admin->exec(sql.c_str());
    INFO(r.error());
    REQUIRE(r.ok());
  }
};
#define KEVO_PERSISTENT_STORES store::SqliteStore, store::PostgresStore
#else
#define KEVO_PERSISTENT_STORES store::SqliteStore
#endif
#define KEVO_STORES KEVO_PERSISTENT_STORES, store::MemoryStore

Candidate candidate(int a, int b = 0) {
  return Candidate{fmt::format("a={} b={}", a, b), {{"a", std::to_string(a)}, {"b", std::to_string(b)}}, "test"};
}
Evaluation evaluation(double speedup, FailureKind failure = FailureKind::none) {
  Evaluation e;
  e.failure = failure;
  e.speedup = speedup;
  e.seconds = 1.0 / speedup;
  e.reference_seconds = 1.0;
  e.diagnostics.bottleneck = Bottleneck::memory;
  e.diagnostics.achieved_gbytes_per_s = 123.5;
  e.diagnostics.achieved_gflops = 7.25;
  e.diagnostics.roofline_fraction = 0.4;
  e.diagnostics.message = "it's \"fine\"; -- really";  // quotes and comment marks stay data
  e.diagnostics.detail = "line 1\nline 2";
  return e;
}
/// Adds `c` to `run` with its finished evaluation `e`.
template <class Store>
void record(Store& store, std::int64_t run, const Candidate& c, const Evaluation& e, bool settled = true) {
  const NodeKey key = store.add_node(run, no_key, no_key, c, MemoryMode::fresh).value();
  REQUIRE(store.add_evaluation(run, key, e, settled));
}
std::vector<std::string> sources(const expected<std::vector<Candidate>, Error>& candidates) {
  REQUIRE(candidates);
  std::vector<std::string> out;
  for (const auto& c : *candidates) out.push_back(c.source);
  return out;
}

/// An evaluator that says which target its figures are measured on.
struct EvaluatorOn : kevo::testing::SyntheticEvaluator {
  explicit EvaluatorOn(std::string identity) : target(std::move(identity)) {}
  std::string target;
  std::string target_identity() const { return target; }
};
}  // namespace

TEMPLATE_TEST_CASE("a run's nodes and evaluations come back as they were recorded", "[store]", KEVO_STORES) {
  FreshStore<TestType> fresh;
  if (!fresh.available()) return;
  auto store = fresh.open();
  REQUIRE(store);
  CHECK_FALSE(store->latest_run());  // an empty store holds nothing to resume

  auto run = store->begin_run({.problem = "scoring", .problem_dir = "problems/scoring", .settings_json = R"({"jobs": 2})",
                               .problem_identity = "id-1", .reference_seconds = 0.5});
  REQUIRE(run);
  auto root = store->add_node(*run, no_key, no_key, candidate(0), MemoryMode::fresh);
  REQUIRE(root);
  auto child = store->add_node(*run, *root, no_key, candidate(1), MemoryMode::trajectory);
  REQUIRE(child);
  auto crossed = store->add_node(*run, *root, *child, candidate(2, 3), MemoryMode::combined);
  REQUIRE(crossed);
  REQUIRE(store->add_evaluation(*run, *root, evaluation(1.0)));
  REQUIRE(store->add_evaluation(*run, *child, evaluation(0, FailureKind::compile_error)));
  REQUIRE(store->finish_run(*run, "evaluation_budget", *root, 0.98));

  auto info = store->find_run(*run);
  REQUIRE(info);
  CHECK(info->problem == "scoring");
  CHECK(info->problem_dir == "problems/scoring");
  CHECK(info->settings_json == R"({"jobs": 2})");
  CHECK(info->problem_identity == "id-1");
  CHECK(info->reference_seconds == 0.5);
  CHECK(info->stopped_because == "evaluation_budget");
  CHECK(info->best_node == *root);
  CHECK(info->verified_speedup == 0.98);
  auto missing = store->find_run(*run + 1000);
  REQUIRE_FALSE(missing);
  CHECK_THAT(missing.error().message, Catch::Contains("no run"));

  auto nodes = store->load_nodes(*run);
  REQUIRE(nodes);
  REQUIRE(nodes->size() == 3);
  const auto& n = *nodes;
  CHECK(n[0].key == *root);
  CHECK(n[0].parent == no_key);
  CHECK(n[1].parent == *root);
  CHECK(n[2].mate == *child);
  CHECK(n[1].memory_mode == MemoryMode::trajectory);
  CHECK(n[2].memory_mode == MemoryMode::combined);
  CHECK(n[2].candidate.source == "a=2 b=3");
  CHECK(n[2].candidate.knobs == candidate(2, 3).knobs);
  CHECK(n[2].candidate.hash() == candidate(2, 3).hash());
  CHECK(n[2].candidate.origin == "test");
  CHECK_FALSE(n[2].evaluation);  // not finished
  REQUIRE(n[0].evaluation);
  const Evaluation expected = evaluation(1.0);
  CHECK(n[0].evaluation->speedup == expected.speedup);
  CHECK(n[0].evaluation->seconds == expected.seconds);
  CHECK(n[0].evaluation->diagnostics.bottleneck == Bottleneck::memory);
  CHECK(n[0].evaluation->diagnostics.achieved_gbytes_per_s == 123.5);
  CHECK(n[0].evaluation->diagnostics.achieved_gflops == 7.25);
  CHECK(n[0].evaluation->diagnostics.roofline_fraction == 0.4);
  CHECK(n[0].evaluation->diagnostics.message == expected.diagnostics.message);
  CHECK(n[0].evaluation->diagnostics.detail == "line 1\nline 2");
  REQUIRE(n[1].evaluation);
  CHECK(n[1].evaluation->failure == FailureKind::compile_error);
  CHECK(n[0].finish_order < n[1].finish_order);

  // A second run is the latest; the first keeps its own nodes.
  auto second = store->begin_run({.problem = "scoring"});
  REQUIRE(second);
  auto latest = store->latest_run();
  REQUIRE(latest);
  CHECK(latest->id == *second);
  CHECK(latest->stopped_because.empty());
  CHECK(latest->best_node == no_key);
  CHECK(store->load_nodes(*second)->empty());
  CHECK(store->load_nodes(*run)->size() == 3);

  // Durable when the call returned: another connection sees it all.
  auto other = fresh.open();
  REQUIRE(other);
  CHECK(other->load_nodes(*run)->size() == 3);
  CHECK(other->latest_run()->id == *second);
}

TEMPLATE_TEST_CASE("a replaced evaluation keeps its place in the finish order, and its settled flag", "[store]",
                   KEVO_STORES) {
  FreshStore<TestType> fresh;
  if (!fresh.available()) return;
  auto store = fresh.open();
  REQUIRE(store);
  auto run = store->begin_run({.problem = "scoring"}).value();
  const NodeKey a = store->add_node(run, no_key, no_key, candidate(1), MemoryMode::fresh).value();
  const NodeKey b = store->add_node(run, a, no_key, candidate(2), MemoryMode::fresh).value();
  const NodeKey c = store->add_node(run, a, no_key, candidate(3), MemoryMode::fresh).value();
  REQUIRE(store->add_evaluation(run, c, evaluation(2.0)));
  REQUIRE(store->add_evaluation(run, b, evaluation(3.0), false));  // a new best, its race not run yet
  REQUIRE(store->add_evaluation(run, a, evaluation(1.0)));

  auto nodes = store->load_nodes(run).value();
  CHECK_FALSE(nodes[1].settled);
  CHECK(nodes[0].settled);
  CHECK(nodes[2].settled);
  // The race settles b's figure: the row is replaced where it was.
  REQUIRE(store->add_evaluation(run, b, evaluation(2.5), true));
  auto after = store->load_nodes(run).value();
  REQUIRE(after.size() == 3);
  CHECK(after[1].settled);
  CHECK(after[1].evaluation->speedup == 2.5);
  CHECK(after[2].finish_order < after[1].finish_order);  // c finished first,
  CHECK(after[1].finish_order < after[0].finish_order);  // then b, then a
  CHECK(after[1].finish_order == nodes[1].finish_order);
  // And back to unsettled (a kill between storing and racing a re-timed best).
  REQUIRE(store->add_evaluation(run, b, evaluation(2.6), false));
  CHECK_FALSE(store->load_nodes(run).value()[1].settled);
}

TEMPLATE_TEST_CASE("a run keeps the reference time its speedups are over", "[store]", KEVO_STORES) {
  FreshStore<TestType> fresh;
  if (!fresh.available()) return;
  auto store = fresh.open();
  REQUIRE(store);
  auto run = store->begin_run({.problem = "scoring", .reference_seconds = 0.053}).value();
  CHECK(store->find_run(run)->reference_seconds == 0.053);
  REQUIRE(store->set_reference_seconds(run, 0.129));
  CHECK(store->find_run(run)->reference_seconds == 0.129);
  auto unset = store->begin_run({.problem = "scoring"}).value();
  CHECK(store->find_run(unset)->reference_seconds == 0);
}

TEMPLATE_TEST_CASE("earlier runs of the same problem give their best settled candidates", "[store]", KEVO_STORES) {
  FreshStore<TestType> fresh;
  if (!fresh.available()) return;
  auto store = fresh.open();
  REQUIRE(store);
  const auto first = store->begin_run({.problem = "scoring"}).value();
  record(*store, first, candidate(1), evaluation(2.0));
  record(*store, first, candidate(2), evaluation(5.0));
  record(*store, first, candidate(3), evaluation(9.0, FailureKind::wrong_answer));  // fast and wrong: never a warm start
  record(*store, first, candidate(4), evaluation(8.0), false);                        // unsettled: not trusted
  const auto second = store->begin_run({.problem = "scoring"}).value();
  record(*store, second, candidate(1), evaluation(3.0));  // the same candidate again: once, at its best figure
  record(*store, second, candidate(5), evaluation(4.0));
  const auto other_problem = store->begin_run({.problem = "softmax"}).value();
  record(*store, other_problem, candidate(6), evaluation(50.0));
  const auto now = store->begin_run({.problem = "scoring"}).value();
  record(*store, now, candidate(7), evaluation(60.0));  // the asking run's own nodes are not "earlier"

  auto best = store->best_of_earlier_runs("scoring", now, 10);
  REQUIRE(best);
  REQUIRE(best->size() == 3);
  CHECK((*best)[0].source == candidate(2).source);
  CHECK((*best)[0].knobs == candidate(2).knobs);
  CHECK_THAT((*best)[0].origin, Catch::Contains("earlier run") && Catch::Contains("5.00x"));
  CHECK((*best)[1].source == candidate(5).source);
  CHECK((*best)[2].source == candidate(1).source);
  CHECK_THAT((*best)[2].origin, Catch::Contains("3.00x"));
  CHECK(store->best_of_earlier_runs("scoring", now, 1)->size() == 1);
  CHECK(store->best_of_earlier_runs("unknown", now, 4)->empty());
}

TEMPLATE_TEST_CASE("a warm start takes the runs measured on the same target only, unless it asks for any", "[store]", KEVO_STORES) {
  FreshStore<TestType> fresh;
  if (!fresh.available()) return;
  auto store = fresh.open();
  REQUIRE(store);
  const auto on_a = store->begin_run({.problem = "scoring", .target_identity = "A"}).value();
  record(*store, on_a, candidate(1), evaluation(2.0));
  const auto on_b = store->begin_run({.problem = "scoring", .target_identity = "B"}).value();
  record(*store, on_b, candidate(2), evaluation(5.0));
  const auto now = store->begin_run({.problem = "scoring", .target_identity = "A"}).value();

  CHECK(sources(store->best_of_earlier_runs("scoring", "A", now, 10)) == std::vector{candidate(1).source});
  CHECK(sources(store->best_of_earlier_runs("scoring", "B", now, 10)) == std::vector{candidate(2).source});
  CHECK(sources(store->best_of_earlier_runs("scoring", "C", now, 10)).empty());
  const std::vector every_target{candidate(2).source, candidate(1).source};
  CHECK(sources(store->best_of_earlier_runs("scoring", "", now, 10)) == every_target);
  CHECK(sources(store->best_of_earlier_runs("scoring", now, 10)) == every_target);  // the three-argument form: any target

  CHECK(store->find_run(on_a)->target_identity == "A");
  CHECK(store->find_run(on_b)->target_identity == "B");
  CHECK(store->latest_run()->target_identity == "A");
  CHECK(store->find_run(store->begin_run({.problem = "scoring"}).value())->target_identity.empty());
}

TEMPLATE_TEST_CASE("a store written before runs kept their target opens, and their target is unknown", "[store]",
                   KEVO_PERSISTENT_STORES) {
  FreshStore<TestType> fresh;
  if (!fresh.available()) return;
  std::int64_t old_run = 0;
  {
    auto store = fresh.open();
    REQUIRE(store);
    old_run = store->begin_run({.problem = "scoring", .target_identity = "A"}).value();
    record(*store, old_run, candidate(1), evaluation(2.0));
  }
  fresh.forget_target_identities();
  auto store = fresh.open();
  REQUIRE(store);
  auto info = store->find_run(old_run);
  REQUIRE(info);
  CHECK(info->target_identity.empty());
  // Unknown is not this target: only a warm start from any target takes the old run.
  const auto now = store->begin_run({.problem = "scoring", .target_identity = "A"}).value();
  CHECK(sources(store->best_of_earlier_runs("scoring", "A", now, 10)).empty());
  CHECK(sources(store->best_of_earlier_runs("scoring", "", now, 10)) == std::vector{candidate(1).source});
  CHECK(store->find_run(now)->target_identity == "A");
}

// Two searches write to one store at once, each through its own connection (as two processes
// would); a third run then starts from the best that they found.
TEMPLATE_TEST_CASE("two searches on one store at once, then a third starts from their best", "[store][loop]",
                   KEVO_STORES) {
  FreshStore<TestType> fresh;
  if (!fresh.available()) return;
  const Problem problem = kevo::testing::synthetic_problem();
  REQUIRE(fresh.open());  // creates the schema before the searches race to it

  std::optional<expected<SearchResult, Error>> results[2];
  std::thread searches[2];
  for (int i = 0; i < 2; ++i)
    searches[i] = std::thread([&, i] {
      auto store = fresh.open();
      if (!store) {
        results[i] = unexpected(store.error());
        return;
      }
      kevo::testing::SyntheticEvaluator evaluator;
      evaluator.delay = std::chrono::milliseconds(2);  // so that the two interleave
      auto loop = make_search_loop(problem, evaluator, *store,
                                   {.jobs = 2, .max_evaluations = 40, .seed = static_cast<std::uint64_t>(11 + i),
                                    .warm_start = 0});
      results[i] = loop.run(loop.synthesizer().seed());
    });
  for (auto& t : searches) t.join();
  double best_so_far = 0;
  auto store = fresh.open();
  REQUIRE(store);
  std::set<std::int64_t> runs;
  for (auto& r : results) {
    REQUIRE(r.has_value());
    INFO((*r ? std::string() : r->error().message));
    REQUIRE(*r);
    const SearchResult& result = **r;
    runs.insert(result.run_id);
    best_so_far = std::max(best_so_far, result.best_speedup);
    // Each run holds its own nodes, every one evaluated once, none of the other's.
    auto nodes = store->load_nodes(result.run_id);
    REQUIRE(nodes);
    std::size_t evaluated = 0;
    for (const auto& n : *nodes) evaluated += n.evaluation.has_value();
    CHECK(evaluated == result.evaluations);
    auto info = store->find_run(result.run_id);
    REQUIRE(info);
    CHECK(info->best_node == result.best_key);
  }
  CHECK(runs.size() == 2);

  kevo::testing::SyntheticEvaluator evaluator;
  auto third = make_search_loop(problem, evaluator, *store, {.jobs = 1, .max_evaluations = 4, .seed = 3});
  auto r3 = third.run(third.synthesizer().seed());
  REQUIRE(r3);
  // Its first children are the earlier runs' best candidates: four evaluations reach their best.
  CHECK(r3->best_speedup >= best_so_far);
  double best_seed = 0;
  for (NodeId id = 1; id <= 4; ++id) {
    CHECK_THAT(third.candidate(id).origin, Catch::Contains("earlier run"));
    best_seed = std::max(best_seed, kevo::testing::SyntheticEvaluator::speedup_of(third.candidate(id).knobs));
  }
  CHECK(best_seed == best_so_far);
}

TEMPLATE_TEST_CASE("a search warm-starts from runs on its evaluator's target, and from other targets' only when asked",
                   "[store][loop]", KEVO_STORES) {
  FreshStore<TestType> fresh;
  if (!fresh.available()) return;
  const Problem problem = kevo::testing::synthetic_problem();
  auto store = fresh.open();
  REQUIRE(store);
  EvaluatorOn gpu_a("cuda; gpu: A"), gpu_b("cuda; gpu: B");
  auto first = make_search_loop(problem, gpu_a, *store, {.jobs = 1, .max_evaluations = 12, .seed = 1});
  auto r1 = first.run(first.synthesizer().seed());
  REQUIRE(r1);
  CHECK(store->find_run(r1->run_id)->target_identity == "cuda; gpu: A");

  // The children of a later run's root that came from earlier runs.
  auto warm_starts = [&](EvaluatorOn& evaluator, bool any_target) {
    auto loop = make_search_loop(problem, evaluator, *store,
                                 {.jobs = 1, .max_evaluations = 6, .seed = 2, .warm_start_any_target = any_target});
    auto r = loop.run(loop.synthesizer().seed());
    REQUIRE(r);
    CHECK(store->find_run(r->run_id)->target_identity == evaluator.target);
    std::size_t count = 0;
    for (NodeId id = 1; id < loop.tree().size(); ++id)
      count += loop.candidate(id).origin.find("earlier run") != std::string::npos;
    return count;
  };
  SECTION("another target's runs are no warm start") { CHECK(warm_starts(gpu_b, false) == 0); }
  SECTION("unless the run asks for any target's") { CHECK(warm_starts(gpu_b, true) > 0); }
  SECTION("the same target's are") { CHECK(warm_starts(gpu_a, false) > 0); }
}

#if KEVO_TEST_HAVE_POSTGRES
TEST_CASE("PostgreSQL: a server that cannot be reached is a one-line error naming it", "[store][postgres]") {
  auto store = store::PostgresStore::open("host=127.0.0.1 port=1 dbname=nowhere user=kevo connect_timeout=5");
  REQUIRE_FALSE(store);
  CHECK_THAT(store.error().message, Catch::StartsWith("PostgreSQL at 127.0.0.1:1/nowhere: cannot connect"));
  CHECK(store.error().message.find('\n') == std::string::npos);

  auto garbled = store::PostgresStore::open("host=127.0.0.1 port");
  REQUIRE_FALSE(garbled);
  CHECK_THAT(garbled.error().message, Catch::StartsWith("PostgreSQL: invalid connection string"));
  CHECK(garbled.error().message.find('\n') == std::string::npos);
}

TEST_CASE("PostgreSQL: the schema is versioned, created once, and a newer one is refused", "[store][postgres]") {
  FreshStore<store::PostgresStore> fresh;
  if (!fresh.available()) return;
  // Several processes opening a fresh database at once create its schema once.
  std::atomic<int> opened{0};
  std::vector<std::thread> openers;
  for (int i = 0; i < 4; ++i)
    openers.emplace_back([&] {
      if (fresh.open()) ++opened;
    });
  for (auto& t : openers) t.join();
  CHECK(opened == 4);
  auto version = fresh.admin->query(fmt::format("SELECT version FROM {}.kevo_schema", fresh.quoted()).c_str());
  REQUIRE(version.ok());
  REQUIRE(version.rows() == 1);
  CHECK(version.integer(0, 0) == store::PostgresStore::schema_version);

  // A store written by a newer kevo: refused, not misread.
  auto bump = fresh.admin->query(fmt::format("UPDATE {}.kevo_schema SET version = $1", fresh.quoted()).c_str(), {"99"});
  REQUIRE(bump.ok());
  auto newer = fresh.open();
  REQUIRE_FALSE(newer);
  CHECK_THAT(newer.error().message, Catch::Contains(fmt::format("schema is version 99, newer than this kevo knows ({})",
                                                                store::PostgresStore::schema_version)));
  CHECK_THAT(newer.error().message, Catch::StartsWith("PostgreSQL at "));
}
#endif

}  // namespace kevo_tests::store_conformance_test
