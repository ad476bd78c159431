// kevo/eval/roofline.hpp: this machine's roofline (streaming read bandwidth and peak FLOP/s),
// measured once by a small program and cached, and the bottleneck classification built on it.
//
//   auto roofline = kevo::eval::load_or_measure_roofline(cache_dir, "g++");
//   kevo::Diagnostics d = kevo::eval::classify(bytes, flops, seconds, *roofline);
//   fmt::print("{} ({:.0f}% of roofline)\n", to_string(d.bottleneck), 100 * d.roofline_fraction);
#pragma once

#include <kevo/candidate.hpp>
#include <kevo/detail/json_writer.hpp>
#include <kevo/eval/sandbox.hpp>
#include <kevo/expected.hpp>

#include <fmt/format.h>
#include <simdjson.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace kevo::eval {

/// The two roofs of this machine, all cores together.
struct Roofline {
  std::string host;
  std::string cpu_model;
  double read_gbytes_per_s = 0;   ///< streaming read from memory, all cores
  double peak_gflops = 0;         ///< fp32 fused multiply-adds, all cores, widest vectors
  bool from_cache = false;        ///< read from the cache rather than measured just now

  /// FLOPs per byte where the two roofs meet.
  double ridge_intensity() const { return read_gbytes_per_s > 0 ? peak_gflops / read_gbytes_per_s : 0; }
};

/// Below this fraction of the roofline bound, a kernel is neither memory- nor compute-bound but
/// latency-bound: dependency chains, scalar code, too little parallelism.
inline constexpr double latency_bound_fraction = 0.10;

/// Names the bottleneck of a kernel that moved `bytes` and did `flops` in `seconds`.
inline Diagnostics classify(double bytes, double flops, double seconds, const Roofline& roofline) {
  Diagnostics d;
  if (!(seconds > 0) || roofline.read_gbytes_per_s <= 0 || roofline.peak_gflops <= 0) {
    d.message = "no timing or no roofline: bottleneck unknown";
    return d;
  }
  d.achieved_gbytes_per_s = bytes / seconds / 1e9;
  d.achieved_gflops = flops / seconds / 1e9;
  const double memory_seconds = bytes / (roofline.read_gbytes_per_s * 1e9);
  const double compute_seconds = flops / (roofline.peak_gflops * 1e9);
  const double bound_seconds = std::max(memory_seconds, compute_seconds);
  d.roofline_fraction = bound_seconds / seconds;
  const bool memory_side = memory_seconds >= compute_seconds;
  if (d.roofline_fraction < latency_bound_fraction) {
    d.bottleneck = Bottleneck::latency;
    d.message = fmt::format(
        "latency-bound: {:.1f}% of the roofline ({:.1f} GB/s, {:.1f} GFLOP/s); break dependency chains (vectors, "
        "independent accumulators, unrolling) and use more cores",
        100 * d.roofline_fraction, d.achieved_gbytes_per_s, d.achieved_gflops);
  } else if (memory_side) {
    d.bottleneck = Bottleneck::memory;
    d.message = fmt::format("memory-bound: {:.1f} GB/s of {:.1f} GB/s ({:.0f}% of the roofline); move fewer bytes, reuse what is loaded",
                            d.achieved_gbytes_per_s, roofline.read_gbytes_per_s, 100 * d.roofline_fraction);
  } else {
    d.bottleneck = Bottleneck::compute;
    d.message = fmt::format("compute-bound: {:.1f} GFLOP/s of {:.1f} GFLOP/s ({:.0f}% of the roofline); use wider vectors, FMAs, more cores",
                            d.achieved_gflops, roofline.peak_gflops, 100 * d.roofline_fraction);
  }
  return d;
}

