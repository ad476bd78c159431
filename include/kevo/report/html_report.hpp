// kevo/report/html_report.hpp: a search run as one self-contained HTML page, drawn from the store
// alone: best speedup against evaluations, every evaluation's outcome, the tree, the winners.
//
//   auto store = kevo::store::SqliteStore::open("kevo-runs/cpu_scoring.db").value();
//   auto html = kevo::report::render_html(store, run_id);     // expected<std::string, Error>
//   kevo::report::write_html(store, run_id, "report.html");
#pragma once

#include <kevo/report/html.hpp>
#include <kevo/store.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <unordered_map>

namespace kevo::report {

namespace detail {

/// Speedup as a colour from grey (1x or less) to deep green (the best).
inline std::string speed_colour(double speedup, double best) {
  const double t = best > 1 ? std::clamp(std::log(std::max(speedup, 1.0)) / std::log(best), 0.0, 1.0) : 0.0;
  return fmt::format("rgb({},{},{})", int(190 - 160 * t), int(190 - 40 * t), int(190 - 140 * t));
}

/// Best-so-far line and one dot per evaluation, in the order evaluations finished.
inline std::string progress_svg(const std::vector<const StoredNode*>& finished, double best) {
  const SpeedupFrame frame = SpeedupFrame::fitting(best, finished.size());
  auto x = [&](std::size_t i) { return frame.x(i); };
  auto y = [&](double s) { return frame.y(s); };
  std::string svg = frame.open("evaluations, in the order they finished", 200);
  std::string line;
  double best_so_far = 0;
  for (std::size_t i = 0; i < finished.size(); ++i) {
    const Evaluation& e = *finished[i]->evaluation;
    if (e.ok()) best_so_far = std::max(best_so_far, e.speedup);
    line += fmt::format("{}{:.1f},{:.1f}", line.empty() ? "" : " ", x(i), y(best_so_far));
    svg += e.ok() ? fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3" fill="#4477aa"><title>node {}: {:.2f}x, {}</title></circle>)",
                                x(i), y(e.speedup), finished[i]->key, e.speedup, escape_html(finished[i]->candidate.origin))
                  : fmt::format(R"(<text x="{:.1f}" y="{:.1f}" fill="#cc3311" text-anchor="middle">x<title>node {}: {}: {}</title></text>)",
                                x(i), y(0) - 2, finished[i]->key, to_string(e.failure), escape_html(e.diagnostics.message));
  }
  svg += fmt::format(R"(<polyline points="{}" fill="none" stroke="#228833" stroke-width="2"/>)", line);
  return svg + "</svg>";
}

/// The tree, root on the left: leaves take successive rows, a parent sits beside its first child.
inline std::string tree_svg(const std::vector<StoredNode>& nodes, double best) {
  std::unordered_map<NodeKey, std::vector<std::size_t>> children;
  std::unordered_map<NodeKey, std::size_t> index;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    index[nodes[i].key] = i;
    if (nodes[i].parent != no_key) children[nodes[i].parent].push_back(i);
  }
  std::vector<double> row(nodes.size()), depth(nodes.size());
  double next_row = 0;
  int max_depth = 0;
  // Depth-first without recursion: a tree can be deep.
  std::vector<std::pair<std::size_t, int>> stack;
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].parent == no_key) stack.emplace_back(i, 0);
  std::vector<std::size_t> order;
  while (!stack.empty()) {
    auto [i, d] = stack.back();
    stack.pop_back();
    depth[i] = d;
    max_depth = std::max(max_depth, d);
    order.push_back(i);
    auto& kids = children[nodes[i].key];
    if (kids.empty()) row[i] = next_row++;
    else row[i] = -1;
    for (auto it = kids.rbegin(); it != kids.rend(); ++it) stack.emplace_back(*it, d + 1);
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it)  // parents after their children
    if (row[*it] < 0) row[*it] = row[children[nodes[*it].key].front()];

  const double dx = 90, dy = 14, width = 40 + dx * (max_depth + 1), height = 20 + dy * std::max(next_row, 1.0);
  std::string svg = fmt::format(R"(<svg viewBox="0 0 {} {}" width="{}" height="{}" font-size="10">)", width, height, width, height);
  auto px = [&](std::size_t i) { return 20 + dx * depth[i]; };
  auto py = [&](std::size_t i) { return 10 + dy * row[i]; };
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (auto p = index.find(nodes[i].parent); p != index.end())
      svg += fmt::format(R"(<path d="M{:.0f},{:.0f} H{:.0f} V{:.0f} H{:.0f}" fill="none" stroke="#bbb"/>)", px(p->second),
                         py(p->second), px(p->second) + dx / 2, py(i), px(i));
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const auto& n = nodes[i];
    const bool ok = n.evaluation && n.evaluation->ok();
    const std::string fill = !n.evaluation ? "#fff" : ok ? speed_colour(n.evaluation->speedup, best) : "#cc3311";
    const std::string label = !n.evaluation ? "pending" : ok ? fmt::format("{:.2f}x", n.evaluation->speedup)
                                                             : std::string(to_string(n.evaluation->failure));
    svg += fmt::format(R"(<circle cx="{:.0f}" cy="{:.0f}" r="5" fill="{}" stroke="#555"><title>node {}: {} &#10;{}</title></circle>)"
                       R"(<text x="{:.0f}" y="{:.0f}">{}</text>)",
                       px(i), py(i), fill, n.key, label, escape_html(to_string(n.candidate.knobs)), px(i) + 7, py(i) + 3, label);
  }
  return svg + "</svg>";
}

}  // namespace detail

