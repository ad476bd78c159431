// The GPU half from the installed package, as a serving binary's .cu would take it: kevo::retrieval_cuda
// gives the flags its headers need (C++20, relaxed constexpr) and the CUDA runtime, and nothing of the
// search's wings (run.cmake checks with ldd). Building is most of the check; run, it names the GPU
// where there is one.
#include <kevo/retrieval/dispatch/fused_retrieval_pipeline.cuh>

#include <cstdio>
#include <string>

int main() {
  const int gpus = kevo::retrieval::gpu_device_count();
  if (gpus <= 0) {
    std::puts("cuda consumer: built against kevo::retrieval_cuda; no GPU here, so nothing ran on one");
    return 0;
  }
  std::string name;
  if (kevo::retrieval::gpu_device_name(&name, 0) != kevo::retrieval::gpu_success) {
    std::puts("cuda consumer: FAILED to read the GPU's name");
    return 1;
  }
  std::printf("cuda consumer: built against kevo::retrieval_cuda; %d GPU(s), the first %s\n", gpus, name.c_str());
  return 0;
}
