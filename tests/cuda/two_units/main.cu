// test_cuda_two_units: a program whose two .cu files both include the pipeline's headers links
// (each kernel's host stub may be defined in both), and, where a GPU exists, the same kernel
// launched from either file computes the same row. Without a GPU it checks what the host can.
#include <algorithm>
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
  constexpr int features = 64;
  std::vector<float> w1(features), x(features);
  for (int i = 0; i < features; ++i) {
    w1[i] = 0.01f * static_cast<float>((i * 37) % 23 - 11);  // mixed signs, not zero
    x[i] = 0.1f * static_cast<float>((i * 11) % 17 - 5);
  }
  double expected = 0.25;  // c1
  for (int i = 0; i < features; ++i) expected += static_cast<double>(w1[i]) * x[i];
  expected = std::max(expected, 0.0);
  float *d_w1, *d_c1, *d_x, *d_hidden;
  KEVO_GPU_ASSERT(gpu_malloc(&d_w1, features * 4));
  KEVO_GPU_ASSERT(gpu_malloc(&d_x, features * 4));
  KEVO_GPU_ASSERT(gpu_malloc(&d_c1, 4));
  KEVO_GPU_ASSERT(gpu_malloc(&d_hidden, 8));
  const float c1 = 0.25f, poison = -12345.0f;
  const float poisoned[2] = {poison, poison};
  KEVO_GPU_ASSERT(gpu_copy(d_w1, w1.data(), features * 4));
  KEVO_GPU_ASSERT(gpu_copy(d_x, x.data(), features * 4));
  KEVO_GPU_ASSERT(gpu_copy(d_c1, &c1, 4));
  KEVO_GPU_ASSERT(gpu_copy(d_hidden, poisoned, 8));
  kernels::tower_hidden<<<1, 32>>>(d_w1, d_c1, d_x, features, 1, d_hidden);
  KEVO_GPU_ASSERT(gpu_device_synchronize());
  check(hidden_row_in_other_unit(d_w1, d_c1, d_x, features, d_hidden + 1), "the other unit's launch ran");
  float hidden[2];
  KEVO_GPU_ASSERT(gpu_copy(hidden, d_hidden, 8));
  check(hidden[0] != poison && hidden[1] != poison, "both launches wrote their row");
  check(std::fabs(hidden[0] - expected) < 1e-4 && hidden[0] == hidden[1], "both units' launches compute the row");
  std::printf("two units linked; both launched tower_hidden: %.6f and %.6f (expected %.6f)\n", hidden[0], hidden[1],
              expected);
  return failures == 0 ? 0 : 1;
}
