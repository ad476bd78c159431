// kevo/synth/answer_parser.hpp: the robust extraction of a candidate from the LLM's answer, given
// as a whole-file rewrite (the largest fenced code block) or as SEARCH/REPLACE edits applied to the
// parent. Every malformed answer is an error with a message saying what was wrong, never a crash,
// and answer_fault() reads that message back as the fault the synthesizer counts. The prompt that
// asks for the answer is assembled by synth/prompt_builder.hpp.
//
//   auto code = kevo::synth::extract_code(answer_text, parent_source);   // rewrite or SEARCH/REPLACE
//   if (!code) log(kevo::synth::answer_fault(code.error().message), code.error().message);
//   else use(code->source);                                               // code->form, code->edits
#pragma once

#include <kevo/detail/text.hpp>
#include <kevo/expected.hpp>
#include <kevo/knowledge/document.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kevo::synth {

namespace detail {
using knowledge::detail::trim;
using kevo::detail::one_line;
}  // namespace detail

/// How the code was found in the answer.
enum class AnswerForm : std::uint8_t { rewrite, edits };

struct ExtractedCode {
  std::string source;
  AnswerForm form = AnswerForm::rewrite;
  std::size_t edits = 0;
  std::string explanation;  ///< the prose before the code, one line
};

struct ExtractionOptions {
  std::size_t max_answer_bytes = 1u << 20;
  std::size_t max_source_bytes = 256u << 10;
};

namespace detail {

struct Fence {
  std::string language;
  std::string body;
  bool closed = false;
  std::size_t begin = 0;  ///< offset of the opening fence in the answer
};

inline std::vector<Fence> fences_of(std::string_view text) {
  std::vector<Fence> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t open = text.find("```", pos);
    if (open == std::string_view::npos) break;
    if (open > 0 && text[open - 1] != '\n') {  // a fence starts a line (after optional spaces)
      std::size_t k = open;
      while (k > 0 && text[k - 1] == ' ') --k;
      if (k > 0 && text[k - 1] != '\n') {
        pos = open + 3;
        continue;
      }
    }
    const std::size_t eol = text.find('\n', open);
    Fence f;
    f.begin = open;
    f.language = std::string(trim(std::string(text.substr(open + 3, eol == std::string_view::npos ? std::string_view::npos : eol - open - 3))));
    if (eol == std::string_view::npos) {
      out.push_back(std::move(f));
      break;
    }
    std::size_t close = text.find("\n```", eol);
    if (close == std::string_view::npos) {
      f.body = std::string(text.substr(eol + 1));
      out.push_back(std::move(f));
      break;
    }
    f.body = std::string(text.substr(eol + 1, close + 1 - (eol + 1)));
    f.closed = true;
    out.push_back(std::move(f));
    const std::size_t after = text.find('\n', close + 4);
    pos = after == std::string_view::npos ? text.size() : after + 1;
  }
  return out;
}

inline bool is_code_language(std::string_view lang) {
  static constexpr std::array<std::string_view, 10> names{"", "cpp", "c++", "cxx", "cc", "c", "cuda", "cu", "hip", "h"};
  std::string lower;
  for (char c : lang) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return std::find(names.begin(), names.end(), lower) != names.end();
}

inline bool looks_like_refusal(std::string_view text) {
  static constexpr std::array<std::string_view, 8> openings{"i can't", "i cannot", "i'm sorry", "i am sorry", "i won't",
                                                            "i am unable", "i'm unable", "as an ai"};
  std::string head;
  for (char c : text.substr(0, 400)) head += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (auto o : openings)
    if (head.find(o) != std::string::npos) return true;
  return false;
}

/// Finds `needle` in `haystack`, exactly or else ignoring trailing whitespace on each line.
inline std::optional<std::pair<std::size_t, std::size_t>> locate(std::string_view haystack, std::string_view needle) {
  if (needle.empty()) return std::nullopt;
  if (const std::size_t at = haystack.find(needle); at != std::string_view::npos) return std::pair{at, needle.size()};
  auto strip_line_ends = [](std::string_view s, std::vector<std::size_t>* origin) {
    std::string out;
    std::size_t i = 0;
    while (i < s.size()) {
      std::size_t eol = s.find('\n', i);
      if (eol == std::string_view::npos) eol = s.size();
      std::size_t end = eol;
      while (end > i && (s[end - 1] == ' ' || s[end - 1] == '\t' || s[end - 1] == '\r')) --end;
      for (std::size_t k = i; k < end; ++k) {
        out += s[k];
        if (origin) origin->push_back(k);
      }
      if (eol < s.size()) {
        out += '\n';
        if (origin) origin->push_back(eol);
      }
      i = eol + 1;
    }
    if (origin) origin->push_back(s.size());
    return out;
  };
  std::vector<std::size_t> origin;
  const std::string h = strip_line_ends(haystack, &origin);
  std::string n = strip_line_ends(needle, nullptr);
  while (!n.empty() && n.back() == '\n') n.pop_back();
  if (n.empty()) return std::nullopt;
  const std::size_t at = h.find(n);
  if (at == std::string::npos) return std::nullopt;
  const std::size_t begin = origin[at];
  std::size_t end = origin[at + n.size() - 1] + 1;
  if (needle.ends_with('\n')) {  // the match takes whole lines: their trailing blanks and newline too
    while (end < haystack.size() && (haystack[end] == ' ' || haystack[end] == '\t' || haystack[end] == '\r')) ++end;
    if (end < haystack.size() && haystack[end] == '\n') ++end;
  }
  return std::pair{begin, end - begin};
}

}  // namespace detail

