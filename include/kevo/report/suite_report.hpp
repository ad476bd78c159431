// kevo/report/suite_report.hpp: a suite of problems searched one by one (kevo-suite), scored as the field
// scores KernelBench: fast_p is the share of all problems whose best kernel is correct and more than p times
// faster than the peer (fast_0: correct at all). A problem that could not be used, or needed an LLM that was
// not given, counts as not correct. Written as a text table, JSON and one HTML page with a picture.
//
//   std::vector<kevo::report::SuiteRow> rows = ...;        // one per problem
//   kevo::report::SuiteScore s = kevo::report::score(rows);  // s.fast_eager[1] is fast_1.0 over PyTorch eager
//   fmt::print("{}", kevo::report::suite_table(rows, s));
#pragma once

#include <kevo/detail/json_text.hpp>
#include <kevo/report/html.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kevo::report {

/// One problem of a suite, as its search left it.
struct SuiteRow {
  std::string problem;           ///< the file's name
  std::string family;            ///< the template family, or empty (an LLM wrote the kernels)
  bool correct = false;          ///< a verified best exists: it passed the checker on fresh inputs, and its race
  double over_eager = 0;         ///< the verified speedup over PyTorch eager (0: none)
  std::optional<double> over_compile;  ///< over torch.compile, where it was timed
  std::size_t evaluations = 0;
  std::string stopped_because;   ///< the search's stop reason, or why there was no search ("needs --llm", "unusable: ...")
  double seconds = 0;            ///< the search's wall time
};

/// The fast_p thresholds reported, in order: fast_0, fast_1.0, fast_1.5.
inline constexpr std::array<double, 3> suite_thresholds = {0.0, 1.0, 1.5};

struct SuiteScore {
  std::size_t problems = 0, correct = 0;
  std::array<double, 3> fast_eager{};    ///< per threshold: the share of all problems
  std::array<double, 3> fast_compile{};  ///< the same over torch.compile, among all problems (where not timed: not faster)
  std::size_t compile_timed = 0;         ///< problems with a torch.compile time
  double geomean_eager = 0;              ///< over the correct problems; 0: none
  double geomean_compile = 0;            ///< over the correct problems with a torch.compile time; 0: none
};

inline SuiteScore score(const std::vector<SuiteRow>& rows) {
  SuiteScore s;
  s.problems = rows.size();
  double log_eager = 0, log_compile = 0;
  std::size_t with_compile = 0;
  for (const auto& r : rows) {
    if (r.over_compile) ++s.compile_timed;
    if (!r.correct) continue;
    ++s.correct;
    for (std::size_t i = 0; i < suite_thresholds.size(); ++i) {
      // fast_0 is "correct"; above it, strictly faster than p times the peer.
      if (i == 0 || r.over_eager > suite_thresholds[i]) s.fast_eager[i] += 1;
      if (r.over_compile && (i == 0 || *r.over_compile > suite_thresholds[i])) s.fast_compile[i] += 1;
    }
    if (r.over_eager > 0) log_eager += std::log(r.over_eager);
    if (r.over_compile && *r.over_compile > 0) {
      log_compile += std::log(*r.over_compile);
      ++with_compile;
    }
  }
  for (std::size_t i = 0; i < suite_thresholds.size(); ++i) {
    s.fast_eager[i] = s.problems ? s.fast_eager[i] / double(s.problems) : 0;
    s.fast_compile[i] = s.problems ? s.fast_compile[i] / double(s.problems) : 0;
  }
  if (s.correct) s.geomean_eager = std::exp(log_eager / double(s.correct));
  if (with_compile) s.geomean_compile = std::exp(log_compile / double(with_compile));
  return s;
}

namespace detail {
inline std::string ratio_text(std::optional<double> v) { return v && *v > 0 ? fmt::format("{:.2f}x", *v) : "-"; }
}  // namespace detail

/// The table as text: one line per problem, then the score.
inline std::string suite_table(const std::vector<SuiteRow>& rows, const SuiteScore& s) {
  std::string out = fmt::format("{:<28} {:<22} {:>7} {:>9} {:>11} {:>6}  {}\n", "problem", "family", "correct", "vs eager", "vs compile", "evals",
                                "stopped");
  for (const auto& r : rows)
    out += fmt::format("{:<28} {:<22} {:>7} {:>9} {:>11} {:>6}  {}\n", r.problem.substr(0, 28), (r.family.empty() ? "(llm)" : r.family).substr(0, 22),
                       r.correct ? "yes" : "no", detail::ratio_text(r.correct ? std::optional(r.over_eager) : std::nullopt),
                       detail::ratio_text(r.correct ? r.over_compile : std::nullopt), r.evaluations, r.stopped_because);
  out += fmt::format("over PyTorch eager:   fast_0 {:.0f}%  fast_1.0 {:.0f}%  fast_1.5 {:.0f}%  geomean {:.2f}x ({} of {} correct)\n",
                     100 * s.fast_eager[0], 100 * s.fast_eager[1], 100 * s.fast_eager[2], s.geomean_eager, s.correct, s.problems);
  out += s.compile_timed ? fmt::format("over torch.compile:   fast_0 {:.0f}%  fast_1.0 {:.0f}%  fast_1.5 {:.0f}%  geomean {:.2f}x ({} timed)\n",
                                       100 * s.fast_compile[0], 100 * s.fast_compile[1], 100 * s.fast_compile[2], s.geomean_compile, s.compile_timed)
                         : std::string("over torch.compile:   not timed (this PyTorch has no torch.compile)\n");
  return out;
}

