// kevo/retrieval/sharded_backend.hpp: one ad pool over several engines (the GPUs of one host, or
// CPU backends), as one RetrievalBackend. An ad lives on the shard its id hashes to, so its updates
// always go there and a replaced ad is never on two shards. A search asks every shard at once for
// its top-K and merges them on the host: the global top-K is the top-K of the shards' top-Ks, with
// ties to the lower id, as the spec ranks. A shard that fails fails the search, naming the shard;
// a partial answer is given only by search_sharded, where the caller opts in, and is marked.
//
// Why the host merges: each shard's top-K already ends in host memory (that is what a search
// returns), and a P-way merge of ranked lists takes K log P steps (about 20 us for 8 shards of
// 1,000); a device merge would add a peer copy and a launch to every search. The shards' work runs
// on a pool of threads kept for the backend's life: starting a thread a shard a search cost about
// 25 us each.
//
//   std::vector<std::unique_ptr<RetrievalBackend>> gpus = ...;   // one per device, each on its own streams
//   ShardedBackend pool(std::move(gpus));
//   pool.upsert(ads);                                 // routed by id
//   auto top = pool.search(request);                  // every shard, merged
#pragma once

#include <algorithm>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include "kevo/retrieval/backend.hpp"
#include "kevo/retrieval/checked_ads.hpp"
#include "kevo/retrieval/reference.hpp"
#include "kevo/retrieval/shard_placement.hpp"
#include "kevo/retrieval/types.hpp"

namespace kevo::retrieval {

struct ShardingOptions {
  /// search_sharded may answer from the shards that answered, marking the ones that failed.
  bool allow_partial = false;
  /// Callers that may search at once without queueing for the shard threads (each call takes one
  /// thread per shard but the first, which runs on the caller's).
  unsigned concurrent_callers = 4;
};

/// The spec's ranking of the union of several ranked answers (score descending, ties to the lower
/// id), cut to the first `k`: a P-way merge of their heads, K log P steps. An answer that is not
/// ranked (no backend of kevo's returns one) is sorted first rather than trusted.
inline std::vector<ScoredAd> merge_ranked(std::vector<std::vector<ScoredAd>> answers, int k) {
  std::size_t total = 0;
  for (auto& answer : answers) {
    if (!std::is_sorted(answer.begin(), answer.end(), ranks_before)) std::sort(answer.begin(), answer.end(), ranks_before);
    total += answer.size();
  }
  const std::size_t wanted = std::min(total, static_cast<std::size_t>(std::max(k, 0)));
  // A min-heap of each answer's next ad, by rank: the top is the best head.
  using Head = std::pair<std::size_t, std::size_t>;  // (answer, position)
  auto worse = [&](const Head& a, const Head& b) { return ranks_before(answers[b.first][b.second], answers[a.first][a.second]); };
  std::vector<Head> heads;
  for (std::size_t i = 0; i < answers.size(); ++i)
    if (!answers[i].empty()) heads.emplace_back(i, 0);
  std::make_heap(heads.begin(), heads.end(), worse);
  std::vector<ScoredAd> merged;
  merged.reserve(wanted);
  while (merged.size() < wanted) {
    std::pop_heap(heads.begin(), heads.end(), worse);
    auto& [answer, at] = heads.back();
    merged.push_back(answers[answer][at]);
    if (++at < answers[answer].size()) std::push_heap(heads.begin(), heads.end(), worse);
    else heads.pop_back();
  }
  return merged;
}

/// A merged answer, and the shards it lacks (empty: complete).
struct ShardedAnswer {
  std::vector<ScoredAd> top;
  std::vector<std::size_t> failed_shards;
  std::string failure;  ///< the first failed shard's error, where any failed
  ErrorKind failure_kind = ErrorKind::backend;
  bool complete() const { return failed_shards.empty(); }
};

class ShardedBackend final : public RetrievalBackend {
 public:
  /// The shards must share one schema and model; `create` checks that, the constructor throws.
  static expected<std::unique_ptr<ShardedBackend>, Error> create(std::vector<std::unique_ptr<RetrievalBackend>> shards,
                                                                 ShardingOptions options = {}) {
    if (auto ok = check(shards); !ok) return unexpected(ok.error());
    return std::make_unique<ShardedBackend>(std::move(shards), options);
  }
  ShardedBackend(std::vector<std::unique_ptr<RetrievalBackend>> shards, ShardingOptions options = {})
      : shards_(std::move(shards)),
        options_(options),
        workers_((std::max<std::size_t>(2, shards_.size()) - 1) * std::max(1u, options.concurrent_callers)) {
    if (auto ok = check(shards_); !ok) throw std::invalid_argument(ok.error().message);
  }