namespace detail {

/// The measuring program: a multi-threaded streaming sum and a multi-threaded FMA loop.
inline constexpr std::string_view roofline_program = R"(// kevo roofline probe (generated)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#if defined(__AVX512F__)
constexpr int lanes = 16;
#elif defined(__AVX__)
constexpr int lanes = 8;
#else
constexpr int lanes = 4;
#endif
typedef float vec __attribute__((vector_size(lanes * sizeof(float))));
using clock_type = std::chrono::steady_clock;

template <class F>
double best_seconds(int rounds, F&& f) {
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = clock_type::now();
    f();
    best = std::min(best, std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  return best;
}

int main() {
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  // Streaming read: far larger than any last-level cache.
  const std::size_t floats = std::size_t(64) << 20;  // 256 MiB
  float* data = static_cast<float*>(std::aligned_alloc(64, floats * sizeof(float)));
  if (!data) return 1;
  {
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([&, t] { std::memset(data + floats / threads * t, 1, floats / threads * sizeof(float)); });
    for (auto& th : pool) th.join();
  }
  std::vector<float> sums(threads * 16);
  auto stream = [&] {
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const vec* p = reinterpret_cast<const vec*>(data + floats / threads * t);
        const std::size_t n = floats / threads / lanes;
        vec a0 = {}, a1 = {}, a2 = {}, a3 = {};
        for (std::size_t i = 0; i + 4 <= n; i += 4) { a0 += p[i]; a1 += p[i + 1]; a2 += p[i + 2]; a3 += p[i + 3]; }
        vec s = a0 + a1 + a2 + a3;
        sums[t * 16] = s[0];
      });
    for (auto& th : pool) th.join();
  };
  const double stream_seconds = best_seconds(5, stream);
  const double read_gbytes_per_s = double(floats / threads * threads) * sizeof(float) / stream_seconds / 1e9;

  // Peak FLOP/s: independent FMA chains, enough of them to cover the FMA latency.
  const long iterations = 4 << 20;
  auto fma_loop = [&] {
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        vec a[12];
        for (int k = 0; k < 12; ++k) for (int l = 0; l < lanes; ++l) a[k][l] = 1.0f + 1e-7f * (k + l);
        vec m, c;
        for (int l = 0; l < lanes; ++l) { m[l] = 0.999999f; c[l] = 1e-6f; }
        for (long i = 0; i < iterations; ++i) {
          for (int k = 0; k < 12; ++k) a[k] = a[k] * m + c;
          asm volatile("" : "+x"(m));
        }
        vec s = {};
        for (int k = 0; k < 12; ++k) s += a[k];
        sums[t * 16] = s[0];
      });
    for (auto& th : pool) th.join();
  };
  const double fma_seconds = best_seconds(3, fma_loop);
  const double peak_gflops = double(iterations) * 12 * lanes * 2 * threads / fma_seconds / 1e9;
  std::printf("{\"read_gbytes_per_s\":%.6g,\"peak_gflops\":%.6g,\"threads\":%u,\"lanes\":%d,\"check\":%g}\n",
              read_gbytes_per_s, peak_gflops, threads, lanes, double(sums[0]));
  std::free(data);
}
)";

inline std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown-host";
  return name;
}

inline std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  return "unknown-cpu";
}

/// What code built with -march=native depends on: the CPU's model and its feature flags (the
/// first core's; "flags" on x86, "Features" on Arm).
inline std::string cpu_identity() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(in, line) && flags.empty())
    if (line.rfind("flags", 0) == 0 || line.rfind("Features", 0) == 0) flags = line;
  return cpu_model_name() + "\n" + flags;
}

inline expected<Roofline, Error> parse_roofline(const std::string& json_text) {
  simdjson::ondemand::parser parser;
  simdjson::padded_string input(json_text);
  simdjson::ondemand::document doc;
  if (parser.iterate(input).get(doc)) return make_error("roofline: not valid JSON");
  Roofline r;
  double bw = 0, peak = 0;
  if (doc["read_gbytes_per_s"].get_double().get(bw) || doc["peak_gflops"].get_double().get(peak))
    return make_error("roofline: missing read_gbytes_per_s or peak_gflops");
  r.read_gbytes_per_s = bw;
  r.peak_gflops = peak;
  std::string_view text;
  if (!doc["host"].get_string().get(text)) r.host = std::string(text);
  if (!doc["cpu_model"].get_string().get(text)) r.cpu_model = std::string(text);
  if (!(r.read_gbytes_per_s > 0 && r.peak_gflops > 0)) return make_error("roofline: non-positive roofs");
  return r;
}

}  // namespace detail

