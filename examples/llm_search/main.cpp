// kevo-llm-search: optimize one kernel with an LLM writing the candidates.
//
// The LLM synthesizer (one adaptive prompt: problem, reference, target constraints, the parent's
// diagnostics, the memory operator's context and knowledge retrieved for the signals at hand)
// runs inside the same SearchLoop as kevo-search, with the SQLite FTS5 knowledge base as the
// retriever; improvements are written back to it as skills that the LLM summarizes.
//
//   export KEVO_LLM_BASE_URL=https://api.openai.com/v1 KEVO_LLM_MODEL=gpt-4.1 KEVO_LLM_API_KEY_ENV=OPENAI_API_KEY
//   kevo-llm-search problems/cpu_scoring --budget 20 --log-prompts
//   ...
//   LLM usage: 21 requests (0 failed, 1 retries), 61234 input + 18012 output tokens
//
// Without an LLM configured it says so in one line and runs the offline template synthesizer.
#include <kevo/problem_loader.hpp>
#include <kevo/eval/cpu_evaluator.hpp>
#include <kevo/knowledge/knowledge_base.hpp>
#include <kevo/knowledge/llm_skill_writer.hpp>
#include <kevo/memory/any_memory.hpp>
#include <kevo/net/llm_client.hpp>
#include <kevo/search/any_policy.hpp>
#include <kevo/search_loop.hpp>
#include <kevo/synth/template_synthesizer.hpp>
#include <kevo/store/sqlite_store.hpp>
#include <kevo/synth/llm_synthesizer.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

constexpr const char* usage = R"(usage: kevo-llm-search PROBLEM_DIR [options]

Searches for a faster kernel with an LLM writing the candidates. The LLM comes from the
environment or the flags (flags win):
  KEVO_LLM_BASE_URL     --base-url URL     e.g. https://api.openai.com/v1, http://127.0.0.1:8000/v1,
                                           https://api.anthropic.com
  KEVO_LLM_MODEL        --model NAME
  KEVO_LLM_API_KEY_ENV  --api-key-env VAR  the variable that holds the key (none: send no key)
  KEVO_LLM_WIRE         --wire FORMAT      openai (default) or anthropic
Without a base URL and model, it falls back to the offline template synthesizer.

options:
  --budget N          candidates to evaluate (default 20); generations that give nothing to evaluate
                      (code identical to the parent, no code, edits that do not apply, failed
                      requests) do not count: they have their own cap
  --max-failed-generations N  stop once this many generations failed (default: twice --budget);
                      the summary counts them by fault, and the stop names the commonest
  --jobs N            generations and evaluations in flight (default 2)
  --policy NAME       mcts (default), evolutionary, greedy, random
  --memory NAME       adaptive (default), combined, trajectory, siblings, fresh
  --max-tokens N      per answer (default 8192)
  --max-tokens-field NAME  the OpenAI-format field for it: max_tokens (default), or
                      max_completion_tokens for OpenAI's newer models
  --no-temperature    send no temperature (models that accept only their default)
  --allow-weak-isolation  run an LLM search with its key in this process's environment even where
                      the candidates' jail lacks a layer (kevo checks each at start and refuses by default)
  --token-budget N    stop the search once this many tokens are spent (default: none)
  --price IN OUT      US dollars per million input and output tokens, to report and cap cost
  --cost-budget USD   stop the search once this much is spent (needs --price)
  --ca-file PATH      extra trusted certificates (PEM) for a self-hosted HTTPS server
  --timeout SECONDS   per LLM request, retries included (default 120: a long chat completion
                      takes a minute or two); Ctrl-C cancels requests in flight at once
  --knowledge DIR     knowledge folder (default: the shipped knowledge/)
  --knowledge-db PATH where knowledge and learned skills persist (default kevo-runs/knowledge.db)
  --store PATH        SQLite store of the search (default kevo-runs/PROBLEM.llm.db)
  --log-prompts       print every prompt and answer to stderr
  --seed S            random seed (default 1)
)";

struct Options {
  fs::path problem_dir;
  std::string base_url, model, api_key_env, wire = "openai";
  std::size_t budget = 20, jobs = 2, max_tokens = 8192, max_failed_generations = 0;
  std::uint64_t token_budget = 0, seed = 1;
  double timeout_seconds = 120;
  std::string policy = "mcts", memory = "adaptive";
  fs::path knowledge_dir = KEVO_KNOWLEDGE_DIR, knowledge_db, store;
  std::string max_tokens_field = "max_tokens", ca_file;
  double price_input = 0, price_output = 0, cost_budget = 0;
  bool log_prompts = false, send_temperature = true, allow_weak_isolation = false;
};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

