// The retrieval kernels' policy structs: the domains kevo's search sweeps. Every combination in the
// declared domains is legal and prints to a distinct key (results are stored under it); one value
// outside a domain makes a policy illegal.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "kevo/retrieval/tuning/policies.hpp"

using namespace kevo::retrieval;

TEST_CASE("every scoring policy in the declared domains is legal and has its own key", "[retrieval][policy]") {
  std::set<std::string> keys;
  std::size_t combinations = 0;
  for (int threads : ScoringPolicy::block_threads_domain)
    for (int tiles : ScoringPolicy::tiles_per_chunk_domain)
      for (int blocks : ScoringPolicy::blocks_per_sm_domain)
        for (int in_flight : ScoringPolicy::tiles_in_flight_domain)
          for (int stages : ScoringPolicy::stages_domain) {
            const ScoringPolicy p{threads, tiles, blocks, in_flight, stages};
            REQUIRE(is_legal(p));
            keys.insert(to_string(p));
            ++combinations;
          }
  REQUIRE(combinations == 2u * 4u * 6u * 2u * 4u);
  REQUIRE(keys.size() == combinations);
}

TEST_CASE("a value outside any knob's domain makes the policy illegal", "[retrieval][policy]") {
  REQUIRE(is_legal(PipelinePolicy{}));
  auto illegal = [](auto edit) {
    PipelinePolicy p;
    edit(p);
    return !is_legal(p);
  };
  CHECK(illegal([](PipelinePolicy& p) { p.scoring.block_threads = 96; }));
  CHECK(illegal([](PipelinePolicy& p) { p.scoring.tiles_per_chunk = 2; }));
  CHECK(illegal([](PipelinePolicy& p) { p.scoring.blocks_per_sm = 5; }));
  CHECK(illegal([](PipelinePolicy& p) { p.scoring.tiles_in_flight = 3; }));
  CHECK(illegal([](PipelinePolicy& p) { p.scoring.stages = 1; }));  // a ring needs a stage in flight
  CHECK(illegal([](PipelinePolicy& p) { p.matching.block_threads = 1024; }));
  CHECK(illegal([](PipelinePolicy& p) { p.matching.blocks_per_sm = 3; }));
  CHECK(illegal([](PipelinePolicy& p) { p.topk.boundary_cap = 1000; }));
  CHECK(illegal([](PipelinePolicy& p) { p.topk.boundary_cap = 16384; }));  // K + cap keys outgrow one block's sort
  CHECK(illegal([](PipelinePolicy& p) { p.batch_scoring.one_pass_from = 1; }));
  CHECK(illegal([](PipelinePolicy& p) { p.batch_scoring.stages = 3; }));
  CHECK(illegal([](PipelinePolicy& p) { p.batch_scoring.group = 4; }));  // spills registers (run 31)
  CHECK(illegal([](PipelinePolicy& p) { p.batch_scoring.blocks_per_sm = 3; }));
}

TEST_CASE("matching, top-K and batch policies print every knob", "[retrieval][policy]") {
  std::set<std::string> keys;
  for (int threads : MatchingPolicy::block_threads_domain)
    for (int blocks : MatchingPolicy::blocks_per_sm_domain) keys.insert(to_string(MatchingPolicy{threads, blocks}));
  REQUIRE(keys.size() == MatchingPolicy::block_threads_domain.size() * MatchingPolicy::blocks_per_sm_domain.size());
  for (int cap : TopKPolicy::boundary_cap_domain) REQUIRE(to_string(TopKPolicy{cap}).find(std::to_string(cap)) != std::string::npos);
  std::set<std::string> batch_keys;
  for (int from : BatchScoringPolicy::one_pass_from_domain)
    for (int stages : BatchScoringPolicy::stages_domain)
      for (int group : BatchScoringPolicy::group_domain)
        for (int blocks : BatchScoringPolicy::blocks_per_sm_domain) {
          const BatchScoringPolicy p{from, stages, group, blocks};
          REQUIRE(is_legal(p));
          batch_keys.insert(to_string(p));
        }
  REQUIRE(batch_keys.size() == 4u * 2u * 2u * 4u);
  const PipelinePolicy d{};
  REQUIRE(to_string(d) == to_string(d.matching) + " " + to_string(d.scoring) + " " + to_string(d.topk) + " " +
                              to_string(d.batch_scoring));
}
