// kevo/default_search_loop.hpp: the three-line start. make_search_loop composes the search loop
// from kevo's own components: the offline template synthesizer, MCTS, adaptive memory and no
// knowledge base. kevo/search_loop.hpp alone is for a loop of the user's own components.
//
//   auto store = kevo::store::SqliteStore::open("search.db").value();
//   auto loop = kevo::make_search_loop(problem, evaluator, store, {.jobs = 2, .max_evaluations = 60});
//   auto result = loop.run(loop.synthesizer().seed());   // or loop.resume(run_id)
#pragma once

#include <kevo/memory/operators.hpp>
#include <kevo/search/mcts.hpp>
#include <kevo/search_loop.hpp>
#include <kevo/synth/template_synthesizer.hpp>

#include <utility>

namespace kevo {

template <class Eval, class Store>  // unconstrained: SearchLoop's checks name what is missing
auto make_search_loop(const Problem& problem, Eval& evaluator, Store& store, SearchArguments args = {}) {
  return SearchLoop<synth::TemplateSynthesizer, search::Mcts, memory::Adaptive, Eval, knowledge::NullRetriever, Store>(
      problem, synth::TemplateSynthesizer(problem), search::Mcts{}, memory::Adaptive{}, evaluator,
      knowledge::NullRetriever{}, store, std::move(args));
}

}  // namespace kevo
