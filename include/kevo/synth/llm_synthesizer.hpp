// kevo/synth/llm_synthesizer.hpp: a Synthesizer that asks an LLM for new kernel code. One adaptive
// prompt (synth/prompt_builder.hpp) carries the problem, the target's constraints, the parent's
// diagnostics, the memory context and the retrieved knowledge; the answer is taken as a whole-file
// rewrite or as SEARCH/REPLACE edits. Every malformed answer or failed request is a failed
// generation with a readable reason, never a crash; an exhausted token budget stops the search.
//
//   auto llm = kevo::net::BlockingLlmClient::create({.base_url = url, .model = "gpt-x", .api_key_env = "OPENAI_API_KEY"});
//   kevo::synth::LlmSynthesizer synth(std::move(*llm));
//   auto candidate = synth.generate(request);   // expected<Candidate, Error>
#pragma once

#include <kevo/net/chat.hpp>
#include <kevo/synth/prompt_builder.hpp>
#include <kevo/synthesizer.hpp>

#include <fmt/format.h>

#include <atomic>
#include <concepts>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>

namespace kevo::synth {

/// What the synthesizer needs of an LLM client: a blocking chat completion (net::BlockingLlmClient).
using net::ChatCompleter;

struct LlmSynthesizerOptions {
  std::size_t max_tokens = 8192;                 ///< per answer
  std::optional<double> temperature = 0.7;
  PromptOptions prompt;
  ExtractionOptions extraction;
  int max_repeat_retries = 1;                    ///< re-ask, in the same conversation, when the code was tried before
  /// Called with every prompt and the answer's text (empty when the request failed), e.g. for
  /// --log-prompts. The API key is never part of either.
  std::function<void(const Prompt&, std::string_view answer)> on_exchange;
};

namespace detail {
template <class C>
concept thread_safe_completer = requires { requires C::thread_safe; };
}  // namespace detail

template <ChatCompleter Completer>
class LlmSynthesizer {
 public:
  /// With a thread-safe client the loop may run several generations at once (LLM answers take
  /// seconds, so this is where `--jobs` pays off); on_exchange must then be thread-safe too.
  static constexpr bool concurrent_generation = detail::thread_safe_completer<Completer>;

  explicit LlmSynthesizer(Completer completer, LlmSynthesizerOptions options = {})
      : completer_(std::move(completer)), options_(std::move(options)) {}

  expected<Candidate, Error> generate(const GenerationRequest& request) {
    if (!request.problem) return make_error("LLM synthesizer: the request names no problem");
    const Prompt prompt = build_prompt(request, options_.prompt);
    net::ChatRequest chat;
    chat.system = prompt.system;
    chat.messages.push_back({"user", prompt.user});
    chat.max_tokens = options_.max_tokens;
    chat.temperature = options_.temperature;

    const std::string parent_source = request.parent.candidate ? request.parent.candidate->source : std::string();
    for (int round = 0;; ++round) {
      auto answer = completer_.complete(chat);
      if (options_.on_exchange) options_.on_exchange(prompt, answer ? std::string_view(answer->text) : std::string_view());
      if (!answer) {
        if (answer.error().kind == net::LlmErrorKind::budget_exhausted) shared_->budget_exhausted = true;
        return make_error(fmt::format("LLM request failed ({}): {}", to_string(answer.error().kind), answer.error().message));
      }
      auto code = extract_code(answer->text, parent_source, options_.extraction);
      if (!code) {
        std::string reason = code.error().message;
        if (answer->truncated()) reason += " (the answer stopped at max_tokens)";
        return make_error("LLM answer unusable: " + reason);
      }
      const bool repeat = !shared_->first_sighting(content_hash(code->source));
      if (repeat && round < options_.max_repeat_retries) {
        // The search would discard it unevaluated; telling the model so in the same conversation
        // costs one short turn and usually yields a different idea.
        chat.messages.push_back({"assistant", answer->text});
        chat.messages.push_back({"user", "That code is identical to an implementation the search has already evaluated. "
                                         "Propose a different change, in the same answer format."});
        continue;
      }
      Candidate c;
      c.source = std::move(code->source);
      // The model's own one-line account of the change: it lands in the tree and in learned skills.
      c.origin = code->form == AnswerForm::edits ? fmt::format("llm edits ({})", code->edits) : std::string("llm rewrite");
      if (!code->explanation.empty()) c.origin += ": " + detail::one_line(code->explanation, 200);
      return c;
    }
  }

  /// Called by the loop for every candidate in the tree (resumed ones too), so repeats are caught.
  void remember(const Candidate& c) { shared_->first_sighting(c.hash()); }

  /// True once a request failed for lack of budget, or the client reports its budget spent; the
  /// search loop checks this and stops cleanly.
  bool budget_exhausted() const {
    if constexpr (requires { completer_.budget_exhausted(); }) {
      if (completer_.budget_exhausted()) return true;
    }
    return shared_->budget_exhausted;
  }

  Completer& completer() { return completer_; }
  const Completer& completer() const { return completer_; }
  const LlmSynthesizerOptions& options() const { return options_; }

 private:
  Completer completer_;
  LlmSynthesizerOptions options_;
  // Touched from the loop's thread and from concurrent generations; on the heap so the
  // synthesizer stays movable.
  struct Shared {
    std::mutex mutex;
    std::unordered_set<std::uint64_t> seen;
    std::atomic<bool> budget_exhausted{false};
    bool first_sighting(std::uint64_t hash) {
      std::lock_guard lock(mutex);
      return seen.insert(hash).second;
    }
  };
  std::unique_ptr<Shared> shared_ = std::make_unique<Shared>();
};

namespace detail {
/// The least a completer must offer; checks LlmSynthesizer against the concept without pulling in
/// the HTTP client here.
struct CompleterArchetype {
  expected<net::ChatResponse, net::LlmError> complete(const net::ChatRequest&);
};
}  // namespace detail
static_assert(Synthesizer<LlmSynthesizer<detail::CompleterArchetype>>);

}  // namespace kevo::synth
