// The reference GEMM on the GPU: the textbook shared-memory tiling, one 16 x 16 tile of C per block of
// 16 x 16 threads, one element of C per thread, fp16 inputs widened to fp32 and summed in fp32.
#include "kevo_problem.hpp"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace {

constexpr int tile = 16;

__global__ void __launch_bounds__(tile * tile) gemm_reference(const __half* A,  // (M, K)
                                                              const __half* B,  // (K, N)
                                                              float* C,         // (M, N)
                                                              long M, long N, long K) {
  __shared__ float A_tile[tile][tile];  // (tile rows of A, tile of k)
  __shared__ float B_tile[tile][tile];  // (tile of k, tile columns of B)
  const int ty = threadIdx.x / tile, tx = threadIdx.x % tile;
  const long row = long(blockIdx.y) * tile + ty, col = long(blockIdx.x) * tile + tx;
  float sum = 0;
  for (long k0 = 0; k0 < K; k0 += tile) {
    A_tile[ty][tx] = row < M && k0 + tx < K ? __half2float(A[row * K + k0 + tx]) : 0.0f;
    B_tile[ty][tx] = k0 + ty < K && col < N ? __half2float(B[(k0 + ty) * N + col]) : 0.0f;
    __syncthreads();
    for (int k = 0; k < tile; ++k) sum += A_tile[ty][k] * B_tile[k][tx];
    __syncthreads();
  }
  if (row < M && col < N) C[row * N + col] = sum;
}

}  // namespace

void reference(const Shape& shape, const __half* A, const __half* B, float* C) {
  const long M = shape.M, N = shape.N, K = shape.K;
  if (M <= 0 || N <= 0) return;
  const dim3 grid(unsigned((N + tile - 1) / tile), unsigned((M + tile - 1) / tile));
  gemm_reference<<<grid, tile * tile>>>(A, B, C, M, N, K);
}
