// kevo/report/comparison_report.hpp: every run of one problem on one page, for comparing them (one
// per search policy, say): each run's best speedup against evaluations, and what each verified.
//
//   auto store = kevo::store::SqliteStore::open("kevo-runs/cpu_scoring.db").value();
//   auto html = kevo::report::render_comparison_html(store, "cpu_scoring");   // expected<std::string, Error>
//   kevo::report::write_comparison_html(store, "cpu_scoring", "compare.html");
#pragma once

#include <kevo/report/html.hpp>
#include <kevo/store.hpp>

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kevo::report {

namespace detail {

/// Paul Tol's "bright" colours: told apart by colour-blind readers too. Past seven runs they repeat,
/// and the legend's run ids tell the curves apart.
inline constexpr std::array<std::string_view, 7> run_colours = {"#4477aa", "#ee6677", "#228833", "#ccbb44",
                                                                "#66ccee", "#aa3377", "#bbbbbb"};

/// What the comparison shows of one run.
struct ComparedRun {
  RunInfo info;
  std::string policy;               ///< as the run's settings name it; empty where they do not
  std::vector<double> best_so_far;  ///< after each finished evaluation, in the order they finished
  std::size_t failures = 0;
};

/// The policy a run's settings name (kevo-search records {"policy":"mcts",...}); empty where none:
/// a caller of the loop writes its own settings, or none.
inline std::string policy_of(std::string_view settings_json) {
  simdjson::dom::parser parser;
  simdjson::dom::element settings;
  std::string_view policy;
  if (parser.parse(settings_json.data(), settings_json.size()).get(settings) || settings["policy"].get_string().get(policy))
    return {};
  return std::string(policy);
}

/// A run's figure as the console gives it: verified where it was, else what the search measured.
inline std::string outcome_text(const ComparedRun& r) {
  const double searched = r.best_so_far.empty() ? 0 : r.best_so_far.back();
  if (r.info.stopped_because.empty()) return fmt::format("unfinished, best so far {:.2f}x", searched);
  if (r.info.best_node != no_key && r.info.verified_speedup > 0)
    return fmt::format("verified {:.2f}x (node {})", r.info.verified_speedup, r.info.best_node);
  return r.info.best_node != no_key ? fmt::format("{:.2f}x, NOT verified", searched) : std::string("no correct candidate");
}

/// One best-so-far line per run over a shared scale, so that the curves compare at a glance.
inline std::string comparison_svg(const std::vector<ComparedRun>& runs) {
  std::size_t n = 2;
  double best = 0;
  for (const auto& r : runs) {
    n = std::max(n, r.best_so_far.size());
    if (!r.best_so_far.empty()) best = std::max(best, r.best_so_far.back());
  }
  const SpeedupFrame frame = SpeedupFrame::fitting(best, n);
  auto x = [&](std::size_t i) { return frame.x(i); };
  auto y = [&](double s) { return frame.y(s); };
  std::string svg = frame.open(fmt::format("evaluations, in the order each run finished them (1 to {})", frame.n), 170);
  for (std::size_t k = 0; k < runs.size(); ++k) {
    const auto& r = runs[k];
    std::string points;
    for (std::size_t i = 0; i < r.best_so_far.size(); ++i)
      points += fmt::format("{}{:.1f},{:.1f}", points.empty() ? "" : " ", x(i), y(r.best_so_far[i]));
    svg += fmt::format(R"(<polyline class="run" data-run="{}" points="{}" fill="none" stroke="{}" stroke-width="2">)"
                       R"(<title>run {}</title></polyline>)",
                       r.info.id, points, run_colours[k % run_colours.size()], r.info.id);
  }
  return svg + "</svg>";
}

}  // namespace detail

/// Every run of `problem` in `store`, oldest first, ready to compare. The SearchStore concept lists
/// no runs, so this asks for each id up to the latest: stores number runs from 1, and a missing id
/// (a run deleted by hand) is passed over.
template <SearchStore Store>
expected<std::vector<detail::ComparedRun>, Error> compared_runs(Store& store, std::string_view problem) {
  std::vector<detail::ComparedRun> runs;
  auto latest = store.latest_run();
  for (std::int64_t id = 1; latest && id <= latest->id; ++id) {
    auto run = store.find_run(id);
    if (!run || run->problem != problem) continue;
    auto nodes = store.load_nodes(id);
    if (!nodes) return unexpected(nodes.error());
    std::vector<const StoredNode*> finished;
    for (const auto& n : *nodes)
      if (n.evaluation) finished.push_back(&n);
    std::sort(finished.begin(), finished.end(), [](auto a, auto b) { return a->finish_order < b->finish_order; });
    detail::ComparedRun r{.info = *run, .policy = detail::policy_of(run->settings_json)};
    double best = 0;
    for (const auto* n : finished) {
      if (n->evaluation->ok()) best = std::max(best, n->evaluation->speedup);
      else ++r.failures;
      r.best_so_far.push_back(best);
    }
    runs.push_back(std::move(r));
  }
  if (runs.empty()) return make_error(fmt::format("the store holds no run of '{}'", problem));
  return runs;
}

/// One page comparing every run of `problem`: their curves on one chart, a legend, and a table.
template <SearchStore Store>
expected<std::string, Error> render_comparison_html(Store& store, std::string_view problem) {
  auto runs = compared_runs(store, problem);
  if (!runs) return unexpected(runs.error());
  std::string legend, table;
  for (std::size_t k = 0; k < runs->size(); ++k) {
    const auto& r = (*runs)[k];
    const std::string name = r.policy.empty() ? fmt::format("run {}", r.info.id) : fmt::format("run {}, {}", r.info.id, r.policy);
    legend += fmt::format(R"(<li><span class="swatch" style="background:{}"></span>{}: {}</li>)" "\n",
                          detail::run_colours[k % detail::run_colours.size()], escape_html(name),
                          escape_html(detail::outcome_text(r)));
    // A CPU's identity lists its every flag: the cell shows its start, hovering the whole.
    const std::string& target = r.info.target_identity;
    const std::string target_cell = target.empty() ? std::string("-")
                                    : target.size() <= 40 ? escape_html(target)
                                                          : fmt::format(R"(<span title="{}">{}...</span>)", escape_html(target),
                                                                        escape_html(target.substr(0, 40)));
    table += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.2f}x</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                         r.info.id, r.policy.empty() ? "-" : escape_html(r.policy), r.best_so_far.size(), r.failures,
                         r.best_so_far.empty() ? 0.0 : r.best_so_far.back(),
                         r.info.verified_speedup > 0 ? fmt::format("{:.2f}x", r.info.verified_speedup) : std::string("-"),
                         r.info.stopped_because.empty() ? "not yet" : escape_html(r.info.stopped_because),
                         target_cell);
  }
  return fmt::format(R"(<!doctype html>
<html><head><meta charset="utf-8"><title>kevo: {problem}, {count} runs compared</title>
<style>body{{font-family:sans-serif;margin:2em;color:#222}} td,th{{padding:2px 8px;text-align:left}}
.figure{{overflow-x:auto;border:1px solid #ddd;padding:8px;margin-bottom:1.5em}}
.legend{{list-style:none;padding:0}} .swatch{{display:inline-block;width:2em;height:4px;margin-right:8px;vertical-align:middle}}</style></head>
<body>
<h1>kevo: {problem}, {count} runs compared</h1>
<p>Best speedup so far against evaluations, one line per run. Speedups are over each run's own reference
timing: compare runs measured on the same target.</p>
<div class="figure">{chart}</div>
<ul class="legend">
{legend}</ul>
<table><tr><th>run</th><th>policy</th><th>evaluations</th><th>failed</th><th>best, as searched</th><th>verified</th>
<th>stopped</th><th>target</th></tr>
{table}</table>
</body></html>
)",
                     fmt::arg("problem", escape_html(problem)), fmt::arg("count", runs->size()),
                     fmt::arg("chart", detail::comparison_svg(*runs)), fmt::arg("legend", legend), fmt::arg("table", table));
}

template <SearchStore Store>
expected<void, Error> write_comparison_html(Store& store, std::string_view problem, const std::filesystem::path& path) {
  return write_page(render_comparison_html(store, problem), path);
}

}  // namespace kevo::report
