// kevo/eval/torch_problem.hpp: a KernelBench-format file as a kevo problem. The file holds
// `class Model(nn.Module)`, module-level sizes, `get_inputs()` and `get_init_inputs()`; kevo's PyTorch helper
// (harness/kevo_torch.py) learns from PyTorch, once, the names, shapes and dtypes of the inputs, of the
// module's parameters and buffers (candidates receive them as inputs, after the forward's own) and of the
// outputs, and which template family its forward is, if any (torch_families.hpp).
//
//   auto problem = kevo::eval::load_torch_problem("KernelBench/level1/19_ReLU.py", {.size_scale = 0.25});
//   if (!problem) { fmt::print(stderr, "{}\n", problem.error().message); return 2; }   // one line: the file and why
//
// The candidate's contract is kevo's usual one: `void kernel(const Shape&, inputs..., parameters..., outputs...)`,
// where Shape holds every tensor's dims (`x_0`, `x_1`, ... for a tensor `x`). int64 tensors (argmax's output)
// are `int` in kernels: every value must fit. The checker drives the helper for the reference on every call
// (fresh inputs drawn as get_inputs() draws them, under a new seed); PyTorch eager is the reference time.
#pragma once

#include <kevo/eval/checked_run.hpp>
#include <kevo/eval/harness/embedded_sources.hpp>
#include <kevo/eval/jailed_evaluator.hpp>
#include <kevo/eval/sandbox.hpp>
#include <kevo/eval/torch_families.hpp>
#include <kevo/problem.hpp>

#include <fmt/format.h>
#include <simdjson.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace kevo::eval {

struct TorchProblemOptions {
  std::string python = {};          ///< empty: $KEVO_PYTHON, else /usr/bin/python3 (Debian's python3-torch), else python3 on PATH
  double size_scale = 1.0;          ///< shrinks the module's size constants (integers of 64 or more), for small machines and tests
  Target target = Target::cpu;
  std::filesystem::path cache_dir = {};  ///< where the helper is written; empty: default_cache_dir(), the evaluators' cache
  std::size_t memory_limit_bytes = std::size_t{2} << 30;  ///< the tensors of one call (twice: two slots) must fit
  std::chrono::seconds timeout{300};
};

namespace detail {

/// An executable's absolute path, found as the sandbox finds programs (on PATH where the name has no '/'); empty: none.
inline std::string resolve_executable(const std::string& name) {
  auto found = find_program(name);
  return found ? std::filesystem::absolute(*found).string() : std::string();
}

/// The Python that runs PyTorch: the one named, else $KEVO_PYTHON, else Debian's, else python3 on PATH.
inline std::string torch_python(const std::string& given) {
  if (!given.empty()) return resolve_executable(given);
  if (const char* env = std::getenv("KEVO_PYTHON"); env && *env) return resolve_executable(env);
  if (::access("/usr/bin/python3", X_OK) == 0) return "/usr/bin/python3";
  return resolve_executable("python3");
}

/// The helper's text, written once per content into the cache: `<cache>/torch/kevo_torch-<hash>.py`.
inline expected<std::filesystem::path, Error> write_torch_helper(const std::filesystem::path& cache_dir) {
  namespace fs = std::filesystem;
  const std::string_view text = harness_files::kevo_torch_py;
  const fs::path dir = cache_dir / "torch";
  const fs::path path = dir / fmt::format("kevo_torch-{:016x}.py", content_hash(text));
  std::error_code ec;
  if (fs::exists(path, ec)) return path;
  fs::create_directories(dir, ec);
  const fs::path temporary = path.string() + fmt::format(".tmp-{}", ::getpid());
  {
    std::ofstream out(temporary, std::ios::binary);
    out << text;
    if (!out) return make_error(fmt::format("{}: cannot write kevo's PyTorch helper", temporary.string()));
  }
  fs::rename(temporary, path, ec);
  if (ec) return make_error(fmt::format("{}: cannot write kevo's PyTorch helper: {}", path.string(), ec.message()));
  return path;
}

inline SandboxLimits torch_helper_limits(std::chrono::seconds timeout) {
  SandboxLimits l;
  l.wall_time = timeout;
  l.drop_privileges = false;
  l.isolate = false;
  l.output_bytes = 16u << 20;
  l.file_size_bytes = std::size_t{1} << 30;
  const char* path = std::getenv("PATH");
  const char* home = std::getenv("HOME");
  l.environment = {std::string("PATH=") + (path ? path : "/usr/local/bin:/usr/bin:/bin"), "LANG=C", "LC_ALL=C", "PYTHONDONTWRITEBYTECODE=1",
                   std::string("HOME=") + (home ? home : "/tmp")};
  return l;
}

inline std::string sanitized_name(std::string stem) {
  for (char& c : stem)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-')) c = '_';
  if (stem.empty() || stem.front() == '.') stem = "problem" + stem;
  return stem.substr(0, 100);
}

}  // namespace detail

