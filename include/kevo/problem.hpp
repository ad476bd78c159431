// kevo/problem.hpp: a kernel-optimization problem, as a user writes it: a directory holding
//   problem.json      the manifest: params, tensors, shapes, tolerance, bytes/FLOPs model, knobs
//   reference.cpp     the reference implementation: `void reference(const Shape&, tensors...)`
//   <template>        the kernel template: `void kernel(const Shape&, tensors...)`, with ${knob}
//                     placeholders that each candidate fills in from the knobs' declared domains
// See problems/README.md for the format, and problems/ for three complete examples. This header
// holds the types (the search loop needs them); load_problem, which reads a directory's JSON, is
// in kevo/problem_loader.hpp.
//
//   auto problem = kevo::load_problem("problems/cpu_scoring");
//   if (!problem) { fmt::print(stderr, "{}\n", problem.error().message); return 2; }
//   std::string source = problem->render(problem->default_knobs());
#pragma once

#include <kevo/candidate.hpp>
#include <kevo/expected.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace kevo {

/// Which side of the machine a knob works on, so a synthesizer can answer a diagnosis with the
/// knobs that address it (a memory-bound parent gets memory-side moves).
enum class KnobSide : std::uint8_t { memory, compute, parallel, any };

inline constexpr std::string_view to_string(KnobSide s) {
  switch (s) {
    case KnobSide::memory: return "memory";
    case KnobSide::compute: return "compute";
    case KnobSide::parallel: return "parallel";
    case KnobSide::any: return "any";
  }
  return "?";
}

/// One tuning knob: its legal values in a meaningful order (neighbours are small moves).
struct KnobSpec {
  std::string name;
  std::vector<std::string> domain;
  std::string default_value;
  KnobSide side = KnobSide::any;

  std::optional<std::size_t> index_of(std::string_view value) const {
    for (std::size_t i = 0; i < domain.size(); ++i)
      if (domain[i] == value) return i;
    return std::nullopt;
  }
};

/// A setting the problem's author expects to be worth a look (as Triton's autotune configs are): a
/// few knobs set at once, the rest as the parent has them. The template search tries each from
/// the root before it moves one knob at a time, which alone may never cross to another family
/// of kernels (tensor cores, a radix select) when each knob on its own makes things slower.
struct StartingPoint {
  std::string name;
  Knobs knobs;  ///< only the knobs it sets
};

enum class TensorRole : std::uint8_t { input, output };
enum class ElementType : std::uint8_t { f32, i32, f16 };  ///< "float", "int", "half" (CUDA problems)

/// A kernel argument: its element count is a C++ expression over the problem's params.
struct TensorSpec {
  std::string name;
  TensorRole role = TensorRole::input;
  ElementType type = ElementType::f32;
  std::string size;       ///< e.g. "N * D"
  std::string init = "normal";  ///< inputs: "normal" (mean 0, sd `scale`) or "uniform" [low, high)
  double scale = 1.0;
  double low = 0, high = 1;
  double step = 0;        ///< inputs: round drawn values to multiples of `step` (0: no rounding),
                          ///< so that sums are exact in any order when the kernel may reorder them
};

/// Values for the problem's params, one shape the kernel must handle.
using Shape = std::map<std::string, long, std::less<>>;

struct Tolerance {
  double absolute = 1e-5;
  double relative = 1e-5;
};

/// Where a KernelBench-format problem's reference comes from: PyTorch runs the file's `Model`, in kevo's
/// helper process beside the trusted checker (kevo/eval/torch_problem.hpp loads one).
struct TorchModule {
  std::filesystem::path file;     ///< the .py, absolute
  std::string python;             ///< the interpreter whose PyTorch runs it, absolute
  std::string device = "cpu";     ///< "cpu", or "cuda" for a CUDA target
  double size_scale = 1.0;        ///< the factor applied to the module's size constants (--size-scale)
  std::string family;             ///< the template family its forward matched; empty: none (search it with an LLM)
  std::string torch_version;      ///< the helper's PyTorch
  bool has_compile = false;       ///< whether that PyTorch has torch.compile (a peer to time beside eager)
};

