//! checker.cu's body, its last part, for CUDA problems (the rest as for checker.cpp): device
//! memory, inputs, checks and clock all on the device, and main(). It closes the namespace.
//! Lines that start with //! are not embedded (cmake/EmbedHarnessSources.cmake).

#include <cuda.h>
#include <cuda_runtime.h>

// The checker's own CUDA calls: a failure here is kevo's or the device's, not the candidate's.
#define KEVO_CUDA_OK(call)                                                                                   \
  do {                                                                                                       \
    const cudaError_t status_ = (call);                                                                      \
    if (status_ != cudaSuccess) report_status("sandbox_error", std::string("the checker's ") + #call + " failed: " + cudaGetErrorString(status_)); \
  } while (0)
// The driver API through the runtime's entry points: no link against libcuda, whose stub clashes
// with the static runtime's own hidden references.
template <class F>
F driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess || !fn)
    report_status("sandbox_error", std::string("the CUDA driver has no ") + name);
  return reinterpret_cast<F>(fn);
}
#define KEVO_DRIVER(name) driver_entry<decltype(&name)>(#name)
#define KEVO_CU_OK(call)                                                                                     \
  do {                                                                                                       \
    const CUresult status_ = (call);                                                                         \
    if (status_ != CUDA_SUCCESS)                                                                             \
      report_status("sandbox_error", std::string("the checker's ") + #call + " failed with CUresult " + std::to_string(static_cast<int>(status_))); \
  } while (0)

constexpr std::uint32_t poison_word = 0x7fc0deadu;   // float and int: a NaN no arithmetic makes
constexpr std::uint32_t poison_half = 0x7eadu;       // half: likewise

int element_bytes(const TensorInfo& t) { return t.kind == 2 ? 2 : 4; }
std::uint32_t poison_of(const TensorInfo& t) { return t.kind == 2 ? poison_half : poison_word; }

// ---- device code ----

__device__ __forceinline__ unsigned long long mix64(unsigned long long x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ double unit(unsigned long long x) { return static_cast<double>(mix64(x) >> 11) * (1.0 / 9007199254740992.0); }

__device__ __forceinline__ void store_value(unsigned char* p, long i, int kind, double v) {
  if (kind == 0) reinterpret_cast<float*>(p)[i] = static_cast<float>(v);
  else if (kind == 1) reinterpret_cast<int*>(p)[i] = static_cast<int>(floor(v));
  else reinterpret_cast<__half*>(p)[i] = __double2half(v);
}

__device__ __forceinline__ std::uint32_t load_word(const unsigned char* p, long i, int kind) {
  return kind == 2 ? reinterpret_cast<const unsigned short*>(p)[i] : reinterpret_cast<const std::uint32_t*>(p)[i];
}

__device__ __forceinline__ double word_value(std::uint32_t w, int kind) {
  if (kind == 0) return static_cast<double>(__uint_as_float(w));
  if (kind == 1) return static_cast<double>(static_cast<int>(w));
  return static_cast<double>(__half2float(__ushort_as_half(static_cast<unsigned short>(w))));
}

// Fresh inputs: element i of a tensor is a function of (seed, i) alone.
__global__ void draw_kernel(unsigned char* out, long n, int kind, int uniform, double scale, double low, double high, double step,
                            unsigned long long seed) {
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += static_cast<long>(gridDim.x) * blockDim.x) {
    const unsigned long long key = seed * 0x2545f4914f6cdd1dull + 2 * static_cast<unsigned long long>(i);
    double v;
    if (uniform) {
      v = low + (high - low) * unit(key);
    } else {
      const double u1 = fmax(unit(key), 1e-300), u2 = unit(key + 1);
      v = scale * sqrt(-2.0 * log(u1)) * cospi(2.0 * u2);
    }
    if (step > 0) v = rint(v / step) * step;
    store_value(out, i, kind, v);
  }
}

__global__ void fill_kernel(unsigned char* p, long n, int bytes, std::uint32_t word) {
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += static_cast<long>(gridDim.x) * blockDim.x) {
    if (bytes == 2) reinterpret_cast<unsigned short*>(p)[i] = static_cast<unsigned short>(word);
    else reinterpret_cast<std::uint32_t*>(p)[i] = word;
  }
}

// One element in 256 replaced by another element of the pool.
__global__ void perturb_kernel(unsigned char* p, const unsigned char* pool, long n, long pool_n, int bytes, unsigned long long seed) {
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += static_cast<long>(gridDim.x) * blockDim.x) {
    const unsigned long long h = mix64(seed ^ static_cast<unsigned long long>(i));
    if (h % 256 != 0) continue;
    const long from = static_cast<long>((h >> 8) % static_cast<unsigned long long>(pool_n));
    if (bytes == 2) reinterpret_cast<unsigned short*>(p)[i] = reinterpret_cast<const unsigned short*>(pool)[from];
    else reinterpret_cast<std::uint32_t*>(p)[i] = reinterpret_cast<const std::uint32_t*>(pool)[from];
  }
}

enum Counter { unwritten, first_unwritten, wrong, first_wrong, replayed, past_end, first_past_end, counter_count };

