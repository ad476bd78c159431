// kevo/retrieval/backend.hpp: what a serving binary needs from a retrieval engine, the CPU
// backend that runs the reference on machines without a GPU, and BatchingBackend, which answers
// concurrent searches in batches. A GPU backend (cuda_backend.cuh) models the same interface, so
// a server picks one at start-up.
//
//   CpuRetrievalBackend cpu(schema, model);
//   cpu.upsert(ads);
//   expected<std::vector<ScoredAd>, Error> top = cpu.search(request);
//   BatchingBackend batched(cpu, {.max_batch = 8});   // share it between request threads
#pragma once

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <stdexcept>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

#include "kevo/retrieval/ad_pool.hpp"
#include "kevo/retrieval/checked_ads.hpp"
#include "kevo/retrieval/fair_mutex.hpp"
#include "kevo/retrieval/reference.hpp"
#include "kevo/retrieval/types.hpp"

namespace kevo::retrieval {

/// A retrieval engine behind a server: search, and real-time updates that never tear a read.
class RetrievalBackend {
 public:
  virtual ~RetrievalBackend() = default;
  virtual std::string name() const = 0;
  virtual const Schema& schema() const = 0;
  virtual const Model& model() const = 0;
  /// Top-K for one request; a bad request comes back as an error with a message for the caller.
  /// The request is checked here, once (check_request), and the engine takes the checked form.
  expected<std::vector<ScoredAd>, Error> search(const Request& request) {
    auto checked = check_request(schema(), model(), request);
    if (!checked) return unexpected(checked.error());
    return search_checked(*checked);
  }
  /// Top-K for each of several requests, in order. Every request is checked before any runs; a bad
  /// one fails the batch, naming its place in it.
  expected<std::vector<std::vector<ScoredAd>>, Error> search_batch(std::span<const Request> requests) {
    auto checked = check_requests(schema(), model(), requests);
    if (!checked) return unexpected(checked.error());
    return search_batch_checked(*checked);
  }
  /// Top-K for a request that check_request accepted for this backend's schema and model. Errors
  /// here are the engine's (a request whose vectors overflow fp16 is found only by running it).
  virtual expected<std::vector<ScoredAd>, Error> search_checked(const CheckedRequest& request) = 0;
  /// As search_checked for each request, in order; an engine that serves a batch faster than its
  /// requests one by one overrides this. A failed search fails the batch, naming its place in it.
  virtual expected<std::vector<std::vector<ScoredAd>>, Error> search_batch_checked(std::span<const CheckedRequest> requests) {
    std::vector<std::vector<ScoredAd>> all;
    for (std::size_t r = 0; r < requests.size(); ++r) {
      auto top = search_checked(requests[r]);
      if (!top) return batch_error(r, top.error());
      all.push_back(std::move(*top));
    }
    return all;
  }
  /// Inserts or replaces ads; every later search sees all of them.
  virtual expected<void, Error> upsert(std::span<const AdRecord> ads) = 0;
  /// Applies a batch that check_ads accepted for this backend's schema; a backend that can skip
  /// checking it again overrides this (the GPU's does: a sharded pool checks each part once).
  virtual expected<void, Error> upsert_checked(const CheckedAds& ads) {
    std::vector<AdRecord> scratch;
    return upsert(ads.contiguous(scratch));
  }
  /// Expires ads by id; returns how many were live.
  virtual expected<std::size_t, Error> expire(std::span<const std::uint32_t> ids) = 0;
  /// Rebuilds whatever index speeds up searches after a bulk load (the GPU's matching postings);
  /// results never depend on it. Nothing to do on the CPU.
  virtual expected<void, Error> reindex() { return {}; }
  /// Gathers the live ads back into targeting order after updates have scattered the grouping a
  /// bulk load gave them (the GPU's DeviceAdIndex::regroup, whose scoring reads runs of eligible
  /// slots faster); results never depend on it. The CPU reference reads every slot alike: nothing
  /// to do there.
  virtual expected<void, Error> regroup() { return {}; }
  /// The kernel policy each stage serves with and where it came from (a tuning file, the defaults
  /// and why); empty for a backend that runs no tuned kernels (the CPU's). `/health` shows it.
  virtual std::string kernel_policy() const { return {}; }
};

/// The CPU backend: the reference over a HostAdPool. Searches share a lock that updates take
/// exclusively, so a search sees each update wholly or not at all.
class CpuRetrievalBackend final : public RetrievalBackend {
 public:
  /// The checks the GPU pipeline's create makes: a valid schema and model that agree on d.
  static expected<void, Error> check(const Schema& schema, const Model& model) {
    if (auto ok = validate_schema(schema); !ok) return ok;
    if (auto ok = validate_model(model); !ok) return ok;
    if (model.dim != schema.dim)
      return make_error("the model's d (" + std::to_string(model.dim) + ") is not the pool's (" +
                        std::to_string(schema.dim) + ")");
    return {};
  }
  static expected<std::unique_ptr<CpuRetrievalBackend>, Error> create(Schema schema, Model model,
                                                                     unsigned threads = default_thread_count()) {
    if (auto ok = check(schema, model); !ok) return unexpected(ok.error());
    return std::make_unique<CpuRetrievalBackend>(std::move(schema), std::move(model), threads);
  }
  /// Throws std::invalid_argument with check()'s message where `create` would return it: a schema
  /// and model that disagree would otherwise read past an ad's row.
  CpuRetrievalBackend(Schema schema, Model model, unsigned threads = default_thread_count())
      : pool_(std::move(schema)), model_(std::move(model)), threads_(std::max(1u, threads)) {
    if (auto ok = check(pool_.schema(), model_); !ok) throw std::invalid_argument(ok.error().message);
  }

