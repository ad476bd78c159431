// The second translation unit of test_cuda_two_units: it includes the pipeline's headers and
// launches one of their kernels itself, as a second .cu file of a serving binary would.
#include "kevo/retrieval/dispatch/fused_retrieval_pipeline.cuh"
#include "two_units.hpp"

std::size_t sort_bytes_in_other_unit(std::uint32_t capacity) {
  return kevo::retrieval::kernels::topk_sort_bytes(capacity);
}

bool expert_row_in_other_unit(const float* w2, const float* c2, const float* hidden, int hidden_dim, float* u) {
  kevo::retrieval::kernels::tower_expert<<<1, 32>>>(w2, c2, hidden, hidden_dim, 1, 1, u);
  return cudaDeviceSynchronize() == cudaSuccess;
}
