// A quick check-and-time of cuda_scoring template variants outside kevo's checker, for trying a
// template change before a search: renders one knob setting (../variants/render.py), checks it against
// problems/cuda_scoring/reference.cu on every check shape of problem.json and the timing shape, with
// the embeddings at offsets of 0, 8 and 1 halves (aligned to 32, to 16 bytes, and not), outputs
// poisoned, then times the median of 20 calls at the timing shape with CUDA events, each after an L2
// flush, beside a plain read of the same bytes (the roofline, measured in the same run). Inputs are
// drawn on the device, on the problem's grids. The timing N is 5M (the problem's) or the first argument.
// On the device, from the repository root:
//   python3 benchmarks/search/variants/render.py problems/cuda_scoring /tmp/k.cu math=pipeline_agent
//   nvcc -std=c++20 -O3 -arch=sm_90 -Ibenchmarks/search/scoring_variants -Iinclude -o /tmp/t \
//     benchmarks/search/scoring_variants/check_and_time.cu /tmp/k.cu problems/cuda_scoring/reference.cu && /tmp/t 100000000
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../variants/timing.cuh"
#include "kevo_problem.hpp"

// u and g on a grid of 1/128, embeddings of 1/16, biases of 1/1000: every dot product exact in fp32.
__global__ void fill(__half* vectors, long vector_count, __half* rows, long row_values, float* bias, long n) {
  const long most = vector_count > row_values ? vector_count : row_values, end = most > n ? most : n;
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < end; i += long(gridDim.x) * blockDim.x) {
    if (i < vector_count) vectors[i] = __float2half((int(mix(i) % 33) - 16) / 128.f);
    if (i < row_values) rows[i] = __float2half((int(mix(i * 7 + 5) % 33) - 16) / 16.f);
    if (i < n) bias[i] = (int(mix(~i) % 201) - 100) / 1e3f;
  }
}

// Reads every 16-byte word of the rows and every bias once, four loads in flight a thread, writing
// only if an impossible sum comes out (so the reads cannot be dropped): the bytes the scoring kernel
// must move, at the device's streaming read speed.
__global__ void read_all(const uint4* rows, long words, const float* bias, long n, float* out) {
  unsigned acc = 0;
  const long stride = long(gridDim.x) * blockDim.x;
  long i = blockIdx.x * long(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < words; i += 4 * stride) {
    const uint4 a = __ldcs(rows + i), b = __ldcs(rows + i + stride), c = __ldcs(rows + i + 2 * stride),
                d = __ldcs(rows + i + 3 * stride);
    acc ^= a.x ^ a.w ^ b.y ^ b.z ^ c.x ^ c.y ^ d.z ^ d.w;
  }
  for (; i < words; i += stride) acc ^= __ldcs(rows + i).x;
  float sum = 0;
  for (long j = blockIdx.x * long(blockDim.x) + threadIdx.x; j < n; j += stride) sum += __ldcs(bias + j);
  if (acc == 0x12345678u && sum == 1.5f) out[blockIdx.x] = sum;
}

int main(int argc, char** argv) {
  const long timing_n = argc > 1 ? std::atol(argv[1]) : 5000000;
  char timing[256] = "no timing";
  long S[][4] = {{1, 64, 1, 1},      {1, 128, 8, 2},    {15, 128, 8, 2},     {33, 64, 4, 1},
                 {97, 256, 8, 8},    {129, 128, 2, 1},  {1000, 128, 8, 2},   {4099, 128, 3, 2},
                 {12345, 256, 8, 3}, {65537, 64, 7, 7}, {100003, 128, 8, 2}, {timing_n, 128, 8, 2}};
  int bad = 0;
  int multiprocessors = 0;
  cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, 0);
  for (auto& s : S) {
    const long N = s[0], D = s[1], E = s[2], M = E * D;
    const bool timed = &s == &S[std::size(S) - 1];
    const Shape sh{N, D, E, s[3]};
    __half *du, *da;
    float *db, *d1, *d2;
    cudaMalloc(&du, 4 * M);
    cudaMalloc(&da, N * D * 2 + 64);
    cudaMalloc(&db, N * 4);
    cudaMalloc(&d1, N * 4);
    cudaMalloc(&d2, N * 4);
    std::vector<float> o(N), p(N);
    for (int f : {0, 8, 1}) {
      if (timed && f) continue;
      __half* a0 = da + f;
      fill<<<4 * multiprocessors, 256>>>(du, 2 * M, a0, N * D, db, N);
      cudaMemset(d1, 255, N * 4);
      cudaMemset(d2, 255, N * 4);
      reference(sh, du, du + M, a0, db, d1);
      kernel(sh, du, du + M, a0, db, d2);
      auto e = cudaDeviceSynchronize();
      cudaMemcpy(o.data(), d1, N * 4, cudaMemcpyDefault);
      cudaMemcpy(p.data(), d2, N * 4, cudaMemcpyDefault);
      long w = 0;
      for (long i = 0; i < N; ++i) w += !(fabsf(o[i] - p[i]) <= 1e-3f * (1 + fabsf(o[i])));
      if (w || e) {
        ++bad;
        printf("FAIL %ld %ld %ld %ld f=%d wrong=%ld %s\n", N, D, E, s[3], f, w, cudaGetErrorString(e));
      }
    }
    if (timed) {
      const float ms = median_ms_after_flush([&] { kernel(sh, du, du + M, da, db, d2); }, 3, 20);
      const long words = N * D * 2 / 16;
      const float read_ms = median_ms_after_flush(
          [&] { read_all<<<16 * multiprocessors, 256>>>(reinterpret_cast<const uint4*>(da), words, db, N, d1); }, 3, 20);
      std::snprintf(timing, sizeof timing, "%.4f ms %.2f Gads/s at N = %ld, read roofline %.4f ms = %.2f TB/s (%.0f%%) %s",
                    ms, N / (ms * 1e-3) / 1e9, N, read_ms, (N * D * 2.0 + N * 8.0) / (read_ms * 1e-3) / 1e12,
                    100.0 * read_ms / ms, cudaGetErrorString(cudaGetLastError()));
    }
    cudaFree(du);
    cudaFree(da);
    cudaFree(db);
    cudaFree(d1);
    cudaFree(d2);
  }
  // One line, as the sweep (../variants/sweep.sh) reads it.
  if (bad) printf("%s BAD %d\n", timing, bad);
  else printf("%s ALL OK\n", timing);
}
