//! checker.cpp's body, before the target's part, for a problem with a C++ reference (reference.cpp, linked into the
//! checker): the checker draws the inputs itself, from the manifest's distributions. torch_reference.cpp is
//! the other choice. Lines that start with //! are not embedded (cmake/EmbedHarnessSources.cmake).
// The reference is C++, linked into this checker; the inputs are drawn here, as problem.json says.
constexpr bool inputs_from_torch = false;
void call_reference(const Shape& shape, void* const* p) { problem_reference(shape, p); }

// The PyTorch client's names, which the target's part calls only where inputs_from_torch.
std::vector<std::vector<std::uint32_t>> torch_draw(const Shape&, std::uint64_t, long) { return {}; }
[[maybe_unused]] int torch_inherited_fd = -1;
enum class TorchCounts { none, of_inputs, of_outputs };
std::vector<std::uint64_t> torch_shared_request(const std::string&, TorchCounts) { return {}; }
