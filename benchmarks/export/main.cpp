// kevo-bench-export: fills a synthetic kevo store with a million nodes (by default) and times the
// trajectory export over it, with the export's peak RSS: the export streams, so its memory must not
// grow with the store.
//
//   kevo-bench-export --nodes 1000000 --store /tmp/kevo-export-bench.db
//   export: 1000000 records in 9.8 s (102000 records/s, 2.1 GB of JSONL, 210 MB/s), peak RSS 9.6 MB
//
// The export runs in a child process, so its peak RSS is its own, not the fill's.
#include <kevo/detail/json_writer.hpp>
#include <kevo/detail/sqlite.hpp>
#include <kevo/store/sqlite_store.hpp>
#include <kevo/store/trajectory_export.hpp>

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

struct Options {
  long long nodes = 1'000'000;
  long long runs = 10;
  std::size_t source_bytes = 2000;  // about a template kernel's size
  std::string store = "/tmp/kevo-export-bench.db";
  std::string out = "/tmp/kevo-export-bench.jsonl";
  bool reuse = false;  // export a store an earlier invocation filled
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// Nodes spread over `runs` runs, each a child of an earlier node of its run, one in five a failure,
/// written in one transaction (the store's own calls commit each record, which would time the fill,
/// not the export).
int fill(const Options& o) {
  for (auto suffix : {"", "-wal", "-shm"}) std::filesystem::remove(o.store + suffix);
  if (auto store = kevo::store::SqliteStore::open(o.store); !store) {  // the real schema
    fmt::print(stderr, "{}\n", store.error().message);
    return 1;
  }
  auto db = kevo::detail::SqliteHandle::open(o.store).value();
  auto check = [](auto ok) {
    if (!ok) throw std::runtime_error(ok.error().message);
  };
  check(db.exec("PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF; BEGIN"));
  auto run = db.prepare("INSERT INTO runs(id, problem, settings, started_at, best_node) VALUES (?1, 'synthetic', '{}', 0, ?2)").value();
  for (long long r = 1; r <= o.runs; ++r) {
    run.bind(1, r);
    run.bind(2, r);  // node r is each run's first node: a best to flag
    if (run.step() != SQLITE_DONE) throw std::runtime_error(db.last_error());
    run.reset();
  }
  auto node = db.prepare(
                    "INSERT INTO nodes(id, run_id, parent_id, source_hash, source, knobs, origin, memory_mode, created_at)"
                    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'combined', ?8)")
                  .value();
  auto evaluation = db.prepare(
                          "INSERT INTO evaluations(run_id, node_id, failure, speedup, seconds, reference_seconds, bottleneck,"
                          " gbytes_per_s, gflops, roofline_fraction, message, detail, finished_at)"
                          " VALUES (?1, ?2, ?3, ?4, ?5, 1.0, 'memory', 12.5, 3.25, 0.4, ?6, ?7, ?8)")
                        .value();
  std::mt19937_64 rng(42);
  std::string body;
  for (std::size_t i = 0; body.size() < o.source_bytes; ++i)
    body += fmt::format("  acc[{}] += x[i * {} + k] * w[k]; // \"lane\" {}\n", i % 8, i % 13 + 1, i);
  body.resize(o.source_bytes);
  for (long long id = 1; id <= o.nodes; ++id) {
    const long long r = (id - 1) % o.runs + 1;
    const long long parent = id <= o.runs ? 0 : id - o.runs * static_cast<long long>(1 + rng() % 8);
    const kevo::Knobs knobs{{"block", std::to_string(1 << (rng() % 8))}, {"unroll", std::to_string(rng() % 4 + 1)}};
    node.bind(1, id);
    node.bind(2, r);
    if (parent > 0) node.bind(3, parent);
    else node.bind_null(3);
    const std::string source = fmt::format("// node {}\nvoid kernel() {{\n{}}}\n", id, body);
    node.bind(4, fmt::format("{:016x}", kevo::content_hash(source)));
    node.bind(5, source);
    node.bind(6, kevo::detail::knobs_to_json(knobs));
    node.bind(7, fmt::format("mutate block {}", id % 7));
    node.bind(8, static_cast<double>(id));
    if (node.step() != SQLITE_DONE) throw std::runtime_error(db.last_error());
    node.reset();
    const bool ok = rng() % 5 != 0;
    evaluation.bind(1, r);
    evaluation.bind(2, id);
    evaluation.bind(3, std::string_view(ok ? "ok" : "compile_error"));
    evaluation.bind(4, ok ? 1.0 + static_cast<double>(rng() % 1000) / 100.0 : 0.0);
    evaluation.bind(5, ok ? 0.001 : 0.0);
    evaluation.bind(6, std::string_view(ok ? "memory-bound at 40% of the roofline" : "error: 'lanes' was not declared"));
    evaluation.bind(7, std::string_view(ok ? "" : "kernel.cpp:12:5: error: 'lanes' was not declared in this scope"));
    evaluation.bind(8, static_cast<double>(id));
    if (evaluation.step() != SQLITE_DONE) throw std::runtime_error(db.last_error());
    evaluation.reset();
  }
  check(db.exec("COMMIT; PRAGMA wal_checkpoint(TRUNCATE)"));
  return 0;
}

int export_store(const Options& o) {
  auto exporter = kevo::store::TrajectoryExporter::open(o.store);
  if (!exporter) {
    fmt::print(stderr, "{}\n", exporter.error().message);
    return 2;
  }
  std::ofstream out(o.out, std::ios::binary | std::ios::trunc);
  auto summary = exporter->write(out);
  if (!summary) {
    fmt::print(stderr, "{}\n", summary.error().message);
    return 1;
  }
  return summary->records == static_cast<std::size_t>(o.nodes) ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "--nodes") o.nodes = std::stoll(value());
    else if (arg == "--runs") o.runs = std::stoll(value());
    else if (arg == "--source-bytes") o.source_bytes = std::stoul(value());
    else if (arg == "--store") o.store = value();
    else if (arg == "--out") o.out = value();
    else if (arg == "--reuse") o.reuse = true;
    else {
      fmt::print(stderr, "usage: kevo-bench-export [--nodes N] [--runs R] [--source-bytes B] [--store PATH] [--out PATH] [--reuse]\n");
      return 2;
    }
  }
  if (!o.reuse) {
    const auto start = std::chrono::steady_clock::now();
    if (int status = fill(o)) return status;
    fmt::print("fill: {} nodes in {} runs, {}-byte sources, in {:.1f} s; store {:.1f} MB\n", o.nodes, o.runs, o.source_bytes,
               seconds_since(start), static_cast<double>(std::filesystem::file_size(o.store)) / 1e6);
  }

  const auto start = std::chrono::steady_clock::now();
  const pid_t child = fork();
  if (child == 0) _exit(export_store(o));
  int status = 0;
  rusage usage{};
  if (wait4(child, &status, 0, &usage) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fmt::print(stderr, "export failed (status {})\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 1;
  }
  const double seconds = seconds_since(start);
  const double bytes = static_cast<double>(std::filesystem::file_size(o.out));
  fmt::print("export: {} records in {:.2f} s ({:.0f} records/s, {:.2f} GB of JSONL, {:.0f} MB/s), peak RSS {:.1f} MB"
             " (user {:.2f} s, system {:.2f} s)\n",
             o.nodes, seconds, static_cast<double>(o.nodes) / seconds, bytes / 1e9, bytes / 1e6 / seconds,
             static_cast<double>(usage.ru_maxrss) / 1024.0, usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6,
             usage.ru_stime.tv_sec + usage.ru_stime.tv_usec / 1e6);
  return 0;
}
