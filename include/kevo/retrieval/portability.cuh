// kevo/retrieval/portability.cuh: with device_intrinsics.cuh, the one place that names the GPU
// runtime, for CUDA (nvcc) and HIP on AMD (hipcc; KEVO_GPU_AMD, set there). The library's other
// headers say gpu_* and KEVO_GPU_* for the runtime, gpu_cub for CUB's algorithms (rocPRIM behind
// CUB's names on AMD: kevo/retrieval/rocprim_cub.cuh), and device_intrinsics.cuh's gpu_* for warp
// intrinsics and inline PTX. Where AMD lacks a feature (programmatic dependent launch) the HIP
// branch takes the plain path, said beside it.
//
//   kevo::retrieval::gpu_stream_t stream;
//   KEVO_GPU_TRY(gpu_stream_create(&stream));   // returns kevo::Error from the enclosing function
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#include <algorithm>

#include "kevo/expected.hpp"
#include "kevo/retrieval/device_intrinsics.cuh"

#if KEVO_GPU_AMD
#include <hip/hip_cooperative_groups.h>
#include "kevo/retrieval/rocprim_cub.cuh"
#else
#include <cooperative_groups.h>
#include <cub/cub.cuh>
#endif

namespace kevo::retrieval {

#if KEVO_GPU_AMD
using gpu_error_t = hipError_t;
using gpu_stream_t = hipStream_t;
using gpu_event_t = hipEvent_t;
inline constexpr gpu_error_t gpu_success = hipSuccess;
inline constexpr gpu_error_t gpu_error_out_of_memory = hipErrorOutOfMemory;
using gpu_device_properties_t = hipDeviceProp_t;
using gpu_function_attributes_t = hipFuncAttributes;
namespace gpu_cub = ::kevo::retrieval::rocprim_cub;
inline const char* gpu_error_string(gpu_error_t e) { return hipGetErrorString(e); }
#else
using gpu_error_t = cudaError_t;
using gpu_stream_t = cudaStream_t;
using gpu_event_t = cudaEvent_t;
inline constexpr gpu_error_t gpu_success = cudaSuccess;
inline constexpr gpu_error_t gpu_error_out_of_memory = cudaErrorMemoryAllocation;
using gpu_device_properties_t = cudaDeviceProp;
using gpu_function_attributes_t = cudaFuncAttributes;
namespace gpu_cub = ::cub;
inline const char* gpu_error_string(gpu_error_t e) { return cudaGetErrorString(e); }
#endif

/// Turns a runtime error code into kevo::Error, naming the call.
inline expected<void, Error> gpu_check(gpu_error_t e, const char* what) {
  if (e == gpu_success) return {};
  return make_error(std::string(what) + ": " + gpu_error_string(e),
                    e == gpu_error_out_of_memory ? ErrorKind::capacity : ErrorKind::backend);
}

// ---- host runtime ------------------------------------------------------------------------------
// One wrapper per runtime call the library makes, so that the HIP branch maps each to its hip*
// twin in one place. Copies name no direction: unified addressing tells the runtime (both
// runtimes' "default" kind). Streams are non-blocking and events untimed, the only kinds used.

#if KEVO_GPU_AMD
// HIP on AMD: each wrapper's hip* twin, in the order of the CUDA branch below.
template <class T>
gpu_error_t gpu_malloc(T** pointer, std::size_t bytes) { return hipMalloc(reinterpret_cast<void**>(pointer), bytes); }
inline gpu_error_t gpu_free(void* pointer) { return hipFree(pointer); }
template <class T>
gpu_error_t gpu_malloc_host(T** pointer, std::size_t bytes) {
  return hipHostMalloc(reinterpret_cast<void**>(pointer), bytes, hipHostMallocDefault);
}
inline gpu_error_t gpu_free_host(void* pointer) { return hipHostFree(pointer); }
inline gpu_error_t gpu_copy(void* dst, const void* src, std::size_t bytes) {
  return hipMemcpy(dst, src, bytes, hipMemcpyDefault);
}
inline gpu_error_t gpu_copy_async(void* dst, const void* src, std::size_t bytes, gpu_stream_t stream) {
  return hipMemcpyAsync(dst, src, bytes, hipMemcpyDefault, stream);
}
inline gpu_error_t gpu_memset(void* dst, int value, std::size_t bytes) { return hipMemset(dst, value, bytes); }
inline gpu_error_t gpu_memset_async(void* dst, int value, std::size_t bytes, gpu_stream_t stream) {
  return hipMemsetAsync(dst, value, bytes, stream);
}
inline gpu_error_t gpu_last_error() { return hipGetLastError(); }
inline gpu_error_t gpu_stream_create(gpu_stream_t* stream) { return hipStreamCreateWithFlags(stream, hipStreamNonBlocking); }
inline gpu_error_t gpu_stream_destroy(gpu_stream_t stream) { return hipStreamDestroy(stream); }
inline gpu_error_t gpu_stream_synchronize(gpu_stream_t stream) { return hipStreamSynchronize(stream); }
inline gpu_error_t gpu_stream_wait_event(gpu_stream_t stream, gpu_event_t event) { return hipStreamWaitEvent(stream, event, 0); }
inline gpu_error_t gpu_event_create(gpu_event_t* event) { return hipEventCreateWithFlags(event, hipEventDisableTiming); }
inline gpu_error_t gpu_event_destroy(gpu_event_t event) { return hipEventDestroy(event); }
inline gpu_error_t gpu_event_record(gpu_event_t event, gpu_stream_t stream) { return hipEventRecord(event, stream); }
inline gpu_error_t gpu_event_synchronize(gpu_event_t event) { return hipEventSynchronize(event); }
inline gpu_error_t gpu_device_synchronize() { return hipDeviceSynchronize(); }
inline gpu_error_t gpu_current_device(int* device) { return hipGetDevice(device); }
inline gpu_error_t gpu_set_device(int device) { return hipSetDevice(device); }
inline gpu_error_t gpu_multiprocessor_count(int* count, int device) {
  return hipDeviceGetAttribute(count, hipDeviceAttributeMultiprocessorCount, device);
}
/// AMD has no opt-in beyond the per-block limit (its LDS): that limit is the most one block gets.
inline gpu_error_t gpu_max_shared_memory_optin(int* bytes, int device) {
  return hipDeviceGetAttribute(bytes, hipDeviceAttributeMaxSharedMemoryPerBlock, device);
}
template <class Kernel>
gpu_error_t gpu_resident_blocks(int* blocks, Kernel* kernel, int threads, std::size_t dynamic_shared) {
  return hipOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, threads, dynamic_shared);
}
inline gpu_error_t gpu_function_attributes(gpu_function_attributes_t* attributes, const void* kernel) {
  return hipFuncGetAttributes(attributes, kernel);
}
inline gpu_error_t gpu_allow_dynamic_shared(const void* kernel, int bytes) {
  return hipFuncSetAttribute(kernel, hipFuncAttributeMaxDynamicSharedMemorySize, bytes);
}
inline gpu_error_t gpu_device_properties(gpu_device_properties_t* properties, int device) {
  return hipGetDeviceProperties(properties, device);
}
/// HIP's version is major * 10^7 + minor * 10^5 + patch: "5.2" for HIP 5.2.
inline gpu_error_t gpu_runtime_version(std::string* version) {
  int v = 0;
  const gpu_error_t e = hipRuntimeGetVersion(&v);
  if (e == hipSuccess) *version = std::to_string(v / 10000000) + "." + std::to_string(v / 100000 % 100);
  return e;
}
inline gpu_error_t gpu_get_device_count(int* count) { return hipGetDeviceCount(count); }

