// What the two translation units of test_cuda_two_units tell each other.
#pragma once

#include <cstddef>
#include <cstdint>

std::size_t sort_bytes_in_other_unit(std::uint32_t capacity);
/// u[0] = w2 . hidden + c2[0], by the header's tower_expert launched from the other unit.
bool expert_row_in_other_unit(const float* w2, const float* c2, const float* hidden, int hidden_dim, float* u);
