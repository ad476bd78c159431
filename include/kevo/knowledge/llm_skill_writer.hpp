// kevo/knowledge/llm_skill_writer.hpp: lets an LLM write the summary of each learned skill. It wraps
// any KnowledgeRetriever: retrieval passes through; learn() first asks the model to restate the
// distilled skill (knob diff, the change's own description, diagnosis, gain) as a short reusable
// lesson, and keeps the distilled text when the model fails, answers nothing usable, or contradicts
// the measured facts (a figure or a knob value they lack: see contradiction()).
//
//   kevo::knowledge::LlmSkillWriter writer(knowledge_base, llm);   // both by reference
//   SearchLoop<..., decltype(writer), ...> loop(..., writer, ...);
//   writer.learn(skill);   // stored with the model's summary
#pragma once

#include <kevo/knowledge/skill_facts.hpp>
#include <kevo/knowledge_retriever.hpp>
#include <kevo/net/chat.hpp>

#include <fmt/format.h>

#include <string>

namespace kevo::knowledge {

template <KnowledgeRetriever Retriever, net::ChatCompleter Completer>
class LlmSkillWriter {
 public:
  /// Both must outlive the writer. learn() blocks for one short LLM request; skills are rare
  /// (only clear improvements), so the caller's thread is held only briefly and seldom.
  LlmSkillWriter(Retriever& retriever, Completer& completer, std::size_t max_tokens = 300)
      : retriever_(&retriever), completer_(&completer), max_tokens_(max_tokens) {}

  std::vector<KnowledgeSnippet> retrieve(const KnowledgeQuery& query) { return retriever_->retrieve(query); }

  void learn(const Skill& skill) {
    Skill written = skill;
    if (auto summary = summarize(skill); !summary.empty()) written.summary = std::move(summary);
    retriever_->learn(written);
  }

  void withdraw(const std::string& problem, std::int64_t node_key)
    requires kevo::detail::retriever_withdraws<Retriever>
  {
    retriever_->withdraw(problem, node_key);
  }

  /// The model's summary, or empty when it could not give one or gave one the facts contradict.
  std::string summarize(const Skill& skill) {
    net::ChatRequest request;
    request.system =
        "You distil lessons from kernel optimization experiments into short, reusable advice for the next engineer. "
        "Answer in plain text, two or three sentences, no code, no lists.";
    request.messages.push_back(
        {"user",
         fmt::format("An optimization search on the problem '{}' ({} target) found this improvement:\n{}\n"
                     "Knobs before: {}\nKnobs after: {}\nThe parent was {}-bound; the change made it {:.2f}x faster.\n"
                     "State what was changed and where in the kernel, why it helped given the bottleneck, and the measured gain, "
                     "so the lesson can be applied to similar kernels. Quote only the figures and knob values given here.",
                     skill.problem, to_string(skill.target), skill.summary, skill.before.empty() ? "(none)" : to_string(skill.before),
                     skill.after.empty() ? "(none)" : to_string(skill.after), to_string(skill.bottleneck), skill.improvement)});
    request.max_tokens = max_tokens_;
    request.temperature = 0.2;
    auto answer = completer_->complete(request);
    if (!answer || answer->truncated()) return {};
    std::string text = answer->text;
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.erase(text.begin());
    // Code or an essay is not a skill summary; the distilled text is better than either.
    if (text.empty() || text.find("```") != std::string::npos || text.size() > 1200) return {};
    if (auto why = contradiction(skill, text)) {
      last_contradiction_ = std::move(*why);
      return {};
    }
    return text;
  }

  /// Why the last summary the model wrote was refused, for a log line; empty when none was.
  const std::string& last_contradiction() const { return last_contradiction_; }

  Retriever& retriever() { return *retriever_; }

 private:
  Retriever* retriever_;
  Completer* completer_;
  std::size_t max_tokens_;
  std::string last_contradiction_;
};

namespace detail {
struct SkillCompleterArchetype {
  expected<net::ChatResponse, net::LlmError> complete(const net::ChatRequest&);
};
}  // namespace detail
static_assert(KnowledgeRetriever<LlmSkillWriter<NullRetriever, detail::SkillCompleterArchetype>>);

}  // namespace kevo::knowledge
