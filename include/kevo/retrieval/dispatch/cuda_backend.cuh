// kevo/retrieval/dispatch/cuda_backend.cuh: the GPU pipeline behind the RetrievalBackend interface,
// so that a server picks the GPU where one exists and the CPU reference elsewhere.
//
//   auto gpu = CudaRetrievalBackend::create(schema, model, {.capacity = 1 << 24});
//   RetrievalBackend& backend = **gpu;
//   CudaRetrievalBackend borrowed(pipeline);  // serves a pipeline the caller owns and outlives
#pragma once

#include <memory>
#include <span>

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
  expected<std::vector<ScoredAd>, Error> search(const Request& request) override { return pipeline_->search(request); }
  expected<std::vector<std::vector<ScoredAd>>, Error> search_batch(std::span<const Request> requests) override {
    return pipeline_->search_batch(requests);
  }
  expected<void, Error> upsert(std::span<const AdRecord> ads) override { return pipeline_->index().upsert(ads); }
  expected<std::size_t, Error> expire(std::span<const std::uint32_t> ids) override {
    return pipeline_->index().expire(ids);
  }
  expected<void, Error> reindex() override { return pipeline_->index().reindex(); }
  std::string kernel_policy() const override { return pipeline_->policy_origin(); }
  FusedRetrievalPipeline& pipeline() { return *pipeline_; }

 private:
  explicit CudaRetrievalBackend(std::unique_ptr<FusedRetrievalPipeline> owned)
      : owned_(std::move(owned)), pipeline_(owned_.get()) {}
  std::unique_ptr<FusedRetrievalPipeline> owned_;  // null when the caller owns the pipeline
  FusedRetrievalPipeline* pipeline_;
};

}  // namespace kevo::retrieval
