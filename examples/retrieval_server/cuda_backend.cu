// The retrieval server's GPU backend, compiled by nvcc apart from the Beast code (see retrieval_server.cpp).
#include <kevo/retrieval/dispatch/cuda_backend.cuh>

#include <utility>

#include "cuda_backend.hpp"

namespace kevo::retrieval {

namespace {

/// A GPU engine that stays on its device: the pipeline works on whichever device is current when it
/// is called (it sets none itself), and the current device is per host thread, so every call makes
/// `device_` current first.
class OnDevice final : public RetrievalBackend {
 public:
  OnDevice(int device, std::unique_ptr<RetrievalBackend> engine) : device_(device), engine_(std::move(engine)) {}

  std::string name() const override { return engine_->name(); }
  std::string kernel_policy() const override { return engine_->kernel_policy(); }
  const Schema& schema() const override { return engine_->schema(); }
  const Model& model() const override { return engine_->model(); }
  expected<std::vector<ScoredAd>, Error> search(const Request& request) override {
    if (auto ok = select(); !ok) return unexpected(ok.error());
    return engine_->search(request);
  }
  expected<std::vector<std::vector<ScoredAd>>, Error> search_batch(std::span<const Request> requests) override {
    if (auto ok = select(); !ok) return unexpected(ok.error());
    return engine_->search_batch(requests);
  }
  expected<void, Error> upsert(std::span<const AdRecord> ads) override {
    if (auto ok = select(); !ok) return ok;
    return engine_->upsert(ads);
  }
  expected<std::size_t, Error> expire(std::span<const std::uint32_t> ids) override {
    if (auto ok = select(); !ok) return unexpected(ok.error());
    return engine_->expire(ids);
  }
  expected<void, Error> reindex() override {
    if (auto ok = select(); !ok) return ok;
    return engine_->reindex();
  }

 private:
  expected<void, Error> select() const {
    return gpu_check(gpu_set_device(device_), ("cannot make GPU " + std::to_string(device_) + " current").c_str());
  }
  int device_;
  std::unique_ptr<RetrievalBackend> engine_;
};

}  // namespace

std::unique_ptr<RetrievalBackend> make_cuda_backend(const Schema& schema, const Model& model, std::size_t capacity,
                                                    PolicyChooser choose_policy, std::string& why) {
  if (gpu_device_count() == 0) {
    why = "no GPU on this machine";
    return nullptr;
  }
  auto backend = CudaRetrievalBackend::create(schema, model, {.capacity = capacity, .choose_policy = std::move(choose_policy)});
  if (!backend) {
    why = backend.error().message;
    return nullptr;
  }
  return std::move(*backend);
}

std::unique_ptr<RetrievalBackend> make_cuda_backend_on(int device, const Schema& schema, const Model& model,
                                                       std::size_t capacity, PolicyChooser choose_policy, std::string& why) {
  const int count = gpu_device_count();
  if (device < 0 || device >= count) {
    why = "no GPU " + std::to_string(device) + " on this machine (it has " + std::to_string(count) + ")";
    return nullptr;
  }
  if (auto current = gpu_check(gpu_set_device(device), ("cannot make GPU " + std::to_string(device) + " current").c_str()); !current) {
    why = current.error().message;  // the pipeline is created on the current device
    return nullptr;
  }
  auto engine = make_cuda_backend(schema, model, capacity, std::move(choose_policy), why);
  if (!engine) return nullptr;
  return std::make_unique<OnDevice>(device, std::move(engine));
}

int cuda_device_count() { return gpu_device_count(); }

}  // namespace kevo::retrieval
