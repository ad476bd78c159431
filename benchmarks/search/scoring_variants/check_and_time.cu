// A quick check-and-time of cuda_scoring template variants outside kevo's checker, for trying a
// template change before a search: renders one knob setting (../variants/render.py), checks it against
// problems/cuda_scoring/reference.cu on every check shape of problem.json and the timing shape, with
// the embeddings at offsets of 0, 8 and 1 halves (aligned to 32, to 16 bytes, and not), outputs
// poisoned, then times 20 calls at N = 5M with CUDA events. No flush: 1.3 GB a call streams past L2.
// On the device, from the repository root:
//   python3 benchmarks/search/variants/render.py problems/cuda_scoring /tmp/k.cu math=tensor_core staging=shared_ring
//   nvcc -std=c++17 -O3 -arch=sm_90 -Ibenchmarks/search/scoring_variants -o /tmp/t \
//     benchmarks/search/scoring_variants/check_and_time.cu /tmp/k.cu problems/cuda_scoring/reference.cu && /tmp/t
#include <cmath>
#include <cstdio>
#include <vector>

#include "../variants/timing.cuh"
#include "kevo_problem.hpp"
#define C(d, s, n) cudaMemcpy(d, s, n, cudaMemcpyDefault)

unsigned h(unsigned long x) { return mix(x); }
int main() {
  long S[][4] = {{1, 64, 1, 1},      {1, 128, 8, 2},    {15, 128, 8, 2},     {33, 64, 4, 1},
                 {97, 256, 8, 8},    {129, 128, 2, 1},  {1000, 128, 8, 2},   {4099, 128, 3, 2},
                 {12345, 256, 8, 3}, {65537, 64, 7, 7}, {100003, 128, 8, 2}, {5000000, 128, 8, 2}};
  int bad = 0;
  for (auto& s : S) {
    long N = s[0], D = s[1], E = s[2], M = E * D;
    Shape sh{N, D, E, s[3]};
    std::vector<__half> u(2 * M), a(N * D);
    std::vector<float> b(N), o(N), p(N);
    for (long i = 0; i < 2 * M; ++i) u[i] = (int(h(i) % 33) - 16) / 128.f;
    for (long i = 0; i < N * D; ++i) a[i] = (int(h(i * 7 + 5) % 33) - 16) / 16.f;
    for (long i = 0; i < N; ++i) b[i] = (int(h(~i) % 201) - 100) / 1e3f;
    __half *du, *da;
    float *db, *d1, *d2;
    cudaMalloc(&du, 4 * M);
    cudaMalloc(&da, N * D * 2 + 64);
    cudaMalloc(&db, N * 4);
    cudaMalloc(&d1, N * 4);
    cudaMalloc(&d2, N * 4);
    C(du, u.data(), 4 * M);
    C(db, b.data(), N * 4);
    for (int f : {0, 8, 1}) {
      if (N > 2e5 && f) continue;
      __half* a0 = da + f;
      C(a0, a.data(), N * D * 2);
      cudaMemset(d1, 255, N * 4);
      cudaMemset(d2, 255, N * 4);
      reference(sh, du, du + M, a0, db, d1);
      kernel(sh, du, du + M, a0, db, d2);
      auto e = cudaDeviceSynchronize();
      C(o.data(), d1, N * 4);
      C(p.data(), d2, N * 4);
      long w = 0;
      for (long i = 0; i < N; ++i) w += !(fabsf(o[i] - p[i]) <= 1e-3f * (1 + fabsf(o[i])));
      if (w || e) {
        ++bad;
        printf("FAIL %ld %ld %ld %ld f=%d wrong=%ld %s\n", N, D, E, s[3], f, w, cudaGetErrorString(e));
      }
    }
    if (N > 2e5) {
      cudaEvent_t x, y;
      cudaEventCreate(&x);
      cudaEventCreate(&y);
      for (int i = 0; i < 3; ++i) kernel(sh, du, du + M, da, db, d2);
      cudaEventRecord(x);
      for (int i = 0; i < 20; ++i) kernel(sh, du, du + M, da, db, d2);
      cudaEventRecord(y);
      cudaEventSynchronize(y);
      float ms;
      cudaEventElapsedTime(&ms, x, y);
      printf("%.1f us %.2f Gads/s %s\n", ms * 50, N / (ms / 20 * 1e-3) / 1e9, cudaGetErrorString(cudaGetLastError()));
    }
    cudaFree(du);
    cudaFree(da);
    cudaFree(db);
    cudaFree(d1);
    cudaFree(d2);
  }
  printf(bad ? "BAD %d\n" : "ALL OK\n", bad);
}
