#include "kevo_problem.hpp"

// The inputs are multiples of 1/4 in [-8, 8]: 2 x + y is exact in binary16, so rounding through it changes nothing.
void reference(const Shape& shape, const float* x, const float* y, float* out) {
  for (long i = 0; i < shape.N; ++i) out[i] = 2.0f * x[i] + y[i];
}
