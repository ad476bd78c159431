// A user's evaluator that cannot re-time two candidates side by side.
#include <kevo/evaluator.hpp>

struct TimingOnlyEvaluator {
  kevo::Evaluation evaluate(const kevo::Candidate&, std::uint64_t) { return {}; }
};

static_assert(kevo::check_evaluator<TimingOnlyEvaluator>());

int main() {}
