// The LLM synthesizer without a network: the adaptive prompt and the extraction of candidates from
// answers, well-formed and malformed. The HTTP path is covered by llm_client.test.cpp.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"  // designated initializers name only what matters
#include <kevo/problem_loader.hpp>
#include <kevo/knowledge/knowledge_base.hpp>
#include <kevo/knowledge/llm_skill_writer.hpp>
#include <kevo/synth/llm_synthesizer.hpp>

#include <catch2/catch.hpp>

#include <deque>

namespace kevo_tests::llm_synthesizer_test {

using namespace kevo;
using kevo::synth::build_prompt;
using kevo::synth::extract_code;

namespace {

bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

const Problem& scoring_problem() {
  static const Problem p = [] {
    auto loaded = load_problem(std::string(KEVO_SOURCE_DIR) + "/problems/cpu_scoring");
    REQUIRE(loaded);
    return *loaded;
  }();
  return p;
}

Attempt attempt(NodeId node, std::string source, Evaluation e, Knobs knobs = {}, std::string origin = {}) {
  return Attempt{node, std::make_shared<const Candidate>(Candidate{std::move(source), std::move(knobs), std::move(origin)}), e};
}

Evaluation ok(double speedup, Bottleneck b, double roofline = 0) {
  Evaluation e{.speedup = speedup};
  e.diagnostics.bottleneck = b;
  e.diagnostics.roofline_fraction = roofline;
  return e;
}

Evaluation failed(FailureKind f, std::string message, std::string detail) {
  Evaluation e{.failure = f};
  e.diagnostics.message = std::move(message);
  e.diagnostics.detail = std::move(detail);
  return e;
}

/// A scripted completer: returns the queued answers in order and keeps the requests.
struct ScriptedCompleter {
  std::deque<expected<net::ChatResponse, net::LlmError>> answers;
  std::vector<net::ChatRequest> requests;
  expected<net::ChatResponse, net::LlmError> complete(const net::ChatRequest& r) {
    requests.push_back(r);
    REQUIRE(!answers.empty());
    auto a = std::move(answers.front());
    answers.pop_front();
    return a;
  }
};

net::ChatResponse answer(std::string text, std::string finish = "stop") {
  net::ChatResponse r;
  r.text = std::move(text);
  r.finish_reason = std::move(finish);
  return r;
}

}  // namespace

TEST_CASE("the prompt carries problem, reference, constraints, diagnostics, memory and knowledge") {
  const Problem& p = scoring_problem();
  GenerationRequest r;
  r.problem = &p;
  r.target = p.target;
  auto seed = attempt(0, p.render(p.default_knobs()), ok(1.0, Bottleneck::compute, 0.1), p.default_knobs(), "template defaults");
  Knobs faster_knobs = p.default_knobs();
  faster_knobs["vector_width"] = "8";
  r.parent = seed;
  r.memory_mode = MemoryMode::combined;
  r.trajectory = {seed};
  r.siblings = {attempt(4, p.render(faster_knobs), ok(2.5, Bottleneck::memory), faster_knobs, "mutate vector_width 1->8"),
                attempt(5, "broken", failed(FailureKind::compile_error, "does not compile", "x.cpp:1: error: oops"), {}, "llm rewrite")};
  r.knowledge = {{.title = "Optimizing memory-bound kernels: Move fewer bytes", .category = "optimization", .text = "Fuse passes."}};

  const auto prompt = build_prompt(r);
  CHECK(contains(prompt.system, "x86-64"));
  const std::string& u = prompt.user;
  CHECK(contains(u, "# Problem: cpu_scoring"));
  CHECK(contains(u, "void reference("));                            // the reference
  CHECK(contains(u, "Keep the entry point exactly as declared: `void kernel(const Shape& shape"));
  CHECK(contains(u, "absolute 0.0001"));                            // the tolerance
  CHECK(contains(u, "Host C++17, compiled with: -std=c++17"));       // the standard the flags really pick
  CHECK(contains(u, "compute-bound"));                              // the diagnosis drives the task
  CHECK(contains(u, "Faster than the current implementation"));     // sibling comparison
  CHECK(contains(u, "vector_width 1->8"));                          // what the faster sibling did
  CHECK(contains(u, "Failed (avoid these mistakes)"));
  CHECK(contains(u, "[optimization] Optimizing memory-bound kernels")); // retrieved knowledge
  CHECK(contains(u, "<<<<<<< SEARCH"));                             // the answer format

  SECTION("fresh start shows no memory and asks for a different approach") {
    r.memory_mode = MemoryMode::fresh;
    const auto fresh = build_prompt(r);
    CHECK_FALSE(contains(fresh.user, "Faster than the current implementation"));
    CHECK(contains(fresh.user, "substantially different approach"));
  }
}

TEST_CASE("the prompt adapts to a compile error and trims the compiler output") {
  const Problem& p = scoring_problem();
  std::string compiler_output = "In file included from candidate.cpp:1:\n";
  compiler_output += "candidate.cpp: In function 'void kernel(const Shape&, ...)':\n";
  compiler_output += "candidate.cpp:12:9: error: 'acc' was not declared in this scope\n   12 |   acc += a[d];\n      |   ^~~\n";
  for (int i = 0; i < 200; ++i) compiler_output += "candidate.cpp:40:1: note: candidate template ignored: substitution failure\n";
  compiler_output += "candidate.cpp:12:9: error: 'acc' was not declared in this scope\n";  // a repeat
  GenerationRequest r;
  r.problem = &p;
  r.parent = attempt(3, "void kernel() { acc += 1; }", failed(FailureKind::compile_error, "compile error", compiler_output));
  r.grandparent = attempt(1, "void kernel() { int acc = 0; acc += 1; }", ok(1.2, Bottleneck::memory));
  const auto prompt = build_prompt(r);
  CHECK(contains(prompt.user, "does not compile"));
  CHECK(contains(prompt.user, "'acc' was not declared in this scope"));
  CHECK(contains(prompt.user, "12 |   acc += a[d];"));
  CHECK_FALSE(contains(prompt.user, "note: candidate template ignored"));
  CHECK_FALSE(contains(prompt.user, "In file included"));
  CHECK(contains(prompt.user, "from the last working version"));
  const auto trimmed = synth::trim_compiler_errors(compiler_output);
  CHECK(std::count(trimmed.begin(), trimmed.end(), '\n') == 3);  // error, source line, caret; repeat dropped

  SECTION("a wrong answer asks for the correctness bug and shows the mismatch") {
    r.parent = attempt(3, "src", failed(FailureKind::wrong_answer, "7 of 1001 outputs differ", "first mismatch at index 1000: expected 0.25, got 0"));
    const auto wrong = build_prompt(r);
    CHECK(contains(wrong.user, "results are wrong"));
    CHECK(contains(wrong.user, "first mismatch at index 1000"));
  }
}

TEST_CASE("extraction takes a whole-file rewrite from the largest code block") {
  const std::string text = "I vectorize it.\n\n```text\nnot code\n```\n\n```cpp\nint kernel() { return 2; }\n```\nDone.\n";
  auto code = extract_code(text, "int kernel() { return 1; }\n");
  REQUIRE(code);
  CHECK(code->source == "int kernel() { return 2; }\n");
  CHECK(code->form == synth::AnswerForm::rewrite);
  CHECK(code->explanation == "I vectorize it.");
}

TEST_CASE("extraction applies SEARCH/REPLACE edits to the parent") {
  const std::string parent = "int f(const int* x, int n) {\n  int acc = 0;\n  for (int i = 0; i < n; ++i) acc += x[i];   \n  return acc;\n}\n";
  const std::string edits =
      "Two edits.\n<<<<<<< SEARCH\n  int acc = 0;\n  for (int i = 0; i < n; ++i) acc += x[i];\n=======\n  int acc = 0;\n"
      "  for (int i = 0; i < n; i += 1) acc += x[i];\n>>>>>>> REPLACE\n\n<<<<<<< SEARCH\n  return acc;\n=======\n  return acc + 0;\n>>>>>>> REPLACE\n";
  auto code = extract_code(edits, parent);  // the first SEARCH matches only with trailing spaces ignored
  REQUIRE(code);
  CHECK(code->form == synth::AnswerForm::edits);
  CHECK(code->edits == 2);
  CHECK(code->source == "int f(const int* x, int n) {\n  int acc = 0;\n  for (int i = 0; i < n; i += 1) acc += x[i];\n  return acc + 0;\n}\n");
}

TEST_CASE("malformed answers are errors with a clear reason") {
  const std::string parent = "int kernel() { return 1; }\n";
  auto reason = [&](std::string_view text) {
    auto code = extract_code(text, parent, {.max_answer_bytes = 4096, .max_source_bytes = 1024});
    REQUIRE_FALSE(code);
    return code.error().message;
  };
  CHECK(contains(reason(""), "empty"));
  CHECK(contains(reason("  \n\t "), "empty"));
  CHECK(contains(reason("Use AVX2 and more accumulators."), "no fenced code block"));
  CHECK(contains(reason("I'm sorry, but I can't help with that."), "declined"));
  CHECK(contains(reason("Here:\n```cpp\nint kernel() { return"), "never closed"));
  CHECK(contains(reason("```cpp\n```\n"), "empty"));
  CHECK(contains(reason("```cpp\nint kernel() { return 1; }\n```\n"), "identical"));
  CHECK(contains(reason("<<<<<<< SEARCH\nreturn 7;\n=======\nreturn 8;\n>>>>>>> REPLACE\n"), "edit 1 does not apply"));
  CHECK(contains(reason("<<<<<<< SEARCH\nreturn 1;\n>>>>>>> REPLACE\n"), "no '=======' line"));
  CHECK(contains(reason("<<<<<<< SEARCH\nreturn 1;\n=======\nreturn 2;\n"), "no '>>>>>>> REPLACE' line"));
  CHECK(contains(reason("```cpp\n" + std::string(2000, 'x') + "\n```\n"), "over the 1024-byte limit"));
  CHECK(contains(reason(std::string(5000, 'y')), "over the 4096-byte limit"));
}

TEST_CASE("the synthesizer turns answers into candidates and failures into readable errors") {
  const Problem& p = scoring_problem();
  GenerationRequest r;
  r.problem = &p;
  r.parent = attempt(0, p.render(p.default_knobs()), ok(1.0, Bottleneck::compute), p.default_knobs());

  ScriptedCompleter completer;
  completer.answers.push_back(answer("Unrolled.\n```cpp\n#include \"kevo_problem.hpp\"\nvoid kernel() {}\n```\n"));
  completer.answers.push_back(answer("Thinking about it, the best", "length"));
  completer.answers.push_back(answer("Let me think again about the best", "length"));  // asked once more, with the reason
  std::vector<std::string> logged;
  std::vector<std::string> failures;
  synth::LlmSynthesizer synth(std::move(completer), {.max_tokens = 1000,
                                                     .max_consecutive_failed_generations = 1,  // stop at the first failure
                                                     .on_exchange = [&](const synth::Prompt& prompt, std::string_view a) {
                                                       logged.push_back(prompt.user + "\n---\n" + std::string(a));
                                                     },
                                                     .on_failure = [&](synth::AnswerFault f, std::string_view reason) {
                                                       CHECK(f == synth::AnswerFault::no_code);
                                                       failures.emplace_back(reason);
                                                     }});
  auto first = synth.generate(r);
  REQUIRE(first);
  CHECK(contains(first->source, "void kernel() {}"));
  CHECK(first->origin == "llm rewrite: Unrolled.");
  CHECK(synth.completer().requests.at(0).max_tokens == 1000);
  CHECK(contains(synth.completer().requests.at(0).messages.at(0).content, "# Problem: cpu_scoring"));

  auto second = synth.generate(r);  // no code, twice: a failed generation, and the limit of one in a row
  REQUIRE_FALSE(second);
  CHECK(contains(second.error().message, "the model answers without code"));
  REQUIRE(failures.size() == 1);
  CHECK(contains(failures[0], "no fenced code block"));
  CHECK(contains(failures[0], "stopped at max_tokens"));
  CHECK(contains(synth.completer().requests.at(2).messages.at(2).content, "held no usable code"));
  CHECK(synth.budget_exhausted());
  CHECK(synth.failures().summary() == "1 generation failed: 1 no code");
  CHECK(logged.size() == 3);

  ScriptedCompleter spent;
  spent.answers.push_back(net::make_llm_error(net::LlmErrorKind::budget_exhausted, "token budget exhausted (10 of 10 tokens used)"));
  synth::LlmSynthesizer out_of_tokens(std::move(spent));
  auto third = out_of_tokens.generate(r);
  REQUIRE_FALSE(third);
  CHECK(contains(third.error().message, "budget_exhausted"));
  CHECK(out_of_tokens.budget_exhausted());
  CHECK(out_of_tokens.failures().total == 0);  // a spent budget is not the model's failure
}

TEST_CASE("with an LLM configured, the LLM writes the skill summary, without a usable answer the distilled one stays") {
  auto kb = knowledge::KnowledgeBase::open({});
  REQUIRE(kb);
  ScriptedCompleter completer;
  completer.answers.push_back(answer(
      "Blocking four ads per pass over each expert vector made the memory-bound scoring loop reuse every loaded expert "
      "row four times, cutting traffic and giving 1.8x."));
  completer.answers.push_back(answer("```cpp\nint x;\n```"));  // code is not a summary
  knowledge::LlmSkillWriter writer(*kb, completer);
  Skill skill{.problem = "cpu_scoring",
              .summary = "On cpu_scoring (cpu), changing ads_per_block 1->4 took a memory-bound parent from 1.0x to 1.8x.",
              .before = {{"ads_per_block", "1"}},
              .after = {{"ads_per_block", "4"}},
              .bottleneck = Bottleneck::memory,
              .improvement = 1.8};
  writer.learn(skill);
  CHECK(contains(completer.requests.at(0).messages.at(0).content, "ads_per_block 1->4"));
  Skill other = skill;
  other.problem = "softmax";
  writer.learn(other);
  CHECK(kb->size("skill") == 2);

  auto hits = writer.retrieve({.bottleneck = Bottleneck::memory, .problem_words = "cpu_scoring"});
  REQUIRE(!hits.empty());
  CHECK(hits[0].category == "skill");
  CHECK(contains(hits[0].text, "reuse every loaded expert row four times"));
  auto softmax = writer.retrieve({.bottleneck = Bottleneck::memory, .problem_words = "softmax"});
  REQUIRE(!softmax.empty());
  CHECK(contains(softmax[0].text, "changing ads_per_block 1->4"));  // the distilled text, kept
}

TEST_CASE("code the search has already seen is sent back to the model once, in the same conversation") {
  const Problem& p = scoring_problem();
  GenerationRequest r;
  r.problem = &p;
  r.parent = attempt(0, p.render(p.default_knobs()), ok(1.0, Bottleneck::compute), p.default_knobs());
  ScriptedCompleter completer;
  const std::string a = "A.\n```cpp\nvoid kernel() { /* a */ }\n```\n", b = "B.\n```cpp\nvoid kernel() { /* b */ }\n```\n";
  const std::string c = "C.\n```cpp\nvoid kernel() { /* c */ }\n```\n";
  for (const auto& text : {a, a, b, a, a, c}) completer.answers.push_back(answer(text));
  synth::LlmSynthesizer synth(std::move(completer));
  synth.remember(*r.parent.candidate);

  auto first = synth.generate(r);
  REQUIRE(first);
  CHECK(contains(first->source, "/* a */"));
  auto second = synth.generate(r);  // a again: asked once more, answers b
  REQUIRE(second);
  CHECK(contains(second->source, "/* b */"));
  const auto& retry = synth.completer().requests.at(2);
  REQUIRE(retry.messages.size() == 3);
  CHECK(retry.messages[1].role == "assistant");
  CHECK(contains(retry.messages[2].content, "already evaluated"));
  auto third = synth.generate(r);  // a twice: one re-ask only, then a failed generation, and a fresh conversation
  REQUIRE(third);
  CHECK(contains(third->source, "/* c */"));
  CHECK(synth.completer().requests.size() == 6);
  CHECK(synth.completer().requests.at(5).messages.size() == 1);
  CHECK(synth.failures()[synth::AnswerFault::repeat] == 1);
}

TEST_CASE("an answer identical to the parent, or edits that do not apply, are sent back once with the reason") {
  const Problem& p = scoring_problem();
  GenerationRequest r;
  r.problem = &p;
  const std::string parent = p.render(p.default_knobs());
  r.parent = attempt(0, parent, ok(1.0, Bottleneck::compute), p.default_knobs());
  ScriptedCompleter completer;
  completer.answers.push_back(answer("Here it is.\n```cpp\n" + parent + "\n```\n"));
  completer.answers.push_back(answer("Changed.\n```cpp\nvoid kernel() { /* changed */ }\n```\n"));
  completer.answers.push_back(answer("<<<<<<< SEARCH\nno such line\n=======\nint x;\n>>>>>>> REPLACE\n"));
  completer.answers.push_back(answer("Whole file.\n```cpp\nvoid kernel() { /* whole */ }\n```\n"));
  synth::LlmSynthesizer synth(std::move(completer));
  auto first = synth.generate(r);
  REQUIRE(first);
  CHECK(contains(first->source, "/* changed */"));
  CHECK(contains(synth.completer().requests.at(1).messages.at(2).content, "identical to the current implementation"));
  auto second = synth.generate(r);
  REQUIRE(second);
  CHECK(contains(second->source, "/* whole */"));
  CHECK(contains(synth.completer().requests.at(3).messages.at(2).content, "could not be applied"));
  CHECK(contains(synth.completer().requests.at(3).messages.at(2).content, "no such line"));
  CHECK(synth.failures().total == 0);
}

TEST_CASE("a failed generation is not shown to later prompts as code that was tried") {
  const Problem& p = scoring_problem();
  GenerationRequest r;
  r.problem = &p;
  r.memory_mode = MemoryMode::combined;
  const std::string parent = p.render(p.default_knobs());
  r.parent = attempt(0, parent, ok(1.0, Bottleneck::compute), p.default_knobs());
  r.siblings.push_back(attempt(1, "", failed(FailureKind::generation_failed, "LLM answer unusable: the answer is empty", "")));
  const synth::Prompt prompt = synth::build_prompt(r);
  CHECK_FALSE(contains(prompt.user, "avoid these mistakes"));
  CHECK_FALSE(contains(prompt.user, "changed lines"));
}

TEST_CASE("request bodies follow each wire format") {
  const net::ChatRequest r{.system = "sys \"quoted\"", .messages = {{"user", "a\tb\n\x01 \xff ok \xc3\xa9"}}, .max_tokens = 99, .temperature = 0.5};
  const std::string openai = net::encode_request(net::WireFormat::openai, "m", r);
  CHECK(openai == R"({"model":"m","max_tokens":99,"temperature":0.5,"messages":[{"role":"system","content":"sys \"quoted\""},)"
                  R"({"role":"user","content":"a\tb\n\u0001 \ufffd ok )" "\xc3\xa9" R"("}]})");  // valid UTF-8 passes, a stray byte does not
  CHECK(contains(net::encode_request(net::WireFormat::openai, "m", r, "max_completion_tokens"), R"("max_completion_tokens":99)"));
  const std::string anthropic = net::encode_request(net::WireFormat::anthropic, "m", r, "max_completion_tokens");
  CHECK(contains(anthropic, R"("max_tokens":99)"));
  CHECK(contains(anthropic, R"("system":"sys \"quoted\"")"));
  CHECK_FALSE(contains(anthropic, R"("role":"system")"));
}

