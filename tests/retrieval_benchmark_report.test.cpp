// The retrieval benchmark's report (benchmarks/retrieval/benchmark_report.hpp) over logs the
// benchmark and torch_peer.py printed on the H200 (tests/data/retrieval_*_run*.log, copied
// unchanged from runs 18, 28, 33 and 42 of benchmarks/RESULTS.md).
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

#include "../benchmarks/retrieval/benchmark_report.hpp"

namespace kevo_tests::retrieval_benchmark_report_test {

using namespace kevo::bench;

namespace {

std::ifstream open_data(const char* name) {
  std::ifstream in(std::string(KEVO_TEST_DATA_DIR) + "/" + name);
  REQUIRE(in);
  return in;
}

BenchmarkLog read_run28() {
  auto bench = open_data("retrieval_benchmark_run28.log");
  BenchmarkLog log = parse_benchmark_log(bench);
  auto torch = open_data("retrieval_torch_run28.log");
  parse_torch_log(torch, log);
  return log;
}

}  // namespace

TEST_CASE("a full benchmark log yields its stages, searches, updates, recall and peers", "[bench][report]") {
  const BenchmarkLog log = read_run28();
  CHECK(log.device == "NVIDIA H200");
  CHECK(log.roofline_tbs == Approx(4.494));
  REQUIRE(log.stages.size() == 12);  // 11 rows of the stage table and the narrow extreme
  const StageRow& first = log.stages.front();
  CHECK(first.request == "typical");
  CHECK(first.dtype == "fp16");
  CHECK(first.pool_ads == 100000000);
  CHECK(first.eligible_percent == Approx(37.1));
  CHECK(first.k == 1000);
  CHECK(first.matching_gps == Approx(347.9));
  CHECK(first.matching_percent == Approx(35));
  CHECK(first.scoring_gps == Approx(14.2));
  CHECK(first.scoring_percent == Approx(85));
  CHECK(first.topk_ms == Approx(0.113));
  CHECK(first.pipeline_ms == Approx(3.049));
  CHECK(first.pipeline_gps == Approx(32.80));
  CHECK(first.pipeline_percent == Approx(73));
  CHECK(log.stages.back().request == "narrow");
  CHECK(log.stages.back().eligible_percent == Approx(0.9));
  CHECK(log.stages.back().matching_gps == Approx(282.4));

  REQUIRE(log.host_searches.size() == 6);
  CHECK(log.host_searches[0].label == "kevo fp16, one request at a time");
  CHECK(log.host_searches[0].value == Approx(32.21));
  CHECK(log.host_searches[3].label == "kevo int8, one request at a time");
  CHECK(log.host_searches[3].value == Approx(48.22));

  REQUIRE(log.updates.size() == 4);
  CHECK(log.updates[0].label == "batches of 10000, alone");
  CHECK(log.updates[0].value == Approx(1.60));
  CHECK(log.updates[0].note.empty());
  CHECK(log.updates[1].label == "batches of 10000, while searching");
  CHECK(log.updates[1].note == "106 searches alongside: median 3.63 ms, p99 3.75 ms");
  CHECK(log.updates[3].value == Approx(1.34));

  REQUIRE(log.recall.size() == 3);
  CHECK(log.recall[1].label == "recall@1000");
  CHECK(log.recall[1].value == Approx(0.9816));

  // The torch log's compiler warnings in between are skipped.
  REQUIRE(log.peers.size() == 2);
  CHECK(log.peers[0].label == "PyTorch eager");
  CHECK(log.peers[0].value == Approx(0.493));
  CHECK(log.peers[1].label == "torch.compile");
  CHECK(log.peers[1].value == Approx(0.505));
}

TEST_CASE("an older log parses what it has and skips lines of older forms", "[bench][report]") {
  auto bench = open_data("retrieval_benchmark_run18.log");
  const BenchmarkLog log = parse_benchmark_log(bench);
  REQUIRE(log.stages.size() == 12);
  CHECK(log.stages.front().matching_gps == Approx(292.9));
  CHECK(log.stages.back().matching_gps == Approx(16.8));
  CHECK(log.host_searches.size() == 6);
  CHECK(log.updates.empty());  // run 18 printed "alone: 1.08 M ads/s applied (...)", an older form
}

TEST_CASE("the page draws every section it has figures for", "[bench][report]") {
  const BenchmarkLog log = read_run28();
  const std::string html = render_benchmark_html(log, "run 28 & <H200>");
  CHECK(html.find("run 28 &amp; &lt;H200&gt;") != std::string::npos);  // the title is escaped
  CHECK(html.find("<h2>Each stage against the streaming roofline</h2>") != std::string::npos);
  CHECK(html.find("<h2>kevo against PyTorch, one request at a time</h2>") != std::string::npos);
  CHECK(html.find("<h2>Pipeline throughput against pool size</h2>") != std::string::npos);
  CHECK(html.find("<h2>Ad updates applied</h2>") != std::string::npos);
  // kevo's fastest host-visible search (int8, 48.22 G/s) against eager's 0.493.
  CHECK(html.find("kevo's best is 98x faster") != std::string::npos);
  CHECK(html.find("typical fp16: scoring") != std::string::npos);
  CHECK(html.find("1M ads, fp16") < html.find("100M ads, fp16"));  // pool sizes in ascending order
  std::size_t bars = 0;
  for (std::size_t at = html.find("<rect"); at != std::string::npos; at = html.find("<rect", at + 1)) ++bars;
  // Four headline rows of three stages; kevo fp16 and int8 and two peers; six pool sizes; four updates.
  CHECK(bars == 12 + 4 + 6 + 4);

  auto older = open_data("retrieval_benchmark_run18.log");
  const std::string without_updates = render_benchmark_html(parse_benchmark_log(older), "run 18");
  CHECK(without_updates.find("<h2>Ad updates applied</h2>") == std::string::npos);
  CHECK(without_updates.find("No PyTorch log was given") != std::string::npos);
}

TEST_CASE("a batches log yields one row per dtype and batch size, and its own chart", "[bench][report]") {
  auto batches = open_data("retrieval_benchmark_run33_batches.log");
  BenchmarkLog log = parse_benchmark_log(batches);
  CHECK(log.roofline_tbs == Approx(4.597));
  REQUIRE(log.batches.size() == 8);  // fp16 and int8, 1 2 4 8 requests; the knob lines are not rows
  const BatchRow& fp16_4 = log.batches[2];
  CHECK(fp16_4.dtype == "fp16");
  CHECK(fp16_4.requests == 4);
  CHECK(fp16_4.one_pass_ms == Approx(7.775));
  CHECK(fp16_4.one_by_one_ms == Approx(11.405));
  CHECK(fp16_4.union_percent == Approx(51.5));
  CHECK(fp16_4.pairs_per_listed_ad == Approx(2.77));
  CHECK(fp16_4.pairs_gps == Approx(18.35));
  CHECK(log.batches[7].dtype == "int8");
  CHECK(log.batches[7].requests == 8);
  CHECK(log.host_searches.empty());  // "batch of N: one pass" is not a host-visible search line
  CHECK(log.stages.empty());

  // Read after a full log into the same page: the first log's header stands.
  BenchmarkLog both = read_run28();
  auto again = open_data("retrieval_benchmark_run33_batches.log");
  parse_benchmark_log(again, both);
  CHECK(both.roofline_tbs == Approx(4.494));
  CHECK(both.stages.size() == 12);
  CHECK(both.host_searches.size() == 6);
  CHECK(both.batches.size() == 8);
  const std::string html = render_benchmark_html(both, "runs 28 and 33");
  CHECK(html.find("<h2>Batches in one pass</h2>") != std::string::npos);
  CHECK(html.find("1.47x (7.78 ms against 11.40 ms") != std::string::npos);  // fp16, 4 requests (11.405 rounds down)
  CHECK(html.find("<h2>Batches in one pass</h2>") > html.find("<h2>Pipeline throughput against pool size</h2>"));
  CHECK(render_benchmark_html(read_run28(), "run 28").find("Batches in one pass") == std::string::npos);
}

TEST_CASE("a concurrent-searches log yields a row per dtype, thread count and mode, and its own chart", "[bench][report]") {
  auto serving = open_data("retrieval_benchmark_run42_serving.log");
  BenchmarkLog log = parse_benchmark_log(serving);
  REQUIRE(log.concurrent.size() == 16);  // fp16 and int8; 1 4 8 16 threads; in turn and batching
  const ConcurrentRow& in_turn = log.concurrent[4];
  CHECK(in_turn.dtype == "fp16");
  CHECK(in_turn.clients == 8);
  CHECK_FALSE(in_turn.batching);
  CHECK(in_turn.searches_per_second == Approx(326));
  CHECK(in_turn.pool_gps == Approx(32.55));
  CHECK(in_turn.p50_ms == Approx(24.83));
  CHECK(in_turn.p99_ms == Approx(26.23));
  CHECK(in_turn.searches_per_batch == 1.0);
  const ConcurrentRow& batched = log.concurrent[7];
  CHECK(batched.clients == 16);
  CHECK(batched.batching);
  CHECK(batched.searches_per_second == Approx(464));
  CHECK(batched.searches_per_batch == Approx(7.9));
  CHECK(log.concurrent.back().dtype == "int8");
  CHECK(log.stages.empty());
  CHECK(log.host_searches.empty());

  const std::string html = render_benchmark_html(log, "run 42");
  CHECK(html.find("<h2>Several threads searching at once</h2>") != std::string::npos);
  CHECK(html.find("fp16, 16 threads, batching") != std::string::npos);
  CHECK(html.find("464 searches/s; p50 34.9 ms, p99 36.2 ms; 7.9 a batch") != std::string::npos);
  CHECK(html.find("326 searches/s; p50 24.8 ms, p99 26.2 ms") != std::string::npos);
  std::size_t bars = 0;
  for (std::size_t at = html.find("<rect"); at != std::string::npos; at = html.find("<rect", at + 1)) ++bars;
  CHECK(bars == 16);
  CHECK(render_benchmark_html(read_run28(), "run 28").find("Several threads searching at once") == std::string::npos);
}

TEST_CASE("int8_group32 lines parse as their own dtype and draw in their own colour", "[bench][report]") {
  // Lines as the benchmark prints them, for each of the three embedding types.
  std::stringstream text;
  for (const char* dtype : {"fp16", "int8", "int8_group32"}) {
    text << "| typical | " << dtype << " | 100000000 | 37.1% | 1000 | 348.8 G/s (35%) | 23.5 G/s (75%) | 0.113 ms (7.2% of scoring) | 2.025 ms | 49.39 G/s (59%) |\n"
         << dtype << " one request at a time: 2.074 ms = 48.22 G pool ads/s\n"
         << dtype << " batch of 4: one pass 7.426 ms (1.856 ms a request) = 53.87 G pool ads/s; one by one 7.449 ms = 53.70 G/s; 1.00x; "
                     "union 51.5% of the pool, 2.77 eligible pairs per listed ad; 19.22 G pairs/s; pass bytes 23% of roofline\n"
         << dtype << ",  8 clients, batching: 495 searches/s = 49.50 G pool ads/s; latency p50 18.13 ms, p99 19.16 ms, 4.5 searches a batch\n";
  }
  const BenchmarkLog log = parse_benchmark_log(text);
  REQUIRE(log.stages.size() == 3);
  REQUIRE(log.host_searches.size() == 3);
  REQUIRE(log.batches.size() == 3);
  REQUIRE(log.concurrent.size() == 3);
  CHECK(log.stages[2].dtype == "int8_group32");
  CHECK(log.host_searches[2].label == "kevo int8_group32, one request at a time");
  CHECK(log.batches[1].dtype == "int8");
  CHECK(log.batches[2].dtype == "int8_group32");
  CHECK(log.concurrent[2].dtype == "int8_group32");

  const std::string html = render_benchmark_html(log, "three dtypes");
  // Each bar of a dtype in its colour: the scoring, pool-size, batch and concurrent bars, and the host search.
  auto bars_in = [&](const char* colour) {
    std::size_t n = 0;
    for (std::size_t at = html.find(std::string("fill=\"") + colour); at != std::string::npos;
         at = html.find(std::string("fill=\"") + colour, at + 1))
      ++n;
    return n;
  };
  CHECK(bars_in("#4477aa") == 5);  // fp16
  CHECK(bars_in("#ee7733") == 5);  // int8
  CHECK(bars_in("#009988") == 5);  // int8_group32
}

}  // namespace kevo_tests::retrieval_benchmark_report_test
