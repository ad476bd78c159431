// The second translation unit of test_cuda_two_units: it includes the pipeline's headers and
// launches one of their kernels itself, as a second .cu file of a serving binary would.
#include "kevo/retrieval/dispatch/fused_retrieval_pipeline.cuh"
#include "two_units.hpp"

std::size_t sort_bytes_in_other_unit(std::uint32_t capacity) {
  return kevo::retrieval::kernels::topk_sort_bytes(capacity);
}

bool hidden_row_in_other_unit(const float* w1, const float* c1, const float* x, int features, float* hidden) {
  kevo::retrieval::kernels::tower_hidden<<<1, 32>>>(w1, c1, x, features, 1, hidden);
  return cudaDeviceSynchronize() == cudaSuccess;
}
