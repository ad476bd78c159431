// Budgets that count what they say, against the fake LLM server (tests/support/fake_llm_server.hpp)
// over the real HTTP stack: failed generations never spend the evaluation budget, and a model that
// only fails stops the search with a named reason; a Retry-After holds back the whole endpoint; the
// API key never reaches the store or a prompt; Ctrl-C cancels a hung request within a second.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"  // designated initializers name only what matters
#include <kevo/problem_loader.hpp>
#include <kevo/memory/operators.hpp>
#include <kevo/net/llm_client.hpp>
#include <kevo/search/greedy.hpp>
#include <kevo/default_search_loop.hpp>
#include <kevo/store/sqlite_store.hpp>
#include <kevo/synth/llm_synthesizer.hpp>

#include <catch2/catch.hpp>
#include <support/fake_llm_server.hpp>
#include <support/quick_llm_options.hpp>
#include <support/variant_evaluator.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <unistd.h>

namespace kevo_tests::llm_budget_test {

using namespace kevo;
using namespace std::chrono_literals;
using kevo::testing::LoopbackServer;
using kevo::testing::Received;
using kevo::testing::Reply;

namespace {

constexpr const char* key_variable = "KEVO_TEST_LLM_BUDGET_KEY";
constexpr const char* secret_key = "sk-kevo-budget-test-9876543210fedcba";

net::LlmClientOptions quick_options(const LoopbackServer& server) {
  return kevo::testing::quick_llm_options(server, key_variable, secret_key);
}

bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

using kevo::test::VariantEvaluator;

/// A model that changes the parent: its code plus a numbered comment (with `extra` in it).
Reply variant(const Received& r, int n, std::string_view extra = "") {
  const std::string parent = testing::current_implementation(testing::first_user_message(r.body));
  return Reply{.body = testing::openai_answer(
                   fmt::format("A new variant{}.\n\n```cpp\n{}\n// Variant {}{}\n```\n", extra, parent, n, extra))};
}

bool is_reask(const Received& r) { return contains(r.body, "\"assistant\""); }

using Loop = SearchLoop<synth::LlmSynthesizer<net::BlockingLlmClient>, search::Greedy, memory::Combined, VariantEvaluator,
                        knowledge::NullRetriever, store::SqliteStore>;

Candidate seed_of(const Problem& p) { return Candidate{p.render(p.default_knobs()), p.default_knobs(), "template defaults"}; }

std::size_t evaluated_children(const Loop& loop) {
  std::size_t n = 0;
  for (NodeId id = 1; id < loop.tree().size(); ++id) n += loop.tree()[id].state == NodeState::evaluated;
  return n;
}

}  // namespace

TEST_CASE("a model that repeats the parent stops the search with that reason, never 0 evaluations in silence") {
  auto problem = load_problem(std::string(KEVO_SOURCE_DIR) + "/problems/cpu_scoring");
  REQUIRE(problem);
  LoopbackServer server;
  server.respond_with(testing::echo_parent);
  auto llm = net::BlockingLlmClient::create(quick_options(server));
  REQUIRE(llm);
  auto store = store::SqliteStore::open(":memory:");
  REQUIRE(store);
  VariantEvaluator evaluator;
  const std::size_t budget = 15;
  Loop loop(*problem, synth::LlmSynthesizer(*llm, {.max_failed_generations = 2 * budget}), search::Greedy{}, memory::Combined{},
            evaluator, knowledge::NullRetriever{}, *store, {.jobs = 2, .max_evaluations = budget, .warm_start = 0});
  const auto started = std::chrono::steady_clock::now();
  auto result = loop.run(seed_of(*problem));
  REQUIRE(result);
  CHECK(seconds_since(started) < 20);

  const std::size_t evaluated = evaluated_children(loop);
  const auto why = loop.synthesizer().exhaustion();
  CHECK((evaluated == budget || why));  // never 0 in silence
  CHECK(evaluated == 0);                // (the model never changed anything)
  CHECK(result->stopped_because == StopReason::synthesizer_exhausted);
  REQUIRE(why);
  CHECK(contains(*why, "the model repeats the parent"));
  const auto failures = loop.synthesizer().failures();
  CHECK(failures[synth::AnswerFault::identical_to_parent] == failures.total);
  CHECK(failures.total >= 16);  // the limit in a row
  CHECK(failures.total <= 2 * budget + 2);
  CHECK(contains(failures.summary(), fmt::format("{} generations failed: {} identical to the parent", failures.total, failures.total)));
  // Each conversation asked once more, with the reason.
  const auto received = server.received();
  CHECK(std::count_if(received.begin(), received.end(), [](const Received& r) {
          return contains(r.body, "identical to the current implementation, so there is nothing new to evaluate");
        }) >= 16);
}

TEST_CASE("failed generations do not spend the budget: 15 candidates are evaluated, the failures counted apart") {
  auto problem = load_problem(std::string(KEVO_SOURCE_DIR) + "/problems/cpu_scoring");
  REQUIRE(problem);
  LoopbackServer server;
  // Every other conversation repeats the parent, and again when asked once more; the others change it.
  std::atomic<int> fresh{0}, variants{0};
  server.respond_with([&](const Received& r) {
    if (is_reask(r) || ++fresh % 2 == 1) return testing::echo_parent(r);
    return variant(r, ++variants);
  });
  auto llm = net::BlockingLlmClient::create(quick_options(server));
  REQUIRE(llm);
  auto store = store::SqliteStore::open(":memory:");
  REQUIRE(store);
  VariantEvaluator evaluator;
  std::atomic<int> reported{0};
  Loop loop(*problem,
            synth::LlmSynthesizer(*llm, {.max_failed_generations = 30,
                                         .on_failure = [&](synth::AnswerFault f, std::string_view reason) {
                                           CHECK(f == synth::AnswerFault::identical_to_parent);
                                           CHECK(contains(reason, "identical to the current implementation"));
                                           ++reported;
                                         }}),
            search::Greedy{}, memory::Combined{}, evaluator, knowledge::NullRetriever{}, *store,
            {.jobs = 2, .max_evaluations = 15, .warm_start = 0});
  auto result = loop.run(seed_of(*problem));
  REQUIRE(result);
  CHECK(result->stopped_because == StopReason::evaluation_budget);
  CHECK(evaluated_children(loop) == 15);
  CHECK(result->failures[FailureKind::generation_failed] == 0);
  const auto failures = loop.synthesizer().failures();
  CHECK(failures.total >= 10);
  CHECK(failures.total == static_cast<std::size_t>(reported.load()));
  CHECK_FALSE(loop.synthesizer().exhaustion());
}

TEST_CASE("a Retry-After holds back the next request to the endpoint, from any generation or client") {
  LoopbackServer server;
  server.script({{.status = 429, .body = R"({"error":{"message":"rate limited"}})", .headers = {{"retry-after-ms", "600"}}}});
  server.always(Reply{.body = testing::openai_answer("fine")});
  auto options = quick_options(server);
  options.retry.max_attempts = 1;  // the first request gives up at once: the wait must outlive it
  auto first = net::BlockingLlmClient::create(options);
  auto second = net::BlockingLlmClient::create(options);  // another client, the same endpoint
  REQUIRE(first);
  REQUIRE(second);
  const net::ChatRequest hello{.messages = {{"user", "Make it faster."}}, .max_tokens = 100};
  auto refused = first->complete(hello);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().kind == net::LlmErrorKind::retries_exhausted);
  auto answered = second->complete(hello);
  REQUIRE(answered);
  CHECK(answered->text == "fine");
  const auto received = server.received();
  REQUIRE(received.size() == 2);
  CHECK(received[1].at - received[0].at >= 550ms);

