// kevo/gpu_presence.hpp: whether an NVIDIA driver and at least one device are here, asked
// before any work that needs them (a cuda problem's compiles, a GPU benchmark), without linking CUDA.
//
//   if (auto here = kevo::nvidia_device_present(); !here) return fail(here.error().message, 2);
//   // "no NVIDIA driver or device here: cuda problems need one (no libcuda.so.1)"
#pragma once

#include <kevo/expected.hpp>

#include <string>

#include <dlfcn.h>  // in libc itself since glibc 2.34; kevo::core links ${CMAKE_DL_LIBS} for older ones

namespace kevo {

/// The stop's own words, for those that check for it.
inline constexpr const char* no_nvidia_device_message = "no NVIDIA driver or device here: cuda problems need one";

/// The driver API through dlopen, not a link against libcuda: host-only programs stay free of CUDA,
/// and libcuda's stub clashes with the static CUDA runtime (see harness/cuda_checker.cu). The library
/// stays loaded (a CUDA program here loads the same one anyway). The detail in parentheses says which
/// step failed: no libcuda.so.1, cuInit's error, or no device.
inline expected<void, Error> nvidia_device_present() {
  // No fmt here: nvcc compiles this header too (the retrieval benchmark), and rejects fmt's compile-time format strings.
  auto stop = [](const std::string& detail) { return make_error(std::string(no_nvidia_device_message) + " (" + detail + ")", ErrorKind::backend); };
  void* cuda = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!cuda) return stop("no libcuda.so.1");
  using Init = int (*)(unsigned);              // CUresult cuInit(unsigned int flags)
  using DeviceCount = int (*)(int*);           // CUresult cuDeviceGetCount(int* count)
  using ErrorName = int (*)(int, const char**);  // CUresult cuGetErrorName(CUresult, const char**)
  auto init = reinterpret_cast<Init>(::dlsym(cuda, "cuInit"));
  auto device_count = reinterpret_cast<DeviceCount>(::dlsym(cuda, "cuDeviceGetCount"));
  auto error_name = reinterpret_cast<ErrorName>(::dlsym(cuda, "cuGetErrorName"));
  if (!init || !device_count) return stop("libcuda.so.1 lacks cuInit or cuDeviceGetCount");
  if (const int status = init(0); status != 0) {
    const char* name = nullptr;
    if (!error_name || error_name(status, &name) != 0 || !name) name = "an unnamed error";
    return stop("cuInit: " + std::string(name) + " (" + std::to_string(status) + ")");  // e.g. CUDA_ERROR_NO_DEVICE (100)
  }
  int devices = 0;
  if (device_count(&devices) != 0 || devices <= 0) return stop("0 devices");
  return {};
}

}  // namespace kevo
