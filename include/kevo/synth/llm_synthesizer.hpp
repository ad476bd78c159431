// kevo/synth/llm_synthesizer.hpp: a Synthesizer that asks an LLM for new kernel code. One adaptive
// prompt (synth/prompt_builder.hpp) carries the problem, the target's constraints, the parent's
// diagnostics, the memory context and the retrieved knowledge; the answer is taken as a whole-file
// rewrite or as SEARCH/REPLACE edits (synth/answer_parser.hpp). An answer that repeats the parent
// or tried code, holds no code, or gives edits that do not apply is sent back once with the reason.
// A generation that still fails is counted by its fault and tried afresh: failed generations never
// spend the search's budget of evaluations; they have their own caps, and reaching one stops the
// search with a named reason ("the model repeats the parent"). An exhausted token budget stops it
// too. The API key is redacted from every answer and prompt.
//
//   auto llm = kevo::net::BlockingLlmClient::create({.base_url = url, .model = "gpt-x", .api_key_env = "OPENAI_API_KEY"});
//   kevo::synth::LlmSynthesizer synth(std::move(*llm));
//   auto candidate = synth.generate(request);   // expected<Candidate, Error>
#pragma once

#include <kevo/net/chat.hpp>
#include <kevo/synth/answer_parser.hpp>
#include <kevo/synth/prompt_builder.hpp>
#include <kevo/synthesizer.hpp>

#include <fmt/format.h>

#include <array>
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
  /// Per conversation: re-ask, in the same conversation and with the reason, when the answer is
  /// identical to the parent or to tried code, holds no code, or gives edits that do not apply.
  int max_reasks = 1;
  /// Failed generations in all, and in a row, before the search is stopped with the reason. They
  /// never spend the search's budget of evaluations (kevo-llm-search caps them at twice --budget).
  std::size_t max_failed_generations = 40;
  std::size_t max_consecutive_failed_generations = 16;
  /// Called with every prompt and the answer's text (empty when the request failed), e.g. for
  /// --log-prompts. The API key is redacted from both.
  std::function<void(const Prompt&, std::string_view answer)> on_exchange;
  /// Called with each failed generation, its fault and reason (key redacted), e.g. for a progress line.
  std::function<void(AnswerFault, std::string_view reason)> on_failure;
};

/// The failed generations so far, by fault.
struct GenerationFailures {
  std::array<std::size_t, answer_fault_count> by_fault{};
  std::size_t total = 0;

  std::size_t operator[](AnswerFault f) const { return by_fault[static_cast<std::size_t>(f)]; }
  AnswerFault most_common() const {
    return static_cast<AnswerFault>(std::max_element(by_fault.begin(), by_fault.end()) - by_fault.begin());
  }
  /// "16 generations failed: 9 identical to the parent, 5 no code, 2 requests failed".
  std::string summary() const {
    if (total == 0) return "no generation failed";
    std::string out = fmt::format("{} generation{} failed:", total, total == 1 ? "" : "s");
    const char* separator = " ";
    for (std::size_t i = 0; i < answer_fault_count; ++i) {
      if (by_fault[i] == 0) continue;
      out += fmt::format("{}{} {}", separator, by_fault[i], to_string(static_cast<AnswerFault>(i)));
      separator = ", ";
    }
    return out;
  }
};

