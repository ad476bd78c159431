// Times one kernel (cuda_softmax's three-pass reference, 16384 x 4096 fp32) in the ways kevo's CUDA
// checker and a plain benchmark would, on one device in one run, to find where the checker's figure
// parts from a plain benchmark's:
//   1. cudaMalloc buffers, one call timed with CUDA events after an L2 flush (a plain benchmark);
//   2. cudaMalloc buffers, a batch of 8 calls on distinct buffers, events around the batch;
//   3. the same batch on memory from the driver's VMM API (cuMemCreate, as the checker's arena),
//      at the minimum and at the recommended granularity;
//   4. the batch in a second process that maps that memory from a file descriptor (the runner),
//      timed by this process's wall clock over the socket (the checker) and by the child's events;
//   5. the same after this process has rewritten the slots and run kernels of its own (as the
//      checker does between batches), with and without the child touching every page of its
//      slots first (is the gap the child's cold address translation after a context switch?).
// Build and run on the device: nvcc -O3 -arch=native -o /tmp/clock_check benchmarks/search/clock_check.cu -lcuda && /tmp/clock_check
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr long rows = 16384, cols = 4096, elements = rows * cols;
constexpr std::size_t tensor_bytes = elements * sizeof(float);
constexpr int batch = 8, repetitions = 9, threads = 256;

#define CHECK(x)                                                                    \
  do {                                                                              \
    if (cudaError_t e_ = (x); e_ != cudaSuccess) {                                  \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)
#define CHECK_CU(x)                                                          \
  do {                                                                       \
    if (CUresult r_ = (x); r_ != CUDA_SUCCESS) {                             \
      std::fprintf(stderr, "%s:%d CUresult %d\n", __FILE__, __LINE__, int(r_)); \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

template <class Op>
__device__ float block_reduce(float v, Op op, float* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < threads / 32; ++w) v = op(v, scratch[w]);
  __syncthreads();
  return v;
}

__global__ void __launch_bounds__(threads) softmax(const float* x, float* y, long C) {
  __shared__ float scratch[threads / 32];
  const float* in = x + blockIdx.x * C;
  float* out = y + blockIdx.x * C;
  float max = -INFINITY;
  for (long c = threadIdx.x; c < C; c += threads) max = fmaxf(max, in[c]);
  max = block_reduce(max, [](float a, float b) { return fmaxf(a, b); }, scratch);
  float sum = 0;
  for (long c = threadIdx.x; c < C; c += threads) sum += expf(in[c] - max);
  sum = block_reduce(sum, [](float a, float b) { return a + b; }, scratch);
  for (long c = threadIdx.x; c < C; c += threads) out[c] = expf(in[c] - max) / sum;
}

// One load per 64 KB: the pages' address translations, without the data.
__global__ void touch_pages(const unsigned char* p, std::size_t bytes, unsigned* sink) {
  unsigned acc = 0;
  for (std::size_t i = (blockIdx.x * std::size_t(blockDim.x) + threadIdx.x) << 16; i < bytes; i += (std::size_t(gridDim.x) * blockDim.x) << 16)
    acc += p[i];
  if (acc == 0xdeadbeef) *sink = acc;
}

__global__ void fill(float* p, long n, unsigned seed) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x)
    p[i] = float((i * 2654435761u + seed) % 1000) / 100.0f - 5.0f;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

unsigned char* flush_buffer = nullptr;
constexpr std::size_t flush_bytes = std::size_t{128} << 20;
void flush() { CHECK(cudaMemset(flush_buffer, rand() & 0xff, flush_bytes)); }

// `slots` pairs (x, y) laid out from `base`, slot k at k * 2 * tensor_bytes.
float* x_of(unsigned char* base, int k) { return reinterpret_cast<float*>(base + std::size_t(k) * 2 * tensor_bytes); }
float* y_of(unsigned char* base, int k) { return reinterpret_cast<float*>(base + std::size_t(k) * 2 * tensor_bytes + tensor_bytes); }

void launch_batch(unsigned char* base, int count) {
  for (int k = 0; k < count; ++k) softmax<<<rows, threads>>>(x_of(base, k), y_of(base, k), cols);
}

// Per-call time of `count` calls timed with events after a flush, median over repetitions.
double events_per_call(unsigned char* base, int count) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int r = 0; r < repetitions; ++r) {
    flush();
    CHECK(cudaEventRecord(start));
    launch_batch(base, count);
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1e-3 / count);
  }
  return median(times);
}

void fill_slots(unsigned char* base, int slots) {
  for (int k = 0; k < slots; ++k) fill<<<1024, 256>>>(x_of(base, k), elements, 17u * k + 1);
  CHECK(cudaDeviceSynchronize());
}

