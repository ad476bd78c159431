// kevo/eval/cuda_evaluator.hpp: the Evaluator for CUDA kernels: nvcc for the device's
// architecture (builds cached by source, flags, compiler and GPU), kevo's CUDA checker and runner
// (cuda_harness.hpp: device memory shared through the driver's VMM handles, timing by the
// checker's clock over batches of calls after an L2 flush, the roofline measured in every run),
// ptxas's registers, shared memory and spills in the diagnostics, in the shared JailedEvaluator.
//
//   kevo::eval::CudaEvaluator evaluator(*kevo::load_problem("problems/cuda_softmax"));
//   if (auto ready = evaluator.prepare(); !ready) return fail(ready.error().message);   // no GPU: says so
//   kevo::Evaluation e = evaluator.evaluate(candidate, /*seed=*/7);
#pragma once

#include <kevo/problem_loader.hpp>
#include <kevo/eval/cuda_harness.hpp>
#include <kevo/eval/jailed_evaluator.hpp>
#include <kevo/eval/sandbox.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace kevo::eval {

namespace detail {

inline std::string first_output_line(const std::vector<std::string>& argv) {
  SandboxLimits limits{.wall_time = std::chrono::seconds(20), .drop_privileges = false, .isolate = false};
  const SandboxResult r = run_sandboxed(argv, limits);
  if (!r.ok()) return {};
  std::string line = r.stdout_text.substr(0, r.stdout_text.find('\n'));
  while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.pop_back();
  return line;
}

/// "NVIDIA H200, 9.0" from nvidia-smi, or empty where there is no GPU.
inline std::string gpu_name_and_capability() {
  if (!find_program("nvidia-smi")) return {};
  return first_output_line({"nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader", "--id=0"});
}

}  // namespace detail

/// What is particular to CUDA kernels.
struct CudaToolchain {
  static constexpr Target target = Target::cuda;
  static constexpr std::string_view source_extension = ".cu";
  static constexpr bool uses_gpu = true;

  /// $NVCC, else the toolkit's default home, else nvcc on PATH.
  static std::string default_compiler() {
    if (const char* nvcc = std::getenv("NVCC"); nvcc && *nvcc) return nvcc;
    if (std::filesystem::exists("/usr/local/cuda/bin/nvcc")) return "/usr/local/cuda/bin/nvcc";
    return "nvcc";
  }
  /// $KEVO_CUDA_ARCH, else the GPU's own (sm_90a on a Hopper, for wgmma and TMA), else sm_90a.
  static std::string architecture() {
    if (const char* arch = std::getenv("KEVO_CUDA_ARCH"); arch && *arch) return arch;
    const std::string gpu = detail::gpu_name_and_capability();
    const auto comma = gpu.rfind(", ");
    if (comma == std::string::npos) return "sm_90a";
    std::string capability = gpu.substr(comma + 2);
    capability.erase(std::remove(capability.begin(), capability.end(), '.'), capability.end());
    return "sm_" + capability + (capability == "90" ? "a" : "");
  }
  static std::vector<std::string> compile_flags(const Problem& problem) {
    static const std::string arch = architecture();
    std::vector<std::string> flags{"-std=c++20", "-arch=" + arch};  // as the screen parses, and as kevo's headers need
    flags.insert(flags.end(), problem.compile_flags.begin(), problem.compile_flags.end());
    flags.push_back("-Xptxas=-v");
    return flags;
  }
  static std::vector<std::string> link_flags() { return {}; }
  /// A build is this GPU's (and, through the flags, this architecture's).
  static std::string identity() { return "gpu: " + detail::gpu_name_and_capability(); }
  static CheckerSources checker_sources(const Problem& problem) { return cuda_checker_sources(problem); }
  static std::string runner_source(const Problem& problem) { return cuda_runner_source(problem); }
  static expected<void, Error> check_problem(const Problem& problem) {
    if (problem.target != Target::cuda)
      return make_error(fmt::format("{}: target is {}, but CudaEvaluator runs cuda problems only", (problem.directory / "problem.json").string(),
                                    to_string(problem.target)));
    return {};
  }
  /// Measured by the checker in every run, beside the candidate.
  static expected<Roofline, Error> roofline(const std::filesystem::path&, const std::string&) {
    Roofline r;
    r.host = detail::host_name();
    r.cpu_model = detail::gpu_name_and_capability();
    return r;
  }
  /// ptxas -v, summed up over the candidate's kernels: "ptxas: up to 40 registers, 8192 B shared
  /// memory, 0 B spilled".
  static std::string compile_notes(std::string_view compiler_stderr) {
    static const std::regex registers(R"(Used (\d+) registers)"), shared(R"((\d+) bytes smem)"), spills(R"((\d+) bytes spill stores)");
    long most_registers = -1, most_shared = 0, most_spilled = 0;
    std::istringstream lines{std::string(compiler_stderr)};
    for (std::string line; std::getline(lines, line);) {
      std::smatch m;
      if (std::regex_search(line, m, registers)) most_registers = std::max(most_registers, std::stol(m[1]));
      if (std::regex_search(line, m, shared)) most_shared = std::max(most_shared, std::stol(m[1]));
      if (std::regex_search(line, m, spills)) most_spilled = std::max(most_spilled, std::stol(m[1]));
    }
    if (most_registers < 0) return {};
    return fmt::format("ptxas: up to {} registers, {} B shared memory, {} B spilled{}", most_registers, most_shared, most_spilled,
                       most_spilled > 0 ? " (spills: fewer registers per thread or smaller tiles)" : "");
  }
  /// The command that compiles the checker's problem unit (the body and everything else go through nvcc).
  /// That unit holds no device code, so nvcc's host compiler builds it alone, without nvcc's ~4 s of passes
  /// a problem: the same g++ that compiles nvcc's host side, so both sides of the link agree.
  static std::vector<std::string> checker_problem_compiler(const std::string& compiler) {
    const char* host = std::getenv("NVCC_CCBIN");
    return {host && *host ? host : "g++", "-std=c++20", "-O2", "-isystem", (toolkit_root(compiler) / "include").string()};
  }

  /// The whole toolkit (nvcc runs its own cicc, ptxas and fatbinary, and reads its headers).
  static std::vector<std::filesystem::path> compiler_roots(const std::string& compiler) {
    const auto root = toolkit_root(compiler);
    if (root.empty()) return {};
    std::vector<std::filesystem::path> roots{root};
    // Ubuntu's packages link /usr/local/cuda through /etc/alternatives.
    if (std::filesystem::exists("/etc/alternatives")) roots.push_back("/etc/alternatives");
    return roots;
  }

 private:
  static std::filesystem::path toolkit_root(const std::string& compiler) {
    auto path = find_program(compiler);
    if (!path) return {};
    std::error_code ec;
    const auto canonical = std::filesystem::canonical(*path, ec);
    return ec ? std::filesystem::path() : canonical.parent_path().parent_path();
  }
};

using CudaEvaluator = JailedEvaluator<CudaToolchain>;

static_assert(kevo::Evaluator<CudaEvaluator>);

}  // namespace kevo::eval