/// The stop reason a run of failures earns, named by its most common fault.
inline std::string_view failing_model(AnswerFault f) {
  switch (f) {
    case AnswerFault::identical_to_parent: return "the model repeats the parent";
    case AnswerFault::repeat: return "the model repeats code already tried";
    case AnswerFault::no_code: return "the model answers without code";
    case AnswerFault::edits_do_not_apply: return "the model's edits do not apply";
    case AnswerFault::malformed: return "the model's answers are malformed";
    case AnswerFault::request_failed: return "the LLM requests fail";
  }
  return "?";
}

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
  /// A model fixes code from its compiler errors or mismatch: the loop sends repair requests.
  static constexpr bool repairs = true;

  explicit LlmSynthesizer(Completer completer, LlmSynthesizerOptions options = {})
      : completer_(std::move(completer)), options_(std::move(options)) {}

  /// A candidate, after as many fresh conversations as it takes; an error only once the search
  /// should stop (a failure cap reached, the token budget spent, the client cancelled), saying why.
  expected<Candidate, Error> generate(const GenerationRequest& request) {
    if (!request.problem) return make_error("LLM synthesizer: the request names no problem");
    Prompt prompt = build_prompt(request, options_.prompt);
    prompt.system = redact(std::move(prompt.system));  // a parent's diagnostics may quote what a candidate read
    prompt.user = redact(std::move(prompt.user));
    const std::string parent_source = request.parent.candidate ? request.parent.candidate->source : std::string();
    while (true) {
      if (auto why = shared_->stopped()) return make_error(*why);
      auto outcome = converse(prompt, parent_source);
      if (outcome) {
        shared_->succeeded();
        return std::move(*outcome);
      }
      Failure& f = outcome.error();
      if (f.final) return make_error(std::move(f.message));
      if (options_.on_failure) options_.on_failure(f.fault, f.message);
      if (auto why = shared_->failed(f.fault, f.message, options_)) return make_error(*why);
    }
  }

  /// Called by the loop for every candidate in the tree (resumed ones too), so repeats are caught.
  void remember(const Candidate& c) { shared_->first_sighting(c.hash()); }

  /// True once the search should stop: a failure cap was reached, or the token budget is spent. The
  /// search loop checks this and stops cleanly; exhaustion() says why. (A cancelled client is not
  /// counted here: Ctrl-C stops the loop itself, as interrupted, so that resume continues the run.)
  bool budget_exhausted() const {
    if (shared_->stopped()) return true;
    if constexpr (requires { completer_.budget_exhausted(); }) return completer_.budget_exhausted();
    return false;
  }

  std::optional<std::string> exhaustion() const {
    if (auto why = shared_->stopped()) return why;
    if constexpr (requires { completer_.budget_exhaustion(); }) {
      if (auto why = completer_.budget_exhaustion()) return why;
    }
    if constexpr (requires { completer_.cancelled(); }) {
      if (completer_.cancelled()) return std::string("the LLM requests were cancelled");
    }
    return std::nullopt;
  }

  GenerationFailures failures() const { return shared_->snapshot(); }

  /// `text` without the API key, where the client knows one.
  std::string redact(std::string text) const {
    if constexpr (requires { completer_.redact(std::move(text)); }) return completer_.redact(std::move(text));
    return text;
  }

  Completer& completer() { return completer_; }
  const Completer& completer() const { return completer_; }
  const LlmSynthesizerOptions& options() const { return options_; }

 private:
  struct Failure {
    AnswerFault fault = AnswerFault::malformed;
    std::string message;
    bool final = false;  ///< not the model's failure: the budget is spent or the client cancelled
  };

  /// One conversation: the prompt, then at most max_reasks turns that say what was wrong.
  expected<Candidate, Failure> converse(const Prompt& prompt, const std::string& parent_source) {
    net::ChatRequest chat;
    chat.system = prompt.system;
    chat.messages.push_back({"user", prompt.user});
    chat.max_tokens = options_.max_tokens;
    chat.temperature = options_.temperature;
    for (int round = 0;; ++round) {
      auto answer = completer_.complete(chat);
      const std::string text = answer ? redact(std::move(answer->text)) : std::string();
      if (options_.on_exchange) options_.on_exchange(prompt, text);
      if (!answer) {
        const auto kind = answer.error().kind;
        if (kind == net::LlmErrorKind::budget_exhausted) shared_->budget_exhausted(answer.error().message);
        std::string message = redact(fmt::format("LLM request failed ({}): {}", to_string(kind), answer.error().message));
        const bool final = kind == net::LlmErrorKind::budget_exhausted || kind == net::LlmErrorKind::cancelled;
        const AnswerFault fault = kind == net::LlmErrorKind::malformed_response ? AnswerFault::malformed
                                  : kind == net::LlmErrorKind::empty_response   ? AnswerFault::no_code
                                                                                : AnswerFault::request_failed;
        return unexpected(Failure{fault, std::move(message), final});
      }
      auto code = extract_code(text, parent_source, options_.extraction);
      AnswerFault fault = AnswerFault::repeat;
      std::string reason = "the code is identical to an implementation the search has already evaluated";
      if (!code) {
        fault = answer_fault(code.error().message);
        reason = code.error().message;
        if (answer->truncated()) reason += " (the answer stopped at max_tokens)";
      } else if (shared_->first_sighting(content_hash(code->source))) {
        Candidate c;
        c.source = std::move(code->source);
        // The model's own one-line account of the change: it lands in the tree and in learned skills.
        c.origin = code->form == AnswerForm::edits ? fmt::format("llm edits ({})", code->edits) : std::string("llm rewrite");
        if (!code->explanation.empty()) c.origin += ": " + detail::one_line(code->explanation, 200);
        return c;
      }
      if (fault != AnswerFault::malformed && round < options_.max_reasks) {
        // Telling the model what was wrong, in the same conversation, costs one short turn and
        // usually yields a usable answer; a fresh conversation would likely repeat the mistake.
        chat.messages.push_back({"assistant", text});
        chat.messages.push_back({"user", reask(fault, reason)});
        continue;
      }
      return unexpected(Failure{fault, "LLM answer unusable: " + reason});
    }
  }

  static std::string reask(AnswerFault fault, const std::string& reason) {
    switch (fault) {
      case AnswerFault::identical_to_parent:
        return "That code is identical to the current implementation, so there is nothing new to evaluate. "
               "Propose an actual change, in the same answer format.";
      case AnswerFault::repeat:
        return "That code is identical to an implementation the search has already evaluated. "
               "Propose a different change, in the same answer format.";
      case AnswerFault::no_code:
        return fmt::format("That answer held no usable code ({}). Answer with the complete file in one fenced code block, "
                           "or with SEARCH/REPLACE edits.", reason);
      case AnswerFault::edits_do_not_apply:
        return fmt::format("Those edits could not be applied ({}). Copy each SEARCH text exactly from the current "
                           "implementation, or answer with the complete file in one fenced code block.", reason);
      default:
        return "That answer could not be used (" + reason + "). Try again.";
    }
  }

  Completer completer_;
  LlmSynthesizerOptions options_;
  // Touched from the loop's thread and from concurrent generations; on the heap so the
  // synthesizer stays movable.
  struct Shared {
    mutable std::mutex mutex;
    std::unordered_set<std::uint64_t> seen;
    GenerationFailures failures;
    std::size_t consecutive = 0;
    std::optional<std::string> stop_reason;

    bool first_sighting(std::uint64_t hash) {
      std::lock_guard lock(mutex);
      return seen.insert(hash).second;
    }
    void succeeded() {
      std::lock_guard lock(mutex);
      consecutive = 0;
    }
    void budget_exhausted(const std::string& why) {
      std::lock_guard lock(mutex);
      if (!stop_reason) stop_reason = why;
    }
    /// Counts a failed generation; the stop reason once a cap is reached.
    std::optional<std::string> failed(AnswerFault fault, const std::string& message, const LlmSynthesizerOptions& o) {
      std::lock_guard lock(mutex);
      ++failures.by_fault[static_cast<std::size_t>(fault)];
      ++failures.total;
      ++consecutive;
      if (stop_reason) return stop_reason;
      if (consecutive >= o.max_consecutive_failed_generations)
        stop_reason = fmt::format("{}: {} generations failed in a row (the limit); last: {}", failing_model(failures.most_common()),
                                  consecutive, detail::one_line(message, 160));
      else if (failures.total >= o.max_failed_generations)
        stop_reason = fmt::format("{}: {} generations failed in all (the cap); last: {}", failing_model(failures.most_common()),
                                  failures.total, detail::one_line(message, 160));
      return stop_reason;
    }
    std::optional<std::string> stopped() const {
      std::lock_guard lock(mutex);
      return stop_reason;
    }
    GenerationFailures snapshot() const {
      std::lock_guard lock(mutex);
      return failures;
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
static_assert(synthesizer_repairs<LlmSynthesizer<detail::CompleterArchetype>>);

}  // namespace kevo::synth
