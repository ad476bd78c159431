// retrieval_report: draws a run of the retrieval benchmark as an HTML page (benchmark_report.hpp).
//
//   retrieval_report bench.log [--torch torch.log] [--title "run 28, 2026-11-30"] [-o report.html]
#include "benchmark_report.hpp"

#include <cstring>
#include <fstream>
#include <iostream>

int main(int argc, char** argv) {
  const char* bench_path = nullptr;
  const char* torch_path = nullptr;
  const char* out_path = nullptr;
  std::string title = "retrieval benchmark run";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--torch") && i + 1 < argc) torch_path = argv[++i];
    else if (!std::strcmp(argv[i], "--title") && i + 1 < argc) title = argv[++i];
    else if (!std::strcmp(argv[i], "-o") && i + 1 < argc) out_path = argv[++i];
    else if (!bench_path && argv[i][0] != '-') bench_path = argv[i];
    else bench_path = nullptr, i = argc;
  }
  if (!bench_path) {
    std::cerr << "usage: retrieval_report BENCH_LOG [--torch TORCH_LOG] [--title TITLE] [-o OUT.html]\n";
    return 2;
  }
  std::ifstream bench(bench_path);
  if (!bench) {
    std::cerr << "retrieval_report: cannot read " << bench_path << "\n";
    return 1;
  }
  kevo::bench::BenchmarkLog log = kevo::bench::parse_benchmark_log(bench);
  if (log.stages.empty() && log.updates.empty() && log.host_searches.empty()) {
    std::cerr << "retrieval_report: " << bench_path << " has no figures: not a retrieval benchmark log?\n";
    return 1;
  }
  if (torch_path) {
    std::ifstream torch(torch_path);
    if (!torch) {
      std::cerr << "retrieval_report: cannot read " << torch_path << "\n";
      return 1;
    }
    kevo::bench::parse_torch_log(torch, log);
  }
  const std::string html = kevo::bench::render_benchmark_html(log, title);
  if (!out_path) {
    std::cout << html;
    return 0;
  }
  std::ofstream out(out_path);
  out << html;
  return out ? 0 : 1;
}