template <SearchStore Store>
expected<std::string, Error> render_html(Store& store, std::int64_t run_id) {
  auto run = store.find_run(run_id);
  if (!run) return unexpected(run.error());
  auto nodes = store.load_nodes(run_id);
  if (!nodes) return unexpected(nodes.error());

  std::vector<const StoredNode*> finished;
  std::map<std::string, std::size_t> failures;
  double best = 0;
  const StoredNode* best_node = nullptr;
  for (const auto& n : *nodes) {
    if (!n.evaluation) continue;
    finished.push_back(&n);
    if (!n.evaluation->ok()) ++failures[std::string(to_string(n.evaluation->failure))];
    else if (n.evaluation->speedup > best) best = n.evaluation->speedup, best_node = &n;
  }
  // A finished run names its best node itself (the one the loop verified, as the console and the
  // JSON summary name it); only an unfinished run's best is the fastest figure so far.
  if (run->best_node != no_key)
    for (const auto& n : *nodes)
      if (n.key == run->best_node && n.evaluation && n.evaluation->ok()) best_node = &n;
  const double searched = best_node ? best_node->evaluation->speedup : 0;
  std::string headline = fmt::format("best {:.2f}x over the reference (as the search measured it; unfinished)", best);
  if (!run->stopped_because.empty() && best_node && run->verified_speedup > 0)
    headline = fmt::format("best {:.2f}x over the reference (verified: node {}, re-checked on fresh inputs and re-timed; the search "
                           "measured {:.2f}x)",
                           run->verified_speedup, best_node->key, searched);
  else if (!run->stopped_because.empty() && best_node)
    headline = fmt::format("best {:.2f}x over the reference (node {}, NOT verified: it failed its final re-check)", searched,
                           best_node->key);
  else if (!run->stopped_because.empty())
    headline = fmt::format("no correct candidate: all {} evaluations failed", finished.size());
  std::sort(finished.begin(), finished.end(), [](auto a, auto b) { return a->finish_order < b->finish_order; });

  std::string failures_text;
  for (auto& [kind, count] : failures) failures_text += fmt::format("{} {}, ", count, kind);
  if (failures_text.empty()) failures_text = "none, ";
  failures_text.resize(failures_text.size() - 2);

  std::vector<const StoredNode*> ranked;
  for (auto* n : finished)
    if (n->evaluation->ok()) ranked.push_back(n);
  std::sort(ranked.begin(), ranked.end(), [](auto a, auto b) { return a->evaluation->speedup > b->evaluation->speedup; });
  std::string table;
  for (std::size_t i = 0; i < std::min<std::size_t>(ranked.size(), 10); ++i) {
    const auto& e = *ranked[i]->evaluation;
    table += fmt::format("<tr><td>{}</td><td>{:.2f}x</td><td>{}</td><td>{:.1f} GB/s, {:.1f} GFLOP/s</td><td><code>{}</code></td><td>{}</td></tr>\n",
                         ranked[i]->key, e.speedup, to_string(e.diagnostics.bottleneck), e.diagnostics.achieved_gbytes_per_s,
                         e.diagnostics.achieved_gflops, escape_html(to_string(ranked[i]->candidate.knobs)),
                         escape_html(ranked[i]->candidate.origin));
  }

  return fmt::format(R"(<!doctype html>
<html><head><meta charset="utf-8"><title>kevo: {problem}, run {run}</title>
<style>body{{font-family:sans-serif;margin:2em;color:#222}} td,th{{padding:2px 8px;text-align:left}}
.figure{{overflow-x:auto;border:1px solid #ddd;padding:8px;margin-bottom:1.5em}} code{{font-size:90%}}</style></head>
<body>
<h1>kevo: {problem}, run {run}</h1>
<p>{evaluations} evaluations; {headline}; failures: {failures};
stopped: {stopped}.</p>
<h2>Best speedup against evaluations</h2>
<div class="figure">{progress}</div>
<h2>The fastest candidates</h2>
<table><tr><th>node</th><th>speedup</th><th>bottleneck</th><th>achieved</th><th>knobs</th><th>how it was made</th></tr>
{table}</table>
<h2>The search tree</h2>
<p>Colour: grey is no faster than the reference, green the best; red failed. Hover for knobs.</p>
<div class="figure">{tree}</div>
{best_source}
</body></html>
)",
                     fmt::arg("problem", escape_html(run->problem)), fmt::arg("run", run_id),
                     fmt::arg("evaluations", finished.size()), fmt::arg("headline", escape_html(headline)), fmt::arg("failures", failures_text),
                     fmt::arg("stopped", run->stopped_because.empty() ? "not yet (unfinished or killed)" : run->stopped_because),
                     fmt::arg("progress", detail::progress_svg(finished, best)), fmt::arg("table", table),
                     fmt::arg("tree", detail::tree_svg(*nodes, best)),
                     fmt::arg("best_source", best_node ? fmt::format("<h2>The best kernel (node {})</h2><pre>{}</pre>", best_node->key,
                                                                     escape_html(best_node->candidate.source))
                                                       : std::string()));
}

template <SearchStore Store>
expected<void, Error> write_html(Store& store, std::int64_t run_id, const std::filesystem::path& path) {
  return write_page(render_html(store, run_id), path);
}

}  // namespace kevo::report
