// benchmarks/retrieval/sharded_bench.cpp: see sharded_bench.hpp.
#include "sharded_bench.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "kevo/retrieval/answer_comparison.hpp"
#include "kevo/retrieval/sharded_backend.hpp"

namespace kevo::retrieval::bench {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

/// The median host-visible time of call(r) for r = 0 .. repeats - 1, after two warm-ups; a failed
/// call ends the run (a benchmark of an engine that fails measures nothing).
template <class Call>
double median_seconds(int repeats, Call&& call) {
  std::vector<double> seconds;
  for (int r = -2; r < repeats; ++r) {
    const auto start = Clock::now();
    if (auto ok = call(std::max(r, 0)); !ok) {
      std::fprintf(stderr, "a timed call failed: %s\n", ok.error().message.c_str());
      std::exit(1);
    }
    if (r >= 0) seconds.push_back(seconds_since(start));
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

std::string gpu_list(const std::vector<int>& gpus) {
  std::string out;
  for (int g : gpus) out += (out.empty() ? "" : ",") + std::to_string(g);
  return out;
}

/// Every shard's answer, merged, against one GPU holding every ad, under the spec's rules.
bool answers_agree(ShardedBackend& sharded, RetrievalBackend& whole, const Workload& w, bool quick) {
  std::vector<Request> requests;
  for (int u = 0; u < (quick ? 3 : 8); ++u) requests.push_back(w.request(500 + u, RequestKind::typical, 1000));
  requests.push_back(w.request(600, RequestKind::broad, 1000));
  requests.push_back(w.request(601, RequestKind::narrow, 100));
  requests.push_back(w.request(602, RequestKind::typical, 4096));
  requests.push_back(w.request(603, RequestKind::typical, 1000, w.model().experts));  // dense gating
  for (std::size_t i = 0; i < requests.size(); ++i) {
    auto merged = sharded.search(requests[i]);
    auto reference = whole.search(requests[i]);
    if (!merged || !reference) {
      std::printf("request %zu: %s\n", i, (!merged ? merged.error() : reference.error()).message.c_str());
      return false;
    }
    if (std::string why = answers_differ(*reference, *merged); !why.empty()) {
      std::printf("request %zu disagrees with one GPU holding every ad: %s\n", i, why.c_str());
      return false;
    }
  }
  std::printf("answers: %zu requests (typical, broad, narrow, K = 4096, dense gating), every one equal to one GPU's "
              "holding every ad under the spec's rules\n\n", requests.size());
  return true;
}

/// Batches of 10,000 ads replacing random existing ones (routed to their shards, where `pool` is
/// sharded), alone and while another thread searches back to back. Counted once applied: a last
/// search waits for them all.
void run_updates(RetrievalBackend& pool, const char* label, const Workload& w, std::uint64_t total_ads) {
  constexpr int kBatch = 10000;
  const int batches = 30;  // --quick too: what a pool pays once on its first replacements weighs the same in every run
  Rng rng(17);
  std::vector<std::vector<AdRecord>> prepared(static_cast<std::size_t>(batches));
  for (auto& ads : prepared)
    for (int i = 0; i < kBatch; ++i) ads.push_back(w.ad(rng.next() % total_ads));  // the host-drawn ad: new values in place of the device fill's
  const Request typical = w.request(700, RequestKind::typical, 1000);
  std::printf("\n| updates of %s (batches of %d) | M ads/s applied | searches alongside: median / p99 |\n| --- | --- | --- |\n", label, kBatch);
  for (bool with_search : {false, true}) {
    std::atomic<bool> stop{false};
    std::vector<double> search_ms;
    std::thread searcher;
    if (with_search)
      searcher = std::thread([&] {
        while (!stop) {
          const auto start = Clock::now();
          if (!pool.search(typical)) break;
          search_ms.push_back(seconds_since(start) * 1e3);
        }
      });
    const auto start = Clock::now();
    for (const auto& ads : prepared)
      if (auto ok = pool.upsert(ads); !ok) {
        std::fprintf(stderr, "upsert failed: %s\n", ok.error().message.c_str());
        std::exit(1);
      }
    if (!pool.search(typical)) std::exit(1);  // ordered after every update on every shard
    const double seconds = seconds_since(start);
    stop = true;
    if (searcher.joinable()) searcher.join();
    std::sort(search_ms.begin(), search_ms.end());
    std::printf("| %s | %.2f | ", with_search ? "while searching" : "alone", kBatch * batches / seconds * 1e-6);
    if (search_ms.empty()) std::puts("- |");
    else std::printf("%.2f / %.2f ms |\n", search_ms[search_ms.size() / 2], search_ms[search_ms.size() * 99 / 100]);
  }
}

}  // namespace

bool run_sharded(ShardedPools pools, const Workload& w, bool quick) {
  const std::size_t shards = pools.shards.size();
  std::printf("\n## A sharded pool: %zu shards on GPUs %s, %llu ads\n\n", shards, gpu_list(pools.gpus).c_str(),
              static_cast<unsigned long long>(pools.total_ads));
  for (std::size_t s = 0; s < shards; ++s)
    std::printf("shard %zu: %llu ads on GPU %d\n", s, static_cast<unsigned long long>(pools.shard_ads[s]), pools.gpus[s]);
  auto created = ShardedBackend::create(std::move(pools.shards));
  if (!created) {
    std::printf("the shards were refused: %s\n", created.error().message.c_str());
    return false;
  }
  ShardedBackend& sharded = **created;
  RetrievalBackend& one = sharded.shard(0);
  std::puts("");
  const bool agree = !pools.whole || answers_agree(sharded, *pools.whole, w, quick);

  // One GPU is shard 0 searched alone: a pool of about total / shards ads on one device.
  const int repeats = quick ? 10 : 30;
  auto typical = [&](int r) { return w.request(1000 + static_cast<std::uint64_t>(r), RequestKind::typical, 1000); };
  const double one_s = median_seconds(repeats, [&](int r) { return one.search(typical(r)); });
  const double all_s = median_seconds(repeats, [&](int r) { return sharded.search(typical(r)); });
  constexpr int kBatch = 16;
  auto batch_of = [&](int r) {
    std::vector<Request> batch;
    for (int i = 0; i < kBatch; ++i) batch.push_back(typical(r * kBatch + i));
    return batch;
  };
  const int batch_repeats = quick ? 4 : 10;
  const double one_batch_s = median_seconds(batch_repeats, [&](int r) { return one.search_batch(batch_of(r)); });
  const double all_batch_s = median_seconds(batch_repeats, [&](int r) { return sharded.search_batch(batch_of(r)); });
  const double one_ads = static_cast<double>(pools.shard_ads[0]), all_ads = static_cast<double>(pools.total_ads);
  std::printf("| typical requests, K = 1000 | pool | median time | pool ads/s | vs one GPU |\n| --- | --- | --- | --- | --- |\n");
  std::printf("| one at a time, one GPU (shard 0) | %.0fM | %.3f ms | %.1f G | 1 |\n", one_ads * 1e-6, one_s * 1e3, one_ads / one_s * 1e-9);
  std::printf("| one at a time, %zu %s | %.0fM | %.3f ms | %.1f G | %.2fx |\n", shards, shards == 1 ? "shard" : "shards", all_ads * 1e-6, all_s * 1e3,
              all_ads / all_s * 1e-9, (all_ads / all_s) / (one_ads / one_s));
  if (pools.whole) {
    const double whole_s = median_seconds(repeats, [&](int r) { return pools.whole->search(typical(r)); });
    std::printf("| one at a time, GPU %d holding every ad | %.0fM | %.3f ms | %.1f G | %.2fx |\n", pools.gpus[0],
                all_ads * 1e-6, whole_s * 1e3, all_ads / whole_s * 1e-9, (all_ads / whole_s) / (one_ads / one_s));
  }
  std::printf("| batches of %d, one GPU (shard 0) | %.0fM | %.3f ms | %.1f G | 1 |\n", kBatch, one_ads * 1e-6,
              one_batch_s * 1e3, kBatch * one_ads / one_batch_s * 1e-9);
  std::printf("| batches of %d, %zu %s | %.0fM | %.3f ms | %.1f G | %.2fx |\n", kBatch, shards, shards == 1 ? "shard" : "shards", all_ads * 1e-6,
              all_batch_s * 1e3, kBatch * all_ads / all_batch_s * 1e-9, (all_ads / all_batch_s) / (one_ads / one_batch_s));
  if (pools.whole) {  // the same batches into one pool of every ad, then its memory back
    run_updates(*pools.whole, "one pool of every ad", w, pools.total_ads);
    pools.whole.reset();
  }
  run_updates(sharded, "the shards, routed by id", w, pools.total_ads);
  return agree;
}

}  // namespace kevo::retrieval::bench