TEST_CASE("extraction copes with the usual variations of model output") {
  const std::string parent = "int kernel() {\n  return 1;\n}\n";
  SECTION("edits inside a fenced block") {
    auto code = extract_code("Change it.\n```cpp\n<<<<<<< SEARCH\n  return 1;\n=======\n  return 2;\n>>>>>>> REPLACE\n```\n", parent);
    REQUIRE(code);
    CHECK(code->source == "int kernel() {\n  return 2;\n}\n");
    CHECK(code->explanation == "Change it.");
  }
  SECTION("Windows line endings") {
    auto code = extract_code("<<<<<<< SEARCH\r\n  return 1;\r\n=======\r\n  return 3;\r\n>>>>>>> REPLACE\r\n", parent);
    REQUIRE(code);
    CHECK(contains(code->source, "return 3;"));
    CHECK_FALSE(contains(code->source, "return 1;"));
    auto fenced = extract_code("Here:\r\n```C++\r\nint kernel() { return 4; }\r\n```\r\n", parent);
    REQUIRE(fenced);
    CHECK(contains(fenced->source, "return 4;"));
  }
  SECTION("a snippet, then the whole file: the whole file wins") {
    auto code = extract_code("The key line:\n```cpp\nreturn 5;\n```\nThe file:\n```cpp\nint kernel() {\n  return 5;\n}\n```\n", parent);
    REQUIRE(code);
    CHECK(code->source == "int kernel() {\n  return 5;\n}\n");
  }
  SECTION("prose and a non-code block only") {
    auto code = extract_code("Output:\n```text\n1 2 3\n```\n", parent);
    REQUIRE_FALSE(code);
    CHECK(contains(code.error().message, "no fenced code block"));
  }
}

TEST_CASE("messages are cut at word boundaries, never inside a number or a character") {
  using kevo::synth::detail::one_line;
  CHECK(one_line("short\nmessage") == "short message");
  const std::string timeout = "no answer: the request timed out after 20000 ms while reading the body";
  CHECK(one_line(timeout, 45) == "no answer: the request timed out after 20000...");  // the number whole
  const std::string cut = one_line(timeout, 42);
  CHECK(cut == "no answer: the request timed out after...");
  CHECK(cut.find("2000") == std::string::npos);  // never "after 2000" for 20000
  const std::string word(300, 'x');
  CHECK(one_line(word, 100).size() == 103);
  const std::string accents = std::string(99, 'a') + "\xc3\xa9\xc3\xa9";  // "é" straddles the cut at 100
  CHECK(one_line(accents, 100) == std::string(99, 'a') + "...");
}

}  // namespace kevo_tests::llm_synthesizer_test
