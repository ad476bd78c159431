// The reference: one thread per element.
#include "kevo_problem.hpp"

template <class = void>
__global__ void axpy_reference(long n, const float* x, const __half* y, float* out) {
  const long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = 2.0f * x[i] + __half2float(y[i]);
}

void reference(const Shape& shape, const float* x, const __half* y, float* out) {
  axpy_reference<<<static_cast<unsigned>((shape.N + 255) / 256), 256>>>(shape.N, x, y, out);
}
