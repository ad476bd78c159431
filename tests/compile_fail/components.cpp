// A user's components given to SearchLoop itself, one of them wrong as -D says: a required member
// missing (the synthesizer's, the memory operator's, the retriever's), or an optional hook of the
// wrong shape (the evaluator's, the store's, the synthesizer's, the retriever's). The loop must reject
// each, naming the member or the hook, never take a misshapen hook as absent and silently skip it.
// With none of the -D, every component is right and the file compiles (compile_fail.components_control).
#include <kevo/search_loop.hpp>
#include <kevo/store/memory_store.hpp>

#include <string>

struct Synthesizer {
#ifndef SYNTHESIZER_WITHOUT_GENERATE
  kevo::expected<kevo::Candidate, kevo::Error> generate(const kevo::GenerationRequest&) { return kevo::Candidate{}; }
#endif
#ifdef SYNTHESIZER_HOOK_MISSHAPEN
  void budget_exhausted() const {}  // must answer whether the budget is spent
#else
  bool budget_exhausted() const { return false; }
#endif
  kevo::Candidate seed() const { return {}; }
};

struct Policy {
  kevo::Expansion select(const kevo::SearchTree& tree, kevo::Rng&) { return {tree.root()}; }
  void on_expand(const kevo::SearchTree&, kevo::NodeId) {}
  void on_result(const kevo::SearchTree&, kevo::NodeId) {}
};

struct Memory {
#ifndef MEMORY_WITHOUT_CONTEXT
  kevo::MemoryContext context(const kevo::SearchTree&, kevo::NodeId) { return {}; }
#endif
};

struct Evaluator {
  kevo::Evaluation evaluate(const kevo::Candidate&, std::uint64_t) { return {}; }
  kevo::expected<kevo::Comparison, kevo::Error> compare(const kevo::Candidate&, const kevo::Candidate&, std::uint64_t) {
    return kevo::Comparison{};
  }
#ifdef EVALUATOR_HOOK_MISSHAPEN
  kevo::expected<kevo::Comparison, kevo::Error> compare_with_reference(const kevo::Candidate&) { return kevo::Comparison{}; }  // no seed
#else
  kevo::expected<kevo::Comparison, kevo::Error> compare_with_reference(const kevo::Candidate&, std::uint64_t) { return kevo::Comparison{}; }
#endif
};

struct Retriever {
  std::vector<kevo::KnowledgeSnippet> retrieve(const kevo::KnowledgeQuery&) { return {}; }
#ifndef RETRIEVER_WITHOUT_LEARN
  void learn(const kevo::Skill&) {}
#endif
#ifdef RETRIEVER_HOOK_MISSHAPEN
  void withdraw(std::int64_t) {}  // no problem name
#else
  void withdraw(const std::string&, std::int64_t) {}
#endif
};

// kevo's in-memory store with its optional hook misshapen.
struct Store : kevo::store::MemoryStore {
  explicit Store(kevo::store::MemoryStore s) : kevo::store::MemoryStore(std::move(s)) {}
#ifdef STORE_HOOK_MISSHAPEN
  kevo::expected<void, kevo::Error> set_reference_seconds(double) { return {}; }  // no run
#endif
};

int main() {
  kevo::Problem problem;
  Evaluator evaluator;
  Store store(kevo::store::MemoryStore::open().value());
  kevo::SearchLoop<Synthesizer, Policy, Memory, Evaluator, Retriever, Store> loop(problem, Synthesizer{}, Policy{}, Memory{}, evaluator,
                                                                                Retriever{}, store, {});
  (void)loop;
}
