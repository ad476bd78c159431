//! checker.cpp's two units meet here. The problem's unit (checker_problem.cpp.in, filled and compiled for each
//! problem) defines what is declared below; kevo's checker body (the process part, the reference part and the
//! target's part: the same text for every problem, so compiled once per build cache) uses it. Both units begin
//! with this text, and the body sees a problem only through it: its sizes as the wire carries them, never the
//! problem's own `struct Shape`. Lines that start with //! are not embedded (cmake/EmbedHarnessSources.cmake).
#include <cstddef>
#include <cstdint>
#include <string>

namespace kevo_checker {

// One call's sizes as the wire carries them: the problem's parameters, in its manifest's order.
constexpr std::size_t max_shape_params = 16;
struct ShapeValues {
  std::int64_t values[max_shape_params];
};

struct TensorInfo {
  const char* name;
  bool output;
  bool is_float;
  bool uniform;
  double scale, low, high, step;
  long (*size)(const ShapeValues&);
  int kind;  // 0 float, 1 int, 2 half
};

// Shapes that a range-for walks (C++17: no std::span; problems may ask for -std=c++17).
struct ShapeList {
  const ShapeValues* first;
  std::size_t count;
  const ShapeValues* begin() const { return first; }
  const ShapeValues* end() const { return first + count; }
};

extern const TensorInfo tensors[];
extern const std::size_t tensor_count;
extern const ShapeList check_shapes;
extern const ShapeValues timing_shape;
extern const double tolerance_abs, tolerance_rel;
double bytes_model(const ShapeValues& shape);
double flops_model(const ShapeValues& shape);
std::string shape_text(const ShapeValues& shape);

// The problem's C++ reference (reference.cpp) on a table of pointers, in manifest order. A problem whose
// reference is PyTorch's defines none (the body's torch part never calls it); it defines these instead:
void problem_reference(const ShapeValues& shape, void* const* p);
extern const char* const torch_python;  // the helper's interpreter
extern const char* const torch_scale;   // --size-scale, as text
extern const char* const torch_device;  // "cpu" or "cuda"
extern const char* const torch_spec;    // the kernel's tensors as the helper's `serve` reads them (JSON)

}  // namespace kevo_checker
