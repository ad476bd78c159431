// A sharded pool on one GPU: 2 and 4 CudaRetrievalBackends behind one ShardedBackend answer as the
// reference over the whole pool, through routed upserts and expiries, while updates race searches.
// (One of the files of test_cuda_retrieval_pipeline; its main is main.cu.)
#include <atomic>
#include <set>
#include <thread>

#include "../support/pipeline_fixtures.cuh"
#include "kevo/retrieval/dispatch/cuda_backend.cuh"
#include "kevo/retrieval/sharded_backend.hpp"

using namespace kevo::retrieval;
using namespace kevo_tests::retrieval_pipeline;

namespace {

/// Every shard's answer, merged, against the reference over `host`, for a typical, a broad and a
/// narrow request.
void check_against_reference(ShardedBackend& pool, const HostAdPool& host, const Workload& w, std::uint64_t seed) {
  for (RequestKind kind : {RequestKind::typical, RequestKind::broad, RequestKind::narrow}) {
    const Request request = w.request(seed + static_cast<std::uint64_t>(kind), kind, 400);
    auto top = pool.search(request);
    REQUIRE(top);
    auto ok = compare_with_reference(host, compute_request_vectors(w.model(), request.features), request, *top);
    INFO(pool.name() << ", request kind " << static_cast<int>(kind) << ": " << (ok ? "" : ok.error().message));
    REQUIRE(ok);
  }
}

}  // namespace

TEST_CASE("2 and 4 shards on one GPU answer as the reference over the whole pool, with updates racing searches",
          "[cuda][sharded]") {
  const EmbeddingType type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8);
  const std::size_t shards = GENERATE(2u, 4u);
  const Workload w(small_options(21, type));
  std::vector<std::unique_ptr<RetrievalBackend>> engines;
  for (std::size_t s = 0; s < shards; ++s) {
    auto engine = CudaRetrievalBackend::create(w.schema(), w.model(), {.capacity = 4096});
    REQUIRE(engine);
    engines.push_back(std::move(*engine));
  }
  auto created = ShardedBackend::create(std::move(engines));
  REQUIRE(created);
  ShardedBackend& pool = **created;
  HostAdPool host(w.schema());

  constexpr std::uint32_t kAds = 3000;
  std::vector<AdRecord> ads;
  for (std::uint32_t i = 0; i < kAds; ++i) {
    ads.push_back(w.ad(i));
    if (ads.back().live) REQUIRE(host.upsert(ads.back()));
  }
  REQUIRE(pool.upsert(ads));
  REQUIRE(pool.reindex());
  check_against_reference(pool, host, w, 10);

  // Replacements (new values and targeting for the same ids) race searches in batches of 250; each
  // search must answer, ranked, with no ad twice (a replaced ad lives on one shard only).
  std::vector<std::vector<AdRecord>> batches;
  for (std::uint32_t first = 0; first < kAds; first += 250) {
    std::vector<AdRecord> batch;
    for (std::uint32_t i = first; i < first + 250; ++i) {
      AdRecord ad = w.ad(100000 + i);
      ad.id = i;
      batch.push_back(ad);
    }
    batches.push_back(std::move(batch));
  }
  std::atomic<bool> done{false};
  std::atomic<int> failed_updates{0};
  std::thread writer([&] {
    for (const auto& batch : batches)
      if (!pool.upsert(batch)) ++failed_updates;
    done = true;
  });
  int searches = 0, unranked = 0, repeated = 0;
  const Request racing = w.request(30, RequestKind::typical, 400);
  while (!done || searches < 5) {
    auto top = pool.search(racing);
    REQUIRE(top);
    ++searches;
    unranked += !std::is_sorted(top->begin(), top->end(), ranks_before);
    std::set<std::uint32_t> ids;
    for (const ScoredAd& a : *top) repeated += !ids.insert(a.id).second;
  }
  writer.join();
  INFO(searches << " searches raced the updates");
  CHECK(failed_updates == 0);
  CHECK(unranked == 0);
  CHECK(repeated == 0);
  for (const auto& batch : batches)
    for (const AdRecord& ad : batch) {
      if (ad.live) REQUIRE(host.upsert(ad));
      else host.expire(ad.id);
    }
  check_against_reference(pool, host, w, 40);

  // Expiries are routed too: a third of the ads gone from every shard's answers.
  std::vector<std::uint32_t> gone;
  for (std::uint32_t i = 0; i < kAds; i += 3) gone.push_back(i);
  auto expired = pool.expire(gone);
  REQUIRE(expired);
  std::size_t were_live = 0;
  for (std::uint32_t id : gone) were_live += host.expire(id) ? 1 : 0;
  CHECK(*expired == were_live);
  check_against_reference(pool, host, w, 70);
}
