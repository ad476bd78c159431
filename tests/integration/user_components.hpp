// Components a user writes for kevo's loop, shared by the two consumers: a landscape whose best is
// knob x = 5, and a policy that always expands the newest correct node (a depth-first walk). Only
// the concept headers: kevo::core is enough for them.
#pragma once

#include <kevo/evaluator.hpp>
#include <kevo/search_policy.hpp>

#include <cstdlib>
#include <string>

struct LandscapeEvaluator {
  kevo::Evaluation evaluate(const kevo::Candidate& c, std::uint64_t) {
    kevo::Evaluation e;
    e.speedup = 6.0 - std::abs(std::stoi(c.knobs.at("x")) - 5);
    e.seconds = 1 / e.speedup;
    e.reference_seconds = 1;
    return e;
  }
  kevo::expected<kevo::Comparison, kevo::Error> compare(const kevo::Candidate& a, const kevo::Candidate& b, std::uint64_t s) {
    return kevo::Comparison{1 / evaluate(a, s).speedup, 1 / evaluate(b, s).speedup};
  }
};

struct NewestFirst {
  kevo::NodeId newest = 0;
  kevo::Expansion select(const kevo::SearchTree&, kevo::Rng&) { return {newest}; }
  void on_expand(const kevo::SearchTree&, kevo::NodeId) {}
  void on_result(const kevo::SearchTree& tree, kevo::NodeId n) {
    if (tree[n].state == kevo::NodeState::evaluated) newest = n;
  }
};
static_assert(kevo::SearchPolicy<NewestFirst>);
