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
#include <kevo/eval/any_evaluator.hpp>
#include <kevo/eval/cpu_evaluator.hpp>
#include <kevo/eval/cuda_evaluator.hpp>
#include <kevo/gpu_presence.hpp>
#include <kevo/detail/json_text.hpp>
#include <kevo/knowledge/knowledge_base.hpp>
#include <kevo/knowledge/llm_skill_writer.hpp>
#include <kevo/memory/any_memory.hpp>
#include <kevo/net/llm_client.hpp>
#include <kevo/search/any_policy.hpp>
#include <kevo/search_loop.hpp>
#include <kevo/synth/template_synthesizer.hpp>
#include <kevo/store/sqlite_store.hpp>
#include <kevo/synth/llm_synthesizer.hpp>

#include "../common/command_line.hpp"
#include "../common/problem_argument.hpp"
#include "../common/shipped_data.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

struct Options {
  kevo_examples::ProblemArgument problem;
  std::string base_url, model, api_key_env, wire = "openai";
  std::size_t budget = 20, jobs = 2, max_tokens = 8192, max_failed_generations = 0;
  std::uint64_t token_budget = 0, seed = 1;
  double timeout_seconds = 120;
  std::string policy = "mcts", memory = "adaptive";
  double repair_share = 0.2;
  fs::path knowledge_dir = kevo_examples::shipped_data_dir() / "knowledge", knowledge_db, store, json;
  std::string max_tokens_field = "max_tokens", ca_file;
  std::vector<double> prices;  // --price IN OUT
  double price_input = 0, price_output = 0, cost_budget = 0;
  bool log_prompts = false, send_temperature = true, allow_weak_isolation = false, warm_start_any_target = false;
};

