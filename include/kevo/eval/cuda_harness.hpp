// kevo/eval/cuda_harness.hpp: the sources kevo generates for a CUDA problem's evaluation (see
// harness.hpp for the CPU ones and the parts they share):
//   checker.cu   the trusted process: it owns the device memory of every call (one arena, made
//                with the driver's virtual memory API and shared with the runner as a file
//                descriptor), the inputs, the reference, the checks and the clock;
//   runner.cu    linked with the candidate, jailed: maps the arena and calls kernel() on command.
//
//   auto [checker_problem, checker_body] = kevo::eval::cuda_checker_sources(problem);
//   std::string runner = kevo::eval::cuda_runner_source(problem);
//
// The CUDA text itself is real source, kevo/eval/harness/cuda_checker.cu and
// cuda_runner_helpers.cu, embedded as strings (see harness.hpp).
#pragma once

#include <kevo/eval/harness.hpp>
#include <kevo/eval/harness/embedded_sources.hpp>
#include <kevo/problem.hpp>

#include <string>
#include <string_view>

namespace kevo::eval {

namespace detail {

/// The CUDA checker's own part. Everything stays on the device: inputs are drawn there (a
/// counter-based generator), the reference runs there, and the checks run there too, so a call
/// of a large kernel costs the checker copies at device speed. Timed calls go in batches of up
/// to eight, each call on inputs and addresses of its own, after the L2 cache is flushed; the
/// checker's clock spans the batch (the runner synchronizes the whole device before answering),
/// so a batch's overhead is shared by its calls. Outputs are summed once when the runner answers
/// and once more after the checks: work still running (on a stream or thread the runner did not
/// wait for) changes them, and is named. The text is harness/cuda_checker.cu.
inline constexpr std::string_view cuda_checker_body = harness_files::cuda_checker_cu;

}  // namespace detail

/// checker.cu: the trusted process of a CUDA evaluation (see cuda_checker_body above).
inline CheckerSources cuda_checker_sources(const Problem& p) {
  return {detail::checker_problem_part(p), detail::checker_body(p, detail::cuda_checker_body)};
}

/// runner.cu: linked with the candidate and jailed. It maps the checker's arena (a file
/// descriptor of device memory), and after each command's calls synchronizes the whole device and
/// answers with the first CUDA error, if any (harness/cuda_runner_helpers.cu).
inline std::string cuda_runner_source(const Problem& p) {
  return detail::runner_source_with(p, "runner.cu", "#include <cuda.h>\n#include <cuda_runtime.h>\n",
                                    detail::harness_files::cuda_runner_helpers_cu);
}

}  // namespace kevo::eval
