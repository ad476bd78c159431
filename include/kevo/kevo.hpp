// kevo/kevo.hpp: everything a host program needs to compose and run a search. The GPU pipeline
// (kevo/retrieval/) is included separately; this header reaches no .cuh.
//
//   #include <kevo/kevo.hpp>
//   auto loop = kevo::make_search_loop(problem, evaluator, store, {.max_evaluations = 60});
//   auto result = loop.run(loop.synthesizer().seed());
#pragma once

#include <kevo/config.hpp>
#include <kevo/expected.hpp>

#include <kevo/candidate.hpp>
#include <kevo/problem.hpp>
#include <kevo/problem_loader.hpp>
#include <kevo/search_tree.hpp>

#include <kevo/evaluator.hpp>
#include <kevo/knowledge_retriever.hpp>
#include <kevo/memory_operator.hpp>
#include <kevo/search_policy.hpp>
#include <kevo/store.hpp>
#include <kevo/synthesizer.hpp>

#include <kevo/eval/cpu_evaluator.hpp>
#include <kevo/knowledge/knowledge_base.hpp>
#include <kevo/memory/any_memory.hpp>
#include <kevo/memory/operators.hpp>
#include <kevo/report/html_report.hpp>
#include <kevo/search/any_policy.hpp>
#include <kevo/store/sqlite_store.hpp>
#include <kevo/synth/llm_synthesizer.hpp>
#include <kevo/synth/template_synthesizer.hpp>
#include <kevo/net/llm_client.hpp>

#include <kevo/default_search_loop.hpp>