CUmemAllocationProp vmm_prop() {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

unsigned char* vmm_map(CUmemGenericAllocationHandle handle, std::size_t bytes) {
  CUdeviceptr p = 0;
  CHECK_CU(cuMemAddressReserve(&p, bytes, 0, 0, 0));
  CHECK_CU(cuMemMap(p, bytes, 0, handle, 0));
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK_CU(cuMemSetAccess(p, bytes, &access, 1));
  return reinterpret_cast<unsigned char*>(p);
}

unsigned char* vmm_allocate(std::size_t bytes, CUmemAllocationGranularity_flags which, CUmemGenericAllocationHandle* handle, std::size_t* rounded) {
  CUmemAllocationProp prop = vmm_prop();
  std::size_t g = 0;
  CHECK_CU(cuMemGetAllocationGranularity(&g, &prop, which));
  *rounded = (bytes + g - 1) / g * g;
  CHECK_CU(cuMemCreate(handle, *rounded, &prop, 0));
  std::printf("  (granularity %zu KiB)\n", g >> 10);
  return vmm_map(*handle, *rounded);
}

void send_fd(int sock, int fd, std::uint64_t bytes) {
  iovec iov{&bytes, sizeof bytes};
  alignas(cmsghdr) char space[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = space;
  m.msg_controllen = sizeof space;
  cmsghdr* h = CMSG_FIRSTHDR(&m);
  h->cmsg_level = SOL_SOCKET;
  h->cmsg_type = SCM_RIGHTS;
  h->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(h), &fd, sizeof fd);
  if (::sendmsg(sock, &m, 0) < 0) std::exit(2);
}

int receive_fd(int sock, std::uint64_t& bytes) {
  iovec iov{&bytes, sizeof bytes};
  alignas(cmsghdr) char space[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = space;
  m.msg_controllen = sizeof space;
  if (::recvmsg(sock, &m, 0) <= 0) std::exit(3);
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof fd);
  return fd;
}

// The child: maps the parent's memory; on each command (a count) runs that many calls and
// synchronizes, answers with its own events' figure for the batch; command 0 ends it.
[[noreturn]] void child(int sock) {
  std::uint64_t bytes = 0;
  const int fd = receive_fd(sock, bytes);
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  CUmemGenericAllocationHandle handle;
  CHECK_CU(cuMemImportFromShareableHandle(&handle, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  unsigned char* base = vmm_map(handle, bytes);
  unsigned char* own = nullptr;  // the same layout in memory of the child's own
  CHECK(cudaMalloc(&own, bytes));
  unsigned* sink = nullptr;
  CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  fill_slots(own, batch);
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (;;) {
    int command = 0;
    if (::recv(sock, &command, sizeof command, 0) != sizeof command || command == 0) std::_Exit(0);
    if (command == 200) {  // touch every page of the shared slots, untimed
      touch_pages<<<1024, 256>>>(base, bytes, sink);
      CHECK(cudaDeviceSynchronize());
      double none = 0;
      ::send(sock, &none, sizeof none, 0);
      continue;
    }
    unsigned char* where = command > 0 ? base : own;
    const int count = std::abs(command) == 100 ? 0 : std::abs(command);
    CHECK(cudaEventRecord(start));
    launch_batch(where, count);
    CHECK(cudaEventRecord(stop));
    CHECK(cudaDeviceSynchronize());
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    double seconds = ms * 1e-3;
    ::send(sock, &seconds, sizeof seconds, 0);
  }
}

}  // namespace

int main() {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) return 2;
  const pid_t pid = ::fork();  // before any CUDA call in this process
  if (pid == 0) {
    ::close(pair[0]);
    child(pair[1]);
  }
  ::close(pair[1]);
  const int sock = pair[0];

  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(nullptr));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s; softmax %ld x %ld fp32, %d calls a batch, median of %d\n", prop.name, rows, cols, batch, repetitions);
  CHECK(cudaMalloc(&flush_buffer, flush_bytes));
  const std::size_t bytes = std::size_t(batch) * 2 * tensor_bytes;
  const double moved = 2.0 * tensor_bytes;
  auto say = [&](const char* what, double s) { std::printf("%-72s %.4f ms  %5.0f GB/s\n", what, s * 1e3, moved / s / 1e9); };

  unsigned char* plain = nullptr;
  CHECK(cudaMalloc(&plain, bytes));
  fill_slots(plain, batch);
  events_per_call(plain, batch);  // warm up clocks
  say("1. cudaMalloc, one call, events", events_per_call(plain, 1));
  say("2. cudaMalloc, batch of 8 on distinct buffers, events / 8", events_per_call(plain, batch));
  CHECK(cudaFree(plain));

  std::size_t rounded = 0;
  CUmemGenericAllocationHandle recommended_handle;
  unsigned char* recommended = vmm_allocate(bytes, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED, &recommended_handle, &rounded);
  fill_slots(recommended, batch);
  say("3b. VMM (recommended granularity), batch of 8, events / 8", events_per_call(recommended, batch));
  CHECK_CU(cuMemUnmap(reinterpret_cast<CUdeviceptr>(recommended), rounded));
  CHECK_CU(cuMemRelease(recommended_handle));

  CUmemGenericAllocationHandle handle;
  unsigned char* arena = vmm_allocate(bytes, CU_MEM_ALLOC_GRANULARITY_MINIMUM, &handle, &rounded);
  fill_slots(arena, batch);
  say("3a. VMM (minimum granularity, as the checker), one call, events", events_per_call(arena, 1));
  say("3a. VMM (minimum granularity, as the checker), batch of 8, events / 8", events_per_call(arena, batch));

  int fd = -1;
  CHECK_CU(cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  send_fd(sock, fd, rounded);
  // Each command: flush here, then the wall clock over the socket round trip; the child's events too.
  auto remote = [&](int command, double& child_events) {
    std::vector<double> walls, events;
    for (int r = 0; r < repetitions; ++r) {
      flush();
      CHECK(cudaDeviceSynchronize());
      const double t0 = now();
      ::send(sock, &command, sizeof command, 0);
      double seconds = 0;
      if (::recv(sock, &seconds, sizeof seconds, MSG_WAITALL) != sizeof seconds) std::exit(4);
      walls.push_back(now() - t0);
      events.push_back(seconds);
    }
    child_events = median(events);
    return median(walls);
  };
  double child_events = 0;
  const double empty = remote(100, child_events);
  std::printf("%-72s %.1f us\n", "4. the round trip of an empty command", empty * 1e6);
  double wall = remote(batch, child_events);
  say("4a. child process on the shared VMM memory, batch of 8: parent's wall / 8", wall / batch);
  say("4a. the same batch, the child's own events / 8", child_events / batch);
  say("4a. the parent's wall less the round trip, / 8", (wall - empty) / batch);
  wall = remote(1, child_events);
  say("4b. child process on the shared VMM memory, one call: parent's wall", wall);
  say("4b. the same call, the child's own events", child_events);
  wall = remote(-batch, child_events);
  say("4c. child process on its own cudaMalloc memory, batch of 8: parent's wall / 8", wall / batch);
  say("4c. the same batch, the child's own events / 8", child_events / batch);
  // 5. As the checker: between batches this process rewrites the slots through its own mapping and
  // runs kernels of its own, then flushes; the child's batch follows.
  auto remote_after_checker_work = [&](bool warm, double& child) {
    std::vector<double> walls, events;
    for (int r = 0; r < repetitions; ++r) {
      for (int k = 0; k < batch; ++k) {
        CHECK(cudaMemcpy(x_of(arena, k), x_of(arena, (k + 1) % batch), tensor_bytes, cudaMemcpyDeviceToDevice));
        CHECK(cudaMemset(y_of(arena, k), 0xff, tensor_bytes));
      }
      fill_slots(arena, batch);
      flush();
      CHECK(cudaDeviceSynchronize());
      double seconds = 0;
      if (warm) {
        const int touch = 200;
        ::send(sock, &touch, sizeof touch, 0);
        if (::recv(sock, &seconds, sizeof seconds, MSG_WAITALL) != sizeof seconds) std::exit(4);
      }
      const double t0 = now();
      ::send(sock, &batch, sizeof batch, 0);
      if (::recv(sock, &seconds, sizeof seconds, MSG_WAITALL) != sizeof seconds) std::exit(4);
      walls.push_back(now() - t0);
      events.push_back(seconds);
    }
    child = median(events);
    return median(walls);
  };
  wall = remote_after_checker_work(false, child_events);
  say("5a. after this process's own copies and kernels: the child's events / 8", child_events / batch);
  say("5a. the same: the wall clock less the round trip, / 8", (wall - empty) / batch);
  wall = remote_after_checker_work(true, child_events);
  say("5b. the same, the child touching its slots' pages first (untimed): its events / 8", child_events / batch);
  say("5b. the same: the wall clock / 8 (no switch of context left in it)", wall / batch);
  int quit = 0;
  ::send(sock, &quit, sizeof quit, 0);
  ::waitpid(pid, nullptr, 0);
  return 0;
}
