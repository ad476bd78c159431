// One pool over several engines (ShardedBackend), here CPU backends, as in CI: every answer equals
// one engine's over the whole pool, with updates and expiries routed, searches racing them, and a
// failed shard reported rather than hidden. The GPU's shards are the same class over
// CudaRetrievalBackends (tests/cuda on a machine with GPUs).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <limits>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "kevo/retrieval/answer_comparison.hpp"
#include "kevo/retrieval/retrieval.hpp"
#include "kevo/retrieval/sharded_backend.hpp"

namespace kevo_tests::retrieval_sharded_test {

using namespace kevo;
using namespace kevo::retrieval;

namespace {

Workload small_workload() { return Workload({.seed = 5, .dim = 64, .features = 32, .hidden = 48}); }

std::unique_ptr<ShardedBackend> sharded(const Workload& w, std::size_t shards, ShardingOptions options = {}) {
  std::vector<std::unique_ptr<RetrievalBackend>> engines;
  for (std::size_t i = 0; i < shards; ++i) engines.push_back(std::make_unique<CpuRetrievalBackend>(w.schema(), w.model(), 1));
  auto pool = ShardedBackend::create(std::move(engines), options);
  REQUIRE(pool);
  return std::move(*pool);
}

/// A shard over a CPU engine that forwards every call; the test doubles below change one or two.
class CpuShard : public RetrievalBackend {
 public:
  explicit CpuShard(const Workload& w) : engine_(w.schema(), w.model(), 1) {}
  std::string name() const override { return "cpu"; }
  const Schema& schema() const override { return engine_.schema(); }
  const Model& model() const override { return engine_.model(); }
  expected<std::vector<ScoredAd>, Error> search_checked(const CheckedRequest& r) override { return engine_.search_checked(r); }
  expected<void, Error> upsert(std::span<const AdRecord> ads) override { return engine_.upsert(ads); }
  expected<std::size_t, Error> expire(std::span<const std::uint32_t> ids) override { return engine_.expire(ids); }

 protected:
  CpuRetrievalBackend engine_;
};

/// A shard that fails every search while `failing` is set.
class FlakyShard final : public CpuShard {
 public:
  using CpuShard::CpuShard;
  std::string name() const override { return "flaky"; }
  expected<std::vector<ScoredAd>, Error> search_checked(const CheckedRequest& r) override {
    if (failing) return make_error("the device went away", ErrorKind::backend);
    return engine_.search_checked(r);
  }
  std::atomic<bool> failing{false};
};

/// A CPU shard that counts the index upkeep it is asked for, and fails it while `failing` is set.
class UpkeepShard final : public CpuShard {
 public:
  using CpuShard::CpuShard;
  std::string name() const override { return "upkeep"; }
  expected<void, Error> reindex() override { return count(reindexed); }
  expected<void, Error> regroup() override { return count(regrouped); }
  std::atomic<int> reindexed{0}, regrouped{0};
  std::atomic<bool> failing{false};

