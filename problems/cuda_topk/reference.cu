// The reference top-K on the GPU: every element's order key and index are sorted by CUB's radix sort,
// which is stable, so equal values keep the lower index first; the first K are gathered.
#include "kevo_problem.hpp"

#include <cub/cub.cuh>
#include <cuda_runtime.h>

namespace {

// A key whose unsigned order is the floats' order; -0 and +0 share one key.
__device__ unsigned order_key(float v) {
  unsigned u = __float_as_uint(v);
  if (u == 0x80000000u) u = 0;
  return u & 0x80000000u ? ~u : u | 0x80000000u;
}

__global__ void make_keys(const float* x,  // (N)
                          unsigned* keys,  // (N)
                          int* order,      // (N)
                          long N) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N; i += long(gridDim.x) * blockDim.x) {
    keys[i] = order_key(x[i]);
    order[i] = int(i);
  }
}

__global__ void gather_first(const float* x,       // (N)
                             const int* sorted,    // (N) indices, largest value first
                             float* values,        // (K)
                             int* indices,         // (K)
                             long K) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < K; i += long(gridDim.x) * blockDim.x) {
    indices[i] = sorted[i];
    values[i] = x[sorted[i]];
  }
}

// Device memory kept between calls, grown when a larger N arrives.
struct Scratch {
  long capacity = 0;
  unsigned* keys_in = nullptr;
  unsigned* keys_out = nullptr;
  int* order_in = nullptr;
  int* order_out = nullptr;
  void* temp = nullptr;
  size_t temp_bytes = 0;
};

}  // namespace

void reference(const Shape& shape, const float* x, float* values, int* indices) {
  const long N = shape.N, K = shape.K;
  if (N <= 0 || K <= 0) return;
  static Scratch s;
  if (N > s.capacity) {
    cudaFree(s.keys_in);
    cudaFree(s.keys_out);
    cudaFree(s.order_in);
    cudaFree(s.order_out);
    cudaMalloc(&s.keys_in, N * sizeof(unsigned));
    cudaMalloc(&s.keys_out, N * sizeof(unsigned));
    cudaMalloc(&s.order_in, N * sizeof(int));
    cudaMalloc(&s.order_out, N * sizeof(int));
    s.capacity = N;
  }
  size_t temp_bytes = 0;
  cub::DeviceRadixSort::SortPairsDescending(nullptr, temp_bytes, s.keys_in, s.keys_out, s.order_in, s.order_out, int(N));
  if (temp_bytes > s.temp_bytes) {
    cudaFree(s.temp);
    cudaMalloc(&s.temp, temp_bytes);
    s.temp_bytes = temp_bytes;
  }
  make_keys<<<unsigned((N + 255) / 256 < 4096 ? (N + 255) / 256 : 4096), 256>>>(x, s.keys_in, s.order_in, N);
  cub::DeviceRadixSort::SortPairsDescending(s.temp, temp_bytes, s.keys_in, s.keys_out, s.order_in, s.order_out, int(N));
  gather_first<<<unsigned((K + 255) / 256), 256>>>(x, s.order_out, values, indices, K);
}
