// benchmarks/retrieval/benchmark_report.hpp: the retrieval benchmark's logs as one HTML page with
// pictures: each stage against the roofline, kevo against PyTorch, throughput against pool size,
// batches, threads searching at once, and updates with the search latency beside them. It reads the text the benchmark and
// torch_peer.py print (run_on_device.sh keeps them as bench.log and torch.log), so any recorded run
// can be drawn again.
//
//   std::ifstream bench("bench.log"), torch("torch.log");
//   BenchmarkLog log = parse_benchmark_log(bench);
//   parse_torch_log(torch, log);
//   std::ofstream("report.html") << render_benchmark_html(log, "run 28, 2026-11-30");
#pragma once

#include <kevo/report/html.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <istream>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

namespace kevo::bench {

/// One row of the benchmark's stage table.
struct StageRow {
  std::string request, dtype;
  double pool_ads = 0, eligible_percent = 0;
  int k = 0;
  double matching_gps = 0, matching_percent = 0;  // pool ads/s, % of roofline
  double scoring_gps = 0, scoring_percent = 0;    // eligible ads/s
  double topk_ms = 0, pipeline_ms = 0;
  double pipeline_gps = 0, pipeline_percent = 0;  // pool ads/s (device events)
};

/// A labelled throughput: host-visible searches, peers, updates.
struct Figure {
  std::string label;
  double value = 0;
  std::string note;  // shown after the value
};

/// One batch size of the benchmark's "Batches" section: one pass against the same requests one by one.
struct BatchRow {
  std::string dtype;
  int requests = 0;
  double one_pass_ms = 0, one_by_one_ms = 0;
  double union_percent = 0;  // of the pool: the ads eligible for any request of the batch
  double pairs_per_listed_ad = 0, pairs_gps = 0;
};

/// One line of the "Concurrent searches" section: `clients` threads searching at once, in turn
/// (the pipeline's own lock) or through BatchingBackend.
struct ConcurrentRow {
  std::string dtype;
  int clients = 0;
  bool batching = false;
  double searches_per_second = 0, pool_gps = 0;
  double p50_ms = 0, p99_ms = 0;
  double searches_per_batch = 1;
};

struct BenchmarkLog {
  std::string device;
  double roofline_tbs = 0;
  std::vector<StageRow> stages;
  std::vector<BatchRow> batches;
  std::vector<ConcurrentRow> concurrent;
  std::vector<Figure> host_searches;  // G pool ads/s, request in to top-K out
  std::vector<Figure> updates;        // M ads/s applied
  std::vector<Figure> peers;          // G pool ads/s (PyTorch)
  std::vector<Figure> recall;         // int8 recall@K against fp16
};

/// Reads what retrieval_benchmark prints into `log` (several logs of one run may be read into one).
/// Lines it does not know are skipped, so logs of older runs (fewer sections) still parse.
inline void parse_benchmark_log(std::istream& in, BenchmarkLog& log) {
  static const std::regex header(R"(^# retrieval benchmark on (.+), \d+ SMs; streaming-read roofline ([\d.]+) TB/s)");
  static const std::regex stage(
      R"(^\| (\w+) \| (\w+) \| (\d+) \| ([\d.]+)% \| (\d+) \| ([\d.]+) G/s \(([\d.]+)%\) \| ([\d.]+) G/s \(([\d.]+)%\) \| ([\d.]+) ms .*\| ([\d.]+) ms \| ([\d.]+) G/s \(([\d.]+)%\) \|)");
  static const std::regex batch(
      R"(^(fp16|int8_group32|int8) batch of (\d+): one pass ([\d.]+) ms .*one by one ([\d.]+) ms .*union ([\d.]+)% of the pool, ([\d.]+) eligible pairs per listed ad; ([\d.]+) G pairs/s)");
  static const std::regex host_search(R"(^(fp16|int8_group32|int8) (one request at a time|batch of \d+).*= ([\d.]+) G pool ads/s)");
  static const std::regex update(
      R"(^batches of (\d+), (alone|while searching): ([\d.]+) M ads/s applied[^;]*(?:; (\d+) searches alongside, median ([\d.]+) ms, p99 ([\d.]+) ms)?)");
  static const std::regex recall(R"(^recall@(\d+) = ([\d.]+))");
  static const std::regex concurrent(
      R"(^(fp16|int8_group32|int8), +(\d+) clients, (in turn|batching) *: (\d+) searches/s = ([\d.]+) G pool ads/s; latency p50 ([\d.]+) ms, p99 ([\d.]+) ms(?:, ([\d.]+) searches a batch)?)");
  std::string line;
  std::smatch m;
  auto number = [&](int i) { return std::stod(m[i].str()); };
  while (std::getline(in, line)) {
    if (std::regex_search(line, m, header)) {
      if (log.device.empty()) log.device = m[1], log.roofline_tbs = number(2);  // the first log's
    } else if (std::regex_search(line, m, stage)) {
      log.stages.push_back({m[1], m[2], number(3), number(4), std::stoi(m[5]), number(6), number(7), number(8),
                            number(9), number(10), number(11), number(12), number(13)});
    } else if (std::regex_search(line, m, batch)) {  // (before host_search: both begin "fp16 batch of")
      log.batches.push_back({m[1], std::stoi(m[2]), number(3), number(4), number(5), number(6), number(7)});
    } else if (std::regex_search(line, m, host_search)) {
      log.host_searches.push_back({fmt::format("kevo {}, {}", m[1].str(), m[2].str()), number(3), ""});
    } else if (std::regex_search(line, m, update)) {
      std::string note;
      if (m[4].matched) note = fmt::format("{} searches alongside: median {} ms, p99 {} ms", m[4].str(), m[5].str(), m[6].str());
      log.updates.push_back({fmt::format("batches of {}, {}", m[1].str(), m[2].str()), number(3), note});
    } else if (std::regex_search(line, m, recall)) {
      log.recall.push_back({"recall@" + m[1].str(), number(2), ""});
    } else if (std::regex_search(line, m, concurrent)) {
      log.concurrent.push_back({m[1], std::stoi(m[2]), m[3] == "batching", number(4), number(5), number(6), number(7),
                                m[8].matched ? number(8) : 1.0});
    }
  }
}

inline BenchmarkLog parse_benchmark_log(std::istream& in) {
  BenchmarkLog log;
  parse_benchmark_log(in, log);
  return log;
}

/// Adds what torch_peer.py prints: PyTorch eager and torch.compile, scoring plus top-K.
inline void parse_torch_log(std::istream& in, BenchmarkLog& log) {
  static const std::regex peer(R"(^(eager|torch\.compile) scoring \+ top-K: ([\d.]+) ms = ([\d.]+) G pool ads/s)");
  std::string line;
  std::smatch m;
  while (std::getline(in, line))
    if (std::regex_search(line, m, peer))
      log.peers.push_back({m[1] == "eager" ? "PyTorch eager" : "torch.compile", std::stod(m[3].str()),
                           fmt::format("{} ms a request", m[2].str())});
}

namespace detail {

struct Bar {
  std::string label;
  double value = 0;
  std::string text;  // printed at the bar's end
  std::string colour = "#4477aa";
};

/// Horizontal bars, one per row, scaled to `top` (or to log10 when `log_scale`), with an optional
/// dashed goal line.
inline std::string bar_chart(const std::vector<Bar>& bars, double top, bool log_scale = false,
                             std::optional<double> goal = std::nullopt, std::string_view goal_label = "") {
  constexpr int label_width = 230, plot_width = 420, row = 22;
  const int height = static_cast<int>(bars.size()) * row + 30;
  const double low = log_scale ? std::log10(std::max(1e-3, top) / 1e3) : 0.0;  // three decades
  auto x = [&](double v) {
    const double f = log_scale ? (std::log10(std::max(v, 1e-9)) - low) / (std::log10(top) - low) : v / top;
    return label_width + plot_width * std::clamp(f, 0.0, 1.0);
  };
  std::size_t longest_text = 0;  // room for the text after a full bar (~7 px a character)
  for (const Bar& b : bars) longest_text = std::max(longest_text, b.text.size());
  std::string svg = fmt::format(R"(<svg viewBox="0 0 {0} {1}" width="{0}" height="{1}" font-size="12">)",
                                label_width + plot_width + 10 + 7 * static_cast<int>(longest_text), height);
  for (std::size_t i = 0; i < bars.size(); ++i) {
    const Bar& b = bars[i];
    const double y = 10 + static_cast<double>(i) * row;
    svg += fmt::format(R"(<text x="{}" y="{:.0f}" text-anchor="end">{}</text>)", label_width - 6, y + 14, b.label);
    svg += fmt::format(R"(<rect x="{}" y="{:.0f}" width="{:.1f}" height="{}" fill="{}"/>)", label_width, y + 2,
                       x(b.value) - label_width, row - 6, b.colour);
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.0f}">{}</text>)", x(b.value) + 4, y + 14, b.text);
  }
  if (goal)
    svg += fmt::format(
        R"(<line x1="{0:.1f}" x2="{0:.1f}" y1="4" y2="{1}" stroke="#cc3311" stroke-dasharray="4 3"/><text x="{0:.1f}" y="{2}" fill="#cc3311" text-anchor="middle">{3}</text>)",
        x(*goal), height - 16, height - 4, goal_label);
  return svg + "</svg>";
}

