// The retrieval benchmark's report (benchmarks/retrieval/benchmark_report.hpp) over logs the
// benchmark printed on the H200 (tests/data/retrieval_benchmark_run*.log, copied unchanged from
// runs 18 and 27 of benchmarks/RESULTS.md).
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

#include "../benchmarks/retrieval/benchmark_report.hpp"

using namespace kevo::bench;

namespace {

BenchmarkLog read_log(const char* name) {
  std::ifstream in(std::string(KEVO_TEST_DATA_DIR) + "/" + name);
  REQUIRE(in);
  return parse_benchmark_log(in);
}

}  // namespace

TEST_CASE("a full benchmark log yields its stage table, searches and recall", "[bench][report]") {
  const BenchmarkLog log = read_log("retrieval_benchmark_run18.log");
  CHECK(log.device == "NVIDIA H200");
  CHECK(log.roofline_tbs == Approx(4.498));
  REQUIRE(log.stages.size() == 12);  // 11 rows of the stage table and the narrow extreme
  const StageRow& first = log.stages.front();
  CHECK(first.request == "typical");
  CHECK(first.dtype == "fp16");
  CHECK(first.pool_ads == 100000000);
  CHECK(first.eligible_percent == Approx(37.1));
  CHECK(first.k == 1000);
  CHECK(first.matching_gps == Approx(292.9));
  CHECK(first.scoring_percent == Approx(85));
  CHECK(first.topk_ms == Approx(0.114));
  CHECK(first.pipeline_ms == Approx(3.104));
  CHECK(first.pipeline_gps == Approx(32.21));
  CHECK(log.stages.back().request == "narrow");
  CHECK(log.stages.back().matching_gps == Approx(16.8));
  REQUIRE(log.host_searches.size() == 6);
  CHECK(log.host_searches[0].label == "kevo fp16, one request at a time");
  CHECK(log.host_searches[0].value == Approx(31.74));
  REQUIRE(log.recall.size() == 3);
  CHECK(log.recall[1].label == "recall@1000");
  CHECK(log.recall[1].value == Approx(0.9816));
  CHECK(log.updates.empty());  // run 18 printed updates in an older form, which is skipped
}

TEST_CASE("update lines keep the search latency measured beside them", "[bench][report]") {
  const BenchmarkLog log = read_log("retrieval_benchmark_run27_updates.log");
  CHECK(log.stages.empty());
  REQUIRE(log.updates.size() == 4);
  CHECK(log.updates[0].label == "batches of 10000, alone");
  CHECK(log.updates[0].value == Approx(1.41));
  CHECK(log.updates[0].note.empty());
  CHECK(log.updates[1].label == "batches of 10000, while searching");
  CHECK(log.updates[1].value == Approx(1.48));
  CHECK(log.updates[1].note == "113 searches alongside: median 3.62 ms, p99 3.70 ms");
  CHECK(log.updates[3].value == Approx(1.14));
}

TEST_CASE("the page draws every section it has figures for", "[bench][report]") {
  BenchmarkLog log = read_log("retrieval_benchmark_run18.log");
  // torch_peer.py's lines, with run 19's figures (benchmarks/RESULTS.md).
  std::istringstream torch(
      "# PyTorch 2.11.0+cu130 on NVIDIA H200, N = 100000000, K = 1000, eligible 30.0%\n"
      "eager scoring + top-K: 202.73 ms = 0.493 G pool ads/s, 0.148 G eligible ads/s\n"
      "torch.compile scoring + top-K: 198.16 ms = 0.505 G pool ads/s, 0.151 G eligible ads/s\n");
  parse_torch_log(torch, log);
  REQUIRE(log.peers.size() == 2);
  CHECK(log.peers[0].label == "PyTorch eager");
  CHECK(log.peers[1].value == Approx(0.505));

  const std::string html = render_benchmark_html(log, "run 18 & 19 <H200>");
  CHECK(html.find("run 18 &amp; 19 &lt;H200&gt;") != std::string::npos);  // the title is escaped
  CHECK(html.find("<h2>Each stage against the streaming roofline</h2>") != std::string::npos);
  CHECK(html.find("<h2>kevo against PyTorch, one request at a time</h2>") != std::string::npos);
  CHECK(html.find("<h2>Pipeline throughput against pool size</h2>") != std::string::npos);
  CHECK(html.find("<h2>Ad updates applied</h2>") == std::string::npos);  // none in this log
  // kevo's fastest host-visible search (int8, 44.96 G/s) against eager's 0.493.
  CHECK(html.find("kevo's best is 91x faster") != std::string::npos);
  CHECK(html.find("typical fp16: scoring") != std::string::npos);
  CHECK(html.find("1M ads, fp16") < html.find("100M ads, fp16"));  // pool sizes in ascending order
  // Four headline rows, three bars each, in the roofline chart; three more charts.
  std::size_t bars = 0;
  for (std::size_t at = html.find("<rect"); at != std::string::npos; at = html.find("<rect", at + 1)) ++bars;
  CHECK(bars == 12 + 4 + 6);  // roofline; kevo fp16, int8 and two peers; six pool sizes
  CHECK(html.find("<svg") != std::string::npos);
}
