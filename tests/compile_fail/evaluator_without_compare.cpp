// A user's evaluator that cannot re-time two candidates side by side, given to make_search_loop:
// the loop must name the missing member.
#include <kevo/default_search_loop.hpp>
#include <kevo/store/sqlite_store.hpp>

struct TimingOnlyEvaluator {
  kevo::Evaluation evaluate(const kevo::Candidate&, std::uint64_t) { return {}; }
};

int main() {
  kevo::Problem problem;
  TimingOnlyEvaluator evaluator;
  auto store = kevo::store::SqliteStore::open(":memory:").value();
  auto loop = kevo::make_search_loop(problem, evaluator, store);
  (void)loop;
}
