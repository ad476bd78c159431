// kevo_problem.hpp for tests/harness: what kevo would generate (harness.hpp problem_header) for a
// problem with one parameter N, an input x and an output y of N floats.
#pragma once
#ifdef __CUDACC__
#include <cuda_fp16.h>  // __half, as the header of a CUDA problem includes it
#endif

struct Shape {
  long N;
};

void reference(const Shape& shape, const float* x, float* y);
void kernel(const Shape& shape, const float* x, float* y);