/// A colour per embedding type: fp16 blue, int8 orange, int8_group32 teal.
inline const char* dtype_colour(std::string_view dtype) {
  return dtype == "int8" ? "#ee7733" : dtype == "int8_group32" ? "#009988" : "#4477aa";
}
/// The dtype a host-visible search's label names ("kevo int8, one request at a time": int8).
inline std::string_view label_dtype(std::string_view label) {
  if (label.starts_with("kevo ")) label.remove_prefix(5);
  return label.substr(0, label.find(','));
}

}  // namespace detail

/// The page. `title` names the run (date, commit) as the caller knows it.
inline std::string render_benchmark_html(const BenchmarkLog& log, std::string_view title) {
  using detail::Bar;
  std::string body;
  auto section = [&](std::string_view heading, std::string_view caption, const std::string& svg) {
    body += fmt::format("<h2>{}</h2><p>{}</p>{}\n", heading, caption, svg);
  };
  // The headline rows: the largest pool, K = 1000.
  double largest = 0;
  for (const StageRow& r : log.stages) largest = std::max(largest, r.pool_ads);
  std::vector<Bar> roofline;
  for (const StageRow& r : log.stages) {
    if (r.pool_ads != largest || r.k != 1000) continue;
    const std::string who = r.request + " " + r.dtype;
    roofline.push_back({who + ": matching", r.matching_percent, fmt::format("{:.0f}% ({:.0f} G ads/s)", r.matching_percent, r.matching_gps), "#aaaaaa"});
    roofline.push_back({who + ": scoring", r.scoring_percent, fmt::format("{:.0f}% ({:.1f} G eligible ads/s)", r.scoring_percent, r.scoring_gps), detail::dtype_colour(r.dtype)});
    roofline.push_back({who + ": whole pipeline", r.pipeline_percent, fmt::format("{:.0f}% ({:.1f} G pool ads/s)", r.pipeline_percent, r.pipeline_gps), "#228833"});
  }
  if (!roofline.empty())
    section("Each stage against the streaming roofline",
            fmt::format("{:.0f}M ads, K = 1000. The bar is the bytes the stage must move over its time, as a fraction of a "
                        "streaming read measured in the same run ({:.3f} TB/s). The dashed line is the scoring goal.",
                        largest / 1e6, log.roofline_tbs),
            detail::bar_chart(roofline, 100, false, 90.0, "90%"));

  std::vector<Bar> against;
  double fastest = 0;
  for (const Figure& f : log.host_searches)
    if (f.label.ends_with("one request at a time")) {
      against.push_back({f.label, f.value, fmt::format("{:.1f} G pool ads/s", f.value), detail::dtype_colour(detail::label_dtype(f.label))});
      fastest = std::max(fastest, f.value);
    }
  if (against.empty())  // no host-visible figures in this log: the device-timed pipeline at the largest pool
    for (const StageRow& r : log.stages)
      if (r.pool_ads == largest && r.k == 1000 && r.request == "typical") {
        against.push_back({"kevo " + r.dtype + " (device time)", r.pipeline_gps, fmt::format("{:.1f} G pool ads/s", r.pipeline_gps), detail::dtype_colour(r.dtype)});
        fastest = std::max(fastest, r.pipeline_gps);
      }
  for (const Figure& p : log.peers)
    against.push_back({p.label, p.value, fmt::format("{:.3f} G pool ads/s: kevo's best is {:.0f}x faster", p.value, fastest / p.value), "#bbbbbb"});
  if (!against.empty())
    section("kevo against PyTorch, one request at a time",
            log.peers.empty() ? "No PyTorch log was given for this run."
                              : "Request in, top-K out. Log scale. PyTorch scores every ad and masks the ineligible; it does no index matching.",
            detail::bar_chart(against, fastest * 1.2, !log.peers.empty()));

  std::vector<const StageRow*> by_size;
  for (const StageRow& r : log.stages)
    if (r.request == "typical" && r.k == 1000) by_size.push_back(&r);
  std::stable_sort(by_size.begin(), by_size.end(), [](auto* a, auto* b) { return a->pool_ads < b->pool_ads; });
  std::vector<Bar> sizes;
  double most = 0;
  for (const StageRow* r : by_size) {
    sizes.push_back({fmt::format("{:.0f}M ads, {}", r->pool_ads / 1e6, r->dtype), r->pipeline_gps,
                     fmt::format("{:.1f} G pool ads/s ({:.3f} ms)", r->pipeline_gps, r->pipeline_ms), detail::dtype_colour(r->dtype)});
    most = std::max(most, r->pipeline_gps);
  }
  if (!sizes.empty())
    section("Pipeline throughput against pool size", "Typical request, K = 1000, device time. Small pools are bound by launches.",
            detail::bar_chart(sizes, most * 1.2));

  std::vector<Bar> batches;
  double best_gain = 1;
  for (const BatchRow& b : log.batches) {
    const double gain = b.one_by_one_ms / b.one_pass_ms;
    batches.push_back({fmt::format("{}, {} request{}", b.dtype, b.requests, b.requests > 1 ? "s" : ""), gain,
                       fmt::format("{:.2f}x ({:.2f} ms against {:.2f} ms; union {:.1f}% of the pool, {:.1f} G pairs/s)", gain,
                                   b.one_pass_ms, b.one_by_one_ms, b.union_percent, b.pairs_gps),
                       detail::dtype_colour(b.dtype)});
    best_gain = std::max(best_gain, gain);
  }
  if (!batches.empty())
    section("Batches in one pass",
            "search_batch_async against the same requests searched one by one (device time). A bar past the dashed "
            "line is a batch that gains from reading each listed row once for all its requests.",
            detail::bar_chart(batches, best_gain * 1.25, false, 1.0, "1x"));

  std::vector<Bar> concurrent;
  double most_searches = 0;
  for (const ConcurrentRow& c : log.concurrent) {
    std::string text = fmt::format("{:.0f} searches/s; p50 {:.1f} ms, p99 {:.1f} ms", c.searches_per_second, c.p50_ms, c.p99_ms);
    if (c.batching) text += fmt::format("; {:.1f} a batch", c.searches_per_batch);
    concurrent.push_back({fmt::format("{}, {} thread{}, {}", c.dtype, c.clients, c.clients > 1 ? "s" : "",
                                      c.batching ? "batching" : "in turn"),
                          c.searches_per_second, text, c.batching ? detail::dtype_colour(c.dtype) : "#aaaaaa"});
    most_searches = std::max(most_searches, c.searches_per_second);
  }
  if (!concurrent.empty())
    section("Several threads searching at once",
            "Each thread searches its own users' typical requests back to back, request in to top-K out on the host: in "
            "turn on the pipeline's lock (grey), or through BatchingBackend, which answers the searches that queue as one "
            "search_batch (coloured). The p50 is mostly the queue: threads over searches per second.",
            detail::bar_chart(concurrent, most_searches * 1.2));

  std::vector<Bar> updates;
  double fastest_update = 0;
  for (const Figure& u : log.updates) {
    updates.push_back({u.label, u.value, fmt::format("{:.2f} M ads/s{}{}", u.value, u.note.empty() ? "" : "; ", u.note),
                       u.label.ends_with("alone") ? "#aaaaaa" : "#228833"});
    fastest_update = std::max(fastest_update, u.value);
  }
  if (!updates.empty())
    section("Ad updates applied", "Replacing random live ads. The dashed line is the goal of 1M ads/s while searching.",
            detail::bar_chart(updates, std::max(2.0, fastest_update * 1.2), false, 1.0, "1M/s"));

  std::string table = "<table><tr><th>request</th><th>dtype</th><th>ads</th><th>eligible</th><th>K</th><th>matching</th>"
                      "<th>scoring</th><th>top-K</th><th>pipeline</th></tr>";
  for (const StageRow& r : log.stages)
    table += fmt::format(
        "<tr><td>{}</td><td>{}</td><td>{:.0f}</td><td>{:.1f}%</td><td>{}</td><td>{:.1f} G/s ({:.0f}%)</td><td>{:.1f} G/s ({:.0f}%)</td>"
        "<td>{:.3f} ms</td><td>{:.3f} ms = {:.1f} G/s ({:.0f}%)</td></tr>",
        r.request, r.dtype, r.pool_ads, r.eligible_percent, r.k, r.matching_gps, r.matching_percent, r.scoring_gps,
        r.scoring_percent, r.topk_ms, r.pipeline_ms, r.pipeline_gps, r.pipeline_percent);
  table += "</table>";
  for (const Figure& f : log.recall) table += fmt::format("<p>int8 against fp16: {} = {:.4f}</p>", f.label, f.value);

  return fmt::format(
      R"(<!doctype html><html><head><meta charset="utf-8"><title>kevo retrieval benchmark: {0}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}} table{{border-collapse:collapse;font-size:12px}}
td,th{{border:1px solid #ddd;padding:3px 6px;text-align:right}}</style></head><body>
<h1>kevo retrieval benchmark</h1><p>{0}. {1}, streaming-read roofline {2:.3f} TB/s.</p>
{3}<h2>Every stage row</h2>{4}</body></html>
)",
      report::escape_html(title), report::escape_html(log.device), log.roofline_tbs, body, table);
}

}  // namespace kevo::bench
