// kevo/knowledge_retriever.hpp: the KnowledgeRetriever concept. A retriever picks the knowledge
// that the current signals call for (a compile error pulls debugging guidance, a memory-bound
// profile pulls memory-hierarchy docs) and keeps the skills the search distils.
//
//   kevo::knowledge::NullRetriever none;
//   auto snippets = none.retrieve({.target = kevo::Target::cpu, .bottleneck = kevo::Bottleneck::memory});
//   none.learn(skill);
//   kevo::withdraw_skill(retriever, problem.name, node_key);  // where the retriever supports it
#pragma once

#include <kevo/candidate.hpp>
#include <kevo/detail/member_named.hpp>

#include <concepts>
#include <cstdint>
#include <string>
#include <vector>

KEVO_DETAIL_MEMBER_NAMED(withdraw)

namespace kevo {

/// The signals that drive retrieval.
struct KnowledgeQuery {
  Target target = Target::cpu;
  std::string architecture;                ///< e.g. "x86-64", "sm_90a", "gfx942"
  Bottleneck bottleneck = Bottleneck::unknown;
  FailureKind failure = FailureKind::none;
  std::string error_text;                  ///< compile errors or a mismatch summary
  std::string operator_class;              ///< e.g. "reduction", "gemm", "moe-scoring"
  std::string problem_words;               ///< the problem's own description
  std::size_t token_budget = 1500;
};

struct KnowledgeSnippet {
  std::string title;
  std::string category;  ///< "correctness", "optimization", "hardware", "skill"
  std::string text;
  double score = 0;
};

/// A distilled, reusable lesson: what change helped, where, and by how much.
struct Skill {
  std::string problem;
  Target target = Target::cpu;
  std::string summary;   ///< one paragraph a later generation can act on
  Knobs before, after;   ///< empty for free-form code
  Bottleneck bottleneck = Bottleneck::unknown;
  double improvement = 1;  ///< child speedup over parent speedup
  double speedup = 0;      ///< the child's speedup over the reference
  std::int64_t node_key = 0;  ///< the store's key of the child (a NodeKey); 0 when unknown
};

namespace detail {
template <class R>
concept retriever_retrieves = requires(R& r, const KnowledgeQuery& q) {
  { r.retrieve(q) } -> std::same_as<std::vector<KnowledgeSnippet>>;
};
template <class R>
concept retriever_learns = requires(R& r, const Skill& s) {
  { r.learn(s) } -> std::same_as<void>;
};
/// Optional: `withdraw(problem, node_key)` forgets the skill learned on that node.
template <class R>
concept retriever_withdraws = requires(R& r, const std::string& problem, std::int64_t node_key) {
  { r.withdraw(problem, node_key) } -> std::same_as<void>;
};
}  // namespace detail

/// `retrieve(query) -> vector<KnowledgeSnippet>` and `learn(skill)`.
template <class R>
concept KnowledgeRetriever = detail::retriever_retrieves<R> && detail::retriever_learns<R>;

template <class R>
constexpr bool check_knowledge_retriever() {
  static_assert(detail::retriever_retrieves<R>,
                "KnowledgeRetriever: missing `std::vector<KnowledgeSnippet> retrieve(const KnowledgeQuery&)`");
  static_assert(detail::retriever_learns<R>, "KnowledgeRetriever: missing `void learn(const Skill&)`");
  static_assert(!detail::has_member_named_withdraw<R> || detail::retriever_withdraws<R>,
                "KnowledgeRetriever: the optional hook `withdraw` must be `void withdraw(const std::string& problem, "
                "std::int64_t node_key)`: this one has another shape, and the loop would never call it");
  return true;
}

/// Withdraws the skill learned on `node_key` when the retriever keeps skills by node (a candidate
/// later refused must not teach anything); a no-op for one that does not.
template <class R>
void withdraw_skill(R& retriever, const std::string& problem, std::int64_t node_key) {
  if constexpr (detail::retriever_withdraws<R>) retriever.withdraw(problem, node_key);
}

namespace knowledge {
/// Retrieves nothing and forgets every skill: the default until a knowledge base is configured.
struct NullRetriever {
  std::vector<KnowledgeSnippet> retrieve(const KnowledgeQuery&) { return {}; }
  void learn(const Skill&) {}
};
static_assert(KnowledgeRetriever<NullRetriever>);
}  // namespace knowledge

}  // namespace kevo