  /// The shard an ad id lives on (shard_placement.hpp).
  static std::size_t shard_of(std::uint32_t id, std::size_t shard_count) { return retrieval::shard_of(id, shard_count); }

  std::size_t shard_count() const { return shards_.size(); }
  RetrievalBackend& shard(std::size_t i) { return *shards_[i]; }

  std::string name() const override { return std::to_string(shards_.size()) + " shards of " + shards_[0]->name(); }
  /// The first shard's: the shards are alike, one pool split by id.
  std::string kernel_policy() const override { return shards_[0]->kernel_policy(); }
  const Schema& schema() const override { return shards_[0]->schema(); }
  const Model& model() const override { return shards_[0]->model(); }

  /// Every shard's answer merged; a failed shard fails the search, named.
  expected<std::vector<ScoredAd>, Error> search_checked(const CheckedRequest& request) override {
    ShardedAnswer answer = ask_all(request);
    if (!answer.complete()) return make_error(answer.failure, answer.failure_kind);
    return std::move(answer.top);
  }

  /// As search, but with `allow_partial` the shards that answered are merged and the failed ones
  /// listed, so that a caller can serve a marked partial answer. A bad request is still an error.
  expected<ShardedAnswer, Error> search_sharded(const Request& request) {
    auto checked = check_request(schema(), model(), request);
    if (!checked) return unexpected(checked.error());
    ShardedAnswer answer = ask_all(*checked);
    if (!answer.complete() && (!options_.allow_partial || answer.failed_shards.size() == shards_.size()))
      return make_error(answer.failure, answer.failure_kind);
    return answer;
  }

  /// Each shard takes the whole batch (an engine answers a batch faster than one by one); each
  /// request's answers are merged.
  expected<std::vector<std::vector<ScoredAd>>, Error> search_batch_checked(std::span<const CheckedRequest> requests) override {
    auto per_shard = on_every_shard([&](RetrievalBackend& s, std::size_t) { return s.search_batch_checked(requests); });
    std::vector<std::vector<ScoredAd>> merged(requests.size());
    for (std::size_t i = 0; i < per_shard.size(); ++i) {
      if (!per_shard[i]) return make_error(shard_failure(i, per_shard[i].error()), per_shard[i].error().kind);
      if (per_shard[i]->size() != requests.size())
        return make_error(shard_failure(i, Error{"it answered " + std::to_string(per_shard[i]->size()) + " of " +
                                                 std::to_string(requests.size()) + " searches"}),
                          ErrorKind::bug);
    }
    for (std::size_t r = 0; r < requests.size(); ++r) {
      std::vector<std::vector<ScoredAd>> answers;
      for (auto& shard_answers : per_shard) answers.push_back(std::move((*shard_answers)[r]));
      merged[r] = merge_ranked(std::move(answers), requests[r]->k);
    }
    return merged;
  }

  /// Each ad goes to its shard. Every shard picks and checks its own part of the batch on its own
  /// thread (in place: no ad is copied), and none applies its part until all passed, so a bad ad
  /// changes nothing and no ad is checked twice. The call returns once every shard has its part,
  /// so every later search sees all of them.
  expected<void, Error> upsert(std::span<const AdRecord> ads) override {
    std::vector<std::optional<CheckedAds>> checked(shards_.size());
    auto checks = on_every_shard([&](RetrievalBackend& s, std::size_t i) -> expected<void, Error> {
      std::vector<std::uint32_t> mine;
      for (std::size_t a = 0; a < ads.size(); ++a)
        if (shard_of(ads[a].id, shards_.size()) == i) mine.push_back(static_cast<std::uint32_t>(a));
      auto part = check_ads(s.schema(), ads, std::move(mine));
      if (!part) return unexpected(part.error());
      checked[i].emplace(std::move(*part));
      return {};
    });
    for (auto& check : checks)
      if (!check) return check;  // a bad ad is the caller's, not the shard's: its message as it is
    auto results = on_every_shard([&](RetrievalBackend& s, std::size_t i) -> expected<void, Error> {
      if (checked[i]->size() == 0) return {};
      return s.upsert_checked(*checked[i]);
    });
    for (std::size_t i = 0; i < results.size(); ++i)
      if (!results[i])
        return make_error(shard_failure(i, results[i].error()) + " (the other shards' ads were updated)", results[i].error().kind);
    return {};
  }

