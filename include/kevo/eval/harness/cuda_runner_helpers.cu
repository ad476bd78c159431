//! runner.cu's @helpers@ for CUDA problems: the arena is device memory, mapped here, and each
//! command ends with the whole device synchronized.
//! Lines that start with //! are not embedded (cmake/EmbedHarnessSources.cmake).

// The driver API through the runtime's entry points (see the checker).
template <class F>
F driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess) return nullptr;
  return reinterpret_cast<F>(fn);
}
#define KEVO_DRIVER(name) driver_entry<decltype(&name)>(#name)

std::string cuda_error_text(cudaError_t e) { return std::string("CUDA error ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e); }

unsigned char* map_arena(int control, int fd, std::uint64_t bytes) {
  cudaError_t e = cudaSetDevice(0);
  if (e == cudaSuccess) e = cudaFree(nullptr);
  if (e != cudaSuccess) {
    send_reply(control, reply_failed, 0, ("kevo's runner could not start CUDA: " + cuda_error_text(e)).c_str());
    return nullptr;
  }
  const auto import_handle = KEVO_DRIVER(cuMemImportFromShareableHandle);
  const auto reserve = KEVO_DRIVER(cuMemAddressReserve);
  const auto map = KEVO_DRIVER(cuMemMap);
  const auto set_access = KEVO_DRIVER(cuMemSetAccess);
  CUmemGenericAllocationHandle handle;
  CUdeviceptr mapped = 0;
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const char* step = "finding the driver's VMM entry points";
  CUresult r = !import_handle || !reserve || !map || !set_access ? CUDA_ERROR_NOT_FOUND : CUDA_SUCCESS;
  if (r == CUDA_SUCCESS) {
    step = "cuMemImportFromShareableHandle";
    r = import_handle(&handle, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  }
  if (r == CUDA_SUCCESS) {
    step = "cuMemAddressReserve";
    r = reserve(&mapped, bytes, 0, 0, 0);
  }
  if (r == CUDA_SUCCESS) {
    step = "cuMemMap";
    r = map(mapped, bytes, 0, handle, 0);
  }
  if (r == CUDA_SUCCESS) {
    step = "cuMemSetAccess";
    r = set_access(mapped, bytes, &access, 1);
  }
  if (r != CUDA_SUCCESS) {
    const std::string text = std::string("kevo's runner could not map the checker's device memory: ") + step + " returned " + std::to_string(static_cast<int>(r));
    send_reply(control, reply_failed, 0, text.c_str());
    return nullptr;
  }
  return reinterpret_cast<unsigned char*>(mapped);
}

// An empty command (the checker measuring its round trip) launches kevo's own empty kernel: the
// device then switches from the checker's context to this one, as it does for a real batch, and
// that switch (about 0.2 ms on an H200) is part of the round trip the checker takes off.
__global__ void kevo_empty_kernel() {}
void empty_command() { kevo_empty_kernel<<<1, 1>>>(); }

// Every stream and every thread's work of this context, then the first error.
std::string finish_calls() {
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : cuda_error_text(e);
}