__global__ void compare_kernel(const unsigned char* expected, const unsigned char* got, const unsigned char* previous, long n, int kind,
                               std::uint32_t poison, double tolerance_abs, double tolerance_rel, bool exact, unsigned long long* counters) {
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n + guard_elements; i += static_cast<long>(gridDim.x) * blockDim.x) {
    const std::uint32_t g = load_word(got, i, kind);
    if (i >= n) {
      if (g != poison) {
        atomicAdd(&counters[past_end], 1ull);
        atomicMin(&counters[first_past_end], static_cast<unsigned long long>(i));
      }
      continue;
    }
    const std::uint32_t e = load_word(expected, i, kind);
    if (g == e) continue;
    if (g == poison) {
      atomicAdd(&counters[unwritten], 1ull);
      atomicMin(&counters[first_unwritten], static_cast<unsigned long long>(i));
      continue;
    }
    auto close = [&](std::uint32_t a) {
      if (exact || kind == 1) return a == g;
      const double ev = word_value(a, kind), gv = word_value(g, kind);
      if (isnan(ev) && isnan(gv)) return true;
      return fabs(ev - gv) <= tolerance_abs + tolerance_rel * fabs(ev);
    };
    if (close(e)) continue;
    atomicAdd(&counters[wrong], 1ull);
    atomicMin(&counters[first_wrong], static_cast<unsigned long long>(i));
    if (previous && close(load_word(previous, i, kind))) atomicAdd(&counters[replayed], 1ull);
  }
}

__global__ void count_word_kernel(const unsigned char* p, long n, int kind, std::uint32_t word, unsigned long long* count) {
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += static_cast<long>(gridDim.x) * blockDim.x)
    if (load_word(p, i, kind) == word) atomicAdd(count, 1ull);
}

__global__ void checksum_kernel(const std::uint32_t* p, long words, unsigned long long* sum) {
  unsigned long long local = 0;
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < words; i += static_cast<long>(gridDim.x) * blockDim.x)
    local += mix64(static_cast<unsigned long long>(p[i]) ^ (static_cast<unsigned long long>(i) << 32));
  atomicAdd(sum, local);
}

__global__ void read_probe_kernel(const int4* p, long n, int* sink) {
  int4 acc = make_int4(0, 0, 0, 0);
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += static_cast<long>(gridDim.x) * blockDim.x) {
    const int4 v = p[i];
    acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x7fffffff) *sink = 1;  // keeps the loads
}

int grid_for(long n) { return static_cast<int>(std::min<long>(4096, std::max<long>(1, (n + 255) / 256))); }

// ---- the checker's device memory ----

// Tensor i of a call starts on a 4 KiB boundary of its slot, then `shift` x 256 bytes further
// (cudaMalloc's alignment, which kernels may assume).
constexpr int shifts = 7;
std::size_t span_bytes(std::size_t i, const Shape& shape) {
  const long n = tensors[i].size(shape);
  if (n < 0) report_status("bad_report", std::string("negative size for tensor ") + tensors[i].name + " on shape " + shape_text(shape));
  const std::size_t bytes = static_cast<std::size_t>(n + guard_elements) * element_bytes(tensors[i]) + 256 * shifts;
  return (bytes + 4095) / 4096 * 4096;
}
std::size_t call_bytes(const Shape& shape) {
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < tensor_count; ++i) bytes += span_bytes(i, shape);
  return bytes;
}

struct Arena {
  CUdeviceptr base = 0;
  std::size_t slot_bytes = 0;
  int slots = 0;
} arena;

std::vector<std::size_t> layout(const Shape& shape, int slot, int shift) {
  std::vector<std::size_t> offsets(tensor_count);
  std::size_t at = static_cast<std::size_t>(slot) * arena.slot_bytes;
  for (std::size_t i = 0; i < tensor_count; ++i) {
    offsets[i] = at + 256 * static_cast<std::size_t>(shift % shifts);
    at += span_bytes(i, shape);
  }
  return offsets;
}
unsigned char* in_arena(std::size_t offset) { return reinterpret_cast<unsigned char*>(arena.base + offset); }