  std::string name() const override { return "cpu"; }
  const Schema& schema() const override { return pool_.schema(); }
  const Model& model() const override { return model_; }

  expected<std::vector<ScoredAd>, Error> search_checked(const CheckedRequest& request) override {
    const RequestVectors vectors = compute_request_vectors(model_, request->features);
    if (auto ok = check_request_vectors(vectors); !ok) return unexpected(ok.error());
    std::shared_lock lock(mutex_);
    return reference_search(pool_, vectors, *request, threads_);
  }

  /// Every request of the batch sees the same pool: no update lands between them.
  expected<std::vector<std::vector<ScoredAd>>, Error> search_batch_checked(std::span<const CheckedRequest> requests) override {
    std::vector<RequestVectors> vectors;
    for (std::size_t r = 0; r < requests.size(); ++r) {  // every request's towers first, so a batch that fails runs nothing
      vectors.push_back(compute_request_vectors(model_, requests[r]->features));
      if (auto ok = check_request_vectors(vectors.back()); !ok) return batch_error(r, ok.error());
    }
    std::shared_lock lock(mutex_);
    std::vector<std::vector<ScoredAd>> all;
    for (std::size_t r = 0; r < requests.size(); ++r) all.push_back(reference_search(pool_, vectors[r], *requests[r], threads_));
    return all;
  }

  expected<void, Error> upsert(std::span<const AdRecord> ads) override {
    for (const AdRecord& ad : ads)  // validate all first, so a bad batch changes nothing
      if (auto ok = validate_ad(pool_.schema(), ad); !ok) return ok;
    std::unique_lock lock(mutex_);
    for (const AdRecord& ad : ads) (void)pool_.upsert(ad);
    return {};
  }

  expected<std::size_t, Error> expire(std::span<const std::uint32_t> ids) override {
    std::unique_lock lock(mutex_);
    std::size_t expired = 0;
    for (std::uint32_t id : ids) expired += pool_.expire(id) ? 1 : 0;
    return expired;
  }

 private:
  HostAdPool pool_;
  Model model_;
  unsigned threads_;
  WriterFirstSharedMutex mutex_;  // an update waits only for the searches already running
};

struct BatchingOptions {
  std::size_t max_batch = 8;  // searches per search_batch call
};

/// Answers concurrent searches in batches: a search that arrives while the engine is busy waits,
/// and is taken with whatever else arrived meanwhile (oldest first, at most max_batch) as one
/// search_batch, which an engine that reads each row once per batch serves faster. It has no
/// thread and no timer of its own: a lone search runs at once, and batches form only from
/// searches that would have queued anyway. Whichever waiting caller finds the engine idle runs
/// the oldest searches (it may run others' before its own); each caller returns once its own
/// search is answered.
/// Each search is validated on its own, so a bad request fails alone. A batch the engine fails
/// (a request whose vectors overflow fp16 is found only by running its towers) is retried one
/// search at a time, so the error reaches only the search that causes it, never another
/// caller's. Updates pass straight through (the engine orders them with searches).
class BatchingBackend final : public RetrievalBackend {
 public:
  explicit BatchingBackend(RetrievalBackend& engine, BatchingOptions options = {})
      : engine_(engine), max_batch_(std::max<std::size_t>(1, options.max_batch)) {}

