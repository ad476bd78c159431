// What the two translation units of test_cuda_two_units tell each other.
#pragma once

#include <cstddef>
#include <cstdint>

std::size_t sort_bytes_in_other_unit(std::uint32_t capacity);
/// hidden[0] = relu(w1 . x + c1[0]), by the header's tower_hidden launched from the other unit.
bool hidden_row_in_other_unit(const float* w1, const float* c1, const float* x, int features, float* hidden);
