// The stub problem's reference, for linking tests/harness's checker as kevo links one: y = x.
#include "kevo_problem.hpp"

void reference(const Shape& shape, const float* x, float* y) {
  for (long i = 0; i < shape.N; ++i) y[i] = x[i];
}
