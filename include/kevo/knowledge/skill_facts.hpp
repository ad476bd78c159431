// kevo/knowledge/skill_facts.hpp: a skill's facts (the knob diff, the measured gain, where it was
// learned) and the check that a restated summary keeps to them. A model may reword a skill; it may
// not name a figure or a knob value that was never measured, nor move a knob the wrong way.
//
//   if (auto why = kevo::knowledge::contradiction(skill, model_text)) log(*why);  // keep skill.summary
//   else skill.summary = model_text;
//   body += kevo::knowledge::provenance(skill);   // "Learned on softmax, node 17, cuda, 1.23x over its parent"
#pragma once

#include <kevo/knowledge/document.hpp>
#include <kevo/knowledge_retriever.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace kevo::knowledge {

/// "vector_width 4->8, unroll 1->2" for the knobs that differ (added or removed ones included).
inline std::string knob_diff(const Knobs& before, const Knobs& after) {
  std::string out;
  auto add = [&](std::string_view name, std::string_view from, std::string_view to) {
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {}->{}", name, from.empty() ? "(unset)" : from, to.empty() ? "(unset)" : to);
  };
  for (const auto& [name, value] : after) {
    auto it = before.find(name);
    if (it == before.end()) add(name, "", value);
    else if (it->second != value) add(name, it->second, value);
  }
  for (const auto& [name, value] : before)
    if (!after.contains(name)) add(name, value, "");
  return out;
}

/// Where a skill came from, on one line: "Learned on cuda_softmax, node 17, cuda, 1.23x over its parent".
inline std::string provenance(const Skill& skill) {
  const std::string node = skill.node_key != 0 ? fmt::format(", node {}", skill.node_key) : "";
  return fmt::format("Learned on {}{}, {}, {:.2f}x over its parent", skill.problem, node, to_string(skill.target),
                     skill.improvement);
}

namespace detail {

inline bool word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

inline std::optional<double> number(std::string_view text) {
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text.front()))) return std::nullopt;
  const std::string s(text);
  char* end = nullptr;
  const double value = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() ? std::optional(value) : std::nullopt;
}

/// A number as written: 1.8 has one decimal, so it stands for anything that rounds to it.
struct Figure {
  double value = 0;
  int decimals = 0;
};

/// The figures in `text`: numbers standing alone ("1.8x", "80%", "4->8"), not parts of names such
/// as sm_90, fp16 or 2D.
inline std::vector<Figure> figures_in(std::string_view text) {
  std::vector<Figure> out;
  std::size_t i = 0;
  while (i < text.size()) {
    const bool starts =
        std::isdigit(static_cast<unsigned char>(text[i])) && (i == 0 || (!word_char(text[i - 1]) && text[i - 1] != '.'));
    if (!starts) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
    int decimals = 0;
    if (j + 1 < text.size() && text[j] == '.' && std::isdigit(static_cast<unsigned char>(text[j + 1]))) {
      const std::size_t point = j++;
      while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
      decimals = static_cast<int>(j - point - 1);
    }
    const bool times = j < text.size() && text[j] == 'x' && (j + 1 == text.size() || !word_char(text[j + 1]));
    const bool glued = j < text.size() && word_char(text[j]) && !times;
    if (!glued) out.push_back({*number(text.substr(i, j - i)), decimals});
    i = j;
    while (i < text.size() && word_char(text[i])) ++i;
  }
  return out;
}

/// Words (values such as "1.5", "row_major" and "x86-64" stay whole) and the connectors "->" and
/// "=", in order; other punctuation is one token each, so it ends a clause.
inline std::vector<std::string_view> tokens_of(std::string_view text) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  auto inner = [&](std::size_t k) {  // '.' or '-' joining two word characters, as in 1.5 or x86-64
    return k + 1 < text.size() && (text[k] == '.' || text[k] == '-') && word_char(text[k + 1]) && k > 0 && word_char(text[k - 1]);
  };
  while (i < text.size()) {
    const char c = text[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (text.substr(i, 2) == "->" || text.substr(i, 3) == "\xE2\x86\x92") {  // "->" or "→"
      out.emplace_back("->");
      i += text[i] == '-' ? 2 : 3;
    } else if (word_char(c)) {
      const std::size_t start = i;
      while (i < text.size() && (word_char(text[i]) || inner(i))) ++i;
      out.push_back(text.substr(start, i - start));
    } else {
      out.push_back(text.substr(i, 1));
      ++i;
    }
  }
  return out;
}

inline bool same_value(std::string_view a, std::string_view b) {
  if (a == b) return true;
  const auto x = number(a), y = number(b);
  return x && y && *x == *y;
}