 private:
  expected<void, Error> count(std::atomic<int>& calls) {
    ++calls;
    if (failing) return make_error("regroup needs device memory", ErrorKind::capacity);
    return {};
  }
};

/// A CPU shard that records how each batch reached it: checked already, or not.
class RecordingShard final : public CpuShard {
 public:
  using CpuShard::CpuShard;
  std::string name() const override { return "recording"; }
  expected<void, Error> upsert(std::span<const AdRecord> ads) override {
    ++unchecked_batches;
    return engine_.upsert(ads);
  }
  expected<void, Error> upsert_checked(const CheckedAds& ads) override {
    for (std::size_t i = 0; i < ads.size(); ++i) checked_ids.push_back(ads[i].id);
    ++checked_batches;
    return engine_.upsert_checked(ads);
  }
  int unchecked_batches = 0, checked_batches = 0;  // each shard is called from one thread at a time
  std::vector<std::uint32_t> checked_ids;
};

/// A CPU shard that records which request objects its searches were handed: an engine takes only
/// the checked form (search_checked), so what it sees shows where the request was checked.
class RequestRecordingShard final : public CpuShard {
 public:
  using CpuShard::CpuShard;
  std::string name() const override { return "request-recording"; }
  expected<std::vector<ScoredAd>, Error> search_checked(const CheckedRequest& request) override {
    seen.push_back(&request.request());
    return engine_.search_checked(request);
  }
  expected<std::vector<std::vector<ScoredAd>>, Error> search_batch_checked(std::span<const CheckedRequest> requests) override {
    for (const CheckedRequest& request : requests) seen.push_back(&request.request());
    return engine_.search_batch_checked(requests);
  }
  std::vector<const Request*> seen;  // each shard is called from one thread at a time
};

/// A ShardedBackend over `count` test doubles of type Shard, which `shards` points at.
template <class Shard>
std::unique_ptr<ShardedBackend> pool_of_doubles(const Workload& w, int count, std::vector<Shard*>& shards) {
  std::vector<std::unique_ptr<RetrievalBackend>> engines;
  for (int i = 0; i < count; ++i) {
    auto shard = std::make_unique<Shard>(w);
    shards.push_back(shard.get());
    engines.push_back(std::move(shard));
  }
  auto pool = ShardedBackend::create(std::move(engines));
  REQUIRE(pool);
  return std::move(*pool);
}

}  // namespace

TEST_CASE("each shard is handed its part checked once, and a bad ad anywhere changes no shard", "[retrieval][sharded]") {
  const Workload w = small_workload();
  std::vector<RecordingShard*> shards;
  auto pool = pool_of_doubles(w, 3, shards);
  std::vector<AdRecord> ads;
  for (std::uint64_t i = 0; i < 1000; ++i) ads.push_back(w.ad(i));
  REQUIRE(pool->upsert(ads));
  std::size_t handed = 0;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    CHECK(shards[i]->unchecked_batches == 0);
    CHECK(shards[i]->checked_batches == 1);
    for (std::uint32_t id : shards[i]->checked_ids) CHECK(ShardedBackend::shard_of(id, shards.size()) == i);
    handed += shards[i]->checked_ids.size();
  }
  CHECK(handed == ads.size());
  const Request request = w.request(3, RequestKind::broad, 100);
  const auto before = pool->search(request);
  REQUIRE(before);

  // Every ad replaced, one of them (on the last shard) with an embedding that is not finite.
  std::vector<AdRecord> replaced;
  for (std::uint64_t i = 0; i < 1000; ++i) replaced.push_back(w.ad(i + 5000));
  for (std::uint64_t i = 0; i < 1000; ++i) replaced[i].id = static_cast<std::uint32_t>(i);
  auto bad = std::find_if(replaced.begin(), replaced.end(), [&](const AdRecord& ad) { return ShardedBackend::shard_of(ad.id, 3) == 2; });
  REQUIRE(bad != replaced.end());
  bad->embedding[7] = std::numeric_limits<float>::quiet_NaN();
  auto refused = pool->upsert(replaced);
  REQUIRE_FALSE(refused);
  CHECK_THAT(refused.error().message, Catch::Contains("finite"));
  for (RecordingShard* shard : shards) CHECK(shard->checked_batches + shard->unchecked_batches == 1);  // no shard touched
  const auto after = pool->search(request);
  REQUIRE(after);
  CHECK(*after == *before);
}

TEST_CASE("a request is checked once where it enters: the shards get the caller's own, and never a bad one", "[retrieval][sharded]") {
  const Workload w = small_workload();
  std::vector<RequestRecordingShard*> shards;
  auto pool = pool_of_doubles(w, 3, shards);
  std::vector<AdRecord> ads;
  for (std::uint64_t i = 0; i < 600; ++i) ads.push_back(w.ad(i));
  REQUIRE(pool->upsert(ads));

  const Request request = w.request(1, RequestKind::broad, 50);
  REQUIRE(pool->search(request));
  for (RequestRecordingShard* shard : shards) CHECK(shard->seen == std::vector<const Request*>{&request});  // not a copy

  std::vector<Request> batch = {w.request(2, RequestKind::typical, 10), w.request(3, RequestKind::broad, 20)};
  for (RequestRecordingShard* shard : shards) shard->seen.clear();
  REQUIRE(pool->search_batch(batch));
  for (RequestRecordingShard* shard : shards) CHECK(shard->seen == std::vector<const Request*>{&batch[0], &batch[1]});

  // A bad request reaches no engine: not K out of range on either side, nor a bad request in a batch.
  for (RequestRecordingShard* shard : shards) shard->seen.clear();
  for (int k : {0, kMaxK + 1}) {
    auto refused = pool->search(w.request(4, RequestKind::typical, k));
    REQUIRE_FALSE(refused);
    CHECK_THAT(refused.error().message, Catch::StartsWith("K out of range: " + std::to_string(k)));
  }
  batch[1].routing = w.model().experts + 1;
  auto refused = pool->search_batch(batch);
  REQUIRE_FALSE(refused);
  CHECK_THAT(refused.error().message, Catch::StartsWith("request 1 of the batch: routing width out of range"));
  auto checked = check_requests(pool->schema(), pool->model(), batch);
  REQUIRE_FALSE(checked);
  CHECK(checked.error().message == refused.error().message);
  for (RequestRecordingShard* shard : shards) CHECK(shard->seen.empty());

  // Through the batching layer too: each caller's request is checked before it queues.
  BatchingBackend batching(*pool);
  REQUIRE(batching.search(request));
  REQUIRE_FALSE(batching.search(w.request(5, RequestKind::typical, 0)));
  for (RequestRecordingShard* shard : shards) CHECK(shard->seen == std::vector<const Request*>{&request});
}

