// Uses the installed kevo the way a user's code would: compose a loop, run it, check it.
#include <kevo/kevo.hpp>

#include "user_components.hpp"

#include <cstdio>


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
