// Scoring's routing tournament (agent/scoring.cuh's top_two_experts), checked on the host against
// the spec's rule read plainly: order the experts by larger logit, then lower index, and take the
// first two. It needs no GPU: a [host] test, run in CI too. Logits are drawn from four values (one of
// them -inf, as masked experts are) so that ties, which decide by expert index, are common.
// (One of the files of test_cuda_retrieval_pipeline; its main is main.cu.)
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include "kevo/retrieval/agent/scoring.cuh"

using namespace kevo::retrieval;

TEST_CASE("routing's tournament picks the spec's top two experts, ties to the lower index, for every lane layout",
          "[host][retrieval][scoring]") {
  const std::array<float, 4> values{-1.0f, 0.5f, 2.0f, -INFINITY};
  int checked = 0, tied = 0;
  for (int quad = 0; quad < 4; ++quad)
    for (int code = 0; code < (1 << 16); ++code) {  // every assignment of the four values to 8 experts
      float logit[8], score[8];
      std::array<float, 8> logit_of_expert;
      for (int p = 0; p < 8; ++p) {
        const int expert = expert_at_position(quad, p);
        logit[p] = logit_of_expert[expert] = values[(code >> (2 * expert)) & 3];
        score[p] = 10.0f + expert;  // names the expert
      }
      std::array<int, 8> order;
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logit_of_expert[a] > logit_of_expert[b]; });
      const TopTwoExperts top = top_two_experts(logit, score, quad);
      INFO("quad " << quad << ", code " << code);
      REQUIRE(top.first.score == 10.0f + order[0]);
      REQUIRE(top.first.logit == logit_of_expert[order[0]]);
      REQUIRE(top.second.score == 10.0f + order[1]);
      REQUIRE(top.second.logit == logit_of_expert[order[1]]);
      ++checked;
      tied += logit_of_expert[order[1]] == logit_of_expert[order[2]] || logit_of_expert[order[0]] == logit_of_expert[order[1]];
    }
  CHECK(checked == 4 * (1 << 16));
  CHECK(tied > checked / 2);  // the draw does exercise the tie rule
}

TEST_CASE("each lane layout holds every expert once, pairs of neighbours together", "[host][retrieval][scoring]") {
  for (int quad = 0; quad < 4; ++quad) {
    std::array<int, 8> held{};
    for (int p = 0; p < 8; ++p) ++held[expert_at_position(quad, p)];
    INFO("quad " << quad);
    CHECK(held == std::array<int, 8>{1, 1, 1, 1, 1, 1, 1, 1});
    CHECK(expert_at_position(quad, 0) == 2 * quad);  // the lane's own pair first
    for (int p = 0; p < 8; p += 2) CHECK(expert_at_position(quad, p + 1) == expert_at_position(quad, p) + 1);
  }
}
