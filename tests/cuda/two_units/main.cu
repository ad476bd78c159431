// test_cuda_two_units: a program whose two .cu files both include the pipeline's headers links
// (each kernel's host stub may be defined in both), and, where a GPU exists, the same kernel
// launched from either file computes the same row. Without a GPU it checks what the host can.
#include <cmath>
#include <cstdio>
#include <vector>

#include "kevo/retrieval/dispatch/fused_retrieval_pipeline.cuh"
#include "two_units.hpp"

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what);
    ++failures;
  }
}

}  // namespace

int main() {
  using namespace kevo::retrieval;
  for (std::uint32_t capacity : {1u, 1500u, 4096u + 2048u, 4096u + 8192u})
    check(kernels::topk_sort_bytes(capacity) == sort_bytes_in_other_unit(capacity),
          "both units size top-K's sort alike");
  if (gpu_device_count() == 0) {
    std::puts("two units linked; no GPU here, so no kernel launched");
    return failures == 0 ? 0 : 1;
  }
  constexpr int hidden_dim = 64;
  std::vector<float> w2(hidden_dim), hidden(hidden_dim);
  for (int i = 0; i < hidden_dim; ++i) {
    w2[i] = 0.01f * static_cast<float>((i * 37) % 23 - 11);  // mixed signs, not zero
    hidden[i] = 0.1f * static_cast<float>((i * 11) % 17 - 5);
  }
  double expected = 0.25;  // c2
  for (int i = 0; i < hidden_dim; ++i) expected += static_cast<double>(w2[i]) * hidden[i];
  float *d_w2, *d_c2, *d_hidden, *d_u;
  KEVO_GPU_ASSERT(gpu_malloc(&d_w2, hidden_dim * 4));
  KEVO_GPU_ASSERT(gpu_malloc(&d_hidden, hidden_dim * 4));
  KEVO_GPU_ASSERT(gpu_malloc(&d_c2, 4));
  KEVO_GPU_ASSERT(gpu_malloc(&d_u, 8));
  const float c2 = 0.25f, poison = -12345.0f;
  const float poisoned[2] = {poison, poison};
  KEVO_GPU_ASSERT(gpu_copy(d_w2, w2.data(), hidden_dim * 4));
  KEVO_GPU_ASSERT(gpu_copy(d_hidden, hidden.data(), hidden_dim * 4));
  KEVO_GPU_ASSERT(gpu_copy(d_c2, &c2, 4));
  KEVO_GPU_ASSERT(gpu_copy(d_u, poisoned, 8));
  kernels::tower_expert<<<1, 32>>>(d_w2, d_c2, d_hidden, hidden_dim, 1, 1, d_u);
  KEVO_GPU_ASSERT(gpu_device_synchronize());
  check(expert_row_in_other_unit(d_w2, d_c2, d_hidden, hidden_dim, d_u + 1), "the other unit's launch ran");
  float u[2];
  KEVO_GPU_ASSERT(gpu_copy(u, d_u, 8));
  check(u[0] != poison && u[1] != poison, "both launches wrote their row");
  check(std::fabs(u[0] - expected) < 1e-4 && u[0] == u[1], "both units' launches compute the row");
  std::printf("two units linked; both launched tower_expert: %.6f and %.6f (expected %.6f)\n", u[0], u[1], expected);
  return failures == 0 ? 0 : 1;
}
