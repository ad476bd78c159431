// The retrieval kernels' policy structs: the domains kevo's search sweeps. Every combination in the
// declared domains is legal and prints to a distinct key (results are stored under it); one value
// outside a domain makes a policy illegal.
#include <catch2/catch.hpp>

#include <set>
#include <vector>
#include <string>

#include "kevo/retrieval/tuning/policies.hpp"

namespace kevo_tests::retrieval_policies_test {

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

  // every_policy enumerates the same set from the description, each once, the defaults among them.
  const std::vector<ScoringPolicy> every = every_policy<ScoringPolicy>();
  CHECK(every.size() == combinations);
  std::set<std::string> enumerated;
  for (const ScoringPolicy& p : every) {
    CHECK(is_legal(p));
    enumerated.insert(to_string(p));
  }
  CHECK(enumerated == keys);
  CHECK(enumerated.count(to_string(ScoringPolicy{})) == 1);
  CHECK(every_policy<TopKPolicy>().size() ==
        TopKPolicy::boundary_cap_domain.size() * TopKPolicy::sort_domain.size() * TopKPolicy::one_launch_domain.size());
  CHECK(every_policy<MatchingPolicy>().size() ==
        MatchingPolicy::block_threads_domain.size() * MatchingPolicy::blocks_per_sm_domain.size() *
            MatchingPolicy::segment_queue_domain.size() * MatchingPolicy::launch_after_prior_domain.size());
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
  CHECK(illegal([](PipelinePolicy& p) { p.matching.segment_queue = 3; }));
  CHECK(illegal([](PipelinePolicy& p) { p.topk.boundary_cap = 1000; }));
  CHECK(illegal([](PipelinePolicy& p) { p.topk.boundary_cap = 16384; }));  // K + cap keys outgrow one block's sort
  CHECK(illegal([](PipelinePolicy& p) { p.topk.sort = 2; }));
  CHECK(illegal([](PipelinePolicy& p) { p.topk.one_launch = -1; }));
  CHECK(illegal([](PipelinePolicy& p) { p.batch_scoring.one_pass_from = 1; }));
  CHECK(illegal([](PipelinePolicy& p) { p.batch_scoring.stages = 3; }));
  CHECK(illegal([](PipelinePolicy& p) { p.batch_scoring.group = 4; }));  // spills registers (run 31)
  CHECK(illegal([](PipelinePolicy& p) { p.batch_scoring.blocks_per_sm = 3; }));
}

TEST_CASE("matching, top-K and batch policies print every knob", "[retrieval][policy]") {
  std::set<std::string> keys;
  for (int threads : MatchingPolicy::block_threads_domain)
    for (int blocks : MatchingPolicy::blocks_per_sm_domain)
      for (int queue : MatchingPolicy::segment_queue_domain)
        for (int after_prior : MatchingPolicy::launch_after_prior_domain)
          keys.insert(to_string(MatchingPolicy{threads, blocks, queue, after_prior}));
  REQUIRE(keys.size() == MatchingPolicy::block_threads_domain.size() * MatchingPolicy::blocks_per_sm_domain.size() *
                             MatchingPolicy::segment_queue_domain.size() *
                             MatchingPolicy::launch_after_prior_domain.size());
  std::set<std::string> topk_keys;
  for (int cap : TopKPolicy::boundary_cap_domain)
    for (int sort : TopKPolicy::sort_domain)
      for (int one_launch : TopKPolicy::one_launch_domain) topk_keys.insert(to_string(TopKPolicy{cap, sort, one_launch}));
  REQUIRE(topk_keys.size() ==
          TopKPolicy::boundary_cap_domain.size() * TopKPolicy::sort_domain.size() * TopKPolicy::one_launch_domain.size());
  REQUIRE(topk_keys.count("topk{boundary_cap=4096,sort=1,one_launch=0}") == 1);
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

TEST_CASE("each policy's description drives its knobs, both ways, and names a bad value", "[retrieval][policy]") {
  // Every field of every stage is a knob, and a legal policy comes back from its knobs unchanged.
  const PipelinePolicy d{};
  const kevo::Knobs knobs = to_knobs(d);
  CHECK(knobs.size() == 4 + 5 + 3 + 4);
  CHECK(knobs.at("scoring.stages") == "2");
  CHECK(knobs.at("batch_scoring.group") == "1");
  PipelinePolicy tuned = d;
  tuned.scoring.stages = 0;
  tuned.scoring.tiles_in_flight = 1;
  tuned.matching.blocks_per_sm = 16;
  tuned.matching.segment_queue = 0;
  tuned.matching.launch_after_prior = 0;
  tuned.topk.boundary_cap = 8192;
  auto back = policy_from_knobs(to_knobs(tuned));
  REQUIRE(back);
  CHECK(*back == tuned);
  // A stage's knobs without a prefix, for a search over one kernel; missing knobs keep the defaults.
  auto scoring = policy_from_knobs<ScoringPolicy>({{"blocks_per_sm", "3"}});
  REQUIRE(scoring);
  CHECK(scoring->blocks_per_sm == 3);
  CHECK(scoring->stages == ScoringPolicy{}.stages);

  auto refused = [](const kevo::Knobs& k) {
    auto p = policy_from_knobs(k);
    REQUIRE_FALSE(p);
    return p.error().message;
  };
  CHECK(refused({{"scoring.stages", "1"}}) == "scoring.stages = '1' is not one of {0, 2, 3, 4}");
  CHECK(refused({{"scoring.stages", "two"}}).find("scoring.stages = 'two'") != std::string::npos);
  CHECK(refused({{"scoring.stages", "2x"}}).find("is not one of") != std::string::npos);
  CHECK(refused({{"scoring.stage", "2"}}) == "'scoring.stage' is not a knob of the retrieval pipeline's policy");
}

TEST_CASE("the kernel variants are the compile-time fields' domains, and a run-time field has none", "[retrieval][policy]") {
  std::vector<int> stages;
  for_each_variant_value<ScoringPolicy, field_index<ScoringPolicy>("stages")>([&](auto v) { stages.push_back(v()); });
  CHECK(stages == std::vector<int>(ScoringPolicy::stages_domain.begin(), ScoringPolicy::stages_domain.end()));
  int picked = 0;
  CHECK(dispatch_variant<BatchScoringPolicy, field_index<BatchScoringPolicy>("group")>(2, [&](auto v) { picked = v(); }));
  CHECK(picked == 2);
  CHECK_FALSE(dispatch_variant<BatchScoringPolicy, field_index<BatchScoringPolicy>("group")>(4, [&](auto) { picked = -1; }));
  CHECK(picked == 2);
  for (const auto& f : PolicyDescription<ScoringPolicy>::fields)
    CHECK((f.binding == Binding::compile_time) == (f.name == "block_threads" || f.name == "tiles_in_flight" || f.name == "stages"));
}

}  // namespace kevo_tests::retrieval_policies_test
