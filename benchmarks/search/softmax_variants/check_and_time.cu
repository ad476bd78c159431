// A quick check-and-time of one cuda_softmax template variant outside kevo's checker, for sweeping
// knobs before a search (../variants/sweep.sh runs it over many, with PROBLEM=cuda_softmax):
// checks the variant against problems/cuda_softmax's reference on the problem's check shapes
// (normal inputs of scale 3, outputs poisoned with NaN, the problem's tolerance), then times the
// 16384 x 4096 timing shape with CUDA events, one call at a time after a 256 MiB write that
// flushes L2, and prints the median and the bandwidth on one line.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "../variants/timing.cuh"
#include "kevo_problem.hpp"

namespace {

bool check(const Shape& s, unsigned seed) {
  const long n = s.R * s.C;
  std::vector<float> x(n), expected(n), got(n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& v : x) v = normal(rng);
  float *dx, *dexpected, *dgot;
  cudaMalloc(&dx, n * 4);
  cudaMalloc(&dexpected, n * 4);
  cudaMalloc(&dgot, n * 4);
  cudaMemcpy(dx, x.data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemset(dgot, 0xff, n * 4);  // NaN: an element never written fails
  reference(s, dx, dexpected);
  kernel(s, dx, dgot);
  const cudaError_t e = cudaDeviceSynchronize();
  cudaMemcpy(expected.data(), dexpected, n * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(got.data(), dgot, n * 4, cudaMemcpyDeviceToHost);
  long wrong = 0;
  for (long i = 0; i < n; ++i) wrong += !(std::fabs(got[i] - expected[i]) <= 1e-7f + 5e-5f * std::fabs(expected[i]));
  cudaFree(dx), cudaFree(dexpected), cudaFree(dgot);
  if (wrong || e != cudaSuccess) std::printf("FAIL R=%ld C=%ld: %ld wrong, %s\n", s.R, s.C, wrong, cudaGetErrorString(e));
  return wrong == 0 && e == cudaSuccess;
}

}  // namespace

int main() {
  bool ok = true;
  unsigned seed = 1;
  for (Shape s : {Shape{1, 1}, Shape{3, 17}, Shape{1000, 1}, Shape{64, 1000}, Shape{7, 4099}, Shape{129, 64}, Shape{33, 4096},
                  Shape{5, 12290}, Shape{3, 70001}})
    ok = check(s, seed++) && ok;
  if (!ok) return std::puts("BAD"), 1;
  const Shape s{16384, 4096};
  const long n = s.R * s.C;
  float *x, *y;
  cudaMalloc(&x, n * 4);
  cudaMalloc(&y, n * 4);
  std::vector<float> host(n);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& v : host) v = normal(rng);
  cudaMemcpy(x, host.data(), n * 4, cudaMemcpyHostToDevice);
  const float median = median_ms_after_flush([&] { kernel(s, x, y); }, 3, 20);
  std::printf("%.4f ms %.0f GB/s %s\n", median, 8.0 * n / (median * 1e-3) / 1e9, cudaGetErrorString(cudaGetLastError()));
}