struct Problem {
  std::filesystem::path directory;
  std::string name;
  std::string description;
  Target target = Target::cpu;
  std::vector<std::string> params;
  std::vector<TensorSpec> tensors;
  std::vector<Shape> check_shapes;   ///< correctness is checked on every one of these
  Shape timing_shape;                ///< the shape that speedups are measured on
  Tolerance tolerance;
  std::string bytes_model;           ///< C++ expression over params: bytes the kernel must move
  std::string flops_model;           ///< C++ expression over params: useful FLOPs
  std::vector<std::string> compile_flags;
  bool allow_asm = false;            ///< candidates may hold asm statements (inline PTX) inside functions
  std::vector<std::string> library_headers;  ///< kevo headers candidates may include: "kevo/retrieval/agent/scoring.cuh"
  std::string reference_file;
  std::string reference_source;
  std::string template_file;
  std::string template_source;
  std::vector<KnobSpec> knobs;
  std::vector<StartingPoint> starting_points;  ///< tried from the root first (optional)
  std::string manifest_source;       ///< problem.json as read, for identity() (a PyTorch problem: what kevo learned of it)
  std::optional<TorchModule> torch;  ///< set for a KernelBench-format problem: reference_source is its Python

  const KnobSpec* knob(std::string_view knob_name) const {
    for (const auto& k : knobs)
      if (k.name == knob_name) return &k;
    return nullptr;
  }

  Knobs default_knobs() const {
    Knobs out;
    for (const auto& k : knobs) out[k.name] = k.default_value;
    return out;
  }

  /// The template with every ${knob} replaced by its value. Knobs must be complete.
  std::string render(const Knobs& values) const;

  /// What a stored run records of the problem, so that resume can refuse another problem (or this
  /// one changed): a hash of the manifest, the reference and the template, as 16 hex digits.
  std::string identity() const {
    std::uint64_t h = content_hash(manifest_source);
    h = content_hash(reference_source, h ^ 0x9e3779b97f4a7c15ull);
    h = content_hash(template_source, h ^ 0x9e3779b97f4a7c15ull);
    return fmt::format("{:016x}", h);
  }
};

/// Whether `name` can name files (the store, the best kernel, the report) inside kevo-runs/: a
/// plain file name of [A-Za-z0-9_.-], not starting with '.'.
inline bool is_safe_name(std::string_view name) {
  if (name.empty() || name.size() > 100 || name.front() == '.') return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-')) return false;
  return true;
}

namespace detail {

inline expected<std::string, Error> read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(fmt::format("{}: cannot be read", path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

/// Calls f(name, line, begin, end) for each ${name} placeholder in a template.
template <class F>
void for_each_placeholder(std::string_view text, F&& f) {
  std::size_t line = 1;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n') ++line;
    if (text[i] == '$' && i + 1 < text.size() && text[i + 1] == '{') {
      const std::size_t close = text.find('}', i + 2);
      if (close == std::string_view::npos) return;
      f(text.substr(i + 2, close - i - 2), line, i, close + 1);
      i = close;
    }
  }
}

/// What is wrong with a library header's name ("kevo/retrieval/half.hpp"), or nothing: it is copied
/// from kevo's include root into the build directory, so it must stay inside kevo/ there.
inline std::optional<std::string_view> library_header_fault(std::string_view name) {
  if (name.empty()) return "is empty";
  if (name.front() == '/') return "is an absolute path";
  if (name.find('\\') != std::string_view::npos) return "holds a backslash";
  for (std::size_t at = 0; at <= name.size();) {
    const std::size_t slash = std::min(name.find('/', at), name.size());
    if (name.substr(at, slash - at) == "..") return "has a '..' component";
    at = slash + 1;
  }
  if (!name.starts_with("kevo/")) return "does not start with kevo/";
  if (name.back() == '/') return "names a directory, not a header";
  return std::nullopt;
}

inline bool is_identifier(std::string_view s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

}  // namespace detail

inline std::string Problem::render(const Knobs& values) const {
  std::string out;
  std::size_t copied = 0;
  detail::for_each_placeholder(template_source, [&](std::string_view knob_name, std::size_t, std::size_t begin,
                                                    std::size_t end) {
    out.append(template_source, copied, begin - copied);
    auto it = values.find(knob_name);
    out += it != values.end() ? it->second : std::string(knob_name);
    copied = end;
  });
  out.append(template_source, copied);
  return out;
}

}  // namespace kevo