TEST_CASE("check_ads names the first bad ad, and a checked batch carries its schema", "[retrieval][sharded]") {
  const Workload w = small_workload();
  std::vector<AdRecord> ads;
  for (std::uint64_t i = 0; i < 2000; ++i) ads.push_back(w.ad(i));
  auto checked = check_ads(w.schema(), ads);
  REQUIRE(checked);
  CHECK(checked->size() == ads.size());
  std::vector<AdRecord> scratch;
  CHECK(checked->contiguous(scratch).data() == ads.data());  // a whole batch is read in place
  CHECK(scratch.empty());
  CHECK(same_schema(checked->schema(), w.schema()));
  Schema copy = w.schema();
  CHECK(same_schema(checked->schema(), copy));
  copy.category_values.back() += 1;
  CHECK_FALSE(same_schema(checked->schema(), copy));
  ads[1500].bias = std::numeric_limits<float>::infinity();
  auto refused = check_ads(w.schema(), ads);
  REQUIRE_FALSE(refused);
  CHECK_THAT(refused.error().message, Catch::Contains("bias"));

  // A part: only its positions are checked, read in the order given, and copied only on request.
  auto part = check_ads(w.schema(), ads, {1999, 0, 10});
  REQUIRE(part);
  REQUIRE(part->size() == 3);
  CHECK(&(*part)[0] == &ads[1999]);
  CHECK(&(*part)[1] == &ads[0]);
  CHECK(&(*part)[2] == &ads[10]);
  const auto copies = part->contiguous(scratch);
  REQUIRE(copies.size() == 3);
  CHECK(copies.data() == scratch.data());
  CHECK((copies[0].id == ads[1999].id && copies[1].id == ads[0].id && copies[2].id == ads[10].id));
  auto bad_part = check_ads(w.schema(), ads, {3, 1500});
  REQUIRE_FALSE(bad_part);
  CHECK_THAT(bad_part.error().message, Catch::Contains("bias"));
  auto past = check_ads(w.schema(), ads, {2000});
  REQUIRE_FALSE(past);
  CHECK(past.error().kind == ErrorKind::bug);
  CHECK_THAT(past.error().message, Catch::Contains("past a batch of 2000"));
}

TEST_CASE("ads spread evenly over the shards by id", "[retrieval][sharded]") {
  for (std::size_t shards : {2, 3, 4}) {
    std::vector<int> counts(shards, 0);
    for (std::uint32_t id = 0; id < 40000; ++id) ++counts[ShardedBackend::shard_of(id, shards)];
    for (int c : counts) CHECK(std::abs(c - 40000 / static_cast<int>(shards)) < 40000 / static_cast<int>(shards) / 20);
  }
}

TEST_CASE("merging the shards' ranked answers ranks their union as the spec does", "[retrieval][sharded]") {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int shards = 1 + trial % 5;
    std::vector<std::vector<ScoredAd>> answers(shards);
    std::vector<ScoredAd> all;
    for (auto& answer : answers) {
      const int size = static_cast<int>(rng() % 40);  // some empty
      for (int i = 0; i < size; ++i) {
        // Few distinct scores, so ties are common and only the ids rank them.
        answer.push_back({static_cast<std::uint32_t>(rng() % 100000), static_cast<float>(rng() % 8) * 0.25f - 1.0f});
        all.push_back(answer.back());
      }
      std::sort(answer.begin(), answer.end(), ranks_before);
    }
    // Every fourth trial hands one answer in unranked: it is ranked, not trusted.
    if (trial % 4 == 0) std::shuffle(answers[0].begin(), answers[0].end(), rng);
    std::sort(all.begin(), all.end(), ranks_before);
    const int k = static_cast<int>(rng() % 90);  // below, at and past the answers' total
    const std::vector<ScoredAd> expected(all.begin(), all.begin() + std::min<std::size_t>(all.size(), static_cast<std::size_t>(k)));
    INFO("trial " << trial << ", " << shards << " shards, k " << k);
    CHECK(merge_ranked(answers, k) == expected);
  }
  CHECK(merge_ranked({}, 10).empty());
}

