// The retrieval server's GPU backend, compiled by nvcc apart from the Beast code (see retrieval_server.cpp).
#include <kevo/retrieval/dispatch/cuda_backend.cuh>

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

}  // namespace kevo::retrieval
