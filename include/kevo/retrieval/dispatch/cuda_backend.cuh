// kevo/retrieval/dispatch/cuda_backend.cuh: the GPU pipeline behind the RetrievalBackend interface,
// so that a server picks the GPU where one exists and the CPU reference elsewhere. Every call makes
// the pipeline's own GPU current on the calling thread first: a thread's current device is its own,
// and a sharded pool calls its shards, one on each GPU, from threads of its own.
//
//   auto gpu = CudaRetrievalBackend::create(schema, model, {.capacity = 1 << 24});
//   RetrievalBackend& backend = **gpu;
//   CudaRetrievalBackend borrowed(pipeline);  // serves a pipeline the caller owns and outlives
#pragma once

#include <memory>
#include <span>
#include <string>

#include "kevo/retrieval/backend.hpp"
#include "kevo/retrieval/dispatch/fused_retrieval_pipeline.cuh"

namespace kevo::retrieval {

class CudaRetrievalBackend final : public RetrievalBackend {
 public:
  static expected<std::unique_ptr<CudaRetrievalBackend>, Error> create(const Schema& schema, Model model,
                                                                       FusedRetrievalPipeline::Options options) {
    auto pipeline = FusedRetrievalPipeline::create(schema, std::move(model), options);
    if (!pipeline) return unexpected(pipeline.error());
    return std::unique_ptr<CudaRetrievalBackend>(new CudaRetrievalBackend(std::move(*pipeline)));
  }
  /// Serves through a pipeline the caller owns, and keeps alive while this backend is used (a binary
  /// that also drives the pipeline directly, such as the benchmark).
  explicit CudaRetrievalBackend(FusedRetrievalPipeline& pipeline) : pipeline_(&pipeline) {}

  std::string name() const override { return "cuda"; }
  const Schema& schema() const override { return pipeline_->schema(); }
  const Model& model() const override { return pipeline_->model(); }
  expected<std::vector<ScoredAd>, Error> search_checked(const CheckedRequest& request) override {
    if (auto ok = select_device(); !ok) return unexpected(ok.error());
    return pipeline_->search(request);
  }
  expected<std::vector<std::vector<ScoredAd>>, Error> search_batch_checked(std::span<const CheckedRequest> requests) override {
    if (auto ok = select_device(); !ok) return unexpected(ok.error());
    return pipeline_->search_batch(requests);
  }
  expected<void, Error> upsert(std::span<const AdRecord> ads) override {
    if (auto ok = select_device(); !ok) return ok;
    return pipeline_->index().upsert(ads);
  }
  expected<void, Error> upsert_checked(const CheckedAds& ads) override {
    if (auto ok = select_device(); !ok) return ok;
    return pipeline_->index().upsert(ads);
  }
  expected<std::size_t, Error> expire(std::span<const std::uint32_t> ids) override {
    if (auto ok = select_device(); !ok) return unexpected(ok.error());
    return pipeline_->index().expire(ids);
  }
  expected<void, Error> reindex() override {
    if (auto ok = select_device(); !ok) return ok;
    return pipeline_->index().reindex();
  }
  expected<void, Error> regroup() override {
    if (auto ok = select_device(); !ok) return ok;
    auto regrouped = pipeline_->index().regroup();
    if (!regrouped) return unexpected(regrouped.error());
    return {};
  }
  std::string kernel_policy() const override { return pipeline_->policy_origin(); }
  FusedRetrievalPipeline& pipeline() { return *pipeline_; }

 private:
  explicit CudaRetrievalBackend(std::unique_ptr<FusedRetrievalPipeline> owned)
      : owned_(std::move(owned)), pipeline_(owned_.get()) {}
  expected<void, Error> select_device() const {
    const int device = pipeline_->device();
    return gpu_check(gpu_set_device(device), ("cannot make GPU " + std::to_string(device) + " current").c_str());
  }
  std::unique_ptr<FusedRetrievalPipeline> owned_;  // null when the caller owns the pipeline
  FusedRetrievalPipeline* pipeline_;
};

}  // namespace kevo::retrieval
