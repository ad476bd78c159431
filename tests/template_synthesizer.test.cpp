// The template synthesizer's moves beyond one knob at a time: the problem's starting points, tried
// from the root first, and compound moves that set several knobs at once.
#include <kevo/problem_loader.hpp>
#include <kevo/synth/template_synthesizer.hpp>

#include "support/synthetic_evaluator.hpp"

#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

namespace kevo_tests::template_synthesizer_test {

using namespace kevo;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A copy of the shipped softmax problem whose manifest gains `starting_points` (raw JSON).
std::filesystem::path softmax_with_starting_points(const std::string& name, const std::string& json) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("kevo-starting-points-{}-{}", ::getpid(), name);
  std::filesystem::remove_all(dir);
  std::filesystem::copy(std::filesystem::path(KEVO_SOURCE_DIR) / "problems" / "softmax", dir);
  std::ifstream in(dir / "problem.json");
  std::stringstream manifest;
  manifest << in.rdbuf();
  std::string text = manifest.str();
  text.insert(text.find('{') + 1, "\n  \"starting_points\": " + json + ",");
  std::ofstream(dir / "problem.json") << text;
  return dir;
}

Attempt attempt_of(const Candidate& c, NodeId node, double speedup) {
  Attempt a;
  a.node = node;
  a.candidate = std::make_shared<const Candidate>(c);
  a.evaluation.speedup = speedup;
  a.evaluation.seconds = 1.0 / speedup;
  a.evaluation.reference_seconds = 1.0;
  return a;
}

// A request to grow a child of the root (no grandparent), as the loop makes it.
GenerationRequest child_of_root(const Problem& problem, const Candidate& root, std::uint64_t seed) {
  GenerationRequest r;
  r.problem = &problem;
  r.parent = attempt_of(root, 0, 1.0);
  r.memory_mode = MemoryMode::combined;
  r.seed = seed;
  return r;
}

std::size_t knobs_changed(const Knobs& from, const Knobs& to) {
  std::size_t n = 0;
  for (const auto& [name, value] : to) n += from.at(name) != value;
  return n;
}

}  // namespace

TEST_CASE("a problem's starting points load, one naming an unknown knob or value is refused by name") {
  auto good = load_problem(softmax_with_starting_points(
      "good", R"([{"name": "wide rows", "knobs": {"vector_width": 8, "unroll": 4}}, {"name": "one knob", "knobs": {"unroll": 2}}])"));
  REQUIRE(good);
  REQUIRE(good->starting_points.size() == 2);
  CHECK(good->starting_points[0].name == "wide rows");
  CHECK(good->starting_points[0].knobs == Knobs{{"vector_width", "8"}, {"unroll", "4"}});
  CHECK(good->starting_points[1].knobs == Knobs{{"unroll", "2"}});

  for (auto [json, field] : {std::pair{R"([{"name": "x", "knobs": {"warp_size": 32}}])", "starting_points[0].knobs.warp_size"},
                             {R"([{"name": "x", "knobs": {"unroll": 3}}])", "starting_points[0].knobs.unroll"},
                             {R"([{"name": "x", "knobs": {}}])", "starting_points[0].knobs"},
                             {R"([{"knobs": {"unroll": 2}}])", "starting_points[0].name"},
                             {R"({"name": "x"})", "starting_points"}}) {
    auto bad = load_problem(softmax_with_starting_points("bad", json));
    REQUIRE_FALSE(bad);
    INFO(bad.error().message);
    CHECK(contains(bad.error().message, "problem.json"));
    CHECK(contains(bad.error().message, std::string("'") + field + "'"));
  }
}

TEST_CASE("the root's first children are the problem's starting points, in order, each once") {
  Problem problem = testing::synthetic_problem();
  problem.starting_points = {{"corner", {{"a", "6"}, {"b", "5"}}}, {"far c", {{"c", "7"}}}};
  synth::TemplateSynthesizer synth(problem);
  const Candidate root = synth.seed();

  auto first = synth.generate(child_of_root(problem, root, 1));
  REQUIRE(first);
  CHECK(first->knobs == Knobs{{"a", "6"}, {"b", "5"}, {"c", "0"}, {"d", "0"}});
  CHECK(contains(first->origin, "starting point 'corner'"));
  CHECK(first->source == problem.render(first->knobs));
  auto second = synth.generate(child_of_root(problem, root, 2));
  REQUIRE(second);
  CHECK(second->knobs == Knobs{{"a", "0"}, {"b", "0"}, {"c", "7"}, {"d", "0"}});
  CHECK(contains(second->origin, "starting point 'far c'"));
  auto third = synth.generate(child_of_root(problem, root, 3));
  REQUIRE(third);
  CHECK_FALSE(contains(third->origin, "starting point"));

  SECTION("below the root, moves are relative to the parent, not starting points") {
    synth::TemplateSynthesizer fresh(problem);
    GenerationRequest deeper = child_of_root(problem, *third, 4);
    deeper.grandparent = attempt_of(root, 0, 1.0);
    auto child = fresh.generate(deeper);
    REQUIRE(child);
    CHECK_FALSE(contains(child->origin, "starting point"));
  }
  SECTION("a resumed search does not propose a starting point its tree already holds") {
    synth::TemplateSynthesizer resumed(problem);
    resumed.remember(*first);
    auto child = resumed.generate(child_of_root(problem, root, 5));
    REQUIRE(child);
    CHECK(contains(child->origin, "starting point 'far c'"));
  }
}

TEST_CASE("about one random move in four sets two or three knobs at once, none sets more") {
  const Problem problem = testing::synthetic_problem();
  const Knobs root_knobs = problem.default_knobs();
  std::map<std::size_t, int> moves_by_size;
  const int draws = 400;
  for (int seed = 0; seed < draws; ++seed) {
    synth::TemplateSynthesizer synth(problem);  // fresh each time: nothing proposed before
    auto child = synth.generate(child_of_root(problem, synth.seed(), static_cast<std::uint64_t>(seed)));
    REQUIRE(child);
    const std::size_t changed = knobs_changed(root_knobs, child->knobs);
    ++moves_by_size[changed];
    if (changed > 1) CHECK(std::count(child->origin.begin(), child->origin.end(), ';') == static_cast<long>(changed) - 1);
  }
  INFO("single " << moves_by_size[1] << ", double " << moves_by_size[2] << ", triple " << moves_by_size[3]);
  CHECK(moves_by_size[1] + moves_by_size[2] + moves_by_size[3] == draws);
  const int compound = moves_by_size[2] + moves_by_size[3];
  CHECK(compound > draws / 4 - 40);  // 100 expected, standard deviation about 9
  CHECK(compound < draws / 4 + 40);
  CHECK(moves_by_size[2] > 0);
  CHECK(moves_by_size[3] > 0);

  synth::TemplateSynthesizer single_steps(problem, {.compound_move_rate = 0.0});
  for (int seed = 0; seed < 20; ++seed) {
    auto child = single_steps.generate(child_of_root(problem, single_steps.seed(), static_cast<std::uint64_t>(seed)));
    REQUIRE(child);
    CHECK(knobs_changed(root_knobs, child->knobs) == 1);
  }
}

}  // namespace kevo_tests::template_synthesizer_test
