// The reference SGEMM: the naive triple loop, one dot product per element of C.
#include "kevo_problem.hpp"

void reference(const Shape& shape, const float* A,  // (M, K)
               const float* B,                       // (K, N)
               float* C) {                           // (M, N)
  const long M = shape.M, N = shape.N, K = shape.K;
  for (long i = 0; i < M; ++i)
    for (long j = 0; j < N; ++j) {
      float sum = 0;
      for (long k = 0; k < K; ++k) sum += A[i * K + k] * B[k * N + j];
      C[i * N + j] = sum;
    }
}
