// The declarations kevo's generated kevo_problem.hpp gives cuda_gemm, for check_and_time.cu.
#pragma once
#include <cuda_fp16.h>
struct Shape {
  long M, N, K;
};
void reference(const Shape&, const __half* A, const __half* B, float* C);
void kernel(const Shape&, const __half* A, const __half* B, float* C);
