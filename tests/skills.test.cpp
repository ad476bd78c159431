// Learned skills keep their facts: one per improvement, with provenance, checked when a model
// rewrites them, withdrawn when their candidate is refused, and kept from older database files.
#include <kevo/knowledge/knowledge_base.hpp>
#include <kevo/knowledge/llm_skill_writer.hpp>
#include <kevo/knowledge/skill_distiller.hpp>
#include <kevo/memory/operators.hpp>
#include <kevo/problem_loader.hpp>
#include <kevo/search/greedy.hpp>
#include <kevo/search_loop.hpp>
#include <kevo/store/sqlite_store.hpp>
#include <kevo/synth/template_synthesizer.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <deque>
#include <functional>
#include <filesystem>
#include <unistd.h>

namespace kevo_tests::skills_test {

namespace fs = std::filesystem;
using namespace kevo;
using kevo::knowledge::KnowledgeBase;

namespace {

fs::path scratch_dir(std::string_view name) {
  fs::path dir = fs::temp_directory_path() / fmt::format("kevo-{}-{}", name, ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

KnowledgeBase open_kb(std::string database = ":memory:") {
  auto kb = KnowledgeBase::open({.database = std::move(database)});
  REQUIRE(kb);
  return std::move(*kb);
}

/// vector_width 4->8 on cpu_scoring: a memory-bound parent at 1.5x becomes 3.0x (2x better).
Skill widening(std::int64_t node_key) {
  Problem problem;
  problem.name = "cpu_scoring";
  problem.knobs = {{.name = "vector_width", .domain = {"1", "4", "8"}, .default_value = "1", .side = KnobSide::memory},
                   {.name = "unroll", .domain = {"1", "2", "4"}, .default_value = "1", .side = KnobSide::compute}};
  Candidate parent{.source = "p", .knobs = {{"vector_width", "4"}, {"unroll", "2"}}};
  Candidate child{.source = "c", .knobs = {{"vector_width", "8"}, {"unroll", "2"}}};
  Evaluation parent_eval{.speedup = 1.5};
  parent_eval.diagnostics.bottleneck = Bottleneck::memory;
  Evaluation child_eval{.speedup = 3.0};
  child_eval.diagnostics.bottleneck = Bottleneck::memory;
  child_eval.diagnostics.roofline_fraction = 0.8;
  auto skill = knowledge::distill_skill(problem, parent, parent_eval, child, child_eval);
  REQUIRE(skill);
  skill->node_key = node_key;
  return *skill;
}

/// A skill on `problem` moving `knob` from 1 to `to`.
Skill moving(std::string problem, std::string knob, std::string to, std::int64_t node_key) {
  return Skill{.problem = std::move(problem),
               .summary = fmt::format("Changing {} helped the memory-bound loop.", knob),
               .before = {{knob, "1"}},
               .after = {{knob, to}},
               .bottleneck = Bottleneck::memory,
               .improvement = 1.2,
               .speedup = 1.2,
               .node_key = node_key};
}

std::vector<KnowledgeSnippet> skills_for(KnowledgeBase& kb, std::string_view problem) {
  auto hits = kb.retrieve({.target = Target::cpu, .bottleneck = Bottleneck::memory, .problem_words = std::string(problem)});
  std::erase_if(hits, [](const KnowledgeSnippet& s) { return s.category != "skill"; });
  return hits;
}

struct ScriptedCompleter {
  std::deque<std::string> answers;
  expected<net::ChatResponse, net::LlmError> complete(const net::ChatRequest&) {
    REQUIRE(!answers.empty());
    net::ChatResponse r{.text = std::move(answers.front()), .finish_reason = "stop"};
    answers.pop_front();
    return r;
  }
};

}  // namespace

TEST_CASE("a skill keeps its facts beside its summary, and says where it was learned") {
  auto kb = open_kb();
  kb.learn(widening(17));
  const auto stored = kb.skills("cpu_scoring");
  REQUIRE(stored.size() == 1);
  const Skill& s = stored[0];
  CHECK(s.node_key == 17);
  CHECK(s.target == Target::cpu);
  CHECK(s.bottleneck == Bottleneck::memory);
  CHECK(s.before == Knobs{{"vector_width", "4"}, {"unroll", "2"}});
  CHECK(s.after == Knobs{{"vector_width", "8"}, {"unroll", "2"}});
  CHECK(s.improvement == Approx(2.0));
  CHECK(s.speedup == Approx(3.0));
  CHECK(contains(s.summary, "vector_width 4->8"));
  CHECK(kb.skills("softmax").empty());

  const auto hits = skills_for(kb, "cpu_scoring");
  REQUIRE(hits.size() == 1);
  CHECK(contains(hits[0].text, "Learned on cpu_scoring, node 17, cpu, 2.00x over its parent"));
}

TEST_CASE("a summary is checked against the facts") {
  const Skill facts = widening(17);
  using knowledge::contradiction;
  SECTION("faithful restatements pass") {
    CHECK_FALSE(contradiction(facts, "Widening vector_width from 4 to 8 let the memory-bound loop move more per load: 2x over "
                                     "the parent, 3.00x the reference, 80% of the roofline."));
    CHECK_FALSE(contradiction(facts, "Raising vector_width 4->8 with unroll=2 made it 100% faster on sm_90 style fp16 data."));
    CHECK_FALSE(contradiction(facts, "Setting vector_width to 8 cut memory traffic; increase vector_width to reduce loads."));
    CHECK_FALSE(contradiction(facts, "A wider vector_width cut memory traffic, about 2.0x."));
  }
  SECTION("a figure that was never measured") {
    auto why = contradiction(facts, "Widening vector_width made the kernel 2.7x faster.");
    REQUIRE(why);
    CHECK(contains(*why, "2.7"));
    CHECK(contradiction(facts, "It now reaches 95% of the roofline."));
    CHECK(contradiction(facts, "Loading 16 floats at a time helped."));
  }
  SECTION("a knob value the change did not set") {
    auto why = contradiction(facts, "Setting vector_width to 16 gave 2x.");
    REQUIRE(why);
    CHECK(contains(*why, "vector_width"));
    CHECK(contradiction(facts, "vector_width=4 was best."));
    CHECK(contradiction(facts, "Moving vector_width from 2 to 8 gave 2x."));
    CHECK(contradiction(facts, "Keeping unroll at 4 mattered."));
  }
  SECTION("a knob said to move the wrong way") {
    CHECK(contradiction(facts, "Lowering the vector_width cut register pressure."));
    CHECK(contradiction(facts, "Raising unroll helped."));  // unroll stayed at 2
  }
}

TEST_CASE("a model summary that contradicts the facts is refused for the distilled text") {
  auto kb = open_kb();
  ScriptedCompleter completer;
  completer.answers = {"Widening vector_width from 4 to 8 doubled the bytes per load of this memory-bound loop: 2x.",
                       "Widening vector_width to 8 made the memory-bound loop 2.7x faster.",
                       "Setting vector_width to 16 cut the memory traffic in half."};
  knowledge::LlmSkillWriter writer(kb, completer);
  const Skill distilled = widening(1);
  for (std::int64_t node = 1; node <= 3; ++node) writer.learn(widening(node));
  CHECK(contains(writer.last_contradiction(), "vector_width"));

  const auto stored = kb.skills("cpu_scoring");
  REQUIRE(stored.size() == 3);
  CHECK(contains(stored[0].summary, "doubled the bytes per load"));  // faithful: the model's words kept
  CHECK(stored[1].summary == distilled.summary);                       // a figure nothing measured
  CHECK(stored[2].summary == distilled.summary);                       // a knob value never set
}

TEST_CASE("skills are distinct per improvement") {
  auto kb = open_kb();
  kb.learn(widening(17));
  kb.learn(widening(23));  // the same change, found again at another node: a second skill
  kb.learn(widening(17));  // the same node learned twice: one skill
  CHECK(kb.size("skill") == 2);
  const auto stored = kb.skills();
  REQUIRE(stored.size() == 2);
  CHECK(stored[0].node_key == 17);
  CHECK(stored[1].node_key == 23);
  // Without a node key, as before: identical texts of a problem are one skill.
  kb.learn(widening(0));
  kb.learn(widening(0));
  CHECK(kb.size("skill") == 3);
}

TEST_CASE("retrieval returns every skill that says something different, and each change once") {
  auto kb = open_kb();
  kb.learn(moving("cpu_scoring", "vector_width", "8", 1));
  kb.learn(moving("cpu_scoring", "unroll", "4", 2));
  kb.learn(moving("cpu_scoring", "block", "64", 3));
  kb.learn(moving("cpu_scoring", "unroll", "4", 4));  // the same knob diff as node 2: a near-duplicate
  kb.learn(moving("cpu_scoring", "vector_width", "8", 5));
  CHECK(kb.size("skill") == 5);
  auto hits = skills_for(kb, "cpu_scoring");
  CHECK(hits.size() == 3);
  for (const char* change : {"vector_width=8", "unroll=4", "block=64"})
    CHECK(std::count_if(hits.begin(), hits.end(), [&](const auto& s) { return contains(s.text, change); }) == 1);

  kb.learn(moving("cpu_scoring", "stages", "3", 6));
  kb.learn(moving("cpu_scoring", "tile", "32", 7));
  CHECK(skills_for(kb, "cpu_scoring").size() == 4);  // max_skills_per_problem
}

TEST_CASE("a withdrawn skill is never retrieved again, in this run or a later one") {
  const fs::path dir = scratch_dir("skills-withdraw");
  const std::string db = (dir / "kevo.db").string();
  {
    auto kb = open_kb(db);
    kb.learn(moving("cpu_scoring", "vector_width", "8", 11));
    kb.learn(moving("cpu_scoring", "unroll", "4", 12));
    REQUIRE(skills_for(kb, "cpu_scoring").size() == 2);
    kevo::withdraw_skill(kb, "cpu_scoring", 11);   // as the search loop calls it
    CHECK(kb.withdraw_skill("cpu_scoring", 99));   // never learned: nothing to do
    CHECK_FALSE(kb.withdraw_skill("cpu_scoring", 0));  // names no skill
    const auto hits = skills_for(kb, "cpu_scoring");
    REQUIRE(hits.size() == 1);
    CHECK(contains(hits[0].text, "unroll=4"));
  }
  auto later = open_kb(db);
  CHECK(later.size("skill") == 1);
  const auto hits = skills_for(later, "cpu_scoring");
  REQUIRE(hits.size() == 1);
  CHECK(contains(hits[0].text, "node 12"));

  // Through the LLM writer too; a retriever without the hook ignores it.
  ScriptedCompleter completer;
  knowledge::LlmSkillWriter writer(later, completer);
  kevo::withdraw_skill(writer, "cpu_scoring", 12);
  CHECK(later.size("skill") == 0);
  knowledge::NullRetriever none;
  static_assert(!kevo::detail::retriever_withdraws<knowledge::NullRetriever>);
  kevo::withdraw_skill(none, "cpu_scoring", 12);
  fs::remove_all(dir);
}

TEST_CASE("a database file from before the facts opens and keeps its skills") {
  const fs::path dir = scratch_dir("skills-old-db");
  const std::string db = (dir / "kevo.db").string();
  {
    // The schema and a skill row exactly as the previous version wrote them.
    auto old = kevo::detail::SqliteHandle::open(db);
    REQUIRE(old);
    REQUIRE(old->exec("CREATE VIRTUAL TABLE kevo_knowledge USING fts5(title, tags, body, category UNINDEXED, "
                      "targets UNINDEXED, architectures UNINDEXED, source UNINDEXED, origin UNINDEXED, "
                      "tokenize = 'porter unicode61')"));
    REQUIRE(old->exec("INSERT INTO kevo_knowledge VALUES ('Skill learned on cpu_scoring (cpu)', "
                      "'skill cpu cpu_scoring memory-bound tile', 'Tiling by 16 kept rows in cache.\nKnobs before: tile=1\n"
                      "Knobs after: tile=16\nImprovement over the parent: 1.40x', 'skill', 'cpu', '', 'skill', 'cpu_scoring')"));
  }
  auto kb = open_kb(db);
  CHECK(kb.size("skill") == 1);
  CHECK(kb.skills().empty());  // it has no facts, and needs none to be retrieved
  kb.learn(moving("cpu_scoring", "unroll", "4", 5));
  auto hits = skills_for(kb, "cpu_scoring");
  REQUIRE(hits.size() == 2);
  CHECK(std::any_of(hits.begin(), hits.end(), [](const auto& s) { return contains(s.text, "Tiling by 16"); }));
  REQUIRE(kb.withdraw_skill("cpu_scoring", 5));
  hits = skills_for(kb, "cpu_scoring");
  REQUIRE(hits.size() == 1);
  CHECK(contains(hits[0].text, "Tiling by 16"));
  fs::remove_all(dir);
}

namespace {

/// Each knob set away from its default makes a candidate 1.5x faster, so a search improves step by
/// step and learns skills; once `refuse` is set, every candidate is wrong (the best's final re-check).
struct KnobCountingEvaluator {
  const Problem* problem;
  bool refuse = false;
  Evaluation evaluate(const Candidate& c, std::uint64_t) {
    Evaluation e;
    if (refuse) {
      e.failure = FailureKind::wrong_answer;
      e.diagnostics.message = "wrong on fresh inputs";
      return e;
    }
    const Knobs defaults = problem->default_knobs();
    double changed = 0;
    for (const auto& [name, value] : c.knobs) changed += defaults.count(name) && defaults.at(name) != value;
    e.speedup = std::pow(1.5, changed);
    e.seconds = 1 / e.speedup;
    e.reference_seconds = 1;
    e.diagnostics.bottleneck = Bottleneck::memory;
    return e;
  }
  expected<Comparison, Error> compare(const Candidate& a, const Candidate& b, std::uint64_t seed) {
    return Comparison{evaluate(a, seed).seconds, evaluate(b, seed).seconds};
  }
};

}  // namespace

TEST_CASE("a search withdraws the skill of a best that fails its final re-check") {
  const Problem problem = load_problem(std::string(KEVO_SOURCE_DIR) + "/problems/cpu_scoring").value();
  KnobCountingEvaluator evaluator{&problem};
  auto store = store::SqliteStore::open(":memory:");
  REQUIRE(store);
  bool best_had_skill = false;
  constexpr std::size_t budget = 12;
  std::function<std::vector<Skill>()> skills_now;  // the loop's knowledge base, once the loop exists
  SearchArguments args{.jobs = 1, .max_evaluations = budget, .warm_start = 0, .retime_new_best = false};
  args.on_progress = [&](const Progress& p) {
    if (p.evaluations < budget + 1) return;
    for (const Skill& skill : skills_now()) best_had_skill |= skill.node_key == p.best_key;
    evaluator.refuse = true;  // the search is over: what comes next is the best's re-check
  };
  SearchLoop<synth::TemplateSynthesizer, search::Greedy, memory::Combined, KnobCountingEvaluator, KnowledgeBase, store::SqliteStore>
      loop(problem, synth::TemplateSynthesizer(problem), search::Greedy{}, memory::Combined{}, evaluator, open_kb(), *store, args);
  skills_now = [&] { return loop.retriever().skills(problem.name); };
  auto result = loop.run(Candidate{problem.render(problem.default_knobs()), problem.default_knobs(), "template defaults"});
  REQUIRE(result);
  REQUIRE(result->best_speedup > 1.4);
  REQUIRE(best_had_skill);
  CHECK_FALSE(result->verified);
  CHECK(contains(result->verification_message, "failed its re-check"));
  const auto left = loop.retriever().skills(problem.name);
  CHECK_FALSE(left.empty());  // the other improvements still teach
  for (const Skill& skill : left) CHECK(skill.node_key != result->best_key);
}

}  // namespace kevo_tests::skills_test
