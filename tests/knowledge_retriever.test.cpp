// The knowledge base: signals pull the right material, the budget holds, skills persist.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"  // designated initializers name only what matters
#include <kevo/knowledge/knowledge_base.hpp>
#include <kevo/knowledge/skill_distiller.hpp>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <unistd.h>

namespace kevo_tests::knowledge_retriever_test {

namespace fs = std::filesystem;
using namespace kevo;
using kevo::knowledge::KnowledgeBase;

namespace {

const fs::path shipped = fs::path(KEVO_SOURCE_DIR) / "knowledge";

fs::path scratch_dir(std::string_view name) {
  fs::path dir = fs::temp_directory_path() / fmt::format("kevo-{}-{}", name, ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

KnowledgeBase open_shipped(std::string database = ":memory:") {
  auto kb = KnowledgeBase::open({.database = std::move(database), .folders = {shipped}});
  REQUIRE(kb);
  return std::move(*kb);
}

bool mentions(const KnowledgeSnippet& s, std::string_view word) {
  auto lower = [](std::string t) {
    for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return t;
  };
  return lower(s.title + " " + s.text).find(word) != std::string::npos;
}

}  // namespace

TEST_CASE("the shipped knowledge folder indexes every document") {
  auto kb = open_shipped();
  CHECK(kb.size("document") >= 60);  // 18 documents, several sections each
  CHECK(kb.size("skill") == 0);
}

TEST_CASE("a memory-bound signal retrieves memory-hierarchy material for the target") {
  auto kb = open_shipped();
  SECTION("cpu") {
    auto snippets = kb.retrieve({.target = Target::cpu, .architecture = "x86-64", .bottleneck = Bottleneck::memory});
    REQUIRE(snippets.size() >= 2);
    CHECK((mentions(snippets[0], "memory") || mentions(snippets[0], "cache")));
    CHECK(std::any_of(snippets.begin(), snippets.end(), [](auto& s) { return mentions(s, "prefetch"); }));
    // Nothing for other targets leaks into a CPU prompt.
    for (const auto& s : snippets) {
      CHECK_FALSE(mentions(s, "hopper"));
      CHECK_FALSE(mentions(s, "cdna"));
    }
  }
  SECTION("cuda on hopper") {
    auto snippets = kb.retrieve({.target = Target::cuda, .architecture = "sm_90a", .bottleneck = Bottleneck::memory});
    REQUIRE(!snippets.empty());
    CHECK(std::any_of(snippets.begin(), snippets.end(), [](auto& s) { return s.category == "hardware" && mentions(s, "hopper"); }));
    CHECK(std::any_of(snippets.begin(), snippets.end(), [](auto& s) { return mentions(s, "coalesc"); }));
    for (const auto& s : snippets) CHECK_FALSE(mentions(s, "avx"));
  }
  SECTION("hip on mi300") {
    auto snippets = kb.retrieve({.target = Target::hip, .architecture = "gfx942", .bottleneck = Bottleneck::occupancy});
    REQUIRE(!snippets.empty());
    CHECK(std::any_of(snippets.begin(), snippets.end(), [](auto& s) { return mentions(s, "wavefront"); }));
  }
}

TEST_CASE("no CPU prompt carries a GPU-only section, and no GPU prompt a CPU-only one") {
  auto docs = knowledge::load_documents(shipped);
  REQUIRE(docs);
  // The snippet titles each target must never see: sections (or whole documents) for other targets only.
  auto excluded = [&](std::string_view target) {
    std::set<std::string> titles;
    for (const auto& d : *docs)
      for (const auto& s : d.sections) {
        const auto& targets = s.targets.empty() ? d.targets : s.targets;
        const bool any = targets.empty() || std::find(targets.begin(), targets.end(), "any") != targets.end();
        if (!any && std::find(targets.begin(), targets.end(), target) == targets.end())
          titles.insert(s.heading.empty() ? d.title : fmt::format("{}: {}", d.title, s.heading));
      }
    return titles;
  };
  const auto not_for_cpu = excluded("cpu"), not_for_cuda = excluded("cuda");
  CHECK(not_for_cpu.size() >= 10);  // the GPU documents, and the GPU sections of documents for every target
  CHECK(std::any_of(not_for_cpu.begin(), not_for_cpu.end(), [](auto& t) { return t.find("pinned memory") != std::string::npos; }));
  CHECK(std::any_of(not_for_cuda.begin(), not_for_cuda.end(), [](auto& t) { return t.find("option mismatch") != std::string::npos; }));

  auto kb = KnowledgeBase::open({.database = ":memory:", .folders = {shipped}, .max_sections_per_document = 100, .min_relative_score = 0});
  REQUIRE(kb);
  const Bottleneck bottlenecks[] = {Bottleneck::memory, Bottleneck::compute, Bottleneck::latency, Bottleneck::occupancy};
  const FailureKind failures[] = {FailureKind::none, FailureKind::compile_error, FailureKind::wrong_answer, FailureKind::crash, FailureKind::timeout};
  const char* texts[] = {"", "top-k selection of scores, a reduction over rows", "small kernels, many launches, copy the result back",
                         "gemm epilogue, tensor cores, pinned memory, a second stream", "AVX-512 intrinsics, target specific option mismatch"};
  int cpu_snippets = 0, cuda_snippets = 0;
  for (const auto b : bottlenecks)
    for (const auto f : failures)
      for (const char* text : texts) {
        for (const auto& s : kb->retrieve({.target = Target::cpu, .architecture = "x86-64", .bottleneck = b, .failure = f, .error_text = text, .token_budget = 100000})) {
          ++cpu_snippets;
          INFO(s.title);
          CHECK(not_for_cpu.count(s.title) == 0);
          CHECK_FALSE(mentions(s, "pinned"));
          CHECK_FALSE(mentions(s, "second stream"));
          CHECK_FALSE(mentions(s, "dependent launch"));
          CHECK_FALSE(mentions(s, "wgmma"));
        }
        for (const auto& s : kb->retrieve({.target = Target::cuda, .architecture = "sm_90a", .bottleneck = b, .failure = f, .error_text = text, .token_budget = 100000})) {
          ++cuda_snippets;
          INFO(s.title);
          CHECK(not_for_cuda.count(s.title) == 0);
          CHECK_FALSE(mentions(s, "always_inline"));
          CHECK_FALSE(mentions(s, "false sharing"));
        }
      }
  CHECK(cpu_snippets > 100);
  CHECK(cuda_snippets > 100);
}

TEST_CASE("a compile error retrieves debugging material") {
  auto kb = open_shipped();
  const std::string errors =
      "candidate.cpp:14:21: error: '_mm256_fmadd_ps' was not declared in this scope\n"
      "   14 |     acc = _mm256_fmadd_ps(a, b, acc);\n"
      "candidate.cpp:20:3: error: expected ';' before 'return'\n";
  auto snippets = kb.retrieve({.target = Target::cpu,
                               .bottleneck = Bottleneck::memory,
                               .failure = FailureKind::compile_error,
                               .error_text = errors});
  REQUIRE(!snippets.empty());
  CHECK(snippets[0].category == "optimization");
  CHECK(mentions(snippets[0], "error"));
  CHECK(std::any_of(snippets.begin(), snippets.end(), [](auto& s) { return mentions(s, "not declared"); }));
}

TEST_CASE("a wrong answer retrieves correctness material") {
  auto kb = open_shipped();
  auto snippets = kb.retrieve({.target = Target::cpu,
                               .failure = FailureKind::wrong_answer,
                               .error_text = "mismatch at index 1023: expected 0.125 got 0.0; 7 of 1031 elements differ"});
  REQUIRE(!snippets.empty());
  CHECK(std::any_of(snippets.begin(), snippets.end(), [](auto& s) { return s.category == "correctness"; }));
}

TEST_CASE("retrieval stays within the token budget") {
  auto kb = open_shipped();
  for (std::size_t budget : {0u, 60u, 200u, 700u, 3000u}) {
    auto snippets = kb.retrieve({.target = Target::cuda,
                                 .bottleneck = Bottleneck::compute,
                                 .operator_class = "gemm",
                                 .problem_words = "matrix multiply bf16 tensor cores",
                                 .token_budget = budget});
    std::size_t used = 0;
    for (const auto& s : snippets) used += knowledge::snippet_tokens(s);
    CHECK(used <= budget);
    if (budget >= 700) CHECK(!snippets.empty());
    if (budget == 0) CHECK(snippets.empty());
  }
}

TEST_CASE("a user adds documents for a new accelerator by dropping files into a folder") {
  const fs::path dir = scratch_dir("kb-drop");
  fs::create_directories(dir / "hardware" / "acme-npu");
  std::ofstream(dir / "hardware" / "acme-npu" / "scratchpad.md") << "---\n"
                                                                     "title: ACME NPU scratchpad\n"
                                                                     "targets: [hip]\n"
                                                                     "architectures: [acme1]\n"
                                                                     "tags: [memory-bound, scratchpad]\n"
                                                                     "---\n\n"
                                                                     "## Scratchpad banks\nThe ACME scratchpad has 16 banks; "
                                                                     "memory-bound kernels should stripe tiles across them.\n";
  std::ofstream(dir / "notes.md") << "no front matter: skipped\n";
  auto kb = KnowledgeBase::open({.folders = {shipped, dir}});
  REQUIRE(kb);
  auto snippets = kb->retrieve({.target = Target::hip, .architecture = "acme1", .bottleneck = Bottleneck::memory});
  REQUIRE(!snippets.empty());
  CHECK(std::any_of(snippets.begin(), snippets.end(), [](auto& s) { return mentions(s, "acme"); }));
  CHECK(snippets[0].category != "");
  // Architecture-specific documents stay out when another architecture is asked for.
  auto other = kb->retrieve({.target = Target::hip, .architecture = "gfx942", .bottleneck = Bottleneck::memory});
  for (const auto& s : other) CHECK_FALSE(mentions(s, "acme"));

  // A persistent database forgets a document once its file is gone.
  const std::string db = (dir / "kb.db").string();
  REQUIRE(KnowledgeBase::open({.database = db, .folders = {dir}})->size("document") == 1);
  fs::remove(dir / "hardware" / "acme-npu" / "scratchpad.md");
  CHECK(KnowledgeBase::open({.database = db, .folders = {dir}})->size("document") == 0);

  std::ofstream(dir / "bad.md") << "---\ntitle: broken\ncategory: recipes\n---\ntext\n";
  auto broken = KnowledgeBase::open({.folders = {dir}});
  REQUIRE_FALSE(broken);
  CHECK(broken.error().message.find("bad.md") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("a learned skill is retrieved by a later instance on the same database file") {
  const fs::path dir = scratch_dir("kb-skill");
  const std::string db = (dir / "kevo.db").string();

  Problem problem;
  problem.name = "cpu_scoring";
  problem.target = Target::cpu;
  problem.knobs = {{.name = "vector_width", .domain = {"1", "4", "8"}, .default_value = "1", .side = KnobSide::memory},
                   {.name = "unroll", .domain = {"1", "2", "4"}, .default_value = "1", .side = KnobSide::compute}};
  Candidate parent{.source = "p", .knobs = {{"vector_width", "4"}, {"unroll", "2"}}, .origin = "seed"};
  Candidate child{.source = "c", .knobs = {{"vector_width", "8"}, {"unroll", "2"}}, .origin = "mutate vector_width 4->8"};
  Evaluation parent_eval{.speedup = 1.5};
  parent_eval.diagnostics.bottleneck = Bottleneck::memory;
  parent_eval.diagnostics.message = "memory-bound at 40% of the bandwidth roofline";
  Evaluation child_eval{.speedup = 3.0};
  child_eval.diagnostics.bottleneck = Bottleneck::memory;
  child_eval.diagnostics.roofline_fraction = 0.8;

  auto skill = knowledge::distill_skill(problem, parent, parent_eval, child, child_eval);
  REQUIRE(skill);
  CHECK(skill->summary.find("vector_width 4->8") != std::string::npos);
  CHECK(skill->summary.find("memory-side") != std::string::npos);
  CHECK(skill->improvement == Approx(2.0));
  CHECK_FALSE(knowledge::distill_skill(problem, child, child_eval, parent, parent_eval));  // slower: no skill

  {
    auto kb = open_shipped(db);
    kb.learn(*skill);
    kb.learn(*skill);  // stored once
    CHECK(kb.size("skill") == 1);
  }
  auto later = open_shipped(db);  // re-indexes documents, keeps skills
  CHECK(later.size("skill") == 1);
  auto snippets = later.retrieve({.target = Target::cpu,
                                  .bottleneck = Bottleneck::memory,
                                  .problem_words = "cpu_scoring: score rows against a query, keep the top K"});
  REQUIRE(!snippets.empty());
  CHECK(snippets[0].category == "skill");
  CHECK(snippets[0].text.find("vector_width 4->8") != std::string::npos);
  // Skills are per target.
  auto gpu = later.retrieve({.target = Target::cuda, .bottleneck = Bottleneck::memory, .problem_words = "cpu_scoring"});
  for (const auto& s : gpu) CHECK(s.category != "skill");
  fs::remove_all(dir);
}

TEST_CASE("a skill from free-form code quotes the changed lines") {
  Problem problem;
  problem.name = "row_sum";
  Candidate parent{.source = "float s = 0;\nfor (i...) s += x[i];\n"};
  Candidate child{.source = "float s0 = 0, s1 = 0;\nfor (i...) { s0 += x[i]; s1 += x[i+1]; }\n", .origin = "llm rewrite"};
  Evaluation failed{.failure = FailureKind::compile_error};
  failed.diagnostics.message = "error: 'x' was not declared";
  Evaluation ok{.speedup = 1.2};
  auto skill = knowledge::distill_skill(problem, parent, failed, child, ok);
  REQUIRE(skill);
  CHECK(skill->summary.find("compile_error") != std::string::npos);
  CHECK(skill->summary.find("s1 += x[i+1]") != std::string::npos);
}

}  // namespace kevo_tests::knowledge_retriever_test
