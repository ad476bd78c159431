// A user's program on kevo::core alone: the search loop with every component the user's own
// (synthesizer, policy, memory, evaluator, store), linking neither SQLite, OpenSSL nor Beast. The
// guards below fail the build if one of kevo's core headers brought them in.
#include <kevo/search_loop.hpp>

#if defined(SQLITE_VERSION) || defined(OPENSSL_VERSION_NUMBER) || defined(BOOST_BEAST_VERSION) || defined(SIMDJSON_VERSION)
#error "kevo/search_loop.hpp brought in SQLite, OpenSSL, Beast or simdjson"
#endif

#include "user_components.hpp"

#include <cstdio>
#include <map>
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

/// The user's own store: in memory.
struct MemoryStore {
  std::vector<kevo::RunInfo> runs;
  std::map<kevo::NodeKey, kevo::StoredNode> nodes;
  kevo::expected<std::int64_t, kevo::Error> begin_run(const kevo::RunInfo& info) {
    runs.push_back(info);
    runs.back().id = static_cast<std::int64_t>(runs.size());
    return runs.back().id;
  }
  kevo::expected<kevo::NodeKey, kevo::Error> add_node(std::int64_t, kevo::NodeKey parent, kevo::NodeKey mate, const kevo::Candidate& c,
                                                      kevo::MemoryMode mode) {
    const kevo::NodeKey key = static_cast<kevo::NodeKey>(nodes.size()) + 1;
    nodes[key] = kevo::StoredNode{.key = key, .parent = parent, .mate = mate, .candidate = c, .memory_mode = mode};
    return key;
  }
  kevo::expected<void, kevo::Error> add_evaluation(std::int64_t, kevo::NodeKey key, const kevo::Evaluation& e) {
    nodes[key].evaluation = e;
    return {};
  }
  kevo::expected<void, kevo::Error> finish_run(std::int64_t run, const std::string& why, kevo::NodeKey best, double speedup) {
    runs[static_cast<std::size_t>(run - 1)].stopped_because = why;
    runs[static_cast<std::size_t>(run - 1)].best_node = best;
    runs[static_cast<std::size_t>(run - 1)].verified_speedup = speedup;
    return {};
  }
  kevo::expected<kevo::RunInfo, kevo::Error> find_run(std::int64_t run) { return runs.at(static_cast<std::size_t>(run - 1)); }
  kevo::expected<kevo::RunInfo, kevo::Error> latest_run() { return runs.back(); }
  kevo::expected<std::vector<kevo::StoredNode>, kevo::Error> load_nodes(std::int64_t) {
    std::vector<kevo::StoredNode> out;
    for (auto& [key, node] : nodes) out.push_back(node);
    return out;
  }
  kevo::expected<std::vector<kevo::Candidate>, kevo::Error> best_of_earlier_runs(const std::string&, std::int64_t, std::size_t) {
    return std::vector<kevo::Candidate>{};
  }
};

}  // namespace

int main() {
  kevo::Problem problem;
  problem.name = "core_consumer";
  StepSynthesizer synth{&problem};
  LandscapeEvaluator evaluator;
  MemoryStore store;
  kevo::SearchLoop<StepSynthesizer, NewestFirst, NoMemory, LandscapeEvaluator, kevo::knowledge::NullRetriever, MemoryStore> loop(
      problem, synth, NewestFirst{}, NoMemory{}, evaluator, {}, store, {.jobs = 1, .max_evaluations = 12});
  auto result = loop.run(synth.seed());
  if (!result || result->best_speedup < 6.0 || store.nodes.size() < 6) {
    std::printf("core consumer: FAILED (%s)\n", result ? "best below 6x" : result.error().message.c_str());
    return 1;
  }
  std::printf("core consumer: kevo::core only, own components, best %.1fx in %zu evaluations\n", result->best_speedup, result->evaluations);
  return 0;
}