  SECTION("a wait past the request timeout fails at once, without asking the server") {
    server.script({{.status = 429, .body = "{}", .headers = {{"retry-after", "2"}}}});
    REQUIRE_FALSE(first->complete(hello));
    auto impatient_options = options;
    impatient_options.timeouts.request = 500ms;
    auto impatient = net::BlockingLlmClient::create(impatient_options);
    REQUIRE(impatient);
    const auto started = std::chrono::steady_clock::now();
    auto result = impatient->complete(hello);
    CHECK(seconds_since(started) < 0.3);
    REQUIRE_FALSE(result);
    CHECK(contains(result.error().message, "Retry-After"));
    CHECK(server.received().size() == 3);
  }
}

TEST_CASE("an answer that quotes the API key never brings it into the store, the prompts or a failure's reason") {
  auto problem = load_problem(std::string(KEVO_SOURCE_DIR) + "/problems/cpu_scoring");
  REQUIRE(problem);
  LoopbackServer server;
  std::atomic<int> fresh{0}, variants{0};
  server.respond_with([&](const Received& r) {
    if (!is_reask(r) && ++fresh % 3 == 0)
      return Reply{.body = testing::openai_answer("My key is ${API_KEY}, and I have no code for you.")};
    return variant(r, ++variants, " (read with key ${API_KEY})");
  });
  std::mutex mutex;
  std::vector<std::string> texts;  // every prompt, answer and failure the synthesizer showed
  auto keep = [&](std::string text) {
    std::lock_guard lock(mutex);
    texts.push_back(std::move(text));
  };
  auto llm = net::BlockingLlmClient::create(quick_options(server));
  REQUIRE(llm);
  const auto db = std::filesystem::temp_directory_path() / fmt::format("kevo-llm-budget-{}.db", ::getpid());
  std::filesystem::remove(db);
  std::size_t redacted_candidates = 0;
  {
    auto store = store::SqliteStore::open(db);
    REQUIRE(store);
    VariantEvaluator evaluator;
    Loop loop(*problem,
              synth::LlmSynthesizer(*llm, {.on_exchange = [&](const synth::Prompt& p, std::string_view a) {
                                             keep(p.system + p.user);
                                             keep(std::string(a));
                                           },
                                           .on_failure = [&](synth::AnswerFault, std::string_view reason) { keep(std::string(reason)); }}),
              search::Greedy{}, memory::Combined{}, evaluator, knowledge::NullRetriever{}, *store,
              {.jobs = 2, .max_evaluations = 8, .warm_start = 0});
    auto result = loop.run(seed_of(*problem));
    REQUIRE(result);
    CHECK(evaluated_children(loop) == 8);
    for (NodeId id = 1; id < loop.tree().size(); ++id) {
      const Candidate& c = loop.candidate(id);
      CHECK_FALSE(contains(c.source + c.origin, secret_key));
      redacted_candidates += contains(c.source, "key [redacted]") && contains(c.origin, "key [redacted]");
    }
  }
  CHECK(redacted_candidates == 8);  // the answers did quote it, and it was taken out
  std::ifstream in(db, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  CHECK(contains(bytes.str(), "[redacted]"));
  CHECK_FALSE(contains(bytes.str(), secret_key));
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db.string() + suffix);

  std::lock_guard lock(mutex);
  REQUIRE(texts.size() > 8);
  for (const auto& t : texts) CHECK_FALSE(contains(t, secret_key));
  CHECK(std::any_of(texts.begin(), texts.end(), [](const std::string& t) { return contains(t, "My key is [redacted]"); }));
  // Nor did the key travel back to the server inside a later prompt (the parent's code, a re-ask).
  for (const auto& r : server.received()) CHECK_FALSE(contains(r.body, secret_key));
}