TEST_CASE("two engines' answers agree only within the spec's tolerance, ties at the K-th score either way", "[retrieval][sharded]") {
  std::vector<ScoredAd> reference;
  for (std::uint32_t i = 0; i < 20; ++i) reference.push_back({100 + i, 2.0f - 0.1f * static_cast<float>(i)});
  CHECK(answers_differ(reference, reference).empty());
  auto answer = reference;
  answer.pop_back();
  CHECK(answers_differ(reference, answer) == "returned 19 ads where the reference returns 20");
  answer = reference;
  answer[5].score += 0.01f;  // past 1e-3 (1 + |1.5|)
  CHECK(answers_differ(reference, answer).rfind("rank 5 scored", 0) == 0);
  answer = reference;
  answer[5].score += 0.0005f;  // within it
  CHECK(answers_differ(reference, answer).empty());
  answer = reference;
  answer.back() = {999, reference.back().score + 0.0004f};  // another ad tied with the K-th: either may be returned
  CHECK(answers_differ(reference, answer).empty());
  answer = reference;
  answer[3].id = 999;  // the same score, but an ad far above the K-th is missing
  CHECK(answers_differ(reference, answer) == "ad 103 (score 1.700000) is missing");
}

TEST_CASE("2 and 4 shards answer exactly as one engine over the whole pool, through updates and expiries", "[retrieval][sharded]") {
  const Workload w = small_workload();
  const std::size_t shard_count = GENERATE(2, 4);
  CpuRetrievalBackend whole(w.schema(), w.model(), 2);
  auto pool = sharded(w, shard_count);
  std::vector<AdRecord> ads;
  for (std::uint64_t i = 0; i < 6000; ++i) ads.push_back(w.ad(i));
  REQUIRE(whole.upsert(ads));
  REQUIRE(pool->upsert(ads));
  auto agree = [&](std::uint64_t seed) {
    for (RequestKind kind : {RequestKind::typical, RequestKind::broad, RequestKind::narrow})
      for (int k : {1, 10, 1000}) {
        const Request r = w.request(seed, kind, k);
        auto expected_top = whole.search(r);
        auto got = pool->search(r);
        REQUIRE(expected_top);
        REQUIRE(got);
        INFO(shard_count << " shards, K " << k);
        CHECK(*got == *expected_top);
      }
  };
  agree(1);
  // Replace a third of the ads with new embeddings and targeting, expire some, add new ids.
  std::vector<AdRecord> changed;
  for (std::uint64_t i = 0; i < 6000; i += 3) {
    AdRecord ad = w.ad(i + 100000);
    ad.id = static_cast<std::uint32_t>(i);
    changed.push_back(ad);
  }
  for (std::uint64_t i = 6000; i < 6500; ++i) changed.push_back(w.ad(i));
  REQUIRE(whole.upsert(changed));
  REQUIRE(pool->upsert(changed));
  std::vector<std::uint32_t> gone;
  for (std::uint32_t id = 1; id < 6500; id += 7) gone.push_back(id);
  const auto expired_whole = whole.expire(gone);
  const auto expired_pool = pool->expire(gone);
  REQUIRE(expired_pool);
  CHECK(*expired_pool == *expired_whole);
  agree(2);
  // Batches too, each request merged on its own.
  std::vector<Request> batch;
  for (std::uint64_t r = 0; r < 5; ++r) batch.push_back(w.request(r + 10, RequestKind::typical, 50 + static_cast<int>(r)));
  auto one_by_one = whole.search_batch(batch);
  auto merged = pool->search_batch(batch);
  REQUIRE(merged);
  CHECK(*merged == *one_by_one);
}

TEST_CASE("searches racing routed updates see each ad whole, on one shard only", "[retrieval][sharded]") {
  const Workload w = small_workload();
  auto pool = sharded(w, 4);
  std::vector<AdRecord> ads;
  for (std::uint64_t i = 0; i < 3000; ++i) ads.push_back(w.ad(i));
  REQUIRE(pool->upsert(ads));
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (std::uint64_t round = 0; round < 20; ++round) {
      std::vector<AdRecord> changed;
      for (std::uint64_t i = round % 5; i < 3000; i += 5) {
        AdRecord ad = w.ad(i + 10000 * (round + 1));
        ad.id = static_cast<std::uint32_t>(i);
        changed.push_back(ad);
      }
      REQUIRE(pool->upsert(changed));
    }
    done = true;
  });
  int searches = 0;
  do {  // at least once, however soon the writer finishes
    auto top = pool->search(w.request(static_cast<std::uint64_t>(searches), RequestKind::broad, 1000));
    REQUIRE(top);
    std::set<std::uint32_t> ids;
    for (const ScoredAd& a : *top) CHECK(ids.insert(a.id).second);  // no ad twice: a replaced ad stays on its shard
    CHECK(std::is_sorted(top->begin(), top->end(), [](const ScoredAd& a, const ScoredAd& b) { return a.score > b.score || (a.score == b.score && a.id < b.id); }));
    ++searches;
  } while (!done);
  writer.join();
  CHECK(searches > 0);
}