kevo::expected<Options, kevo::Error> parse_arguments(int argc, char** argv) {
  Options o;
  o.base_url = env("KEVO_LLM_BASE_URL");
  o.model = env("KEVO_LLM_MODEL");
  o.api_key_env = env("KEVO_LLM_API_KEY_ENV");
  if (auto w = env("KEVO_LLM_WIRE"); !w.empty()) o.wire = w;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&]() -> std::optional<std::string_view> {
      if (i + 1 >= argc) return std::nullopt;
      return std::string_view(argv[++i]);
    };
    auto number = [&](auto& out) {
      auto v = value();
      if (!v) return false;
      if constexpr (std::is_floating_point_v<std::remove_reference_t<decltype(out)>>) {
        char* end = nullptr;
        const std::string text(*v);
        out = std::strtod(text.c_str(), &end);
        return end && *end == '\0' && out > 0;
      } else {
        auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
        return ec == std::errc() && end == v->data() + v->size();
      }
    };
    bool ok = true;
    if (arg == "--base-url" || arg == "--model" || arg == "--api-key-env" || arg == "--wire" || arg == "--policy" ||
        arg == "--memory" || arg == "--knowledge" || arg == "--knowledge-db" || arg == "--store" || arg == "--max-tokens-field" ||
        arg == "--ca-file") {
      auto v = value();
      if (!v) return kevo::make_error(fmt::format("{} needs a value", arg));
      if (arg == "--base-url") o.base_url = *v;
      else if (arg == "--model") o.model = *v;
      else if (arg == "--api-key-env") o.api_key_env = *v;
      else if (arg == "--wire") o.wire = *v;
      else if (arg == "--policy") o.policy = *v;
      else if (arg == "--memory") o.memory = *v;
      else if (arg == "--knowledge") o.knowledge_dir = *v;
      else if (arg == "--knowledge-db") o.knowledge_db = *v;
      else if (arg == "--max-tokens-field") o.max_tokens_field = *v;
      else if (arg == "--ca-file") o.ca_file = *v;
      else o.store = *v;
    } else if (arg == "--budget") ok = number(o.budget);
    else if (arg == "--jobs") ok = number(o.jobs) && o.jobs > 0;
    else if (arg == "--max-failed-generations") ok = number(o.max_failed_generations) && o.max_failed_generations > 0;
    else if (arg == "--max-tokens") ok = number(o.max_tokens);
    else if (arg == "--token-budget") ok = number(o.token_budget);
    else if (arg == "--timeout") ok = number(o.timeout_seconds);
    else if (arg == "--price") ok = number(o.price_input) && number(o.price_output);
    else if (arg == "--cost-budget") ok = number(o.cost_budget);
    else if (arg == "--seed") ok = number(o.seed);
    else if (arg == "--log-prompts") o.log_prompts = true;
    else if (arg == "--no-temperature") o.send_temperature = false;
    else if (arg == "--allow-weak-isolation") o.allow_weak_isolation = true;
    else if (arg == "--help" || arg == "-h") return kevo::make_error("");
    else if (arg.starts_with("--")) return kevo::make_error(fmt::format("unknown option {}", arg));
    else if (o.problem_dir.empty()) o.problem_dir = arg;
    else return kevo::make_error(fmt::format("unexpected argument '{}'", arg));
    if (!ok) return kevo::make_error(fmt::format("{} needs a positive number", arg));
  }
  if (o.problem_dir.empty()) return kevo::make_error("no problem directory given");
  return o;
}

/// Lends a knowledge base to the loop without giving it away, so main can still report on it.
struct KnowledgeRef {
  kevo::knowledge::KnowledgeBase* base;
  std::vector<kevo::KnowledgeSnippet> retrieve(const kevo::KnowledgeQuery& q) { return base->retrieve(q); }
  void learn(const kevo::Skill& s) { base->learn(s); }
};

int fail(std::string_view message, int code = 1) {
  fmt::print(stderr, "kevo-llm-search: {}\n", message);
  return code;
}

/// The directory that will hold `path`, created if needed: a place that cannot be created is said
/// in one line (exit 2), never an uncaught filesystem_error.
std::optional<int> make_parent(std::string_view flag, const fs::path& path) {
  if (!path.has_parent_path()) return std::nullopt;
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (!ec && fs::is_directory(path.parent_path(), ec)) return std::nullopt;
  return fail(fmt::format("{} {}: cannot create the directory {}: {}", flag, path.string(), path.parent_path().string(),
                          ec ? ec.message() : "it is not a directory"),
              2);
}