/// Loads a KernelBench-format file as a problem. An unusable file gets one line naming it and the reason.
inline expected<Problem, Error> load_torch_problem(const std::filesystem::path& file, TorchProblemOptions options = {}) {
  namespace fs = std::filesystem;
  const std::string where = file.string();
  auto unusable = [&](std::string_view why) { return make_error(fmt::format("{}: cannot be used as a problem: {}", where, why)); };
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return unusable("no such file");
  if (!(options.size_scale > 0) || options.size_scale > 1) return unusable(fmt::format("the size scale must be in (0, 1], not {}", options.size_scale));
  const std::string python = detail::torch_python(options.python);
  if (python.empty() || ::access(python.c_str(), X_OK) != 0)
    return unusable(fmt::format("no Python to run PyTorch ('{}'): install python3-torch, or name one with --python or KEVO_PYTHON",
                                options.python.empty() ? "python3" : options.python));
  if (options.cache_dir.empty()) options.cache_dir = default_cache_dir();
  auto helper = detail::write_torch_helper(options.cache_dir);
  if (!helper) return unexpected(helper.error());
  const std::string device = options.target == Target::cpu ? "cpu" : "cuda";
  const fs::path absolute = fs::absolute(file);
  // Described on the CPU whatever the target: the tensors and the family are the same there, and a machine with
  // no GPU (CI's) can still load a cuda problem and compile its kernels. The checker and the timer use `device`.
  const SandboxResult r = run_sandboxed({python, helper->string(), "describe", absolute.string(), "--scale", fmt::format("{:.9g}", options.size_scale),
                                         "--device", "cpu", "--max-bytes", std::to_string(options.memory_limit_bytes)},
                                        detail::torch_helper_limits(options.timeout));
  if (!r.started) return unusable("its PyTorch helper could not start: " + r.setup_error);
  if (r.timed_out) return unusable(fmt::format("PyTorch took over {} s to describe it", options.timeout.count()));
  const std::string line = detail::last_json_line(r.stdout_text);
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (line.empty() || parser.parse(line).get(root))
    return unusable(fmt::format("its PyTorch helper ({}) said nothing kevo can read: {}", python, detail::tail(r.stderr_text + r.stdout_text, 300)));
  if (bool ok = false; root["ok"].get(ok) || !ok) {
    std::string_view why;
    return unusable(root["error"].get(why) ? "its PyTorch helper failed without a reason" : why);
  }

  Problem p;
  p.directory = absolute.parent_path();
  p.name = detail::sanitized_name(absolute.stem().string());
  p.target = options.target;
  p.reference_file = absolute.filename().string();
  std::string_view source;
  if (root["source"].get(source)) return unusable("its PyTorch helper gave no source");
  p.reference_source = std::string(source);
  p.template_file = "(the template family's, written by kevo)";

  // The tensors, in kernel order: the forward's inputs, the module's parameters and buffers, the outputs.
  std::string bytes_model;
  double bytes_per_call = 0;
  simdjson::dom::array tensors;
  if (root["tensors"].get(tensors)) return unusable("its PyTorch helper gave no tensors");
  for (simdjson::dom::element t : tensors) {
    std::string_view name, role, type, dtype;
    simdjson::dom::array shape;
    if (t["name"].get(name) || t["role"].get(role) || t["type"].get(type) || t["dtype"].get(dtype) || t["shape"].get(shape))
      return unusable("its PyTorch helper described a tensor incompletely");
    TensorSpec spec;
    spec.name = std::string(name);
    spec.role = role == "output" ? TensorRole::output : TensorRole::input;
    spec.type = type == "float" ? ElementType::f32 : type == "half" ? ElementType::f16 : ElementType::i32;
    if (spec.type == ElementType::f16 && options.target == Target::cpu)
      return unusable(fmt::format("{} is float16, which kevo's CPU kernels do not take (a CUDA target does)", spec.name));
    std::string size;
    Shape dims;
    std::size_t axis = 0;
    double elements = 1;
    for (simdjson::dom::element extent : shape) {
      const std::string param = fmt::format("{}_{}", spec.name, axis++);
      const std::int64_t v = extent.get_int64().value_unsafe();
      p.params.push_back(param);
      p.timing_shape[param] = v;
      size += (size.empty() ? "" : " * ") + param;
      elements *= static_cast<double>(v);
    }
    spec.size = size.empty() ? "1" : size;
    if (elements == 0) return unusable(fmt::format("{} has no elements", spec.name));
    bytes_per_call += elements * (spec.type == ElementType::f16 ? 2 : 4);
    bytes_model += fmt::format("{}{}.0 * {}", bytes_model.empty() ? "" : " + ", spec.type == ElementType::f16 ? 2 : 4, spec.size);
    p.tensors.push_back(std::move(spec));
  }
  if (std::none_of(p.tensors.begin(), p.tensors.end(), [](const TensorSpec& t) { return t.role == TensorRole::output; }))
    return unusable("forward() returns no tensor");
  if (2 * bytes_per_call > static_cast<double>(options.memory_limit_bytes))
    return unusable(fmt::format("its tensors take {:.2f} GiB a call, and this target holds {:.2f} GiB for two calls' worth (try --size-scale)",
                                bytes_per_call / (1u << 30), static_cast<double>(options.memory_limit_bytes) / (1u << 30)));
  p.check_shapes = {p.timing_shape};
  p.bytes_model = bytes_model;

  // KernelBench's tolerances (1e-4 for fp32, 1e-2 for fp16), the absolute one tightened where outputs are so
  // small that a constant would pass (softmax over thousands): kevo never lets an all-zero answer through.
  const bool half = std::any_of(p.tensors.begin(), p.tensors.end(), [](const TensorSpec& t) { return t.type == ElementType::f16; });
  p.tolerance = {.absolute = half ? 1e-2 : 1e-4, .relative = half ? 1e-2 : 1e-4};
  if (simdjson::dom::array rms; !root["output_rms"].get(rms))
    for (simdjson::dom::element v : rms)
      if (double x = 0; !v.get(x) && x > 0) p.tolerance.absolute = std::min(p.tolerance.absolute, 1e-3 * x);
  // As the shipped problems compile (the CUDA toolchain adds the standard and the GPU's architecture).
  p.compile_flags = options.target == Target::cpu ? std::vector<std::string>{"-std=c++17", "-O2", "-march=native"} : std::vector<std::string>{"-O3"};

  TorchModule torch{.file = absolute, .python = python, .device = device, .size_scale = options.size_scale};
  if (std::string_view v; !root["torch"].get(v)) torch.torch_version = std::string(v);
  if (root["has_compile"].get(torch.has_compile)) torch.has_compile = false;

  // The family, where one matched: its template and knobs.
  std::string family_note = "no template family matches its forward";
  if (simdjson::dom::object f; !root["family"].get(f)) {
    FamilyDescription d;
    for (auto [key, value] : f) {
      if (key == "family") d.family = std::string(value.get_string().value_unsafe());
      else if (key == "op" || key == "kind") d.op = std::string(value.get_string().value_unsafe());
      else if (value.is_bool()) d.flags[std::string(key)] = value.get_bool().value_unsafe();
      else if (value.is_number()) d.numbers[std::string(key)] = value.get_double().value_unsafe();
      else if (value.is_string()) d.words[std::string(key)] = std::string(value.get_string().value_unsafe());
      else if (simdjson::dom::object params; !value.get(params))  // a named object: value_unsafe() of a temporary would dangle
        for (auto [k, v] : params) {
          if (v.is_number()) d.numbers[std::string(k)] = v.get_double().value_unsafe();
          else if (v.is_string()) d.words[std::string(k)] = std::string(v.get_string().value_unsafe());
        }
    }
    if (auto t = family_template(d, p)) {
      torch.family = d.family + (d.op.empty() ? "" : " (" + d.op + ")");
      p.template_source = std::move(t->source);
      p.knobs = std::move(t->knobs);
      p.starting_points = std::move(t->starting_points);
      p.flops_model = fmt::format("{:.17g}", t->flops);
    } else {
      family_note = t.error().message;
    }
  }
  if (p.template_source.empty()) {
    // No family: an LLM writes the kernel from the PyTorch source. This starter compiles and writes nothing,
    // so its evaluation names every output as unwritten, and the prompt carries the entry point.
    p.template_source = fmt::format(R"(// {}: no template family matches this KernelBench-format problem's forward; an LLM writes the kernel.
#include "kevo_problem.hpp"

void kernel(const Shape& shape{}) {{ (void)shape; }}
)",
                                    p.name, detail::tensor_parameters(p));
  }
  if (p.flops_model.empty()) p.flops_model = "0";
  std::string ops;
  if (simdjson::dom::array a; !root["ops"].get(a))
    for (simdjson::dom::element op : a) ops += fmt::format("{}{}", ops.empty() ? "" : ", ", std::string_view(op.get_string().value_unsafe()));
  p.description = torch.family.empty()
                      ? fmt::format("KernelBench-format problem {}: {} (its forward calls {}), so an LLM writes its kernels", where, family_note,
                                    ops.empty() ? "what torch.fx cannot trace" : ops)
                      : fmt::format("KernelBench-format problem {}, the {} family, PyTorch {} as the reference", where, torch.family, torch.torch_version);
  if (options.size_scale != 1.0) p.description += fmt::format(", sizes scaled by {:g}", options.size_scale);
  // What identity() hashes beside the source and the template: every learned fact, the scale and the Python.
  p.manifest_source = fmt::format("kernelbench {}\nscale {:.9g}\ndevice {}\npython {}\ntorch {}\n{}", where, options.size_scale, device, python,
                                  torch.torch_version, line.substr(0, line.find("\"source\"")));
  p.torch = std::move(torch);
  return p;
}

/// Whether a command-line problem names a KernelBench-format file rather than a problem directory.
inline bool is_torch_problem_path(const std::filesystem::path& path) { return path.extension() == ".py"; }

}  // namespace kevo::eval
