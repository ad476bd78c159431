// kevo/retrieval/dispatch/request_kernels.cuh: a request's preparation: the user towers, the gating keys, the query bitmap.
// Thin kernels over the agents (agent/): each maps threads to an agent's work. The pipeline
// (fused_retrieval_pipeline.cuh) and the index (device_ad_index.cuh) launch them.
#pragma once

#include <cstdint>

#include "kevo/retrieval/agent/request_vectors.cuh"
#include "kevo/retrieval/agent/scoring.cuh"  // kMaxGpuExperts: the (16, d) vectors buffer is scoring's B operand
#include "kevo/retrieval/agent/topk.cuh"
#include "kevo/retrieval/agent/views.cuh"

namespace kevo::retrieval::kernels {

// Every kernel is a template, those with no parameters of their own taking an unused
// `template <class = void>`: a template's host stub may be defined in each translation unit, so two
// .cu files of one program can include this header (a plain __global__ function would be defined
// twice and fail to link). Launch as usual; take an address as `kernel<>`.

/// Threads of each block of the tower kernels (prepare_request included), which compute one row a warp.
inline constexpr int kTowerThreads = 256;

/// The blocks of a tower kernel over `rows` rows, one warp a row.
__host__ __device__ constexpr unsigned tower_blocks(int rows) {
  constexpr int warps = kTowerThreads / gpu_logical_warp_size;
  return static_cast<unsigned>((rows + warps - 1) / warps);
}
/// The blocks of prepare_request for a tower of `rows` hidden units: the query's block, then the tower's.
__host__ __device__ constexpr unsigned prepare_request_blocks(int rows) { return 1u + tower_blocks(rows); }

/// A request's first kernel: two independent jobs in one launch, since each launch costs the host
/// an enqueue and the device a gap, at every pool size (run 154: the preparation's four kernels
/// took ~15 us of the device's ~27).
/// - Block 0 clears the request's top-K state and query bitmap, then sets its (category, value)
///   bits: one block, so that a barrier orders the clearing before the setting.
/// - The other blocks compute hidden(E, H) = relu(W1 x + c1), one warp a row.
/// Neither job reads what the other writes; tower_gate's flag on the state and matching's reads of
/// the bitmap come in later kernels, which wait for this grid to finish.
template <class = void>
__global__ void __launch_bounds__(kTowerThreads)
    prepare_request(const float* w1, const float* c1, const float* x, int features, int rows, float* hidden,
                    const std::uint32_t* bits, const std::uint32_t* count, std::uint32_t* bitmap,
                    std::uint32_t bitmap_words, TopKState* state) {
  gpu_wait_for_prior_grid();  // where launched after prior (MatchingPolicy::launch_after_prior)
  if (blockIdx.x == 0) {
    static_assert(sizeof(TopKState) % 16 == 0 && alignof(TopKState) <= 16);
    auto* state_words = reinterpret_cast<uint4*>(state);  // temp regions are 256-byte aligned
    for (std::uint32_t i = threadIdx.x; i < sizeof(TopKState) / 16; i += blockDim.x) state_words[i] = uint4{};
    for (std::uint32_t i = threadIdx.x; i < bitmap_words; i += blockDim.x) bitmap[i] = 0;
    __syncthreads();
    for (std::uint32_t i = threadIdx.x; i < *count; i += blockDim.x)
      atomicOr(bitmap + (bits[i] >> 5), 1u << (bits[i] & 31u));
    return;
  }
  const int row = static_cast<int>(((blockIdx.x - 1) * blockDim.x + threadIdx.x) / gpu_logical_warp_size);
  if (row >= rows) return;
  const float dot = warp_dot(w1 + static_cast<std::size_t>(row) * features, x, features, threadIdx.x % gpu_logical_warp_size);
  if (threadIdx.x % gpu_logical_warp_size == 0) hidden[row] = fmaxf(__fadd_rn(dot, c1[row]), 0.0f);
}

/// u(E, d) = W2_e hidden_e + c2_e.
template <class = void>
__global__ void tower_expert(const float* w2, const float* c2, const float* hidden, int hidden_dim, int dim, int rows,
                             float* u) {
  gpu_wait_for_prior_grid();  // where launched after prior (MatchingPolicy::launch_after_prior)
  const int row = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / gpu_logical_warp_size);
  if (row >= rows) return;
  const int e = row / dim;
  const float dot = warp_dot(w2 + static_cast<std::size_t>(row) * hidden_dim,
                             hidden + static_cast<std::size_t>(e) * hidden_dim, hidden_dim, threadIdx.x % gpu_logical_warp_size);
  if (threadIdx.x % gpu_logical_warp_size == 0) u[row] = __fadd_rn(dot, c2[row]);
}

/// vectors(16, d) fp16: rows 0..7 = u_e, rows 8..15 = g_e = P u_e / sqrt(d); experts >= E are zero.
/// A value past fp16's range flags kOverflowVectors in the request's state (its scores would be NaN).
template <class = void>
__global__ void tower_gate(const float* projection, const float* u, int dim, int experts, __half* vectors,
                           TopKState* state) {
  gpu_wait_for_prior_grid();  // where launched after prior (MatchingPolicy::launch_after_prior)
  const int row = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / gpu_logical_warp_size);
  if (row >= kMaxGpuExperts * dim) return;
  const int e = row / dim, j = row % dim;
  const int lane = threadIdx.x % gpu_logical_warp_size;
  if (e >= experts) {
    if (lane == 0) vectors[row] = vectors[kMaxGpuExperts * dim + row] = __float2half_rn(0.0f);
    return;
  }
  const float dot = warp_dot(projection + static_cast<std::size_t>(j) * dim, u + static_cast<std::size_t>(e) * dim,
                             dim, lane);
  if (lane == 0) {
    const __half g = __float2half_rn(__fdiv_rn(dot, __fsqrt_rn(static_cast<float>(dim))));
    const __half expert = __float2half_rn(u[row]);
    vectors[kMaxGpuExperts * dim + row] = g;
    vectors[row] = expert;
    if (__hisinf(g) || __hisnan(g) || __hisinf(expert) || __hisnan(expert)) atomicOr(&state->overflow, kOverflowVectors);
  }
}

}  // namespace kevo::retrieval::kernels