// The command line, with CLI11: --help, unknown flags, missing and bad values are its job. The LLM
// comes from the environment or the flags (flags win).
void describe(CLI::App& app, Options& o) {
  // More than zero: CLI11's PositiveNumber would name the whole double range in its message.
  const CLI::Validator positive(
      [](std::string& text) {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        return end && *end == '\0' && v > 0 ? std::string() : "must be more than 0, not " + text;
      },
      "POSITIVE");
  app.description(
      "Searches for a faster kernel with an LLM writing the candidates. Without a base URL and a model it falls back to the "
      "offline template synthesizer.");
  kevo_examples::describe_problem_argument(app, o.problem);
  app.add_option("--base-url", o.base_url, "e.g. https://api.openai.com/v1, http://127.0.0.1:8000/v1, https://api.anthropic.com")
      ->envname("KEVO_LLM_BASE_URL");
  app.add_option("--model", o.model, "the model's name")->envname("KEVO_LLM_MODEL");
  app.add_option("--api-key-env", o.api_key_env, "the variable that holds the key (none: send no key)")->envname("KEVO_LLM_API_KEY_ENV");
  app.add_option("--wire", o.wire, "the request format")->envname("KEVO_LLM_WIRE")->capture_default_str()->check(
      CLI::IsMember({"openai", "anthropic"}));
  using kevo_examples::whole_number;  // counts and seeds: digits only, no sign
  app.add_option("--budget", o.budget,
                 "candidates to evaluate; generations that give nothing to evaluate (code identical to the parent, no code, edits "
                 "that do not apply, failed requests) do not count: they have their own cap")
      ->capture_default_str()
      ->transform(whole_number)
      ->check(positive);
  app.add_option("--max-failed-generations", o.max_failed_generations,
                 "stop once this many generations failed (default: twice --budget); the summary counts them by fault")
      ->transform(whole_number)
      ->check(positive);
  app.add_option("--jobs", o.jobs, "generations and evaluations in flight")
      ->capture_default_str()
      ->transform(whole_number)
      ->check(CLI::Range(std::size_t{1}, std::size_t{4096}));
  app.add_option("--policy", o.policy, "search policy")->capture_default_str()->check(CLI::IsMember({"mcts", "evolutionary", "greedy", "random"}));
  app.add_option("--repair-share", o.repair_share, "selections spent repairing a candidate that failed (0: never)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--memory", o.memory, "memory operator")->capture_default_str()->check(
      CLI::IsMember({"adaptive", "combined", "trajectory", "siblings", "fresh"}));
  app.add_option("--max-tokens", o.max_tokens, "per answer")->capture_default_str()->transform(whole_number)->check(positive);
  app.add_option("--max-tokens-field", o.max_tokens_field, "the OpenAI-format field for it: max_completion_tokens for OpenAI's newer models")
      ->capture_default_str()
      ->check(CLI::IsMember({"max_tokens", "max_completion_tokens"}));
  app.add_flag("--no-temperature", [&o](std::int64_t) { o.send_temperature = false; }, "send no temperature (models that accept only their default)");
  app.add_flag("--allow-weak-isolation", o.allow_weak_isolation,
               "run an LLM search with its key in this process's environment even where the candidates' jail lacks a layer (kevo "
               "checks each at start and refuses by default)");
  app.add_option("--token-budget", o.token_budget, "stop the search once this many tokens are spent")->transform(whole_number)->check(positive);
  app.add_option("--price", o.prices, "US dollars per million input and output tokens, to report and cap cost")
      ->expected(2)
      ->check(positive);
  app.add_option("--cost-budget", o.cost_budget, "stop the search once this much is spent, in US dollars")->check(positive)->needs("--price");
  app.add_option("--json", o.json, "also write a JSON summary there (as kevo-search's)");
  app.add_option("--ca-file", o.ca_file, "extra trusted certificates (PEM) for a self-hosted HTTPS server");
  app.add_option("--timeout", o.timeout_seconds,
                 "per LLM request in seconds, retries included (a long chat completion takes a minute or two); Ctrl-C cancels "
                 "requests in flight at once")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--knowledge", o.knowledge_dir, "knowledge folder")->capture_default_str();
  app.add_option("--knowledge-db", o.knowledge_db, "where knowledge and learned skills persist (default kevo-runs/knowledge.db)");
  app.add_option("--store", o.store, "SQLite store of the search (default kevo-runs/PROBLEM.llm.db)");
  app.add_flag("--log-prompts", o.log_prompts, "print every prompt and answer to stderr");
  app.add_flag("--warm-start-any-target", o.warm_start_any_target, "warm-start also from earlier runs measured on another device or with another compiler");
  app.add_option("--seed", o.seed, "random seed")->capture_default_str()->transform(whole_number);
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

/// Runs one search with the prepared evaluator, synthesizer and retriever, and prints how it went.
/// `redact` takes the API key out of every line printed. One loop for CPU and CUDA (kevo::eval::AnyEvaluator).
template <class Synth, class Retriever>
int search_with(const Options& o, const kevo::Problem& problem, kevo::eval::AnyEvaluator& evaluator, double compile_seconds, Synth synth,
                Retriever retriever, std::function<std::string(std::string)> redact) {
  using Evaluator = kevo::eval::AnyEvaluator;
  auto policy = kevo::search::make_policy(o.policy, o.repair_share);
  if (!policy) return fail(policy.error().message);
  auto memory = kevo::memory::make_memory(o.memory);
  if (!memory) return fail(memory.error().message);
  const fs::path store_path = o.store.empty() ? fs::path("kevo-runs") / (problem.name + ".llm.db") : o.store;
  if (auto failed = make_parent("--store", store_path)) return *failed;
  auto store = kevo::store::SqliteStore::open(store_path);
  if (!store) return fail(store.error().message, 2);

  fmt::print("reference: {:.3f} ms on the timing shape; budget {}, {} jobs, store {}\n", evaluator.reference_seconds() * 1e3,
             o.budget, o.jobs, store_path.string());

  kevo::SearchArguments args{
      .jobs = o.jobs, .max_evaluations = o.budget, .seed = o.seed, .warm_start_any_target = o.warm_start_any_target, .handle_signals = true};
  args.on_progress = [&](const kevo::Progress& p) {
    const kevo::Evaluation& e = *p.evaluation;
    const std::string outcome = e.ok() ? fmt::format("{:6.2f}x {}-bound", e.speedup, kevo::to_string(e.diagnostics.bottleneck))
                                       : fmt::format("{} ({:.70})", kevo::to_string(e.failure), e.diagnostics.message);
    fmt::print("{}", redact(fmt::format("[{:3}/{}] best {:6.2f}x{} node {:3}: {}  <- {:.80}\n", p.evaluations - 1, o.budget,
                                        p.best_speedup, p.new_best ? " (new)" : "      ", p.node_key, outcome, p.candidate->origin)));
    std::fflush(stdout);
  };
  const kevo::Candidate seed = kevo::synth::TemplateSynthesizer(problem).seed();
  kevo::SearchLoop<Synth, kevo::search::AnyPolicy, kevo::memory::AnyMemory, Evaluator, Retriever,
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
  if (result->repairs.requested > 0) fmt::print("{}\n", result->repairs.summary());
  if constexpr (requires { loop.synthesizer().completer().usage(); })
    fmt::print("LLM usage: {}\n", kevo::net::to_string(loop.synthesizer().completer().usage()));
  if (!o.json.empty()) {
    std::ofstream json(o.json);
    json << fmt::format(R"({{"problem":{},"problem_identity":"{}","evaluations":{},"best_speedup":{:.4f},"verified":{},"stopped_because":"{}",)"
                        R"("elapsed_seconds":{:.2f},"store":{},"run_id":{}{}}})"
                        "\n",
                        kevo::detail::json_quote(problem.name), problem.identity(), evaluated, result->verified_speedup, result->verified,
                        kevo::to_string(result->stopped_because), result->elapsed_seconds, kevo::detail::json_quote(store_path.string()), result->run_id,
                        kevo_examples::torch_summary_fields(problem, result->verified_speedup,
                                                            kevo_examples::speedup_over_compile(problem, compile_seconds, evaluator.reference_seconds(),
                                                                                                result->verified_speedup)));
    if (!json) fmt::print(stderr, "kevo-llm-search: {}: cannot be written\n", o.json.string());
  }
  fmt::print("best: {:.2f}x over {}, node {} ({})\n", result->verified ? result->verified_speedup : result->best_speedup,
             kevo_examples::reference_name(problem),
             result->best_key, result->verified ? "verified" : "NOT verified: " + result->verification_message);
  return result->verified ? 0 : 3;
}

/// search_with() on the problem's target, its evaluator prepared: a cuda problem's kernels are checked and timed on
/// this machine's GPU.
template <class Synth, class Retriever>
int search(const Options& o, const kevo::Problem& problem, Synth synth, Retriever retriever,
           std::function<std::string(std::string)> redact = [](std::string s) { return s; }) {
  auto prepared = [&](auto& concrete) -> int {
    if (auto ready = concrete.prepare(); !ready) return fail(ready.error().message);
    kevo::eval::AnyEvaluator evaluator(concrete);
    return search_with(o, problem, evaluator, concrete.torch_peers().compile_seconds, std::move(synth), std::move(retriever), std::move(redact));
  };
  if (problem.target != kevo::Target::cuda) {
    kevo::eval::CpuEvaluator evaluator(problem);
    return prepared(evaluator);
  }
  if (auto here = kevo::nvidia_device_present(); !here) return fail(here.error().message, 2);
  kevo::eval::CudaEvaluator evaluator(problem);
  return prepared(evaluator);
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
  Options o;
  CLI::App app{"", "kevo-llm-search"};
  describe(app, o);
  if (auto stop = kevo_examples::parse_command_line(app, argc, argv)) return *stop;
  if (o.prices.size() == 2) o.price_input = o.prices[0], o.price_output = o.prices[1];
  auto problem = kevo_examples::load_problem_argument(o.problem);
  if (!problem) return fail(problem.error().message);
  if (o.problem.describe_only) return fmt::print("{}", kevo_examples::describe_problem(*problem)), 0;
  if (auto why = kevo_examples::unsearchable_target(*problem)) return fail(*why, 2);

  const fs::path knowledge_db = o.knowledge_db.empty() ? fs::path("kevo-runs") / "knowledge.db" : o.knowledge_db;
  if (auto failed = make_parent("--knowledge-db", knowledge_db)) return *failed;
  auto knowledge = kevo::knowledge::KnowledgeBase::open({.database = knowledge_db.string(), .folders = {o.knowledge_dir}});
  if (!knowledge) return fail(knowledge.error().message);
  fmt::print("knowledge: {} sections and {} learned skills in {}\n", knowledge->size("document"), knowledge->size("skill"),
             knowledge_db.string());

  if ((o.base_url.empty() || o.model.empty()) && problem->torch && problem->torch->family.empty())
    return fail(fmt::format("no LLM configured (set KEVO_LLM_BASE_URL and KEVO_LLM_MODEL, or --base-url and --model), and {} has no "
                            "template family for the offline synthesizer to search",
                            problem->torch->file.string()));
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
