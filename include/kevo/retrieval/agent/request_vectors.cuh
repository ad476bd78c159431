// kevo/retrieval/agent/request_vectors.cuh: the user towers and gating keys of one request, as
// warp-per-row dot products (the weights are a few MB, read once per request).
//
//   float y = warp_dot(row, x, n, lane);   // every lane gets the sum
#pragma once

#include <cstdint>

#include "kevo/retrieval/portability.cuh"

namespace kevo::retrieval {

/// Sum over i < n of row[i] * x[i], lanes striding the row so that loads coalesce. The order
/// (per-lane fma chains, then a butterfly) is the one the CPU reference's ordered_dot follows.
__device__ __forceinline__ float warp_dot(const float* row, const float* x, int n, int lane) {
  float acc = 0.0f;
  for (int i = lane; i < n; i += gpu_logical_warp_size) acc = __fmaf_rn(row[i], x[i], acc);
#pragma unroll
  for (int offset = gpu_logical_warp_size / 2; offset > 0; offset /= 2) acc += gpu_shfl_xor(gpu_all_lanes, acc, offset);
  return acc;
}

}  // namespace kevo::retrieval
