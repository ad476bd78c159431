// The retrieval server's GPU backend, compiled by nvcc apart from the Beast code (see retrieval_server.cpp).
#include <kevo/retrieval/dispatch/cuda_backend.cuh>

#include <string>
#include <utility>

#include "cuda_backend.hpp"

namespace kevo::retrieval {

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
  return make_cuda_backend(schema, model, capacity, std::move(choose_policy), why);  // stays on `device` (cuda_backend.cuh)
}

int cuda_device_count() { return gpu_device_count(); }

}  // namespace kevo::retrieval
