// The reference fused MoE-gated scoring on the GPU: one thread per ad, plain loops, fp32 sums.
// It is the spec's score, ../shared/spec/retrieval-model.md, "Score (the MoE-gated interaction
// model)", as include/kevo/retrieval/reference.hpp's reference_score computes it:
//   s_e = a_i . u_e,  l_e = a_i . g_e                 (e < E; fp16 values, fp32 sums)
//   chosen = the KE experts with the largest l_e      (ties: the lower expert index first)
//   w_e = exp(l_e - max chosen l) / sum over chosen of exp(l_c - max chosen l)
//   score_i = sum over chosen of w_e s_e + b_i
// KE == E is dense softmax gating. Every ad is scored (the pipeline scores the eligible ones only).
#include "kevo_problem.hpp"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

namespace {

constexpr int reference_threads = 256;
constexpr int max_experts = 8;  // the pipeline's GPU limit (kMaxGpuExperts)

__global__ void __launch_bounds__(reference_threads) scoring_reference(const __half* u,           // (E, D)
                                                                       const __half* g,           // (E, D)
                                                                       const __half* embeddings,  // (N, D)
                                                                       const float* bias,         // (N)
                                                                       float* scores,             // (N)
                                                                       long N, long D, int E, int KE) {
  const long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
  if (i >= N) return;
  const __half* a = embeddings + i * D;

  // The expert scores and gate logits.
  float s[max_experts], l[max_experts];
  for (int e = 0; e < E; ++e) {
    float score = 0, logit = 0;
    for (long k = 0; k < D; ++k) {
      const float x = __half2float(a[k]);
      score += x * __half2float(u[e * D + k]);
      logit += x * __half2float(g[e * D + k]);
    }
    s[e] = score;
    l[e] = logit;
  }

  // Routing: KE times, the unchosen expert with the largest logit (the lower index on a tie).
  bool chosen[max_experts] = {};
  float top = 0;
  for (int r = 0; r < KE; ++r) {
    int best = -1;
    for (int e = 0; e < E; ++e)
      if (!chosen[e] && (best < 0 || l[e] > l[best])) best = e;
    chosen[best] = true;
    if (r == 0) top = l[best];  // the largest chosen logit
  }

  // Softmax over the chosen logits, the weighted expert scores, the bias.
  float weighted = 0, total = 0;
  for (int e = 0; e < E; ++e) {
    if (!chosen[e]) continue;
    const float w = expf(l[e] - top);
    weighted += w * s[e];
    total += w;
  }
  scores[i] = weighted / total + bias[i];
}

}  // namespace

void reference(const Shape& shape, const __half* u, const __half* g, const __half* embeddings, const float* bias,
               float* scores) {
  const long N = shape.N, D = shape.D;
  const int E = int(shape.E), KE = int(shape.KE);
  // Outside the problem's domain (1 <= KE <= E <= 8) nothing is written, and every check fails.
  if (N <= 0 || D <= 0 || E < 1 || E > max_experts || KE < 1 || KE > E) return;
  const long blocks = (N + reference_threads - 1) / reference_threads;
  scoring_reference<<<unsigned(blocks), reference_threads>>>(u, g, embeddings, bias, scores, N, D, E, KE);
}