/// Runs one search with the given synthesizer and retriever, and prints how it went. `redact`
/// takes the API key out of every line printed.
template <class Synth, class Retriever>
int search(const Options& o, const kevo::Problem& problem, Synth synth, Retriever retriever,
           std::function<std::string(std::string)> redact = [](std::string s) { return s; }) {
  auto policy = kevo::search::make_policy(o.policy);
  if (!policy) return fail(policy.error().message);
  auto memory = kevo::memory::make_memory(o.memory);
  if (!memory) return fail(memory.error().message);
  const fs::path store_path = o.store.empty() ? fs::path("kevo-runs") / (problem.name + ".llm.db") : o.store;
  if (auto failed = make_parent("--store", store_path)) return *failed;
  auto store = kevo::store::SqliteStore::open(store_path);
  if (!store) return fail(store.error().message, 2);

  kevo::eval::CpuEvaluator evaluator(problem);
  if (auto ready = evaluator.prepare(); !ready) return fail(ready.error().message);
  fmt::print("reference: {:.3f} ms on the timing shape; budget {}, {} jobs, store {}\n", evaluator.reference_seconds() * 1e3,
             o.budget, o.jobs, store_path.string());

  kevo::SearchArguments args{.jobs = o.jobs, .max_evaluations = o.budget, .seed = o.seed, .handle_signals = true};
  args.on_progress = [&](const kevo::Progress& p) {
    const kevo::Evaluation& e = *p.evaluation;
    const std::string outcome = e.ok() ? fmt::format("{:6.2f}x {}-bound", e.speedup, kevo::to_string(e.diagnostics.bottleneck))
                                       : fmt::format("{} ({:.70})", kevo::to_string(e.failure), e.diagnostics.message);
    fmt::print("{}", redact(fmt::format("[{:3}/{}] best {:6.2f}x{} node {:3}: {}  <- {:.80}\n", p.evaluations - 1, o.budget,
                                        p.best_speedup, p.new_best ? " (new)" : "      ", p.node_key, outcome, p.candidate->origin)));
    std::fflush(stdout);
  };
  const kevo::Candidate seed = kevo::synth::TemplateSynthesizer(problem).seed();
  kevo::SearchLoop<Synth, kevo::search::AnyPolicy, kevo::memory::AnyMemory, kevo::eval::CpuEvaluator, Retriever,
                   kevo::store::SqliteStore>
      loop(problem, std::move(synth), *policy, *memory, evaluator, retriever, *store, args);
  auto result = loop.run(seed);
  if (!result) return fail(result.error().message);
  // Why it stopped, in words, where the synthesizer knows more than the loop ("the model repeats the parent").
  std::string why;
  if constexpr (requires { loop.synthesizer().exhaustion(); }) {
    if (result->stopped_because == kevo::StopReason::synthesizer_exhausted)
      if (auto exhaustion = loop.synthesizer().exhaustion()) why = " (" + *exhaustion + ")";
  }
  if (why.empty() && result->stopped_because == kevo::StopReason::synthesizer_exhausted)
    why = fmt::format(" ({} generations failed)", result->failures[kevo::FailureKind::generation_failed]);
  // Evaluations, the seed included; a generation that gave nothing to evaluate is not one.
  const std::size_t evaluated = result->evaluations - result->failures[kevo::FailureKind::generation_failed];
  fmt::print("{}", redact(fmt::format("stopped: {}{} after {} evaluations in {:.1f} s\n", kevo::to_string(result->stopped_because), why,
                                      evaluated, result->elapsed_seconds)));
  if constexpr (requires { loop.synthesizer().failures(); })
    fmt::print("{}\n", loop.synthesizer().failures().summary());
  if constexpr (requires { loop.synthesizer().completer().usage(); })
    fmt::print("LLM usage: {}\n", kevo::net::to_string(loop.synthesizer().completer().usage()));
  fmt::print("best: {:.2f}x over reference, node {} ({})\n", result->verified ? result->verified_speedup : result->best_speedup,
             result->best_key, result->verified ? "verified" : "NOT verified: " + result->verification_message);
  return result->verified ? 0 : 3;
}

}  // namespace

int llm_search_main(int argc, char** argv);

int main(int argc, char** argv) {
  try {
    return llm_search_main(argc, argv);
  } catch (const fs::filesystem_error& e) {  // a place on disk that cannot be used: one line, not an abort
    return fail(e.what(), 2);
  }
}

