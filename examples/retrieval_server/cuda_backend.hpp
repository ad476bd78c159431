// The retrieval server's GPU backend as host code sees it (cuda_backend.cu defines it): retrieval_server
// and the server's tests (tests/support/serving_client.hpp, KEVO_SERVER_TEST_BACKEND=gpu) link it.
#pragma once

#include <kevo/retrieval/backend.hpp>
#include <kevo/retrieval/tuning/policy_choice.hpp>

#include <cstddef>
#include <memory>
#include <string>

namespace kevo::retrieval {

/// The GPU backend with room for `capacity` ads, or nullptr with the reason in `why` (no GPU, no memory).
std::unique_ptr<RetrievalBackend> make_cuda_backend(const Schema& schema, const Model& model, std::size_t capacity,
                                                    PolicyChooser choose_policy, std::string& why);

/// As make_cuda_backend, on GPU `device`: the engine is created there, and every later call (from any
/// thread: a sharded pool calls its shards from threads of its own) makes `device` the calling
/// thread's current device first. Null, with `why`, where `device` is not one of this machine's GPUs.
std::unique_ptr<RetrievalBackend> make_cuda_backend_on(int device, const Schema& schema, const Model& model,
                                                       std::size_t capacity, PolicyChooser choose_policy, std::string& why);

/// How many GPUs this machine has (0: none, or no driver).
int cuda_device_count();

}  // namespace kevo::retrieval
