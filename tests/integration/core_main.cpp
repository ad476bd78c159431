// A user's program on kevo::core alone: the search loop with the user's own components (synthesizer,
// policy, memory, evaluator) and kevo's in-memory store, linking neither SQLite, OpenSSL nor Beast.
// The guards below fail the build if one of kevo's core headers brought them in.
#include <kevo/search_loop.hpp>
#include <kevo/store/memory_store.hpp>

#if defined(SQLITE_VERSION) || defined(OPENSSL_VERSION_NUMBER) || defined(BOOST_BEAST_VERSION) || defined(SIMDJSON_VERSION)
#error "kevo/search_loop.hpp or kevo/store/memory_store.hpp brought in SQLite, OpenSSL, Beast or simdjson"
#endif

#include "user_components.hpp"

#include <cstdio>
#include <string>
#include <vector>

namespace {

/// Knob x from 0 to 7, one step from the parent's; the best is x = 5.
struct StepSynthesizer {
  const kevo::Problem* problem;
  kevo::Candidate seed() const { return {"x=0", {{"x", "0"}}, "seed"}; }
  kevo::expected<kevo::Candidate, kevo::Error> generate(const kevo::GenerationRequest& r) {
    const int x = std::stoi(r.parent.candidate->knobs.at("x"));
    const int next = (x + 1 + static_cast<int>(r.seed % 2)) % 8;
    return kevo::Candidate{"x=" + std::to_string(next), {{"x", std::to_string(next)}}, "step"};
  }
};

struct NoMemory {
  kevo::MemoryContext context(const kevo::SearchTree&, kevo::NodeId) { return {}; }
};

}  // namespace

int main() {
  kevo::Problem problem;
  problem.name = "core_consumer";
  StepSynthesizer synth{&problem};
  LandscapeEvaluator evaluator;
  auto store = kevo::store::MemoryStore::open().value();
  kevo::SearchLoop<StepSynthesizer, NewestFirst, NoMemory, LandscapeEvaluator, kevo::knowledge::NullRetriever, kevo::store::MemoryStore> loop(
      problem, synth, NewestFirst{}, NoMemory{}, evaluator, {}, store, {.jobs = 1, .max_evaluations = 12});
  auto result = loop.run(synth.seed());
  const auto stored = result ? store.load_nodes(result->run_id) : kevo::expected<std::vector<kevo::StoredNode>, kevo::Error>{};
  if (!result || result->best_speedup < 6.0 || !stored || stored->size() < 6) {
    std::printf("core consumer: FAILED (%s)\n", result ? "best below 6x" : result.error().message.c_str());
    return 1;
  }
  std::printf("core consumer: kevo::core only, own components, best %.1fx in %zu evaluations\n", result->best_speedup, result->evaluations);
  return 0;
}
