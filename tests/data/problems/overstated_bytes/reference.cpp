// The reference row-wise softmax: three scalar passes per row (max, exp and sum, normalize).
#include "kevo_problem.hpp"

#include <cmath>

void reference(const Shape& shape, const float* x,  // (R, C)
               float* y) {                           // (R, C)
  for (long r = 0; r < shape.R; ++r) {
    const float* in = x + r * shape.C;
    float* out = y + r * shape.C;
    float max = in[0];
    for (long c = 1; c < shape.C; ++c) max = in[c] > max ? in[c] : max;
    float sum = 0;
    for (long c = 0; c < shape.C; ++c) {
      out[c] = std::exp(in[c] - max);
      sum += out[c];
    }
    for (long c = 0; c < shape.C; ++c) out[c] /= sum;
  }
}