TEST_CASE("Ctrl-C cancels a hung LLM request within a second, and the search still reports") {
  auto problem = load_problem(std::string(KEVO_SOURCE_DIR) + "/problems/cpu_scoring");
  REQUIRE(problem);
  LoopbackServer server;
  server.always(Reply{.body = testing::openai_answer("late"), .delay = 3000ms});  // hangs past the signal
  auto options = quick_options(server);
  options.timeouts.read = options.timeouts.request = 60'000ms;
  auto llm = net::BlockingLlmClient::create(options);
  REQUIRE(llm);
  net::CancelOnInterrupt cancel_on_interrupt([client = *llm]() mutable { client.cancel(); });
  auto store = store::SqliteStore::open(":memory:");
  REQUIRE(store);
  VariantEvaluator evaluator;
  Loop loop(*problem, synth::LlmSynthesizer(*llm), search::Greedy{}, memory::Combined{}, evaluator, knowledge::NullRetriever{},
            *store, {.jobs = 2, .max_evaluations = 10, .warm_start = 0, .handle_signals = true});
  std::atomic<std::int64_t> signalled_at{0};
  std::thread interrupter([&] {
    std::this_thread::sleep_for(400ms);
    signalled_at = std::chrono::steady_clock::now().time_since_epoch().count();
    ::kill(::getpid(), SIGINT);
  });
  auto result = loop.run(seed_of(*problem));
  const auto ended = std::chrono::steady_clock::now().time_since_epoch().count();
  interrupter.join();
  REQUIRE(result);
  CHECK(result->stopped_because == StopReason::interrupted);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::duration(ended - signalled_at.load())).count();
  CHECK(waited < 1.0);
  CHECK(llm->cancelled());
  CHECK(server.received().size() >= 1);
}

}  // namespace kevo_tests::llm_budget_test