int llm_search_main(int argc, char** argv) {
  auto options = parse_arguments(argc, argv);
  if (!options) {
    if (!options.error().message.empty()) fmt::print(stderr, "kevo-llm-search: {}\n\n", options.error().message);
    fmt::print(stderr, "{}", usage);
    return 2;
  }
  const Options& o = *options;
  auto problem = kevo::load_problem(o.problem_dir);
  if (!problem) return fail(problem.error().message);

  const fs::path knowledge_db = o.knowledge_db.empty() ? fs::path("kevo-runs") / "knowledge.db" : o.knowledge_db;
  if (auto failed = make_parent("--knowledge-db", knowledge_db)) return *failed;
  auto knowledge = kevo::knowledge::KnowledgeBase::open({.database = knowledge_db.string(), .folders = {o.knowledge_dir}});
  if (!knowledge) return fail(knowledge.error().message);
  fmt::print("knowledge: {} sections and {} learned skills in {}\n", knowledge->size("document"), knowledge->size("skill"),
             knowledge_db.string());

  if (o.base_url.empty() || o.model.empty()) {
    fmt::print("kevo-llm-search: no LLM configured (set KEVO_LLM_BASE_URL and KEVO_LLM_MODEL, or --base-url and --model); "
               "using the offline template synthesizer\n");
    return search(o, *problem, kevo::synth::TemplateSynthesizer(*problem), KnowledgeRef{&*knowledge});
  }

  // What the candidates' jail really has here. Where a layer is missing, a candidate might reach this
  // process and the API key in its environment: refuse, unless the user accepts that.
  const kevo::eval::IsolationReport isolation = kevo::eval::inspect_isolation();
  fmt::print("kevo-llm-search: {}\n", isolation.summary());
  if (!isolation.jail) return fail(isolation.summary());
  const char* key = o.api_key_env.empty() ? nullptr : std::getenv(o.api_key_env.c_str());
  if (!isolation.complete() && key && *key && !o.allow_weak_isolation)
    return fail(fmt::format("the candidates' jail lacks a layer here, and the API key is in this process's environment (${}); "
                            "run where namespaces are allowed, or pass --allow-weak-isolation to accept the risk",
                            o.api_key_env));
  if (!isolation.complete() && key && *key) fmt::print(stderr, "kevo-llm-search: WARNING: running with weak isolation and an API key, as asked\n");

  const auto wire = kevo::net::wire_format_from_string(o.wire);
  if (!wire) return fail(fmt::format("--wire must be openai or anthropic, not '{}'", o.wire));
  kevo::net::LlmClientOptions client_options{.base_url = o.base_url, .wire_format = *wire, .model = o.model, .api_key_env = o.api_key_env};
  client_options.timeouts.request = std::chrono::milliseconds(static_cast<long long>(o.timeout_seconds * 1000));
  client_options.timeouts.read = client_options.timeouts.request;
  client_options.budget.max_total_tokens = o.token_budget;
  client_options.max_in_flight = o.jobs + 1;  // one more than the generations, so a skill summary never queues behind them
  client_options.max_tokens_field = o.max_tokens_field;
  client_options.ca_file = o.ca_file;
  client_options.pricing = {.input_per_million = o.price_input, .output_per_million = o.price_output};
  client_options.budget.max_cost_usd = o.cost_budget;
  client_options.log = [](std::string_view line) { fmt::print(stderr, "llm: {}\n", line); };  // the client redacts these
  auto llm = kevo::net::BlockingLlmClient::create(client_options);
  if (!llm) return fail(llm.error().message);
  fmt::print("LLM: {} at {} ({} wire format)\n", o.model, o.base_url, kevo::net::to_string(*wire));

  // Ctrl-C: the loop stops launching work, and this cancels the requests in flight, so the summary
  // comes within a second rather than after a hung request's timeout.
  kevo::net::CancelOnInterrupt cancel_on_interrupt([client = *llm]() mutable { client.cancel(); });

  std::mutex log_mutex;  // generations run concurrently
  kevo::synth::LlmSynthesizerOptions synth_options{.max_tokens = o.max_tokens};
  synth_options.max_failed_generations = o.max_failed_generations ? o.max_failed_generations : 2 * std::max<std::size_t>(o.budget, 1);
  if (!o.send_temperature) synth_options.temperature.reset();
  synth_options.on_failure = [&](kevo::synth::AnswerFault, std::string_view reason) {
    std::lock_guard lock(log_mutex);
    fmt::print("generation failed (not counted against the budget): {}\n", kevo::synth::detail::one_line(reason, 160));
    std::fflush(stdout);
  };
  if (o.log_prompts)
    synth_options.on_exchange = [&](const kevo::synth::Prompt& prompt, std::string_view answer) {
      std::lock_guard lock(log_mutex);
      fmt::print(stderr, "===== system\n{}\n===== user\n{}\n===== answer\n{}\n=====\n", prompt.system, prompt.user,
                 answer.empty() ? "(no answer)" : answer);
    };
  kevo::knowledge::LlmSkillWriter skills(*knowledge, *llm);
  const int status = search(o, *problem, kevo::synth::LlmSynthesizer(*llm, synth_options), skills,
                            [client = *llm](std::string text) { return client.redact(std::move(text)); });
  fmt::print("knowledge: {} learned skills now in {}\n", knowledge->size("skill"), knowledge_db.string());
  return status;
}
