// What the variant harnesses (../*_variants/check_and_time.cu) share: a hash for deterministic
// inputs, and a call's median time by CUDA events, one call at a time after a 256 MiB write that
// pushes the previous call's data out of L2.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

__host__ __device__ inline unsigned mix(unsigned long x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdUL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53UL;
  return unsigned(x >> 32);
}

template <class Call>
float median_ms_after_flush(Call call, int warmup, int timed) {
  constexpr std::size_t flush_bytes = std::size_t{256} << 20;
  void* flush = nullptr;
  cudaMalloc(&flush, flush_bytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> ms;
  for (int i = 0; i < warmup + timed; ++i) {
    cudaMemsetAsync(flush, i, flush_bytes);
    cudaEventRecord(start);
    call();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    if (i >= warmup) ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(flush);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}
