// A user's policy that forgot on_result: SearchLoop itself must reject it, naming what is missing
// (the README's promise), not with a generic "constraints not satisfied".
#include <kevo/memory/operators.hpp>
#include <kevo/search_loop.hpp>
#include <kevo/store/sqlite_store.hpp>
#include <kevo/synth/template_synthesizer.hpp>

struct ForgetfulPolicy {
  kevo::Expansion select(const kevo::SearchTree& tree, kevo::Rng&) { return {tree.root()}; }
  void on_expand(const kevo::SearchTree&, kevo::NodeId) {}
#ifdef KEVO_CONTROL
  void on_result(const kevo::SearchTree&, kevo::NodeId) {}
#endif
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
  auto store = kevo::store::SqliteStore::open(":memory:").value();
  kevo::SearchLoop<kevo::synth::TemplateSynthesizer, ForgetfulPolicy, kevo::memory::Adaptive, Evaluator, kevo::knowledge::NullRetriever,
                   kevo::store::SqliteStore>
      loop(problem, kevo::synth::TemplateSynthesizer(problem), ForgetfulPolicy{}, kevo::memory::Adaptive{}, evaluator, {}, store, {});
  (void)loop;
}
