// The device half of kevo-tune-pipeline, in plain C++: device_timer.cu builds the pool on the GPU
// with nvcc, main.cpp (fmt, the search, the store) calls it.
#pragma once

#include <kevo/retrieval/tuning/policies.hpp>
#include <kevo/retrieval/tuning/policy_choice.hpp>
#include <kevo/retrieval/tuning/policy_timing.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace kevo_tune {

struct DeviceTimerOptions {
  std::uint64_t ads = 100'000'000;
  int dim = 128;
  kevo::retrieval::EmbeddingType dtype = kevo::retrieval::EmbeddingType::fp16;
  std::string request_kind = "typical";  ///< typical, broad or narrow
  int k = 1000;
  int requests = 5;  ///< drawn per seed
  int repeats = 3;
  int batch = 1;     ///< 1: searches one by one; more: batches of that many
  std::uint64_t workload_seed = 1;
  std::string load_order = "id";  ///< id, or targeting (slot_order.hpp): tune on the pool order the server loads
};

/// A pool on the device and the timer over it.
class DeviceTimer {
 public:
  virtual ~DeviceTimer() = default;
  virtual kevo::retrieval::PolicyTiming time(const kevo::retrieval::PipelinePolicy& policy, std::uint64_t seed) = 0;
  virtual kevo::retrieval::DeviceIdentity device() const = 0;
  virtual kevo::retrieval::PipelinePolicy defaults() const = 0;  ///< the policy the pipeline starts with
};

/// Whether a CUDA device is here; where not, `error` says so (checked before the store is opened).
bool device_present(std::string& error);

/// Builds the pool (a minute at 100M ads); nullptr with `error` set where it cannot (no GPU, too
/// little memory, a bad option).
std::unique_ptr<DeviceTimer> make_device_timer(const DeviceTimerOptions& options, std::string& error);

}  // namespace kevo_tune
