// The reference CPU scoring (shared/spec/retrieval-model.md, routing width 2): a plain scalar loop.
// Its strict left-to-right fp32 sums keep the compiler from vectorizing it.
#include "kevo_problem.hpp"

#include <cmath>

void reference(const Shape& shape, const float* ads,  // (N, D)
               const float* bias,                      // (N)
               const float* experts,                   // (E, D): u_e
               const float* gates,                     // (E, D): g_e
               float* scores) {                        // (N)
  const long N = shape.N, D = shape.D, E = shape.E;
  for (long i = 0; i < N; ++i) {
    const float* a = ads + i * D;
    // The two experts with the largest gate logits; on a tie the lower index wins.
    long first = -1, second = -1;
    float first_logit = 0, second_logit = 0, first_score = 0, second_score = 0;
    for (long e = 0; e < E; ++e) {
      float s = 0, l = 0;
      for (long d = 0; d < D; ++d) {
        s += a[d] * experts[e * D + d];
        l += a[d] * gates[e * D + d];
      }
      if (first < 0 || l > first_logit) {
        second = first, second_logit = first_logit, second_score = first_score;
        first = e, first_logit = l, first_score = s;
      } else if (second < 0 || l > second_logit) {
        second = e, second_logit = l, second_score = s;
      }
    }
    if (second < 0) {  // a single expert: its weight is 1
      scores[i] = first_score + bias[i];
      continue;
    }
    // softmax over the two logits, shifted by the larger one
    const float w = std::exp(second_logit - first_logit);
    scores[i] = (first_score + w * second_score) / (1.0f + w) + bias[i];
  }
}
