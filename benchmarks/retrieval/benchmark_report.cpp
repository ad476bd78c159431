// retrieval_report: draws a run of the retrieval benchmark as an HTML page (benchmark_report.hpp).
//
//   retrieval_report bench.log [more.log ...] [--torch torch.log] [--title "run 28, 2026-11-30"] [-o report.html]
//
// Several benchmark logs (one run's steps, e.g. --stages-only and --batch-only) are drawn as one page.
#include "benchmark_report.hpp"

#include <cstring>
#include <fstream>
#include <iostream>
#include <vector>

int main(int argc, char** argv) {
  std::vector<const char*> bench_paths;
  const char* torch_path = nullptr;
  const char* out_path = nullptr;
  std::string title = "retrieval benchmark run";
  bool usage_error = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--torch") && i + 1 < argc) torch_path = argv[++i];
    else if (!std::strcmp(argv[i], "--title") && i + 1 < argc) title = argv[++i];
    else if (!std::strcmp(argv[i], "-o") && i + 1 < argc) out_path = argv[++i];
    else if (argv[i][0] != '-') bench_paths.push_back(argv[i]);
    else usage_error = true;
  }
  if (bench_paths.empty() || usage_error) {
    std::cerr << "usage: retrieval_report BENCH_LOG [BENCH_LOG ...] [--torch TORCH_LOG] [--title TITLE] [-o OUT.html]\n";
    return 2;
  }
  kevo::bench::BenchmarkLog log;
  auto figures = [&] { return log.stages.size() + log.batches.size() + log.updates.size() + log.host_searches.size() +
                          log.concurrent.size(); };
  for (const char* path : bench_paths) {
    std::ifstream bench(path);
    if (!bench) {
      std::cerr << "retrieval_report: cannot read " << path << "\n";
      return 1;
    }
    const std::size_t figures_before = figures();
    kevo::bench::parse_benchmark_log(bench, log);
    if (figures() == figures_before) {
      std::cerr << "retrieval_report: " << path << " has no figures: not a retrieval benchmark log?\n";
      return 1;
    }
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
