// Uses the installed kevo the way a user's code would: compose a loop, run it, check it.
#include <kevo/kevo.hpp>

#include <cstdio>

namespace {
/// A user's own evaluator: a landscape whose best is knob x = 5.
struct LandscapeEvaluator {
  kevo::Evaluation evaluate(const kevo::Candidate& c, std::uint64_t) {
    kevo::Evaluation e;
    const int x = std::stoi(c.knobs.at("x"));
    e.speedup = 1.0 + 5 - std::abs(x - 5);
    return e;
  }
  kevo::expected<kevo::Comparison, kevo::Error> compare(const kevo::Candidate& a, const kevo::Candidate& b, std::uint64_t s) {
    return kevo::Comparison{1 / evaluate(a, s).speedup, 1 / evaluate(b, s).speedup};
  }
};
/// A user's own policy: always expand the newest correct node (a depth-first walk).
struct NewestFirst {
  kevo::NodeId newest = 0;
  kevo::Expansion select(const kevo::SearchTree&, kevo::Rng&) { return {newest}; }
  void on_expand(const kevo::SearchTree&, kevo::NodeId) {}
  void on_result(const kevo::SearchTree& tree, kevo::NodeId n) {
    if (tree[n].state == kevo::NodeState::evaluated) newest = n;
  }
};
static_assert(kevo::SearchPolicy<NewestFirst>);
}  // namespace

int main() {
  kevo::Problem problem;
  problem.name = "consumer";
  problem.template_source = "x = ${x};";
  problem.knobs.push_back({"x", {"0", "1", "2", "3", "4", "5", "6", "7"}, "0", kevo::KnobSide::compute});
  LandscapeEvaluator evaluator;
  auto store = kevo::store::SqliteStore::open(":memory:").value();
  auto loop = kevo::make_search_loop(problem, evaluator, store, {.max_evaluations = 20});
  auto result = loop.run(loop.synthesizer().seed());
  if (!result || result->best_speedup < 6.0) {
    std::puts("consumer: the search did not find x = 5");
    return 1;
  }
  // The same search with the user's own policy plugged in.
  auto store2 = kevo::store::SqliteStore::open(":memory:").value();
  kevo::SearchLoop<kevo::synth::TemplateSynthesizer, NewestFirst, kevo::memory::Combined, LandscapeEvaluator,
                   kevo::knowledge::NullRetriever, kevo::store::SqliteStore>
      own(problem, kevo::synth::TemplateSynthesizer(problem), NewestFirst{}, kevo::memory::Combined{}, evaluator,
          kevo::knowledge::NullRetriever{}, store2, {.max_evaluations = 20});
  auto own_result = own.run(kevo::synth::TemplateSynthesizer(problem).seed());
  if (!own_result || own_result->evaluations != 21) {
    std::puts("consumer: the search with a user-defined policy failed");
    return 1;
  }
  std::printf("consumer: kevo %s found %.1fx\n", KEVO_VERSION_STRING, result->best_speedup);
  return 0;
}