inline std::string suite_json(const std::vector<SuiteRow>& rows, const SuiteScore& s, std::string_view settings_json) {
  using kevo::detail::json_quote;
  std::string out = fmt::format("{{\"settings\":{},\"problems\":[", settings_json.empty() ? "{}" : settings_json);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    out += fmt::format("{}{{\"problem\":{},\"family\":{},\"correct\":{},\"speedup_over_eager\":{:.4f},\"speedup_over_compile\":{},"
                       "\"evaluations\":{},\"stopped_because\":{},\"seconds\":{:.1f}}}",
                       i ? "," : "", json_quote(r.problem), json_quote(r.family), r.correct, r.over_eager,
                       r.over_compile ? fmt::format("{:.4f}", *r.over_compile) : "null", r.evaluations, json_quote(r.stopped_because), r.seconds);
  }
  auto shares = [](const std::array<double, 3>& f) { return fmt::format("{{\"fast_0\":{:.4f},\"fast_1.0\":{:.4f},\"fast_1.5\":{:.4f}}}", f[0], f[1], f[2]); };
  out += fmt::format("],\"score\":{{\"problems\":{},\"correct\":{},\"over_eager\":{},\"geomean_over_eager\":{:.4f},\"over_compile\":{},"
                     "\"geomean_over_compile\":{:.4f},\"compile_timed\":{}}}}}\n",
                     s.problems, s.correct, shares(s.fast_eager), s.geomean_eager, shares(s.fast_compile), s.geomean_compile, s.compile_timed);
  return out;
}

/// One page: the score, a bar per problem (its speedup over eager on a log scale, 1x marked), and the table.
inline std::string suite_html(const std::vector<SuiteRow>& rows, const SuiteScore& s, std::string_view title) {
  const double width = 760, row_height = 22, left = 190, height = row_height * double(rows.size()) + 40;
  double top = 2;
  for (const auto& r : rows) top = std::max(top, r.over_eager);
  const double span = std::log10(top) + 1;  // from 0.1x to the best
  auto x = [&](double v) { return left + (width - left - 60) * (std::log10(std::max(v, 0.1)) + 1) / span; };
  std::string svg = fmt::format(R"(<svg viewBox="0 0 {0} {1}" width="{0}" height="{1}" font-size="12">)", width, height);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const double y = 10 + row_height * double(i);
    svg += fmt::format(R"(<text x="{}" y="{:.0f}" text-anchor="end">{}</text>)", left - 6, y + 14, escape_html(r.problem));
    if (r.correct && r.over_eager > 0)
      svg += fmt::format(R"(<rect x="{:.1f}" y="{:.0f}" width="{:.1f}" height="16" fill="{}"/><text x="{:.1f}" y="{:.0f}">{:.2f}x</text>)", x(0.1), y,
                         x(r.over_eager) - x(0.1), r.over_eager > 1 ? "#2a7" : "#d84", x(r.over_eager) + 4, y + 13, r.over_eager);
    else
      svg += fmt::format(R"(<text x="{:.1f}" y="{:.0f}" fill="#a33">{}</text>)", x(0.1) + 4, y + 13, escape_html(r.stopped_because));
  }
  svg += fmt::format(R"(<line x1="{0:.1f}" x2="{0:.1f}" y1="5" y2="{1:.0f}" stroke="#333" stroke-dasharray="4"/><text x="{0:.1f}" y="{2:.0f}">1x = PyTorch eager</text></svg>)",
                     x(1), height - 20, height - 6);
  std::string table = "<table><tr><th>problem</th><th>family</th><th>correct</th><th>vs eager</th><th>vs compile</th><th>evaluations</th><th>stopped</th></tr>";
  for (const auto& r : rows)
    table += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", escape_html(r.problem),
                         escape_html(r.family.empty() ? "(llm)" : r.family), r.correct ? "yes" : "no",
                         detail::ratio_text(r.correct ? std::optional(r.over_eager) : std::nullopt), detail::ratio_text(r.correct ? r.over_compile : std::nullopt),
                         r.evaluations, escape_html(r.stopped_because));
  return fmt::format(R"(<!doctype html><html><head><meta charset="utf-8"><title>{0}</title><style>body{{font-family:sans-serif;margin:2em}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left}}</style></head><body>
<h1>{0}</h1><pre>{1}</pre>{2}{3}</table></body></html>
)",
                     escape_html(title), escape_html(suite_table({}, s).substr(suite_table({}, s).find('\n') + 1)), svg, table);
}

}  // namespace kevo::report
