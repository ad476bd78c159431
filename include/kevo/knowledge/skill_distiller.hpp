// kevo/knowledge/skill_distiller.hpp: turns an improvement (a child that beat its parent) into a
// compact, reusable Skill without an LLM: the knob diff, or the changed lines of free-form code,
// plus the parent's diagnosis and the measured gain.
//
//   if (auto skill = kevo::knowledge::distill_skill(problem, parent, parent_eval, child, child_eval))
//     knowledge_base.learn(*skill);
#pragma once

#include <kevo/candidate.hpp>
#include <kevo/knowledge/document.hpp>
#include <kevo/knowledge/skill_facts.hpp>
#include <kevo/knowledge_retriever.hpp>
#include <kevo/problem.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace kevo::knowledge {

/// Lines of `after` that `before` lacks, and the reverse: a cheap change summary that needs no
/// alignment (prompts and skills only quote a few lines of it).
struct LineChanges {
  std::vector<std::string> added;
  std::vector<std::string> removed;
};

inline LineChanges changed_lines(std::string_view before, std::string_view after) {
  auto lines = [](std::string_view text) {
    std::vector<std::string> out;
    while (!text.empty()) {
      const std::size_t eol = text.find('\n');
      std::string_view line = detail::trim(text.substr(0, eol));
      if (!line.empty() && line != "{" && line != "}") out.emplace_back(line);
      text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    }
    return out;
  };
  const auto b = lines(before), a = lines(after);
  const std::multiset<std::string> bs(b.begin(), b.end()), as(a.begin(), a.end());
  LineChanges out;
  for (const auto& l : a)
    if (!bs.contains(l)) out.added.push_back(l);
  for (const auto& l : b)
    if (!as.contains(l)) out.removed.push_back(l);
  return out;
}

/// A skill when `child` is correct and faster than `parent` (a failed parent counts as speedup 0,
/// so fixing it is a skill too); nullopt otherwise.
inline std::optional<Skill> distill_skill(const Problem& problem, const Candidate& parent, const Evaluation& parent_eval,
                                          const Candidate& child, const Evaluation& child_eval) {
  if (!child_eval.ok()) return std::nullopt;
  const double before = parent_eval.ok() ? parent_eval.speedup : 0.0;
  if (child_eval.speedup <= before) return std::nullopt;

  Skill skill;
  skill.problem = problem.name;
  skill.target = problem.target;
  skill.before = parent.knobs;
  skill.after = child.knobs;
  skill.bottleneck = parent_eval.ok() ? parent_eval.diagnostics.bottleneck : child_eval.diagnostics.bottleneck;
  skill.improvement = before > 0 ? child_eval.speedup / before : child_eval.speedup;
  skill.speedup = child_eval.speedup;

  std::string change;
  const bool both_templated = !parent.knobs.empty() && !child.knobs.empty();
  if (const std::string diff = both_templated ? knob_diff(parent.knobs, child.knobs) : ""; !diff.empty()) {
    std::vector<std::string> sides;
    for (const auto& [name, value] : child.knobs)
      if (const KnobSpec* spec = problem.knob(name); spec && (!parent.knobs.contains(name) || parent.knobs.at(name) != value))
        sides.emplace_back(to_string(spec->side));
    change = fmt::format("changing {}", diff);
    if (!sides.empty() && std::all_of(sides.begin(), sides.end(), [&](const auto& s) { return s == sides.front(); }))
      change += fmt::format(" ({}-side knobs)", sides.front());
  } else {
    const LineChanges lines = changed_lines(parent.source, child.source);
    change = fmt::format("a code change ({}; +{} -{} lines)", child.origin.empty() ? "rewrite" : child.origin, lines.added.size(),
                         lines.removed.size());
    std::size_t quoted = 0;
    for (const auto& l : lines.added) {
      if (quoted == 3) break;
      change += fmt::format("{} `{:.100}`", quoted == 0 ? ", adding" : ";", l);
      ++quoted;
    }
  }

  const Diagnostics& was = parent_eval.diagnostics;
  std::string from;
  if (!parent_eval.ok())
    from = fmt::format("a parent that failed with {} ({:.160})", to_string(parent_eval.failure), was.message);
  else
    from = fmt::format("a {}-bound parent at {:.2f}x", to_string(was.bottleneck), parent_eval.speedup);
  skill.summary = fmt::format("On {} ({}), {} took {} to {:.2f}x the reference", problem.name, to_string(problem.target), change,
                              from, child_eval.speedup);
  if (parent_eval.ok()) skill.summary += fmt::format(" ({:.2f}x better)", skill.improvement);
  const Diagnostics& now = child_eval.diagnostics;
  if (now.roofline_fraction > 0)
    skill.summary += fmt::format("; the result reaches {:.0f}% of the roofline as a {}-bound kernel", 100 * now.roofline_fraction,
                                 to_string(now.bottleneck));
  skill.summary += '.';
  return skill;
}

}  // namespace kevo::knowledge
