// The reference row-wise softmax on the GPU: one block of 256 threads per row, three passes over the
// row in global memory (max, sum of expf, write expf / sum), each reduced across the block.
#include "kevo_problem.hpp"

#include <cuda_runtime.h>

#include <cmath>

namespace {

constexpr int reference_threads = 256;

// Reduces `v` over the block; every thread gets the result. `scratch` holds one value per warp.
template <class Op>
__device__ float block_reduce(float v, Op op, float* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < reference_threads / 32; ++w) v = op(v, scratch[w]);
  __syncthreads();  // scratch is reused by the next reduction
  return v;
}

__global__ void __launch_bounds__(reference_threads) softmax_reference(const float* x,  // (R, C)
                                                                       float* y,        // (R, C)
                                                                       long C) {
  __shared__ float scratch[reference_threads / 32];
  const float* in = x + blockIdx.x * C;
  float* out = y + blockIdx.x * C;
  float max = -INFINITY;
  for (long c = threadIdx.x; c < C; c += reference_threads) max = fmaxf(max, in[c]);
  max = block_reduce(max, [](float a, float b) { return fmaxf(a, b); }, scratch);
  float sum = 0;
  for (long c = threadIdx.x; c < C; c += reference_threads) sum += expf(in[c] - max);
  sum = block_reduce(sum, [](float a, float b) { return a + b; }, scratch);
  for (long c = threadIdx.x; c < C; c += reference_threads) out[c] = expf(in[c] - max) / sum;
}

}  // namespace

void reference(const Shape& shape, const float* x, float* y) {
  if (shape.R > 0 && shape.C > 0) softmax_reference<<<unsigned(shape.R), reference_threads>>>(x, y, shape.C);
}
