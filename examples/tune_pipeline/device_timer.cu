// The device half of kevo-tune-pipeline: a synthetic pool of the workload on the GPU and the
// timer over it (kevo/retrieval/tuning/pipeline_bench.cuh).
#include "device_timer.hpp"

#include "kevo/retrieval/tuning/pipeline_bench.cuh"

namespace kevo_tune {
namespace {

using namespace kevo::retrieval;

class PoolTimer final : public DeviceTimer {
 public:
  PoolTimer(std::unique_ptr<Workload> workload, SyntheticPool pool, PipelinePolicyTimer::Options options, DeviceIdentity device)
      : workload_(std::move(workload)), timer_(std::move(pool), *workload_, options), device_(std::move(device)) {}
  PolicyTiming time(const PipelinePolicy& policy, std::uint64_t seed) override { return timer_.time(policy, seed); }
  DeviceIdentity device() const override { return device_; }
  PipelinePolicy defaults() const override { return defaults_; }
  void set_defaults(const PipelinePolicy& p) { defaults_ = p; }

 private:
  std::unique_ptr<Workload> workload_;  // the timer draws its requests from it
  PipelinePolicyTimer timer_;
  DeviceIdentity device_;
  PipelinePolicy defaults_;
};

}  // namespace

bool device_present(std::string& error) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) return true;
  error = "no CUDA device here: kevo-tune-pipeline times the pipeline on a GPU";
  return false;
}

std::unique_ptr<DeviceTimer> make_device_timer(const DeviceTimerOptions& o, std::string& error) {
  if (!device_present(error)) return nullptr;
  RequestKind kind = RequestKind::typical;
  if (o.request_kind == "broad") kind = RequestKind::broad;
  else if (o.request_kind == "narrow") kind = RequestKind::narrow;
  else if (o.request_kind != "typical") {
    error = "requests '" + o.request_kind + "' are not typical, broad or narrow";
    return nullptr;
  }
  DeviceIdentity device;
  if (gpu_device_name(&device.gpu, 0) != cudaSuccess || gpu_runtime_version(&device.cuda) != cudaSuccess) {
    error = "cannot read the device's name or the CUDA runtime's version";
    return nullptr;
  }
  auto workload = std::make_unique<Workload>(WorkloadOptions{
      .seed = o.workload_seed, .dim = o.dim, .embedding_type = o.dtype});
  const SlotOrder order = slot_order_named(o.load_order).value_or(SlotOrder::by_id);  // checked by the command line
  auto pool = build_synthetic_pool(*workload, o.ads, 99, nullptr, 8, order);
  if (!pool) {
    error = "building a pool of " + std::to_string(o.ads) + " ads: " + pool.error().message;
    return nullptr;
  }
  const PipelinePolicy defaults = pool->pipeline->policy();
  auto timer = std::make_unique<PoolTimer>(std::move(workload), std::move(*pool),
                                           PipelinePolicyTimer::Options{.kind = kind, .k = o.k, .requests = o.requests, .repeats = o.repeats,
                                                                        .batch = o.batch},
                                           device);
  timer->set_defaults(defaults);
  return timer;
}

}  // namespace kevo_tune
