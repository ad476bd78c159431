// kevo/retrieval/backend.hpp: what a serving binary needs from a retrieval engine, and the CPU
// backend that runs the reference on machines without a GPU. A GPU backend (cuda_backend.cuh)
// models the same interface, so a server picks one at start-up.
//
//   CpuRetrievalBackend cpu(schema, model);
//   cpu.upsert(ads);
//   expected<std::vector<ScoredAd>, Error> top = cpu.search(request);
#pragma once

#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

#include "kevo/retrieval/ad_pool.hpp"
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
  /// Top-K for one request; bad requests come back as errors with a message for the caller.
  virtual expected<std::vector<ScoredAd>, Error> search(const Request& request) = 0;
  /// Top-K for each of several requests, in order; an engine that serves a batch faster than its
  /// requests one by one overrides this. A bad request fails the batch, naming its place in it.
  virtual expected<std::vector<std::vector<ScoredAd>>, Error> search_batch(std::span<const Request> requests) {
    std::vector<std::vector<ScoredAd>> all;
    for (std::size_t r = 0; r < requests.size(); ++r) {
      auto top = search(requests[r]);
      if (!top) return batch_error(r, top.error());
      all.push_back(std::move(*top));
    }
    return all;
  }
  /// Inserts or replaces ads; every later search sees all of them.
  virtual expected<void, Error> upsert(std::span<const AdRecord> ads) = 0;
  /// Expires ads by id; returns how many were live.
  virtual expected<std::size_t, Error> expire(std::span<const std::uint32_t> ids) = 0;
  /// Rebuilds whatever index speeds up searches after a bulk load (the GPU's matching postings);
  /// results never depend on it. Nothing to do on the CPU.
  virtual expected<void, Error> reindex() { return {}; }
};

/// The CPU backend: the reference over a HostAdPool. Searches share a lock that updates take
/// exclusively, so a search sees each update wholly or not at all.
class CpuRetrievalBackend final : public RetrievalBackend {
 public:
  CpuRetrievalBackend(Schema schema, Model model, unsigned threads = default_thread_count())
      : pool_(std::move(schema)), model_(std::move(model)), threads_(threads) {}

  std::string name() const override { return "cpu"; }
  const Schema& schema() const override { return pool_.schema(); }
  const Model& model() const override { return model_; }

  expected<std::vector<ScoredAd>, Error> search(const Request& request) override {
    if (auto ok = validate_request(pool_.schema(), model_, request); !ok) return unexpected(ok.error());
    const RequestVectors vectors = compute_request_vectors(model_, request.features);
    std::shared_lock lock(mutex_);
    return reference_search(pool_, vectors, request, threads_);
  }

  /// Every request of the batch sees the same pool: no update lands between them.
  expected<std::vector<std::vector<ScoredAd>>, Error> search_batch(std::span<const Request> requests) override {
    std::vector<RequestVectors> vectors;
    for (std::size_t r = 0; r < requests.size(); ++r) {  // validate all first, so a bad batch runs nothing
      if (auto ok = validate_request(pool_.schema(), model_, requests[r]); !ok)
        return batch_error(r, ok.error());
      vectors.push_back(compute_request_vectors(model_, requests[r].features));
    }
    std::shared_lock lock(mutex_);
    std::vector<std::vector<ScoredAd>> all;
    for (std::size_t r = 0; r < requests.size(); ++r) all.push_back(reference_search(pool_, vectors[r], requests[r], threads_));
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
  std::shared_mutex mutex_;
};

}  // namespace kevo::retrieval