/// Where the roofline of this host and CPU model is cached under `cache_dir`.
inline std::filesystem::path roofline_cache_path(const std::filesystem::path& cache_dir) {
  const std::string host = detail::host_name();
  const std::string key = host + "\n" + detail::cpu_model_name();
  return cache_dir / "roofline" / fmt::format("{:016x}.json", content_hash(key));
}

/// Reads the cached roofline for this host and CPU model, or measures it (a few seconds) by
/// compiling the probe with -O3 -march=native, and caches it.
inline expected<Roofline, Error> load_or_measure_roofline(const std::filesystem::path& cache_dir, const std::string& compiler,
                                                          std::chrono::seconds timeout = std::chrono::seconds(120)) {
  namespace fs = std::filesystem;
  const fs::path cached = roofline_cache_path(cache_dir);
  if (fs::exists(cached)) {
    std::ifstream in(cached);
    std::stringstream text;
    text << in.rdbuf();
    if (auto r = detail::parse_roofline(text.str())) {
      r->from_cache = true;
      return r;
    }
  }
  std::error_code ec;
  const fs::path dir = cached.parent_path();
  fs::create_directories(dir, ec);
  if (ec) return make_error(fmt::format("{}: cannot be created: {}", dir.string(), ec.message()));
  const std::string unique = fmt::format("{}-{}", ::getpid(), std::hash<std::thread::id>{}(std::this_thread::get_id()));
  const fs::path source = dir / ("probe-" + unique + ".cpp");
  const fs::path program = dir / ("probe-" + unique);
  {
    std::ofstream out(source);
    out << detail::roofline_program;
    if (!out) return make_error(fmt::format("{}: cannot be written", source.string()));
  }
  SandboxLimits trusted;
  trusted.wall_time = timeout;
  trusted.drop_privileges = false;
  trusted.isolate = false;
  trusted.file_size_bytes = 0;
  trusted.output_bytes = 64 << 10;
  trusted.environment = {"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C", "LC_ALL=C", "TMPDIR=/tmp"};
  auto built = run_sandboxed({compiler, "-std=c++17", "-O3", "-march=native", "-pthread", source.string(), "-o", program.string()}, trusted);
  fs::remove(source, ec);
  if (!built.ok()) return make_error(fmt::format("the roofline probe does not compile with {}: {}", compiler, built.stderr_text.substr(0, 2000)));
  auto measured = run_sandboxed({program.string()}, trusted);
  fs::remove(program, ec);
  if (!measured.ok()) return make_error(fmt::format("the roofline probe failed: {}{}", measured.stderr_text.substr(0, 500),
                                                    measured.timed_out ? " (timed out)" : ""));
  auto roofline = detail::parse_roofline(measured.stdout_text);
  if (!roofline) return roofline;
  roofline->host = detail::host_name();
  roofline->cpu_model = detail::cpu_model_name();
  const fs::path temporary = dir / ("roofline-" + unique + ".tmp");
  {
    std::ofstream out(temporary);
    out << fmt::format("{{\"host\":{},\"cpu_model\":{},\"read_gbytes_per_s\":{},\"peak_gflops\":{}}}\n", kevo::detail::json_quote(roofline->host),
                       kevo::detail::json_quote(roofline->cpu_model), roofline->read_gbytes_per_s, roofline->peak_gflops);
  }
  fs::rename(temporary, cached, ec);  // atomic: a concurrent reader sees the old file or the new one
  return roofline;
}

}  // namespace kevo::eval
