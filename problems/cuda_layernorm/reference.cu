// The reference layer norm on the GPU: one block of 256 threads per row, three passes over the row in
// global memory (the mean, the biased variance around it, then the normalized, scaled and shifted row).
#include "kevo_problem.hpp"

#include <cuda_runtime.h>

namespace {

constexpr int reference_threads = 256;
constexpr float epsilon = 1e-5f;

// The block's sum of `v`; every thread gets it. `scratch` holds one value per warp.
__device__ float block_sum(float v, float* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = 0;
  for (int w = 0; w < reference_threads / 32; ++w) v += scratch[w];
  __syncthreads();  // scratch is reused by the next reduction
  return v;
}

__global__ void __launch_bounds__(reference_threads) layernorm_reference(const float* x,      // (R, C)
                                                                         const float* gamma,  // (C)
                                                                         const float* beta,   // (C)
                                                                         float* y,            // (R, C)
                                                                         long C) {
  __shared__ float scratch[reference_threads / 32];
  const float* in = x + blockIdx.x * C;
  float* out = y + blockIdx.x * C;
  float sum = 0;
  for (long c = threadIdx.x; c < C; c += reference_threads) sum += in[c];
  const float mean = block_sum(sum, scratch) / C;
  float squares = 0;
  for (long c = threadIdx.x; c < C; c += reference_threads) squares += (in[c] - mean) * (in[c] - mean);
  const float variance = block_sum(squares, scratch) / C;
  const float inverse_std = 1.0f / sqrtf(variance + epsilon);
  for (long c = threadIdx.x; c < C; c += reference_threads) out[c] = (in[c] - mean) * inverse_std * gamma[c] + beta[c];
}

}  // namespace

void reference(const Shape& shape, const float* x, const float* gamma, const float* beta, float* y) {
  if (shape.R > 0 && shape.C > 0) layernorm_reference<<<unsigned(shape.R), reference_threads>>>(x, gamma, beta, y, shape.C);
}
