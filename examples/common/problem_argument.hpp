// examples/common/problem_argument.hpp: the problem a kevo program is given: a problem directory, a shipped
// problem's name, or a KernelBench-format file (`19_ReLU.py`), whose reference and peers PyTorch runs.
#pragma once

#include <kevo/detail/json_text.hpp>
#include <kevo/eval/torch_problem.hpp>
#include <kevo/problem_loader.hpp>

#include "shipped_data.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

namespace kevo_examples {

struct ProblemArgument {
  std::filesystem::path given;
  std::string python;        ///< --python: the interpreter with PyTorch (KernelBench-format files)
  double size_scale = 1.0;   ///< --size-scale: the module's size constants shrunk by this
  std::string device = "cpu";  ///< --device: where a KernelBench-format problem's kernels run
  bool describe_only = false;  ///< --describe: say what the problem is and stop
};

/// The positional problem and the flags of a KernelBench-format file.
inline void describe_problem_argument(CLI::App& app, ProblemArgument& a) {
  app.add_option("problem", a.given,
                 "the problem: a directory (problem.json, reference, template), a shipped problem's name, or a KernelBench-format "
                 "file (a .py with class Model, get_inputs and get_init_inputs)")
      ->required();
  app.add_option("--python", a.python, "KernelBench files: the Python whose PyTorch runs the reference (default $KEVO_PYTHON, else /usr/bin/python3)");
  app.add_option("--size-scale", a.size_scale, "KernelBench files: shrink the module's size constants (integers of 64 or more) by this factor")
      ->check(CLI::Range(1e-6, 1.0));
  app.add_option("--device", a.device, "KernelBench files: where the kernels run, cpu or cuda")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("--describe", a.describe_only, "say where the problem was found, what it is and its knobs, and stop without searching");
}

/// Why a problem of this target cannot be searched by any program here, said before any work (exit 2);
/// nothing for cpu and cuda. hip: no evaluator runs HIP candidates yet (README, Portability: kevo's HIP
/// code is compiled for AMD and never run, and HIP's NVIDIA platform does not build against CUDA 13).
inline std::optional<std::string> unsearchable_target(const kevo::Problem& p) {
  if (p.target != kevo::Target::hip) return std::nullopt;
  return fmt::format("{}: a hip problem, and kevo has no HIP evaluator yet (its HIP code is compiled for AMD, never run: "
                     "README, Portability); nothing searched",
                     p.name);
}

/// --describe's lines: where the problem came from, its target and tensors, and each knob's values.
inline std::string describe_problem(const kevo::Problem& p) {
  std::string out = fmt::format("{}: {} ({} target)\n  from {}\n", p.name, p.description, kevo::to_string(p.target), p.directory.string());
  for (const auto& t : p.tensors)
    out += fmt::format("  {} {}: {} of {}\n", t.role == kevo::TensorRole::input ? "input" : "output", t.name,
                       t.type == kevo::ElementType::f32 ? "float" : t.type == kevo::ElementType::f16 ? "half" : "int", t.size);
  for (const auto& k : p.knobs) out += fmt::format("  knob {} in {{{}}}, default {}\n", k.name, fmt::join(k.domain, ", "), k.default_value);
  return out;
}

inline kevo::expected<kevo::Problem, kevo::Error> load_problem_argument(const ProblemArgument& a) {
  if (kevo::eval::is_torch_problem_path(a.given))
    return kevo::eval::load_torch_problem(a.given, {.python = a.python,
                                                    .size_scale = a.size_scale,
                                                    .target = a.device == "cuda" ? kevo::Target::cuda : kevo::Target::cpu});
  return kevo::load_problem(resolve_problem(a.given));
}

/// torch.compile's time over the best's, where it was timed (else 0): the verified speedup over eager, rescaled by
/// the two peers' times from the evaluator's prepare() (`compile_seconds`: its torch_peers(), 0 where not timed).
inline double speedup_over_compile(const kevo::Problem& p, double compile_seconds, double reference_seconds, double verified_speedup) {
  if (!p.torch || compile_seconds <= 0 || reference_seconds <= 0) return 0;
  return verified_speedup * compile_seconds / reference_seconds;
}

/// A KernelBench-format problem's fields of a --json summary (each after a comma), or nothing for another problem.
inline std::string torch_summary_fields(const kevo::Problem& p, double verified_speedup, double over_compile) {
  if (!p.torch) return {};
  return fmt::format(R"(,"reference":"pytorch_eager","speedup_over_eager":{:.4f},"speedup_over_compile":{},"size_scale":{:.6g},"family":{})",
                     verified_speedup, over_compile > 0 ? fmt::format("{:.4f}", over_compile) : "null", p.torch->size_scale,
                     kevo::detail::json_quote(p.torch->family));
}

/// What the verified speedup means: over the problem's own reference, or PyTorch eager's.
inline std::string reference_name(const kevo::Problem& p) { return p.torch ? "PyTorch eager" : "reference"; }

}  // namespace kevo_examples
