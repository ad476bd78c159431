// A user's store that records runs but cannot give one back: the loop must name the missing member.
#include <kevo/default_search_loop.hpp>

struct WriteOnlyStore {
  kevo::expected<std::int64_t, kevo::Error> begin_run(const kevo::RunInfo&) { return 1; }
  kevo::expected<kevo::NodeKey, kevo::Error> add_node(std::int64_t, kevo::NodeKey, kevo::NodeKey, const kevo::Candidate&, kevo::MemoryMode) {
    return 1;
  }
  kevo::expected<void, kevo::Error> add_evaluation(std::int64_t, kevo::NodeKey, const kevo::Evaluation&) { return {}; }
  kevo::expected<void, kevo::Error> finish_run(std::int64_t, const std::string&, kevo::NodeKey, double) { return {}; }
  kevo::expected<kevo::RunInfo, kevo::Error> find_run(std::int64_t) { return kevo::RunInfo{}; }
  kevo::expected<kevo::RunInfo, kevo::Error> latest_run() { return kevo::RunInfo{}; }
  kevo::expected<std::vector<kevo::Candidate>, kevo::Error> best_of_earlier_runs(const std::string&, std::int64_t, std::size_t) {
    return std::vector<kevo::Candidate>{};
  }
};

struct Evaluator {
  kevo::Evaluation evaluate(const kevo::Candidate&, std::uint64_t) { return {}; }
  kevo::expected<kevo::Comparison, kevo::Error> compare(const kevo::Candidate&, const kevo::Candidate&, std::uint64_t) {
    return kevo::Comparison{};
  }
};

int main() {
  kevo::Problem problem;
  Evaluator evaluator;
  WriteOnlyStore store;
  auto loop = kevo::make_search_loop(problem, evaluator, store);
  (void)loop;
}
