// kevo/retrieval/portability.cuh: the one place that names the GPU runtime, so that a HIP build
// can follow by filling in the other branch. Everything else says gpu_* and KEVO_GPU_*.
//
//   kevo::retrieval::gpu_stream_t stream;
//   KEVO_GPU_TRY(gpu_stream_create(&stream));   // returns kevo::Error from the enclosing function
#pragma once

#include <string>

#include "kevo/expected.hpp"

#if defined(__HIPCC__)
#error "kevo retrieval: the HIP branch of portability.cuh is not written yet (a later issue)"
#else
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cub/cub.cuh>
#endif

namespace kevo::retrieval {

using gpu_error_t = cudaError_t;
using gpu_stream_t = cudaStream_t;
using gpu_event_t = cudaEvent_t;
inline constexpr gpu_error_t gpu_success = cudaSuccess;
namespace gpu_cub = ::cub;

inline const char* gpu_error_string(gpu_error_t e) { return cudaGetErrorString(e); }

/// Turns a runtime error code into kevo::Error, naming the call.
inline expected<void, Error> gpu_check(gpu_error_t e, const char* what) {
  if (e == gpu_success) return {};
  return make_error(std::string(what) + ": " + gpu_error_string(e));
}

/// Number of GPUs; 0 where the runtime finds none (or no driver).
inline int gpu_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace kevo::retrieval

/// Returns a kevo::Error from the enclosing function when a runtime call fails.
#define KEVO_GPU_TRY(call)                                                                    \
  do {                                                                                        \
    if (auto kevo_gpu_status = ::kevo::retrieval::gpu_check((call), #call); !kevo_gpu_status) \
      return ::kevo::unexpected(kevo_gpu_status.error());                                     \
  } while (0)

/// Aborts on a runtime failure where no error can be returned (destructors, tests' setup).
#define KEVO_GPU_ASSERT(call)                                                                       \
  do {                                                                                              \
    ::kevo::retrieval::gpu_error_t kevo_gpu_status = (call);                                        \
    if (kevo_gpu_status != ::kevo::retrieval::gpu_success) {                                        \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                                 \
              ::kevo::retrieval::gpu_error_string(kevo_gpu_status));                                \
      abort();                                                                                      \
    }                                                                                               \
  } while (0)
