// kevo/eval/executor.hpp: where one checked run (checked_run.hpp) happens. An Executor takes the
// request that JailedEvaluator built (the problem's checker and the candidate's build, both in the
// build cache) and returns the checker's verdict. LocalExecutor runs it here, beside the search:
// kevo's default. SlurmExecutor (slurm_executor.hpp) runs it as a Slurm job step on a node.
//
//   kevo::eval::JailedEvaluator<kevo::eval::CpuToolchain, kevo::eval::SlurmExecutor> evaluator(problem, {}, slurm);
#pragma once

#include <kevo/eval/checked_run.hpp>

#include <concepts>

namespace kevo::eval {

/// `run(request)` is thread-safe and never throws: a run that could not happen is a RunReport
/// with a failure (sandbox_error for kevo's or the cluster's fault, never the candidate's).
/// `remote()` says the run happens on other machines: its timing competes neither with this
/// machine's compiles nor with other runs, so the evaluator need not take turns for it here.
template <class E>
concept Executor = requires(const E& executor, const CheckedRunRequest& request) {
  { executor.run(request) } -> std::same_as<RunReport>;
  { executor.remote() } -> std::convertible_to<bool>;
};

/// Today's behaviour: the checker and the jailed runner on this machine.
struct LocalExecutor {
  bool remote() const { return false; }
  RunReport run(const CheckedRunRequest& request) const { return run_checked(request); }
};

static_assert(Executor<LocalExecutor>);

}  // namespace kevo::eval
