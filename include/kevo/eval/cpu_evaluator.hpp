// kevo/eval/cpu_evaluator.hpp: the Evaluator for CPU kernels: the host compiler, kevo's CPU checker
// and runner, and this machine's measured roofline, in the shared JailedEvaluator.
//
//   kevo::eval::CpuEvaluator evaluator(*kevo::load_problem("problems/cpu_scoring"));
//   if (auto ready = evaluator.prepare(); !ready) return fail(ready.error().message);
//   kevo::Evaluation e = evaluator.evaluate(candidate, /*seed=*/7);   // e.speedup over the reference
#pragma once

#include <kevo/problem_loader.hpp>
#include <kevo/eval/harness.hpp>
#include <kevo/eval/jailed_evaluator.hpp>
#include <kevo/eval/roofline.hpp>

#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace kevo::eval {

/// $CXX, else g++.
inline std::string default_compiler() {
  if (const char* cxx = std::getenv("CXX"); cxx && *cxx) return cxx;
  return "g++";
}

/// What is particular to CPU kernels.
struct CpuToolchain {
  static constexpr Target target = Target::cpu;
  static constexpr std::string_view source_extension = ".cpp";
  static constexpr bool uses_gpu = false;

  static std::string default_compiler() { return eval::default_compiler(); }
  static std::vector<std::string> compile_flags(const Problem& problem) {
    std::vector<std::string> flags{"-std=c++20"};
    flags.insert(flags.end(), problem.compile_flags.begin(), problem.compile_flags.end());
    flags.push_back("-pthread");
    return flags;
  }
  static std::vector<std::string> link_flags() { return {}; }
  /// Flags such as -march=native make a build this CPU's.
  static std::string identity() { return detail::cpu_identity(); }
  static CheckerSources checker_sources(const Problem& problem) { return eval::checker_sources(problem); }
  static std::string runner_source(const Problem& problem) { return eval::runner_source(problem); }
  static expected<void, Error> check_problem(const Problem& problem) {
    if (problem.target != Target::cpu)
      return make_error(fmt::format("{}: target is {}, but CpuEvaluator runs cpu problems only", (problem.directory / "problem.json").string(),
                                    to_string(problem.target)));
    for (const auto& t : problem.tensors)
      if (t.type == ElementType::f16)
        return make_error(fmt::format("{}: tensor '{}' is half, which cpu problems do not have", (problem.directory / "problem.json").string(), t.name));
    return {};
  }
  static expected<Roofline, Error> roofline(const std::filesystem::path& cache_dir, const std::string& compiler) {
    return load_or_measure_roofline(cache_dir, compiler);
  }
  static std::string compile_notes(std::string_view) { return {}; }
  static std::vector<std::filesystem::path> compiler_roots(const std::string& compiler) {
    if (auto path = find_program(compiler); path && !path->string().starts_with("/usr/")) return {std::filesystem::weakly_canonical(*path).parent_path()};
    return {};
  }
};

using CpuEvaluator = JailedEvaluator<CpuToolchain>;
using CpuEvaluatorOptions = EvaluatorOptions;

static_assert(kevo::Evaluator<CpuEvaluator>);
static_assert(kevo::check_evaluator<CpuEvaluator>());

}  // namespace kevo::eval