  std::string name() const override { return engine_.name(); }
  std::string kernel_policy() const override { return engine_.kernel_policy(); }
  const Schema& schema() const override { return engine_.schema(); }
  const Model& model() const override { return engine_.model(); }

  expected<std::vector<ScoredAd>, Error> search_checked(const CheckedRequest& request) override {
    Waiting me{&request};
    std::unique_lock lock(mutex_);
    waiting_.push_back(&me);
    for (;;) {
      changed_.wait(lock, [&] { return me.answer.has_value() || !running_; });
      if (me.answer) return std::move(*me.answer);
      run_oldest(lock);  // may not hold `me` when more than max_batch are waiting: then wait again
    }
  }
  expected<std::vector<std::vector<ScoredAd>>, Error> search_batch_checked(std::span<const CheckedRequest> requests) override {
    return engine_.search_batch_checked(requests);
  }
  expected<void, Error> upsert(std::span<const AdRecord> ads) override { return engine_.upsert(ads); }
  expected<void, Error> upsert_checked(const CheckedAds& ads) override { return engine_.upsert_checked(ads); }
  expected<std::size_t, Error> expire(std::span<const std::uint32_t> ids) override { return engine_.expire(ids); }
  expected<void, Error> reindex() override { return engine_.reindex(); }
  expected<void, Error> regroup() override { return engine_.regroup(); }

  /// Searches waiting to be taken into a batch now.
  std::size_t waiting() const {
    std::lock_guard lock(mutex_);
    return waiting_.size();
  }
  /// Searches answered, batches formed for them, and batches the engine failed (each then retried
  /// one search at a time), since construction.
  struct Counts {
    std::size_t searches = 0, batches = 0, batches_retried = 0;
  };
  Counts counts() const {
    std::lock_guard lock(mutex_);
    return counts_;
  }

 private:
  using Answer = expected<std::vector<ScoredAd>, Error>;
  struct Waiting {
    const CheckedRequest* request;
    std::optional<Answer> answer;  // set under the lock
  };

  /// Takes the oldest waiting searches, runs them unlocked, and hands out the answers (under the
  /// lock: their callers read them there).
  void run_oldest(std::unique_lock<std::mutex>& lock) {
    running_ = true;
    const std::size_t n = std::min(max_batch_, waiting_.size());
    std::vector<Waiting*> batch(waiting_.begin(), waiting_.begin() + static_cast<std::ptrdiff_t>(n));
    waiting_.erase(waiting_.begin(), waiting_.begin() + static_cast<std::ptrdiff_t>(n));
    lock.unlock();
    bool retried = false;
    std::vector<Answer> answers = run(batch, retried);
    lock.lock();
    counts_.batches_retried += retried ? 1 : 0;
    for (std::size_t r = 0; r < n; ++r) batch[r]->answer = std::move(answers[r]);
    running_ = false;
    counts_.searches += n;
    ++counts_.batches;
    changed_.notify_all();
  }

  std::vector<Answer> run(const std::vector<Waiting*>& batch, bool& retried) {
    if (batch.size() == 1) return {run_alone(*batch[0]->request)};
    std::vector<Answer> answers;
    try {
      std::vector<CheckedRequest> requests;  // each refers to its caller's request: nothing copied
      for (const Waiting* w : batch) requests.push_back(*w->request);
      auto all = engine_.search_batch_checked(requests);
      if (all && all->size() == batch.size()) {
        for (auto& top : *all) answers.push_back(Answer(std::move(top)));
        return answers;
      }
    } catch (const std::exception&) {  // as a failed batch: each search again, alone
    }
    retried = true;
    answers.clear();
    for (const Waiting* w : batch) answers.push_back(run_alone(*w->request));
    return answers;
  }

  Answer run_alone(const CheckedRequest& request) {
    try {
      return engine_.search_checked(request);
    } catch (const std::exception& e) {  // the engine's failure is the caller's answer, not a hang
      return make_error(std::string("search failed: ") + e.what(), ErrorKind::backend);
    }
  }

  RetrievalBackend& engine_;
  std::size_t max_batch_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Waiting*> waiting_;
  bool running_ = false;
  Counts counts_;
};

}  // namespace kevo::retrieval
