// A small kernel for trying Nsight Compute on the device: what its CSV looks like, and whether an
// unprivileged uid may read the counters. Run: nvcc -O3 -arch=native -o /tmp/ncu_probe ncu_probe.cu
#include <cuda_runtime.h>

#include <cstdio>

__global__ void scale(const float* x, float* y, long n) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) y[i] = 2.0f * x[i] + 1.0f;
}

int main() {
  const long n = 1L << 26;
  float *x = nullptr, *y = nullptr;
  if (cudaMalloc(&x, n * sizeof(float)) != cudaSuccess || cudaMalloc(&y, n * sizeof(float)) != cudaSuccess) return 1;
  cudaMemset(x, 0, n * sizeof(float));
  for (int i = 0; i < 2; ++i) scale<<<1056, 256>>>(x, y, n);
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("ncu_probe: %s\n", cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
