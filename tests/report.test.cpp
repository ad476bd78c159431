// The HTML report, drawn from a real store after a real (synthetic-landscape) search.
#include <kevo/report/comparison_report.hpp>
#include <kevo/report/html_report.hpp>
#include <kevo/default_search_loop.hpp>
#include <kevo/search/any_policy.hpp>
#include <kevo/store/sqlite_store.hpp>

#include "support/synthetic_evaluator.hpp"

#include <catch2/catch.hpp>

namespace kevo_tests::report_test {

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

TEST_CASE("the comparison draws one curve per run of a problem, named by its policy and verified figure", "[report]") {
  const Problem problem = kevo::testing::synthetic_problem();
  kevo::testing::SyntheticEvaluator evaluator;
  auto store = store::SqliteStore::open(":memory:").value();
  std::vector<std::pair<std::string, SearchResult>> runs;
  for (std::string name : {"greedy", "random", "evolutionary"}) {
    SearchLoop<synth::TemplateSynthesizer, search::AnyPolicy, memory::Adaptive, kevo::testing::SyntheticEvaluator,
               knowledge::NullRetriever, store::SqliteStore>
        loop(problem, synth::TemplateSynthesizer(problem), search::make_policy(name).value(), memory::Adaptive{}, evaluator,
             knowledge::NullRetriever{}, store,
             {.max_evaluations = 12, .seed = runs.size() + 1, .warm_start = 0, .settings_json = fmt::format(R"({{"policy":"{}"}})", name)});
    auto result = loop.run(loop.synthesizer().seed());
    REQUIRE(result);
    REQUIRE(result->verified);
    runs.emplace_back(name, std::move(*result));
  }
  // A run whose settings name no policy is still compared; a run of another problem is not.
  auto plain = make_search_loop(problem, evaluator, store, {.max_evaluations = 6, .seed = 9, .warm_start = 0});
  auto unnamed = plain.run(plain.synthesizer().seed());
  REQUIRE(unnamed);
  Problem other_problem = problem;
  other_problem.name = "other";
  auto other_loop = make_search_loop(other_problem, evaluator, store, {.max_evaluations = 4, .seed = 1, .warm_start = 0});
  auto other = other_loop.run(other_loop.synthesizer().seed());
  REQUIRE(other);

  auto html = report::render_comparison_html(store, "synthetic");
  REQUIRE(html);
  CHECK_THAT(*html, Catch::Contains("synthetic, 4 runs compared"));
  CHECK(count(*html, "<polyline class=\"run\"") == 4);
  for (std::size_t k = 0; k < runs.size(); ++k) {
    const auto& [name, r] = runs[k];
    CHECK_THAT(*html, Catch::Contains(fmt::format(R"(data-run="{}" points=")", r.run_id)));
    CHECK_THAT(*html, Catch::Contains(fmt::format(R"(stroke="{}" stroke-width="2"><title>run {}</title>)", report::detail::run_colours[k], r.run_id)));
    CHECK_THAT(*html, Catch::Contains(fmt::format("run {}, {}: verified {:.2f}x (node {})", r.run_id, name, r.verified_speedup, r.best_key)));
  }
  CHECK_THAT(*html, Catch::Contains(fmt::format("run {}: verified {:.2f}x", unnamed->run_id, unnamed->verified_speedup)));
  CHECK_THAT(*html, !Catch::Contains(fmt::format(R"(data-run="{}")", other->run_id)));
  // One point per finished evaluation: the seed and the budget's twelve.
  const auto points = html->find(fmt::format(R"(data-run="{}" points=")", runs[0].second.run_id));
  const std::string line = html->substr(points, html->find('"', html->find("points=\"", points) + 8) - points);
  CHECK(count(line, ",") == 13);
}

TEST_CASE("the comparison of a problem the store has no run of is an error", "[report]") {
  auto store = store::SqliteStore::open(":memory:").value();
  auto html = report::render_comparison_html(store, "synthetic");
  REQUIRE_FALSE(html);
  CHECK_THAT(html.error().message, Catch::Contains("no run of 'synthetic'"));
}

}  // namespace kevo_tests::report_test
