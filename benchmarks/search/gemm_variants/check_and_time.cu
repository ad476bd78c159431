// A quick check-and-time of one cuda_gemm template variant outside kevo's checker, for sweeping knobs
// before a search (../variants/sweep.sh runs it over many): checks the variant against problems/cuda_gemm's
// reference on odd and even shapes, inputs on the problem's 1/16 grid (so every answer is exact),
// outputs poisoned with NaN; then times the 4096^3 timing shape with CUDA events, one call at a
// time after a 256 MiB write that flushes L2, and prints the median and TFLOP/s on one line.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../variants/timing.cuh"
#include "kevo_problem.hpp"

namespace {

// Values k/16 with |k| <= 16: products and sums stay exact in fp32 for these K.
std::vector<__half> grid_values(long n, unsigned long salt) {
  std::vector<__half> v(n);
  for (long i = 0; i < n; ++i) v[i] = __float2half((int(mix(i * 2654435761UL + salt) % 33) - 16) / 16.0f);
  return v;
}

bool check(const Shape& s, unsigned long salt) {
  const auto a = grid_values(s.M * s.K, salt), b = grid_values(s.K * s.N, ~salt);
  __half *A, *B;
  float *expected, *got;
  cudaMalloc(&A, a.size() * 2);
  cudaMalloc(&B, b.size() * 2);
  cudaMalloc(&expected, s.M * s.N * 4);
  cudaMalloc(&got, s.M * s.N * 4);
  cudaMemcpy(A, a.data(), a.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(B, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
  cudaMemset(expected, 0xff, s.M * s.N * 4);
  cudaMemset(got, 0xff, s.M * s.N * 4);  // NaN: an element never written fails
  reference(s, A, B, expected);
  kernel(s, A, B, got);
  const cudaError_t e = cudaDeviceSynchronize();
  std::vector<float> x(s.M * s.N), y(s.M * s.N);
  cudaMemcpy(x.data(), expected, x.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(y.data(), got, y.size() * 4, cudaMemcpyDeviceToHost);
  long wrong = 0;
  for (std::size_t i = 0; i < x.size(); ++i) wrong += !(x[i] == y[i]);
  cudaFree(A), cudaFree(B), cudaFree(expected), cudaFree(got);
  if (wrong || e != cudaSuccess)
    std::printf("FAIL M=%ld N=%ld K=%ld: %ld wrong, %s\n", s.M, s.N, s.K, wrong, cudaGetErrorString(e));
  return wrong == 0 && e == cudaSuccess;
}

}  // namespace

int main() {
  bool ok = true;
  for (Shape s : {Shape{1, 1, 1}, Shape{17, 33, 9}, Shape{131, 257, 70}, Shape{256, 384, 520}, Shape{333, 200, 1000},
                  Shape{1024, 1024, 1024}})
    ok = check(s, s.M * 7 + s.N) && ok;
  if (!ok) return std::puts("BAD"), 1;
  const Shape s{4096, 4096, 4096};
  const auto a = grid_values(s.M * s.K, 1), b = grid_values(s.K * s.N, 2);
  __half *A, *B;
  float* C;
  cudaMalloc(&A, a.size() * 2);
  cudaMalloc(&B, b.size() * 2);
  cudaMalloc(&C, s.M * s.N * 4);
  cudaMemcpy(A, a.data(), a.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(B, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
  const float median = median_ms_after_flush([&] { kernel(s, A, B, C); }, 3, 10);
  std::printf("%.4f ms %.1f TFLOP/s %s\n", median, 2.0 * s.M * s.N * s.K / (median * 1e-3) / 1e12,
              cudaGetErrorString(cudaGetLastError()));
}