// Device memory that another process can map, exported as a file descriptor (the driver's virtual
// memory API works across the jail's namespaces, where legacy CUDA IPC may not).
CUmemAllocationProp exportable() {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}
std::size_t rounded_to_granularity(std::size_t bytes) {
  const CUmemAllocationProp prop = exportable();
  std::size_t granularity = 0;
  KEVO_CU_OK(KEVO_DRIVER(cuMemGetAllocationGranularity)(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  return (bytes + granularity - 1) / granularity * granularity;
}
// `bytes` (a multiple of the granularity) mapped here at the returned address; its descriptor in `fd`.
CUdeviceptr exported_memory(std::size_t bytes, int& fd) {
  const CUmemAllocationProp prop = exportable();
  CUmemGenericAllocationHandle handle;
  CUdeviceptr base = 0;
  KEVO_CU_OK(KEVO_DRIVER(cuMemCreate)(&handle, bytes, &prop, 0));
  KEVO_CU_OK(KEVO_DRIVER(cuMemAddressReserve)(&base, bytes, 0, 0, 0));
  KEVO_CU_OK(KEVO_DRIVER(cuMemMap)(base, bytes, 0, handle, 0));
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  KEVO_CU_OK(KEVO_DRIVER(cuMemSetAccess)(base, bytes, &access, 1));
  KEVO_CU_OK(KEVO_DRIVER(cuMemExportToShareableHandle)(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  return base;
}

// The arena: every call's tensors, in device memory the runner maps too (sent to it as a descriptor).
void make_arena(std::size_t slot_bytes, int slots) {
  arena.slot_bytes = rounded_to_granularity(slot_bytes);
  arena.slots = slots;
  const std::size_t bytes = arena.slot_bytes * static_cast<std::size_t>(slots);
  int fd = -1;
  arena.base = exported_memory(bytes, fd);
  send_descriptor(fd, bytes);
  ::close(fd);
}

// The checker's own copy of one call's tensors (inputs, or the reference's outputs), with room
// for the guard elements.
struct Tensors {
  std::vector<unsigned char*> data = std::vector<unsigned char*>(tensor_count, nullptr);
};

// Tensor i's largest element count over every shape (a check shape may outgrow the timing shape
// in one tensor: top-K's K, say).
long max_elements(std::size_t i) {
  long n = tensors[i].size(timing_shape);
  for (const Shape& shape : check_shapes) n = std::max(n, tensors[i].size(shape));
  return n;
}

// Room for any shape's tensors, and `extra` elements more each.
Tensors allocate(long extra = 0) {
  Tensors t;
  for (std::size_t i = 0; i < tensor_count; ++i)
    KEVO_CUDA_OK(cudaMalloc(&t.data[i], static_cast<std::size_t>(max_elements(i) + extra + guard_elements) * element_bytes(tensors[i])));
  return t;
}

void poison(unsigned char* p, long n, const TensorInfo& t) { fill_kernel<<<grid_for(n), 256>>>(p, n, element_bytes(t), poison_of(t)); }

// The timing pool is this many elements longer than each input: each timed call reads its own window.
constexpr long pool_window = 4099;

// ---- a KernelBench-format problem's reference: PyTorch, in kevo's helper beside this checker ----
// The helper maps the exchange (device memory of this checker's, inherited as a descriptor) and reads and
// writes the tensors there: a call's tensors cross at device speed, not through pipes and the host.
struct TorchExchange {
  CUdeviceptr base = 0;
  std::vector<std::size_t> offset;  // tensor i's slot: room for its largest size, and the pool's window for an input
} torch_exchange;

void open_torch_exchange() {
  if (torch_exchange.base) return;
  std::size_t bytes = 0;
  std::string request = "exchange";
  for (std::size_t i = 0; i < tensor_count; ++i) {
    torch_exchange.offset.push_back(bytes);
    request += " " + std::to_string(bytes);
    const long n = max_elements(i) + (tensors[i].output ? 0 : pool_window);
    bytes += (static_cast<std::size_t>(n) * element_bytes(tensors[i]) + 4095) / 4096 * 4096;
  }
  bytes = rounded_to_granularity(bytes);
  int fd = -1;
  torch_exchange.base = exported_memory(bytes, fd);
  // Above the helper's 0-3 (dup2 onto 3 then clears close-on-exec, as it would not for a descriptor already 3).
  torch_inherited_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 10);
  ::close(fd);
  torch_shared_request(request + " " + std::to_string(bytes) + "\n", TorchCounts::none);
  ::close(torch_inherited_fd);
}
unsigned char* in_exchange(std::size_t i) { return reinterpret_cast<unsigned char*>(torch_exchange.base + torch_exchange.offset[i]); }

// Inputs as the module's get_inputs() and __init__ draw them under `seed`, each `extra` elements longer
// (from another draw), into `t`.
void torch_draw_into(Tensors& t, const Shape& shape, std::uint64_t seed, long extra) {
  open_torch_exchange();
  const auto counts = torch_shared_request("draw_shared " + std::to_string(seed) + " " + std::to_string(extra) + "\n", TorchCounts::of_inputs);
  for (std::size_t i = 0; i < tensor_count; ++i) {
    if (tensors[i].output) continue;
    const long n = tensors[i].size(shape) + extra;
    if (static_cast<long>(counts[i]) != n)
      report_status("sandbox_error", "the PyTorch reference drew " + std::to_string(counts[i]) + " elements of " + tensors[i].name + ", not " + std::to_string(n));
    KEVO_CUDA_OK(cudaMemcpy(t.data[i], in_exchange(i), static_cast<std::size_t>(n) * element_bytes(tensors[i]), cudaMemcpyDeviceToDevice));
  }
}

// PyTorch's outputs for the inputs at p[...] (device memory), written to the outputs' p[...].
void torch_forward_on_device(const Shape& shape, void* const* p) {
  open_torch_exchange();
  for (std::size_t i = 0; i < tensor_count; ++i)
    if (!tensors[i].output)
      KEVO_CUDA_OK(cudaMemcpy(in_exchange(i), p[i], static_cast<std::size_t>(tensors[i].size(shape)) * element_bytes(tensors[i]), cudaMemcpyDeviceToDevice));
  KEVO_CUDA_OK(cudaDeviceSynchronize());  // a device-to-device copy returns before it is done; the helper reads next
  const auto counts = torch_shared_request("forward_shared\n", TorchCounts::of_outputs);
  for (std::size_t i = 0; i < tensor_count; ++i) {
    if (!tensors[i].output) continue;
    const long n = tensors[i].size(shape);
    if (static_cast<long>(counts[i]) != n)
      report_status("sandbox_error", "the PyTorch reference returned " + std::to_string(counts[i]) + " elements of " + tensors[i].name + ", not " + std::to_string(n));
    KEVO_CUDA_OK(cudaMemcpy(p[i], in_exchange(i), static_cast<std::size_t>(n) * element_bytes(tensors[i]), cudaMemcpyDeviceToDevice));
  }
}

// Inputs `from` the pool at element `at` (or drawn afresh), outputs and guards poisoned.
void fill_inputs(Tensors& t, const Shape& shape, const Tensors* pool, long at, std::uint64_t seed) {
  if (inputs_from_torch && !pool) torch_draw_into(t, shape, seed, 0);
  for (std::size_t i = 0; i < tensor_count; ++i) {
    const TensorInfo& info = tensors[i];
    const long n = info.size(shape);
    const int bytes = element_bytes(info);
    if (info.output) {
      poison(t.data[i], n + guard_elements, info);
      continue;
    }
    if (pool) KEVO_CUDA_OK(cudaMemcpy(t.data[i], pool->data[i] + at * bytes, static_cast<std::size_t>(n) * bytes, cudaMemcpyDeviceToDevice));
    else if (!inputs_from_torch) draw_kernel<<<grid_for(n), 256>>>(t.data[i], n, info.kind, info.uniform, info.scale, info.low, info.high, info.step, seed * 131 + i);
    poison(t.data[i] + static_cast<std::size_t>(n) * bytes, guard_elements, info);
  }
  KEVO_CUDA_OK(cudaGetLastError());
}

unsigned long long* counters = nullptr;  // device: the checks' counts

// `inputs` (and their poisoned outputs) copied into `out`: the reference's arguments there.
std::vector<void*> reference_arguments(const Shape& shape, const Tensors& inputs, Tensors& out) {
  std::vector<void*> pointers(tensor_count);
  for (std::size_t i = 0; i < tensor_count; ++i) {
    const std::size_t bytes = static_cast<std::size_t>(tensors[i].size(shape) + guard_elements) * element_bytes(tensors[i]);
    KEVO_CUDA_OK(cudaMemcpy(out.data[i], inputs.data[i], bytes, cudaMemcpyDeviceToDevice));
    pointers[i] = out.data[i];
  }
  return pointers;
}

// The reference's outputs for `inputs`, into `out` (whose inputs become a copy of them).
void run_reference(const Shape& shape, const Tensors& inputs, Tensors& out, double* seconds = nullptr) {
  const std::vector<void*> pointers = reference_arguments(shape, inputs, out);
  KEVO_CUDA_OK(cudaDeviceSynchronize());
  const double t0 = now();
  if (inputs_from_torch) torch_forward_on_device(shape, pointers.data());
  else call_reference(shape, pointers.data());
  const cudaError_t status = cudaDeviceSynchronize();
  if (seconds) *seconds = now() - t0;
  if (status != cudaSuccess) report_status("sandbox_error", std::string("the reference failed on the device: ") + cudaGetErrorString(status));
  // A reference that leaves an output element unwritten makes every candidate that writes it
  // "wrong": the problem is at fault, and says so before any candidate is blamed.
  for (std::size_t i = 0; i < tensor_count; ++i) {
    if (!tensors[i].output) continue;
    const long n = tensors[i].size(shape);
    unsigned long long left = 0;
    KEVO_CUDA_OK(cudaMemset(counters, 0, sizeof left));
    count_word_kernel<<<grid_for(n), 256>>>(out.data[i], n, tensors[i].kind, poison_of(tensors[i]), counters);
    KEVO_CUDA_OK(cudaMemcpy(&left, counters, sizeof left, cudaMemcpyDeviceToHost));
    if (left > 0)
      report_status("sandbox_error", "the reference left " + std::to_string(left) + " of " + std::to_string(n) + " elements of " +
                                         tensors[i].name + " unwritten on shape " + shape_text(shape) +
                                         " (a reference must write every output element)");
  }
}

// Places `inputs` (and poisoned outputs) in the arena at `offsets`.
void place(const Shape& shape, const Tensors& inputs, const std::vector<std::size_t>& offsets) {
  for (std::size_t i = 0; i < tensor_count; ++i) {
    const std::size_t bytes = static_cast<std::size_t>(tensors[i].size(shape) + guard_elements) * element_bytes(tensors[i]);
    KEVO_CUDA_OK(cudaMemcpy(in_arena(offsets[i]), inputs.data[i], bytes, cudaMemcpyDeviceToDevice));
  }
}

std::string value_text(const TensorInfo& t, const unsigned char* device_element) {
  std::uint32_t word = 0;
  KEVO_CUDA_OK(cudaMemcpy(&word, device_element, element_bytes(t), cudaMemcpyDeviceToHost));
  char text[64];
  if (t.kind == 1) std::snprintf(text, sizeof text, "%d", static_cast<int>(word));
  else if (t.kind == 0) {
    float f;
    std::memcpy(&f, &word, 4);
    std::snprintf(text, sizeof text, "%.9g", static_cast<double>(f));
  } else {
    std::snprintf(text, sizeof text, "%.6g", static_cast<double>(__half2float(__ushort_as_half(static_cast<unsigned short>(word)))));
  }
  return text;
}

// Checks the arena at `offsets` against the reference's `expected` and the `inputs` it was given.
void verify(const Shape& shape, const Tensors& expected, const Tensors& inputs, const std::vector<std::size_t>& offsets, const std::string& what,
            const Tensors* previous = nullptr) {
  for (std::size_t i = 0; i < tensor_count; ++i) {
    const TensorInfo& t = tensors[i];
    const long n = t.size(shape);
    unsigned long long host[counter_count] = {0, ~0ull, 0, ~0ull, 0, 0, ~0ull};
    KEVO_CUDA_OK(cudaMemcpy(counters, host, sizeof host, cudaMemcpyHostToDevice));
    const unsigned char* got = in_arena(offsets[i]);
    const unsigned char* want = t.output ? expected.data[i] : inputs.data[i];
    compare_kernel<<<grid_for(n + guard_elements), 256>>>(want, got, previous && t.output ? previous->data[i] : nullptr, n, t.kind, poison_of(t),
                                                           tolerance_abs, tolerance_rel, !t.output, counters);
    KEVO_CUDA_OK(cudaMemcpy(host, counters, sizeof host, cudaMemcpyDeviceToHost));
    const int bytes = element_bytes(t);
    if (host[past_end] > 0)
      report_status(t.output ? "wrong_answer" : "mutated_input", std::string(t.name) + ": wrote past its end (element " +
                                                                     std::to_string(host[first_past_end]) + " of " + std::to_string(n) + ") " + what);
    if (!t.output) {
      const long k = static_cast<long>(std::min(host[first_wrong], host[first_unwritten]));
      if (host[wrong] + host[unwritten] > 0)
        report_status("mutated_input", std::string("changed its input ") + t.name + " (element " + std::to_string(k) + " was " +
                                           value_text(t, want + k * bytes) + ", is " + value_text(t, got + k * bytes) + ") " + what);
      continue;
    }
    if (host[unwritten] > 0)
      report_status("unwritten_output", std::string(t.name) + ": " + std::to_string(host[unwritten]) + " of " + std::to_string(n) +
                                            " elements left unwritten (first at index " + std::to_string(host[first_unwritten]) + ") " + what);
    if (host[wrong] > 0 && host[replayed] == host[wrong])
      report_status("replayed_output", std::string(t.name) + ": " + std::to_string(host[wrong]) + " of " + std::to_string(n) +
                                           " elements are an earlier call's outputs, for inputs that differ from that call's " + what);
    if (host[wrong] > 0) {
      const long k = static_cast<long>(host[first_wrong]);
      report_status("wrong_answer", std::string(t.name) + ": " + std::to_string(host[wrong]) + " of " + std::to_string(n) +
                                        " elements differ beyond tolerance (first at index " + std::to_string(k) + ": expected " +
                                        value_text(t, want + k * bytes) + ", got " + value_text(t, got + k * bytes) + ") " + what);
    }
  }
}

// A sum over every output of the given calls, for spotting writes that land after the answer.
unsigned long long output_checksum(const Shape& shape, const std::vector<std::vector<std::size_t>>& calls) {
  unsigned long long host = 0;
  KEVO_CUDA_OK(cudaMemcpy(counters, &host, sizeof host, cudaMemcpyHostToDevice));
  for (const auto& offsets : calls)
    for (std::size_t i = 0; i < tensor_count; ++i) {
      if (!tensors[i].output) continue;
      const long words = (tensors[i].size(shape) * element_bytes(tensors[i]) + 3) / 4;
      checksum_kernel<<<grid_for(words), 256>>>(reinterpret_cast<const std::uint32_t*>(in_arena(offsets[i])), words, counters);
    }
  KEVO_CUDA_OK(cudaMemcpy(&host, counters, sizeof host, cudaMemcpyDeviceToHost));
  return host;
}

// Writing a buffer of twice the L2, so that a timed call finds its inputs in memory.
unsigned char* flush_buffer = nullptr;
std::size_t flush_bytes = 0;
void flush_l2() {
  if (!flush_buffer) return;
  static int round = 0;
  KEVO_CUDA_OK(cudaMemset(flush_buffer, ++round & 0xff, flush_bytes));
}

// Runs the calls (each its own offsets) in one command; returns the wall time of the batch.
// The batch's wall time, less kevo's own round trip (waking the runner, the command and the answer
// over the socket, its device synchronize): what is left is the device's work for the calls.
double round_trip = 0;

double run_batch(const Shape& shape, const std::vector<std::vector<std::size_t>>& calls, const std::string& what) {
  KEVO_CUDA_OK(cudaDeviceSynchronize());  // the checker's own copies and flush are done before the clock starts
  const double wall = exchange(shape, calls, what).wall;
  return std::max(wall - round_trip, 0.1 * wall);  // never more than 90% off: the roofline check judges the rest
}

// The shortest of a few empty commands (no kernel() call). A candidate's static initializers run
// in this process too, and could slow these on purpose to have more taken off its calls; so the
// evaluator measures the round trip once with the reference and passes it to every later run.
void measure_round_trip(const Shape& shape) {
  if (options.round_trip >= 0) {
    round_trip = options.round_trip;
    return;
  }
  // Each empty command follows work of the checker's own on the device (a flush), as a batch does.
  double best = 1e30;
  for (int i = 0; i < 7; ++i) {
    flush_l2();
    KEVO_CUDA_OK(cudaDeviceSynchronize());
    best = std::min(best, exchange(shape, {}, "(an empty command: kevo's round trip)").wall);
  }
  round_trip = best;
}

// One call's data: its inputs and the reference's outputs, in the checker's memory.
struct Case {
  Tensors inputs, expected;
  std::vector<std::size_t> offsets;
};

// Runs the cases as one batch and checks each; returns the wall time per call.
double checked_batch(const Shape& shape, std::vector<Case*>& cases, const std::string& what, bool flush, const Tensors* previous = nullptr) {
  std::vector<std::vector<std::size_t>> calls;
  for (Case* c : cases) {
    place(shape, c->inputs, c->offsets);
    calls.push_back(c->offsets);
  }
  if (flush) flush_l2();
  const double wall = run_batch(shape, calls, what);
  const unsigned long long before = output_checksum(shape, calls);
  for (Case* c : cases) verify(shape, c->expected, c->inputs, c->offsets, what, previous);
  ::usleep(2000);
  if (output_checksum(shape, calls) != before)
    report_status("wrong_answer", "its outputs changed after it answered: work still running that the checker's clock did not see " + what);
  return wall / static_cast<double>(cases.size());
}

// The reference timed inside the checker with CUDA events after an L2 flush (median of 5 calls):
// no runner, no socket, no batch. Reported beside the checked figure so that a reader can see
// what kevo's own clock adds (it judges nothing).
double reference_in_process_seconds(const Shape& shape, const Tensors& inputs, Tensors& out) {
  if (inputs_from_torch) return 0;  // PyTorch's own time is taken by the helper's timer, beside the checker
  const std::vector<void*> pointers = reference_arguments(shape, inputs, out);
  cudaEvent_t start, stop;
  KEVO_CUDA_OK(cudaEventCreate(&start));
  KEVO_CUDA_OK(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int r = 0; r < 5; ++r) {
    flush_l2();
    KEVO_CUDA_OK(cudaEventRecord(start));
    call_reference(shape, pointers.data());
    KEVO_CUDA_OK(cudaEventRecord(stop));
    KEVO_CUDA_OK(cudaEventSynchronize(stop));
    float ms = 0;
    KEVO_CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return median(times);
}

// The device's roofline, measured now: a streaming read of 2 GiB, and the arithmetic peak from
// the device's clock and SM count (fp16 tensor cores where a tensor is half).
void measure_roofline(double& gbytes_per_s, double& gflops) {
  const std::size_t bytes = std::size_t{2} << 30;
  int4* buffer = nullptr;
  int* sink = nullptr;
  KEVO_CUDA_OK(cudaMalloc(&buffer, bytes));
  KEVO_CUDA_OK(cudaMalloc(&sink, sizeof(int)));
  KEVO_CUDA_OK(cudaMemset(buffer, 1, bytes));
  int sms = 0, clock_khz = 0, major = 0;
  KEVO_CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  KEVO_CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  CUdevice device;
  KEVO_CU_OK(KEVO_DRIVER(cuDeviceGet)(&device, 0));
  KEVO_CU_OK(KEVO_DRIVER(cuDeviceGetAttribute)(&clock_khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, device));
  cudaEvent_t start, stop;
  KEVO_CUDA_OK(cudaEventCreate(&start));
  KEVO_CUDA_OK(cudaEventCreate(&stop));
  float best_ms = 1e30f;
  for (int r = 0; r < 5; ++r) {
    KEVO_CUDA_OK(cudaEventRecord(start));
    read_probe_kernel<<<sms * 8, 512>>>(buffer, static_cast<long>(bytes / sizeof(int4)), sink);
    KEVO_CUDA_OK(cudaEventRecord(stop));
    KEVO_CUDA_OK(cudaEventSynchronize(stop));
    float ms = 0;
    KEVO_CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    if (r > 0) best_ms = std::min(best_ms, ms);
  }
  gbytes_per_s = static_cast<double>(bytes) / (best_ms * 1e-3) / 1e9;
  bool any_half = false;
  for (std::size_t i = 0; i < tensor_count; ++i) any_half = any_half || tensors[i].kind == 2;
  // Per SM and clock: 128 fp32 FMAs; dense fp16 on tensor cores 4096 FLOPs (Hopper), 2048 before it.
  const double per_sm_clock = any_half ? (major >= 9 ? 4096.0 : 2048.0) : 256.0;
  gflops = per_sm_clock * sms * clock_khz * 1e3 / 1e9;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(buffer);
  cudaFree(sink);
}

// A tolerance under which one constant matches every output element of every check shape makes
// the check meaningless. Tried: 0 and the reference's first output element.
void validate_tolerance() {
  KEVO_CUDA_OK(cudaMalloc(&counters, counter_count * sizeof(unsigned long long)));
  std::uint64_t seed = options.seed;
  for (std::size_t i = 0; i < tensor_count; ++i) {
    if (!tensors[i].output) continue;
    for (int candidate = 0; candidate < 2; ++candidate) {
      bool all_pass = true;
      std::string constant_text;
      seed = options.seed;
      for (const Shape& shape : check_shapes) {
        Tensors inputs = allocate(), expected = allocate(), constant = allocate();
        fill_inputs(inputs, shape, nullptr, 0, seed++);
        run_reference(shape, inputs, expected);
        const long n = tensors[i].size(shape);
        std::uint32_t word = 0;
        if (candidate == 1) KEVO_CUDA_OK(cudaMemcpy(&word, expected.data[i], element_bytes(tensors[i]), cudaMemcpyDeviceToHost));
        if (constant_text.empty()) constant_text = candidate == 0 ? "0" : value_text(tensors[i], expected.data[i]);
        fill_kernel<<<grid_for(n), 256>>>(constant.data[i], n, element_bytes(tensors[i]), word);
        poison(constant.data[i] + n * element_bytes(tensors[i]), guard_elements, tensors[i]);
        unsigned long long host[counter_count] = {0, ~0ull, 0, ~0ull, 0, 0, ~0ull};
        KEVO_CUDA_OK(cudaMemcpy(counters, host, sizeof host, cudaMemcpyHostToDevice));
        compare_kernel<<<grid_for(n + guard_elements), 256>>>(expected.data[i], constant.data[i], nullptr, n, tensors[i].kind, poison_of(tensors[i]),
                                                               tolerance_abs, tolerance_rel, false, counters);
        KEVO_CUDA_OK(cudaMemcpy(host, counters, sizeof host, cudaMemcpyDeviceToHost));
        all_pass = all_pass && host[wrong] == 0 && host[unwritten] == 0;
        for (Tensors* t : {&inputs, &expected, &constant})
          for (auto* p : t->data) cudaFree(p);
      }
      if (all_pass)
        report_status("loose_tolerance", std::string("a kernel that writes the constant ") + constant_text + " to " + tensors[i].name +
                                             " passes every check shape under this tolerance");
    }
  }
  report("{\"status\":\"ok\"}");
}

}  // namespace

int main(int argc, char** argv) {
  parse_options(argc, argv);
  try {
    KEVO_CUDA_OK(cudaSetDevice(0));
    KEVO_CUDA_OK(cudaFree(nullptr));  // the context, before any driver entry point
    if (options.validate_tolerance) validate_tolerance();
    meet_runner();

    // Everything the checker needs is taken before the candidate runs, so that a candidate that
    // takes the whole device fails itself, not the checker.
    std::size_t largest = call_bytes(timing_shape);
    for (const Shape& shape : check_shapes) largest = std::max(largest, call_bytes(shape));
    const std::size_t batch_budget = std::size_t{6} << 30;
    const int batch = static_cast<int>(std::clamp<std::size_t>(batch_budget / largest, 1, max_batch));
    make_arena(largest, std::max(2, batch));
    KEVO_CUDA_OK(cudaMalloc(&counters, counter_count * sizeof(unsigned long long)));
    int l2_bytes = 0;
    KEVO_CUDA_OK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0));
    flush_bytes = std::max<std::size_t>(2 * static_cast<std::size_t>(l2_bytes), std::size_t{64} << 20);
    if (options.flush) KEVO_CUDA_OK(cudaMalloc(&flush_buffer, flush_bytes));
    double roofline_gbytes_per_s = 0, roofline_gflops = 0;
    measure_roofline(roofline_gbytes_per_s, roofline_gflops);
    constexpr long window = pool_window;
    Tensors pool = allocate(window);
    std::vector<Case> cases(static_cast<std::size_t>(batch) + 1);
    for (Case& c : cases) {
      c.inputs = allocate();
      c.expected = allocate();
    }

    expect_greeting();
    if (options.profile) {
      // A profiler started the runner: one checked call on the timing shape is all it needs to see.
      Case& c = cases[0];
      fill_inputs(c.inputs, timing_shape, nullptr, 0, options.seed);
      run_reference(timing_shape, c.inputs, c.expected);
      c.offsets = layout(timing_shape, 0, 0);
      std::vector<Case*> one{&c};
      checked_batch(timing_shape, one, "on the timing shape " + shape_text(timing_shape) + " (profiled)", false);
      send_quit();
      // The profiler prints its metrics once the program it started has exited: it is let finish
      // (report() would kill it), up to the call timeout.
      thaw();
      const double deadline = now() + options.call_timeout;
      while (process_alive(runner) && now() < deadline) ::usleep(20000);
      report("{\"status\":\"ok\",\"profiled\":1}");
      return 0;
    }
    measure_round_trip(timing_shape);

    std::uint64_t seed = options.seed;
    int calls = 0;
    for (const Shape& shape : check_shapes) {
      Case& c = cases[0];
      fill_inputs(c.inputs, shape, nullptr, 0, seed++);
      run_reference(shape, c.inputs, c.expected);
      c.offsets = layout(shape, calls % 2, calls % shifts);
      std::vector<Case*> one{&c};
      checked_batch(shape, one, "on shape " + shape_text(shape), false);
      ++calls;
    }

    // The timing shape: a pool `window` elements longer than each tensor; each call reads the
    // window at its own offset, so no two calls see the same inputs.
    if (inputs_from_torch) torch_draw_into(pool, timing_shape, seed * 131 + 7, window);
    for (std::size_t i = 0; i < tensor_count && !inputs_from_torch; ++i) {
      const TensorInfo& t = tensors[i];
      if (t.output) continue;
      const long n = t.size(timing_shape) + window;
      draw_kernel<<<grid_for(n), 256>>>(pool.data[i], n, t.kind, t.uniform, t.scale, t.low, t.high, t.step, seed * 131 + i + 7);
    }
    seed++;
    KEVO_CUDA_OK(cudaGetLastError());
    std::mt19937_64 offsets(options.seed ^ 0x5bd1e995u);
    const std::string on_timing = "on the timing shape " + shape_text(timing_shape);
    double reference_seconds = 0;
    {
      Case& c = cases[0];
      fill_inputs(c.inputs, timing_shape, &pool, 0, 0);
      run_reference(timing_shape, c.inputs, c.expected, &reference_seconds);
      c.offsets = layout(timing_shape, calls % 2, calls % shifts);
      std::vector<Case*> one{&c};
      checked_batch(timing_shape, one, on_timing, false);
      ++calls;
    }

    // Only in the reference's run (the one that measures the round trip): the figures then compare.
    const double reference_events = options.round_trip < 0 ? reference_in_process_seconds(timing_shape, cases[0].inputs, cases[1].expected) : 0;

    // Timed batches: batch b's calls take slots 0..batch-1 at shift b / 2, so batches 2j and
    // 2j + 1 share their addresses with new inputs (a kernel keyed on pointers replays there);
    // 2j + 1 takes them in reverse, so its first call meets the address of 2j's last.
    std::vector<double> samples;
    const int total = options.warmup + options.repetitions;
    for (int b = 0; b < total; ++b) {
      std::vector<Case*> group;
      for (int k = 0; k < batch; ++k) {
        Case& c = cases[static_cast<std::size_t>(k)];
        fill_inputs(c.inputs, timing_shape, &pool, static_cast<long>(offsets() % window), 0);
        run_reference(timing_shape, c.inputs, c.expected);
        c.offsets = layout(timing_shape, b % 2 ? batch - 1 - k : k, (b / 2) % shifts);
        group.push_back(&c);
      }
      const double seconds = checked_batch(timing_shape, group, on_timing + " (timed batch " + std::to_string(b + 1) + ")", options.flush);
      const bool hopeless = b == 0 && seconds > 0.01 && seconds > 10 * reference_seconds;
      if (b >= options.warmup || hopeless) samples.push_back(seconds);
      if (hopeless) break;
    }

    // The first call's inputs of the last batch with one element in 256 changed, at another address.
    {
      Case& last = cases[0];
      Case& changed = cases[static_cast<std::size_t>(batch)];
      for (std::size_t i = 0; i < tensor_count; ++i) {
        const long n = tensors[i].size(timing_shape);
        const std::size_t bytes = static_cast<std::size_t>(n + guard_elements) * element_bytes(tensors[i]);
        KEVO_CUDA_OK(cudaMemcpy(changed.inputs.data[i], last.inputs.data[i], bytes, cudaMemcpyDeviceToDevice));
        if (!tensors[i].output)
          perturb_kernel<<<grid_for(n), 256>>>(changed.inputs.data[i], pool.data[i], n, n + window, element_bytes(tensors[i]), options.seed * 31 + i);
      }
      run_reference(timing_shape, changed.inputs, changed.expected);
      changed.offsets = layout(timing_shape, 1, (total / 2 + 3) % shifts);
      std::vector<Case*> one{&changed};
      checked_batch(timing_shape, one, on_timing + " (inputs of a timed call with 1 element in 256 changed)", false, &last.expected);
    }

    send_quit();
    char line[768];
    std::snprintf(line, sizeof line,
                  "{\"status\":\"ok\",\"seconds\":%.9g,\"min_seconds\":%.9g,\"samples\":%d,\"bytes\":%.17g,\"flops\":%.17g,"
                  "\"wall_seconds\":%.9g,\"cpu_seconds\":0,\"batch\":%d,\"roofline_gbytes_per_s\":%.9g,\"roofline_gflops\":%.9g,"
                  "\"round_trip_seconds\":%.9g,\"reference_in_process_seconds\":%.9g}",
                  median(samples), *std::min_element(samples.begin(), samples.end()), static_cast<int>(samples.size()),
                  bytes_model(timing_shape), flops_model(timing_shape), median(samples), batch, roofline_gbytes_per_s, roofline_gflops, round_trip, reference_events);
    report(line);
  } catch (const std::bad_alloc&) {
    report_status("sandbox_error", "the checker ran out of memory");
  } catch (const std::exception& e) {
    report_status("sandbox_error", std::string("the checker failed: ") + e.what());
  }
}