TEST_CASE("a failed shard fails the search, named, a partial answer only where the caller opts in, and marked", "[retrieval][sharded]") {
  const Workload w = small_workload();
  for (bool allow_partial : {false, true}) {
    std::vector<std::unique_ptr<RetrievalBackend>> engines;
    engines.push_back(std::make_unique<CpuRetrievalBackend>(w.schema(), w.model(), 1));
    auto flaky = std::make_unique<FlakyShard>(w);
    FlakyShard& shard1 = *flaky;
    engines.push_back(std::move(flaky));
    auto pool = ShardedBackend::create(std::move(engines), {.allow_partial = allow_partial});
    REQUIRE(pool);
    std::vector<AdRecord> ads;
    for (std::uint64_t i = 0; i < 2000; ++i) ads.push_back(w.ad(i));
    REQUIRE((*pool)->upsert(ads));
    const Request r = w.request(3, RequestKind::broad, 100);
    auto whole = (*pool)->search(r);
    REQUIRE(whole);
    shard1.failing = true;
    auto failed = (*pool)->search(r);
    REQUIRE_FALSE(failed);
    CHECK(failed.error().message == "shard 1 of 2 failed: the device went away");
    CHECK(failed.error().kind == ErrorKind::backend);  // the shard's own kind, kept through the merge
    auto partial = (*pool)->search_sharded(r);
    INFO("allow_partial " << allow_partial);
    if (!allow_partial) {
      REQUIRE_FALSE(partial);
      CHECK(partial.error().message == "shard 1 of 2 failed: the device went away");
    } else {
      REQUIRE(partial);
      CHECK_FALSE(partial->complete());
      CHECK(partial->failed_shards == std::vector<std::size_t>{1});
      for (const ScoredAd& a : partial->top) CHECK(ShardedBackend::shard_of(a.id, 2) == 0);  // only shard 0's ads
    }
    shard1.failing = false;
    auto again = (*pool)->search(r);
    REQUIRE(again);
    CHECK(*again == *whole);
  }
}

TEST_CASE("a bad request is the caller's error, and shards of another model are refused", "[retrieval][sharded]") {
  const Workload w = small_workload();
  auto pool = sharded(w, 2);
  Request bad = w.request(1, RequestKind::typical, 10);
  bad.k = 0;
  auto refused = pool->search(bad);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().message.find("shard") == std::string::npos);
  CHECK(refused.error().kind == ErrorKind::caller);
  std::vector<std::unique_ptr<RetrievalBackend>> mixed;
  mixed.push_back(std::make_unique<CpuRetrievalBackend>(w.schema(), w.model(), 1));
  const Workload other({.seed = 6, .dim = 64, .features = 32, .hidden = 48});
  mixed.push_back(std::make_unique<CpuRetrievalBackend>(other.schema(), other.model(), 1));
  auto mismatched = ShardedBackend::create(std::move(mixed));
  REQUIRE_FALSE(mismatched);
  CHECK(mismatched.error().message == "shard 1 has another schema or model than shard 0");
}

TEST_CASE("index upkeep (reindex, regroup) reaches every shard, and a shard's failure is named", "[retrieval][sharded]") {
  const Workload w = small_workload();
  std::vector<UpkeepShard*> shards;
  auto pool = pool_of_doubles(w, 3, shards);
  REQUIRE(pool->reindex());
  REQUIRE(pool->regroup());
  for (const UpkeepShard* s : shards) {
    CHECK(s->reindexed == 1);
    CHECK(s->regrouped == 1);
  }
  shards[2]->failing = true;
  auto failed = pool->regroup();
  REQUIRE_FALSE(failed);
  CHECK(failed.error().message == "shard 2 of 3 failed: regroup needs device memory");
  CHECK(failed.error().kind == ErrorKind::capacity);
  for (const UpkeepShard* s : shards) CHECK(s->regrouped == 2);  // every shard was asked
  auto reindex_failed = pool->reindex();
  REQUIRE_FALSE(reindex_failed);
  CHECK(reindex_failed.error().message == "shard 2 of 3 failed: regroup needs device memory");
}

}  // namespace kevo_tests::retrieval_sharded_test