inline bool starts_with_any(std::string_view word, std::initializer_list<std::string_view> stems) {
  return std::any_of(stems.begin(), stems.end(), [&](std::string_view s) { return word.starts_with(s); });
}

/// +1 when `word` says "more" (raising, doubling, larger), -1 when it says "less", 0 otherwise.
inline int direction_of(std::string_view word) {
  const std::string w = lowercase(word);
  if (starts_with_any(w, {"increas", "rais", "doubl", "grow", "widen", "wider", "larger", "higher", "bigger", "more", "deeper",
                          "longer"}))
    return 1;
  if (starts_with_any(w, {"decreas", "lower", "reduc", "halv", "shrink", "narrow", "smaller", "fewer", "less", "shorter"}))
    return -1;
  return 0;
}

}  // namespace detail

/// Why `summary` contradicts the facts of `skill`, or nullopt when it keeps to them. The facts are
/// the skill's fields and its distilled `skill.summary` (kevo wrote that from the measurements).
/// The rules, each cheap to explain:
///  - a knob named with a value ("unroll 2", "unroll=2", "unroll from 1 to 2", "unroll 1->2")
///    must give its after-value last and its before-value first;
///  - a knob said to be raised or lowered ("lowering unroll") must have moved that way;
///  - every number the summary writes must round to one of the facts: a figure of the distilled
///    text, a knob value, the improvement or the speedup (or either as "N% faster").
inline std::optional<std::string> contradiction(const Skill& skill, std::string_view summary) {
  std::set<std::string, std::less<>> names;
  for (const Knobs* knobs : {&skill.before, &skill.after})
    for (const auto& [name, value] : *knobs) names.insert(name);
  const auto tokens = detail::tokens_of(summary);
  for (std::size_t k = 0; k < tokens.size(); ++k) {
    const auto named = names.find(tokens[k]);
    if (named == names.end()) continue;
    const std::string& name = *named;
    const auto before = skill.before.find(name), after = skill.after.find(name);
    const std::string_view was = before == skill.before.end() ? "(unset)" : std::string_view(before->second);
    const std::string_view now = after == skill.after.end() ? "(unset)" : std::string_view(after->second);

    // The values stated right after the name. "->" and "=" introduce any value; otherwise only a
    // number or one of this knob's own values counts, so "unroll to cut traffic" states none.
    std::vector<std::string_view> stated;
    bool introduced = false;
    for (std::size_t m = k + 1; m < tokens.size() && m <= k + 6 && !names.contains(tokens[m]); ++m) {
      const std::string_view t = tokens[m];
      if (t == "->" || t == "=") {
        introduced = true;
      } else if (introduced || detail::number(t) || t == was || t == now) {
        stated.push_back(t);
        introduced = false;
      } else if (t != "to" && t != "from" && t != ":" && t != "of" && t != "at") {
        break;
      }
    }
    if (!stated.empty() && !detail::same_value(stated.back(), now))
      return fmt::format("it sets {} to {}, but the change set it to {}", name, stated.back(), now);
    if (stated.size() >= 2 && !detail::same_value(stated.front(), was))
      return fmt::format("it moves {} from {}, but the parent had {}", name, stated.front(), was);

    std::size_t p = k;
    while (p > 0 && (tokens[p - 1] == "the" || tokens[p - 1] == "its" || tokens[p - 1] == "a")) --p;
    const int claimed = p > 0 ? detail::direction_of(tokens[p - 1]) : 0;
    const auto from = detail::number(was), to = detail::number(now);
    if (claimed != 0 && from && to && (*to - *from) * claimed <= 0)
      return fmt::format("it says {} {}, but {} went from {} to {}", tokens[p - 1], name, name, was, now);
  }

  std::vector<double> facts;
  for (const auto& f : detail::figures_in(skill.summary)) facts.push_back(f.value);
  for (const Knobs* knobs : {&skill.before, &skill.after})
    for (const auto& [name, value] : *knobs)
      for (const auto& f : detail::figures_in(value)) facts.push_back(f.value);
  for (const double gain : {skill.improvement, skill.speedup}) {
    facts.push_back(gain);
    facts.push_back(100 * (gain - 1));
  }
  for (const auto& claim : detail::figures_in(summary)) {
    const double slack = 0.5 * std::pow(10.0, -claim.decimals) + 1e-9;
    if (std::none_of(facts.begin(), facts.end(), [&](double f) { return std::abs(f - claim.value) <= slack; }))
      return fmt::format("it gives the figure {:.{}f}, which nothing measured supports", claim.value, claim.decimals);
  }
  return std::nullopt;
}

}  // namespace kevo::knowledge
