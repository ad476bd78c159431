// The HTML report, drawn from a real store after a real (synthetic-landscape) search.
#include <kevo/report/html_report.hpp>
#include <kevo/default_search_loop.hpp>
#include <kevo/store/sqlite_store.hpp>

#include "support/synthetic_evaluator.hpp"

#include <catch2/catch.hpp>

using namespace kevo;

namespace {
std::size_t count(const std::string& text, std::string_view what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("the report plots every evaluation and draws every node", "[report]") {
  const Problem problem = kevo::testing::synthetic_problem();
  kevo::testing::SyntheticEvaluator evaluator;
  auto store = store::SqliteStore::open(":memory:").value();
  auto loop = make_search_loop(problem, evaluator, store, {.max_evaluations = 30, .seed = 3});
  auto result = loop.run(loop.synthesizer().seed());
  REQUIRE(result);

  auto html = report::render_html(store, result->run_id);
  REQUIRE(html);
  // The headline gives the verified figure, and names the best node as the result and the store do.
  REQUIRE(result->verified);
  CHECK_THAT(*html, Catch::Contains(fmt::format("31 evaluations; best {:.2f}x over the reference (verified: node {},",
                                                result->verified_speedup, result->best_key)));
  CHECK_THAT(*html, Catch::Contains("stopped: evaluation_budget"));
  // Each evaluation is a dot (correct) or a red cross (failed) in the progress plot...
  std::size_t failed = 0;
  for (const auto& [kind, n] : result->failures) failed += n;
  const std::string plot = html->substr(0, html->find("The fastest candidates"));
  CHECK(count(plot, "<circle") + count(plot, ">x<title>") == 31);
  CHECK(count(plot, ">x<title>") == failed);
  // ...and each node a circle in the tree.
  const std::string tree = html->substr(html->find("The search tree"));
  CHECK(count(tree, "<circle") == 31);
  CHECK_THAT(*html, Catch::Contains("The best kernel"));
}

TEST_CASE("the console, the JSON summary, the report and the store name the same best node", "[report][store]") {
  const Problem problem = kevo::testing::synthetic_problem();
  kevo::testing::SyntheticEvaluator evaluator;
  auto store = store::SqliteStore::open(":memory:").value();
  // A first run, so that the second run's store keys are far from its tree ids.
  auto first = make_search_loop(problem, evaluator, store, {.max_evaluations = 6, .seed = 1, .warm_start = 0});
  REQUIRE(first.run(first.synthesizer().seed()));
  NodeKey last_progress_best = no_key;
  auto loop = make_search_loop(problem, evaluator, store,
                               {.max_evaluations = 20, .seed = 2, .warm_start = 0,
                                .on_progress = [&](const Progress& p) { last_progress_best = p.best_key; }});
  auto result = loop.run(loop.synthesizer().seed());
  REQUIRE(result);
  REQUIRE(result->verified);
  auto run = store.find_run(result->run_id).value();
  CHECK(run.best_node == result->best_key);  // runs.best_node, and what kevo-search prints and writes as JSON
  CHECK(last_progress_best == result->best_key);
  CHECK(run.verified_speedup == result->verified_speedup);
  auto nodes = store.load_nodes(result->run_id).value();
  for (const auto& n : nodes)
    if (n.key == result->best_key) CHECK(n.candidate.source == result->best_candidate->source);
  auto html = report::render_html(store, result->run_id).value();
  CHECK_THAT(html, Catch::Contains(fmt::format("(verified: node {},", result->best_key)));
  CHECK_THAT(html, Catch::Contains(fmt::format("The best kernel (node {})", result->best_key)));
  CHECK_THAT(html, Catch::Contains(fmt::format("best {:.2f}x over the reference (verified", result->verified_speedup)));
}

TEST_CASE("the report of an unknown run is an error", "[report]") {
  auto store = store::SqliteStore::open(":memory:").value();
  auto html = report::render_html(store, 42);
  REQUIRE_FALSE(html);
  CHECK_THAT(html.error().message, Catch::Contains("no run 42"));
}