/// Why an answer gave nothing to evaluate; the synthesizer re-asks for some and counts them all.
enum class AnswerFault : std::uint8_t {
  identical_to_parent,  ///< the code, or the parent after the edits, is the parent
  repeat,               ///< code the search has already evaluated
  no_code,              ///< empty, a refusal, or prose without a code block
  edits_do_not_apply,   ///< a SEARCH text is not in the parent
  malformed,            ///< broken edit markers, an unclosed block, over a size limit
  request_failed,       ///< no answer at all: the request failed
};
inline constexpr std::size_t answer_fault_count = 6;

/// How the summary line names each fault ("9 identical to the parent, 5 no code").
inline constexpr std::string_view to_string(AnswerFault f) {
  switch (f) {
    case AnswerFault::identical_to_parent: return "identical to the parent";
    case AnswerFault::repeat: return "repeats of code already tried";
    case AnswerFault::no_code: return "no code";
    case AnswerFault::edits_do_not_apply: return "edits that did not apply";
    case AnswerFault::malformed: return "malformed";
    case AnswerFault::request_failed: return "requests failed";
  }
  return "?";
}

/// The fault behind an extract_code() error, read from the messages extract_code writes (below).
inline AnswerFault answer_fault(std::string_view message) {
  auto has = [&](std::string_view part) { return message.find(part) != std::string_view::npos; };
  if (has("identical to the current implementation") || has("leave the current implementation unchanged"))
    return AnswerFault::identical_to_parent;
  if (has("does not apply") || has("no parent source")) return AnswerFault::edits_do_not_apply;
  if (has("no fenced code block") || has("the answer is empty") || has("code block is empty") || has("the model declined"))
    return AnswerFault::no_code;
  return AnswerFault::malformed;
}

/// The candidate source in an answer: SEARCH/REPLACE edits applied to `parent_source`, or the
/// largest fenced code block as a whole-file rewrite. Every malformed answer is an error whose
/// message says what was wrong.
inline expected<ExtractedCode, Error> extract_code(std::string_view answer, std::string_view parent_source,
                                                   const ExtractionOptions& options = {}) {
  using namespace detail;
  if (answer.size() > options.max_answer_bytes)
    return make_error(fmt::format("the answer is {} bytes, over the {}-byte limit", answer.size(), options.max_answer_bytes));
  if (trim(std::string(answer)).empty()) return make_error("the answer is empty");

  ExtractedCode out;
  constexpr std::string_view search_marker = "<<<<<<< SEARCH";
  if (const std::size_t first_edit = answer.find(search_marker); first_edit != std::string_view::npos) {
    if (parent_source.empty()) return make_error("the answer gives SEARCH/REPLACE edits but there is no parent source to apply them to");
    out.explanation = one_line(trim(std::string(answer.substr(0, std::min(first_edit, answer.find("```"))))), 300);
    std::string source(parent_source);
    std::size_t pos = first_edit;
    std::size_t index = 0;
    while ((pos = answer.find(search_marker, pos)) != std::string_view::npos) {
      ++index;
      const std::size_t search_begin = answer.find('\n', pos);
      const std::size_t divider = answer.find("\n=======", pos);
      const std::size_t replace_end = answer.find("\n>>>>>>> REPLACE", pos);
      if (search_begin == std::string_view::npos || divider == std::string_view::npos || divider < search_begin)
        return make_error(fmt::format("edit {} is malformed: its SEARCH part has no '=======' line", index));
      if (replace_end == std::string_view::npos || replace_end < divider)
        return make_error(fmt::format("edit {} is malformed: it has no '>>>>>>> REPLACE' line", index));
      const std::string_view search = answer.substr(search_begin + 1, divider + 1 - (search_begin + 1));
      const std::size_t replace_begin = answer.find('\n', divider + 1);
      const std::string_view replace =
          replace_begin >= replace_end ? std::string_view() : answer.substr(replace_begin + 1, replace_end + 1 - (replace_begin + 1));
      const auto where = locate(source, search);
      if (!where)
        return make_error(fmt::format("edit {} does not apply: its SEARCH text is not in the current implementation (it starts `{}`)",
                                      index, one_line(trim(std::string(search)), 80)));
      source.replace(where->first, where->second, replace);
      pos = replace_end + 1;
    }
    if (source == parent_source) return make_error("the edits leave the current implementation unchanged");
    out.source = std::move(source);
    out.form = AnswerForm::edits;
    out.edits = index;
  } else {
    const auto fences = fences_of(answer);
    const Fence* best = nullptr;
    bool unclosed = false;
    for (const auto& f : fences) {
      if (!is_code_language(f.language)) continue;
      if (!f.closed) {
        unclosed = true;
        continue;
      }
      if (!best || f.body.size() > best->body.size()) best = &f;
    }
    if (!best) {
      if (unclosed) return make_error("the answer's code block is never closed (the answer was probably cut off at max_tokens)");
      if (looks_like_refusal(answer)) return make_error(fmt::format("the model declined: \"{}\"", one_line(trim(std::string(answer)), 160)));
      return make_error(fmt::format("the answer has no fenced code block ({} characters, starting \"{}\")", answer.size(),
                                    one_line(trim(std::string(answer)), 80)));
    }
    out.source = best->body;
    out.explanation = one_line(trim(std::string(answer.substr(0, fences.front().begin))), 300);
    if (trim(out.source).empty()) return make_error("the answer's code block is empty");
  }
  if (out.source.size() > options.max_source_bytes)
    return make_error(fmt::format("the code is {} bytes, over the {}-byte limit", out.source.size(), options.max_source_bytes));
  if (!parent_source.empty() && trim(out.source) == trim(std::string(parent_source)))
    return make_error("the code is identical to the current implementation");
  return out;
}

}  // namespace kevo::synth