namespace detail {
/// An ordinary launch, or a cooperative one (which takes its arguments as an array of pointers).
/// `after_prior` has no AMD counterpart (no programmatic dependent launch): the launch waits for the
/// grid before it by stream order, and gpu_wait_for_prior_grid() returns at once.
template <class... Params, class... Args>
gpu_error_t launch(bool after_prior, bool cooperative, void (*kernel)(Params...), dim3 grid, dim3 block,
                   std::size_t dynamic_shared, gpu_stream_t stream, Args&&... args) {
  (void)after_prior;
  if (!cooperative) {
    kernel<<<grid, block, dynamic_shared, stream>>>(std::forward<Args>(args)...);
    return hipGetLastError();
  }
  std::tuple<Params...> values{std::forward<Args>(args)...};
  return std::apply(
      [&](auto&... value) {
        void* pointers[] = {static_cast<void*>(&value)..., nullptr};
        return hipLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), grid, block, pointers,
                                          static_cast<unsigned>(dynamic_shared), stream);
      },
      values);
}
}  // namespace detail
#else
template <class T>
gpu_error_t gpu_malloc(T** pointer, std::size_t bytes) { return cudaMalloc(reinterpret_cast<void**>(pointer), bytes); }
inline gpu_error_t gpu_free(void* pointer) { return cudaFree(pointer); }
/// Page-locked host memory, which asynchronous copies need to stay asynchronous.
template <class T>
gpu_error_t gpu_malloc_host(T** pointer, std::size_t bytes) { return cudaMallocHost(reinterpret_cast<void**>(pointer), bytes); }
inline gpu_error_t gpu_free_host(void* pointer) { return cudaFreeHost(pointer); }
inline gpu_error_t gpu_copy(void* dst, const void* src, std::size_t bytes) {
  return cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
}
inline gpu_error_t gpu_copy_async(void* dst, const void* src, std::size_t bytes, gpu_stream_t stream) {
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream);
}
inline gpu_error_t gpu_memset(void* dst, int value, std::size_t bytes) { return cudaMemset(dst, value, bytes); }
inline gpu_error_t gpu_memset_async(void* dst, int value, std::size_t bytes, gpu_stream_t stream) {
  return cudaMemsetAsync(dst, value, bytes, stream);
}
/// The error of the last launch (and clears it).
inline gpu_error_t gpu_last_error() { return cudaGetLastError(); }
inline gpu_error_t gpu_stream_create(gpu_stream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking); }
inline gpu_error_t gpu_stream_destroy(gpu_stream_t stream) { return cudaStreamDestroy(stream); }
inline gpu_error_t gpu_stream_synchronize(gpu_stream_t stream) { return cudaStreamSynchronize(stream); }
/// Work enqueued on `stream` after this waits for `event`'s last record.
inline gpu_error_t gpu_stream_wait_event(gpu_stream_t stream, gpu_event_t event) { return cudaStreamWaitEvent(stream, event, 0); }
inline gpu_error_t gpu_event_create(gpu_event_t* event) { return cudaEventCreateWithFlags(event, cudaEventDisableTiming); }
inline gpu_error_t gpu_event_destroy(gpu_event_t event) { return cudaEventDestroy(event); }
inline gpu_error_t gpu_event_record(gpu_event_t event, gpu_stream_t stream) { return cudaEventRecord(event, stream); }
inline gpu_error_t gpu_event_synchronize(gpu_event_t event) { return cudaEventSynchronize(event); }
inline gpu_error_t gpu_device_synchronize() { return cudaDeviceSynchronize(); }
inline gpu_error_t gpu_current_device(int* device) { return cudaGetDevice(device); }
inline gpu_error_t gpu_set_device(int device) { return cudaSetDevice(device); }
inline gpu_error_t gpu_multiprocessor_count(int* count, int device) {
  return cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device);
}
/// The most shared memory one block may ask for once allowed (gpu_allow_dynamic_shared).
inline gpu_error_t gpu_max_shared_memory_optin(int* bytes, int device) {
  return cudaDeviceGetAttribute(bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
}
/// How many blocks of `kernel` fit on one multiprocessor at once (0: it cannot launch).
template <class Kernel>
gpu_error_t gpu_resident_blocks(int* blocks, Kernel* kernel, int threads, std::size_t dynamic_shared) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, threads, dynamic_shared);
}
inline gpu_error_t gpu_function_attributes(gpu_function_attributes_t* attributes, const void* kernel) {
  return cudaFuncGetAttributes(attributes, kernel);
}
/// Lets `kernel` (a __global__ function's address) take up to `bytes` of dynamic shared memory,
/// past the default 48 KB.
inline gpu_error_t gpu_allow_dynamic_shared(const void* kernel, int bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

inline gpu_error_t gpu_device_properties(gpu_device_properties_t* properties, int device) {
  return cudaGetDeviceProperties(properties, device);
}
/// The runtime's version ("13.0"), with the device's name what a tuning file is keyed by.
inline gpu_error_t gpu_runtime_version(std::string* version) {
  int v = 0;
  const gpu_error_t e = cudaRuntimeGetVersion(&v);
  if (e == cudaSuccess) *version = std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  return e;
}

inline gpu_error_t gpu_get_device_count(int* count) { return cudaGetDeviceCount(count); }

namespace detail {
/// cudaLaunchKernelEx, as a programmatic dependent and cooperative where asked.
template <class... Params, class... Args>
gpu_error_t launch(bool after_prior, bool cooperative, void (*kernel)(Params...), dim3 grid, dim3 block,
                   std::size_t dynamic_shared, gpu_stream_t stream, Args&&... args) {
  cudaLaunchAttribute attributes[2]{};
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = after_prior ? 1 : 0;
  attributes[1].id = cudaLaunchAttributeCooperative;
  attributes[1].val.cooperative = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = dynamic_shared;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = cooperative ? 2 : 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}
}  // namespace detail
#endif

// ---- built on the wrappers above, alike for both runtimes ---------------------------------------

/// The static shared memory `kernel` was compiled with (its __shared__ variables, as the compiler
/// laid them out), or 0 where the runtime cannot say.
template <class Kernel>
std::size_t gpu_static_shared_bytes(Kernel* kernel) {
  gpu_function_attributes_t attributes{};
  if (gpu_function_attributes(&attributes, reinterpret_cast<const void*>(kernel)) != gpu_success) return 0;
  return attributes.sharedSizeBytes;
}

/// The device's name ("NVIDIA H200"): with the runtime's version, what a tuning file is keyed by.
inline gpu_error_t gpu_device_name(std::string* name, int device) {
  gpu_device_properties_t properties{};
  const gpu_error_t e = gpu_device_properties(&properties, device);
  if (e == gpu_success) *name = properties.name;
  return e;
}

/// Number of GPUs; 0 where the runtime finds none (or no driver).
inline int gpu_device_count() {
  int n = 0;
  if (gpu_get_device_count(&n) != gpu_success) {
    (void)gpu_last_error();
    return 0;
  }
  return n;
}

/// Launches `kernel` as a programmatic dependent of the kernel before it on `stream` (Hopper): the
/// grid is scheduled while that one drains, instead of after, and must call
/// gpu_wait_for_prior_grid() before it touches memory. Saves the gap between dependent launches.
template <class... Params, class... Args>
gpu_error_t gpu_launch_after_prior(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t dynamic_shared,
                                   gpu_stream_t stream, Args&&... args) {
  return detail::launch(true, false, kernel, grid, block, dynamic_shared, stream, std::forward<Args>(args)...);
}

/// gpu_launch_after_prior where `after_prior`, else an ordinary launch: for a policy knob that
/// chooses between them. The kernel calls gpu_wait_for_prior_grid() either way.
template <class... Params, class... Args>
gpu_error_t gpu_launch_after_prior_if(bool after_prior, void (*kernel)(Params...), dim3 grid, dim3 block,
                                      std::size_t dynamic_shared, gpu_stream_t stream, Args&&... args) {
  return detail::launch(after_prior, false, kernel, grid, block, dynamic_shared, stream, std::forward<Args>(args)...);
}

/// As gpu_launch_after_prior, for a kernel that calls gpu_grid_sync(): the launch is cooperative,
/// so the runtime refuses a grid larger than can be resident at once, where a barrier would hang.
template <class... Params, class... Args>
gpu_error_t gpu_launch_cooperative_after_prior(void (*kernel)(Params...), dim3 grid, dim3 block,
                                               std::size_t dynamic_shared, gpu_stream_t stream, Args&&... args) {
  return detail::launch(true, true, kernel, grid, block, dynamic_shared, stream, std::forward<Args>(args)...);
}

/// A barrier of every thread of the grid, in a kernel launched by gpu_launch_cooperative_after_prior;
/// what each thread wrote before it is visible to all after it.
__device__ __forceinline__ void gpu_grid_sync() { cooperative_groups::this_grid().sync(); }

/// Long-lived allocations owned by one object (the index's arrays, the pipeline's weights): freed
/// with their owner, moved with it, never copied (std::unique_ptr with the runtime's free).
struct GpuFree {
  void operator()(void* p) const { (void)gpu_free(p); }
};
struct GpuFreeHost {
  void operator()(void* p) const { (void)gpu_free_host(p); }
};
template <class T>
using DeviceBuffer = std::unique_ptr<T, GpuFree>;
template <class T>
using PinnedBuffer = std::unique_ptr<T, GpuFreeHost>;  // page-locked host memory

/// Replaces what `out` owns with `bytes` of device memory (a DeviceBuffer) or of page-locked host
/// memory (a PinnedBuffer); nothing changes where the allocation fails.
template <class T, class Free>
gpu_error_t gpu_allocate(std::unique_ptr<T, Free>& out, std::size_t bytes) {
  static_assert(std::is_same_v<Free, GpuFree> || std::is_same_v<Free, GpuFreeHost>);
  T* p = nullptr;
  const gpu_error_t e = std::is_same_v<Free, GpuFreeHost> ? gpu_malloc_host(&p, bytes) : gpu_malloc(&p, bytes);
  if (e != gpu_success) return e;
  out.reset(p);
  return gpu_success;
}

/// Device allocations that live for one host function (an index rebuild's temporaries): each
/// `allocate` is freed when the scratch goes out of scope, whichever way the function returns.
class GpuScratch {
 public:
  GpuScratch() = default;
  GpuScratch(const GpuScratch&) = delete;
  GpuScratch& operator=(const GpuScratch&) = delete;
  ~GpuScratch() {
    for (void* p : owned_) (void)gpu_free(p);
  }
  template <class T>
  gpu_error_t allocate(T*& out, std::size_t count) {
    void* p = nullptr;
    if (gpu_error_t e = gpu_malloc(&p, std::max<std::size_t>(count, 1) * sizeof(T)); e != gpu_success) return e;
    owned_.push_back(p);
    out = static_cast<T*>(p);
    return gpu_success;
  }
  /// Hands one allocation over to the caller, who frees it.
  void release(const void* p) { std::erase(owned_, p); }
  /// Takes one allocation over, to be freed with the rest.
  void adopt(void* p) { owned_.push_back(p); }

 private:
  std::vector<void*> owned_;
};

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