  expected<std::size_t, Error> expire(std::span<const std::uint32_t> ids) override {
    std::vector<std::vector<std::uint32_t>> routed(shards_.size());
    for (std::uint32_t id : ids) routed[shard_of(id, shards_.size())].push_back(id);
    auto results = on_every_shard([&](RetrievalBackend& s, std::size_t i) -> expected<std::size_t, Error> {
      const auto& part = routed[i];
      if (part.empty()) return std::size_t{0};
      return s.expire(std::span<const std::uint32_t>(part.data(), part.size()));
    });
    std::size_t expired = 0;
    for (std::size_t i = 0; i < results.size(); ++i) {
      if (!results[i]) return make_error(shard_failure(i, results[i].error()), results[i].error().kind);
      expired += *results[i];
    }
    return expired;
  }

  expected<void, Error> reindex() override {
    return on_each_shard_named([](RetrievalBackend& s) { return s.reindex(); });
  }
  expected<void, Error> regroup() override {
    return on_each_shard_named([](RetrievalBackend& s) { return s.regroup(); });
  }

 private:
  /// Runs `call` on every shard at once; the first failure, named by its shard.
  template <class Call>
  expected<void, Error> on_each_shard_named(Call call) {
    auto results = on_every_shard([&](RetrievalBackend& s, std::size_t) { return call(s); });
    for (std::size_t i = 0; i < results.size(); ++i)
      if (!results[i]) return make_error(shard_failure(i, results[i].error()), results[i].error().kind);
    return {};
  }
  static expected<void, Error> check(const std::vector<std::unique_ptr<RetrievalBackend>>& shards) {
    if (shards.empty()) return make_error("a sharded pool needs at least one shard");
    for (std::size_t i = 0; i < shards.size(); ++i) {
      if (!shards[i]) return make_error("shard " + std::to_string(i) + " is missing");
      if (shards[i]->schema().dim != shards[0]->schema().dim || shards[i]->schema().embedding_type != shards[0]->schema().embedding_type ||
          shards[i]->schema().category_values != shards[0]->schema().category_values || shards[i]->model().dim != shards[0]->model().dim ||
          shards[i]->model().experts != shards[0]->model().experts || shards[i]->model().w1 != shards[0]->model().w1)
        return make_error("shard " + std::to_string(i) + " has another schema or model than shard 0");
    }
    return {};
  }

  std::string shard_failure(std::size_t i, const Error& e) const {
    return "shard " + std::to_string(i) + " of " + std::to_string(shards_.size()) + " failed: " + e.message;
  }

  /// f(shard, its index) on every shard at once (shard 0 on this thread, the others on the pool's), in order.
  template <class F>
  auto on_every_shard(F&& f) -> std::vector<decltype(f(std::declval<RetrievalBackend&>(), std::size_t{}))> {
    using Result = decltype(f(std::declval<RetrievalBackend&>(), std::size_t{}));
    std::vector<std::future<Result>> others;
    for (std::size_t i = 1; i < shards_.size(); ++i) {
      auto task = std::make_shared<std::packaged_task<Result()>>([&, i] { return guarded(f, *shards_[i], i); });
      others.push_back(task->get_future());
      boost::asio::post(workers_, [task] { (*task)(); });
    }
    std::vector<Result> results;
    results.push_back(guarded(f, *shards_[0], 0));
    for (auto& other : others) results.push_back(other.get());
    return results;
  }

  /// A shard that throws has failed, like one that returns an error; the others go on.
  template <class F>
  static auto guarded(F& f, RetrievalBackend& shard, std::size_t i) -> decltype(f(shard, i)) {
    try {
      return f(shard, i);
    } catch (const std::exception& e) {
      return make_error(std::string("threw: ") + e.what(), ErrorKind::backend);
    }
  }

  /// The shards are alike (one schema and model): a request checked for the pool is checked for each.
  ShardedAnswer ask_all(const CheckedRequest& request) {
    auto answers = on_every_shard([&](RetrievalBackend& s, std::size_t) { return s.search_checked(request); });
    ShardedAnswer out;
    std::vector<std::vector<ScoredAd>> answered;
    for (std::size_t i = 0; i < answers.size(); ++i) {
      if (answers[i]) {
        answered.push_back(std::move(*answers[i]));
      } else {
        if (out.failure.empty()) out.failure = shard_failure(i, answers[i].error()), out.failure_kind = answers[i].error().kind;
        out.failed_shards.push_back(i);
      }
    }
    // Every shard refusing alike is the request's own fault (its vectors overflow fp16), not a shard's.
    if (out.failed_shards.size() == shards_.size() &&
        std::all_of(answers.begin(), answers.end(), [&](const auto& a) { return a.error().message == answers[0].error().message; }))
      out.failure = answers[0].error().message;
    out.top = merge_ranked(std::move(answered), request->k);
    return out;
  }

  std::vector<std::unique_ptr<RetrievalBackend>> shards_;
  ShardingOptions options_;
  boost::asio::thread_pool workers_;  // runs shards 1.. of every call; joined before the shards go
};

}  // namespace kevo::retrieval
