// kevo/synthesizer.hpp: the Synthesizer concept. A synthesizer turns a generation request (the
// problem, the parent and what the memory operator lets it see, the retrieved knowledge, and the
// parent's diagnostics) into a new candidate. Models: synth/template_synthesizer.hpp (offline).
//
//   kevo::synth::TemplateSynthesizer synth(problem);
//   kevo::expected<kevo::Candidate, kevo::Error> c = synth.generate(request);
//   if (!c) log(c.error().message);   // a failed generation costs one attempt, never the search
#pragma once

#include <kevo/candidate.hpp>
#include <kevo/detail/member_named.hpp>
#include <kevo/expected.hpp>
#include <kevo/knowledge_retriever.hpp>
#include <kevo/memory_operator.hpp>
#include <kevo/problem.hpp>
#include <kevo/search_tree.hpp>

#include <concepts>
#include <memory>
#include <optional>
#include <vector>

KEVO_DETAIL_MEMBER_NAMED(remember)
KEVO_DETAIL_MEMBER_NAMED(concurrent_generation)
KEVO_DETAIL_MEMBER_NAMED(budget_exhausted)
KEVO_DETAIL_MEMBER_NAMED(repairs)

namespace kevo {

/// A node of the tree as a synthesizer sees it: what was tried and what came of it.
struct Attempt {
  NodeId node = no_node;
  std::shared_ptr<const Candidate> candidate;
  Evaluation evaluation;
};

struct GenerationRequest {
  const Problem* problem = nullptr;
  Target target = Target::cpu;
  Attempt parent;                        ///< carries the parent's diagnostics
  std::optional<Attempt> grandparent;    ///< so a change that broke the parent can be backed off
  std::optional<Attempt> mate;           ///< a second parent, for crossover
  MemoryMode memory_mode = MemoryMode::fresh;
  std::vector<Attempt> trajectory;       ///< root .. parent (when the memory operator allows)
  std::vector<Attempt> siblings;         ///< the parent's finished children, fastest first
  std::vector<KnowledgeSnippet> knowledge;
  std::uint64_t seed = 0;                ///< for any randomness, so a run can be replayed
  /// A repair: `parent` failed (its diagnostics carry the trimmed compile errors or the mismatch)
  /// and this generation should fix it rather than speed it up. Only a synthesizer that says it
  /// repairs (`synthesizer_repairs`) is sent one.
  bool repair = false;
  std::uint32_t repair_try = 0;          ///< with `repair`: 1 for the parent's first repair, 2 for its second...
};

namespace detail {
template <class S>
concept synthesizer_generates = requires(S& s, const GenerationRequest& r) {
  { s.generate(r) } -> std::same_as<expected<Candidate, Error>>;
};
// The optional hooks, each as the loop uses it.
template <class S>
concept synthesizer_remembers = requires(S& s, const Candidate& c) { s.remember(c); };
template <class S>
concept synthesizer_says_concurrent = requires { { S::concurrent_generation } -> std::convertible_to<bool>; };
template <class S>
concept synthesizer_spends_budget = requires(const S& s) { { s.budget_exhausted() } -> std::convertible_to<bool>; };
template <class S>
concept synthesizer_says_repairs = requires { { S::repairs } -> std::convertible_to<bool>; };
}  // namespace detail

/// `generate(request) -> expected<Candidate, Error>`. An error is a failed generation with a
/// reason a person can read; it costs one attempt.
///
/// The loop calls `generate` off its own thread, one call at a time, so a synthesizer may keep
/// state without locks. One that is safe to call from several threads at once (an LLM client
/// waiting on the network) says so with `static constexpr bool concurrent_generation = true;`
/// and then gets up to `jobs` calls in parallel. One that spends a budget (tokens, money) may
/// offer `bool budget_exhausted() const`; the loop then stops cleanly once it returns true. The
/// loop asks it from its own thread while a `generate` may be running, so what it reads must be
/// safe to read then (an atomic counter, as LlmSynthesizer keeps). One that can fix a failed
/// candidate from its diagnostics says so with `static constexpr bool repairs = true;` and is then
/// sent repair requests (GenerationRequest::repair). One that keeps its own record of what it has
/// proposed may offer `void remember(const Candidate&)`: the loop tells it what the tree already
/// holds (a resumed run, warm starts) before any generation. A member named like one of these hooks
/// but of another shape fails check_synthesizer, naming the hook.
template <class S>
concept Synthesizer = detail::synthesizer_generates<S>;

/// Whether a synthesizer repairs failed candidates: it says so with `static constexpr bool repairs
/// = true;` (LlmSynthesizer does). The loop then lets policies spend a share of the budget on
/// repairs, and repairs a broken seed rather than stop; without it (TemplateSynthesizer, which
/// backs off broken knobs itself) it never sends a repair request.
template <class S>
inline constexpr bool synthesizer_repairs = requires { requires S::repairs; };

template <class S>
constexpr bool check_synthesizer() {
  static_assert(detail::synthesizer_generates<S>,
                "Synthesizer: missing `expected<Candidate, Error> generate(const GenerationRequest&)`");
  static_assert(!detail::has_member_named_remember<S> || detail::synthesizer_remembers<S>,
                "Synthesizer: the optional hook `remember` must be `void remember(const Candidate&)`: this one has another "
                "shape, and the loop would never call it");
  static_assert(!detail::has_member_named_concurrent_generation<S> || detail::synthesizer_says_concurrent<S>,
                "Synthesizer: the optional hook `concurrent_generation` must be `static constexpr bool concurrent_generation`: "
                "this one has another shape, and the loop would never read it");
  static_assert(!detail::has_member_named_budget_exhausted<S> || detail::synthesizer_spends_budget<S>,
                "Synthesizer: the optional hook `budget_exhausted` must be `bool budget_exhausted() const`: this one has "
                "another shape, and the loop would never call it");
  static_assert(!detail::has_member_named_repairs<S> || detail::synthesizer_says_repairs<S>,
                "Synthesizer: the optional hook `repairs` must be `static constexpr bool repairs`: this one has another "
                "shape, and the loop would never read it");
  return true;
}

}  // namespace kevo
