// The GPU half from the installed package, as a user's .cu would take it: kevo::cuda gives the flags
// its headers need (C++20, relaxed constexpr) and the CUDA runtime. Building is most of the check;
// run, it names the GPU where there is one.
#include <kevo/retrieval/dispatch/fused_retrieval_pipeline.cuh>

#include <cstdio>
#include <string>

int main() {
  const int gpus = kevo::retrieval::gpu_device_count();
  if (gpus <= 0) {
    std::puts("cuda consumer: built against kevo::cuda; no GPU here, so nothing ran on one");
    return 0;
  }
  std::string name;
  if (kevo::retrieval::gpu_device_name(&name, 0) != kevo::retrieval::gpu_success) {
    std::puts("cuda consumer: FAILED to read the GPU's name");
    return 1;
  }
  std::printf("cuda consumer: built against kevo::cuda; %d GPU(s), the first %s\n", gpus, name.c_str());
  return 0;
}
