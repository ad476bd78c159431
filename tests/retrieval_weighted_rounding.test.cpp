// Weighted int8 rounding (WeightedRounding): it keeps the spec's storage rule, and on requests it
// was not calibrated on it leaves less error in the metric it weighs by, far less in gate logits,
// and flips fewer top-2 routings than the pool's round-to-nearest. Bad input gets a clear error.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>
#include <vector>

#include "kevo/retrieval/retrieval.hpp"

namespace kevo_tests::retrieval_weighted_rounding_test {

using namespace kevo::retrieval;

namespace {

std::vector<std::vector<float>> user_features(const Workload& w, std::uint64_t first, int count) {
  std::vector<std::vector<float>> users;
  for (int i = 0; i < count; ++i) users.push_back(w.request(first + static_cast<std::uint64_t>(i)).features);
  return users;
}

std::vector<double> dequantized(const QuantizedEmbedding& q) {
  const std::size_t group = q.values.size() / q.scales.size();
  std::vector<double> a(q.values.size());
  for (std::size_t k = 0; k < a.size(); ++k) a[k] = double{q.scales[k / group]} * q.values[k];
  return a;
}

/// The two experts a row routes to (largest gate logits, ties to the lower index), as a set.
std::pair<int, int> top_two(const std::vector<double>& logit) {
  int first = 0;
  for (int e = 1; e < static_cast<int>(logit.size()); ++e)
    if (logit[e] > logit[first]) first = e;
  int second = first == 0 ? 1 : 0;
  for (int e = 0; e < static_cast<int>(logit.size()); ++e)
    if (e != first && logit[e] > logit[second]) second = e;
  return {std::min(first, second), std::max(first, second)};
}

/// What a storage's rounding does to held-out requests: its squared error in expert scores and
/// gate logits, summed, and how many (ad, request) pairs route to other experts than fp16 would.
struct RoundingDamage {
  double score_error = 0.0, logit_error = 0.0;
  int flips = 0;
};

RoundingDamage damage(const Workload& w, const std::vector<RequestVectors>& requests, int ads,
                      const std::function<QuantizedEmbedding(const std::vector<float>&)>& store) {
  RoundingDamage out;
  const int d = w.model().dim, experts = w.model().experts;
  for (int i = 0; i < ads; ++i) {
    const AdRecord ad = w.ad(static_cast<std::uint64_t>(i));
    const std::vector<double> stored = dequantized(store(ad.embedding));
    for (const RequestVectors& v : requests) {
      std::vector<double> exact_logit(experts), stored_logit(experts);
      for (int e = 0; e < experts; ++e) {
        double score_error = 0.0;
        for (int k = 0; k < d; ++k) {
          exact_logit[e] += double{round_to_half(ad.embedding[k])} * v.gate[e * d + k];
          stored_logit[e] += stored[k] * v.gate[e * d + k];
          score_error += (stored[k] - round_to_half(ad.embedding[k])) * v.expert[e * d + k];
        }
        out.score_error += score_error * score_error;
        out.logit_error += (stored_logit[e] - exact_logit[e]) * (stored_logit[e] - exact_logit[e]);
      }
      out.flips += top_two(exact_logit) != top_two(stored_logit);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("weighted rounding keeps the storage rule: q in [-127, 127] at quantize()'s kinds of scales", "[retrieval][int8]") {
  const Workload w({.seed = 11});
  auto rounding = WeightedRounding::calibrate(w.model(), user_features(w, 5000, 64));
  REQUIRE(rounding);
  CHECK(rounding->dim() == 128);
  for (EmbeddingType type : {EmbeddingType::int8, EmbeddingType::int8_group32}) {
    Schema schema = w.schema();
    schema.embedding_type = type;
    for (int i = 0; i < 200; ++i) {
      const AdRecord ad = w.ad(static_cast<std::uint64_t>(i));
      auto q = rounding->quantize(type, ad.embedding);
      REQUIRE(q);
      REQUIRE(check_quantized_embedding(schema, *q));  // the count of values and scales, and no -128
      const QuantizedEmbedding nearest = quantize(type, ad.embedding);
      if (type == EmbeddingType::int8) {
        CHECK(q->scales == nearest.scales);  // one scale, max |a| / 127, as the pool's own
      } else {
        for (float s : q->scales) {
          CHECK(s > 0.0f);
          CHECK(round_to_half(s) == s);  // a stored fp16 scale
        }
      }
      // The dequantised row stays the embedding to within a few steps, never far off.
      const std::vector<double> stored = dequantized(*q);
      const std::size_t group = q->values.size() / q->scales.size();
      for (std::size_t k = 0; k < stored.size(); ++k)
        CHECK(std::fabs(stored[k] - ad.embedding[k]) <= 4.0 * q->scales[k / group]);
      CHECK(q->values != nearest.values);  // it does round otherwise
    }
  }
}

TEST_CASE("weighted rounding leaves less error where held-out requests look, and flips fewer routings", "[retrieval][int8]") {
  const Workload w({.seed = 2026});
  auto rounding = WeightedRounding::calibrate(w.model(), user_features(w, 100'000, 128));
  REQUIRE(rounding);
  std::vector<RequestVectors> held_out;  // users the calibration never saw
  for (const auto& features : user_features(w, 100, 24)) held_out.push_back(compute_request_vectors(w.model(), features));
  const int ads = 2000;
  for (EmbeddingType type : {EmbeddingType::int8, EmbeddingType::int8_group32}) {
    const RoundingDamage nearest = damage(w, held_out, ads, [&](const std::vector<float>& a) { return quantize(type, a); });
    const RoundingDamage weighted = damage(w, held_out, ads, [&](const std::vector<float>& a) { return rounding->quantize(type, a).value(); });
    INFO(to_string(type) << ": score error " << weighted.score_error << " against " << nearest.score_error << ", logit error "
                         << weighted.logit_error << " against " << nearest.logit_error << ", flips " << weighted.flips << " against "
                         << nearest.flips << " of " << ads * held_out.size());
    // It trades: a little more error in expert scores for much less in the logits that pick the
    // experts (a flip moves a score far more than rounding does), less in all as H weighs them.
    const double gate_weight = WeightedRoundingOptions{}.gate_weight;
    CHECK(weighted.score_error + gate_weight * weighted.logit_error < 0.7 * (nearest.score_error + gate_weight * nearest.logit_error));
    CHECK(weighted.logit_error < 0.6 * nearest.logit_error);
    CHECK(weighted.score_error < 1.5 * nearest.score_error);
    CHECK(weighted.flips < nearest.flips);
  }
}

TEST_CASE("weighted rounding refuses what it cannot round, naming it", "[retrieval][int8]") {
  const Workload w({.seed = 3});
  const auto users = user_features(w, 0, 4);
  CHECK(WeightedRounding::calibrate(w.model(), {}).error().message == "weighted rounding: calibrating needs at least one sample user");
  auto short_user = users;
  short_user[2].resize(10);
  CHECK(WeightedRounding::calibrate(w.model(), short_user).error().message ==
        "weighted rounding: sample user 2 has 10 features, the model takes 256");
  CHECK(!WeightedRounding::calibrate(w.model(), users, {.damping = 0.0}));
  Model broken = w.model();
  broken.dim = 0;
  CHECK(!WeightedRounding::calibrate(broken, users));

  auto rounding = WeightedRounding::calibrate(w.model(), users);
  REQUIRE(rounding);
  std::vector<float> embedding = w.ad(0).embedding;
  CHECK(rounding->quantize(EmbeddingType::fp16, embedding).error().message ==
        "weighted rounding makes int8 storage; an fp16 pool takes the embedding itself");
  std::vector<float> short_embedding(embedding.begin(), embedding.begin() + 64);
  CHECK(rounding->quantize(EmbeddingType::int8, short_embedding).error().message ==
        "weighted rounding: the embedding has 64 values, calibrated for d = 128");
  embedding[7] = 70000.0f;  // beyond fp16, which int8_group32's scales and dequantised values are in
  CHECK(rounding->quantize(EmbeddingType::int8_group32, embedding).error().message.find("beyond fp16's range") != std::string::npos);
  embedding[7] = std::nanf("");
  CHECK(rounding->quantize(EmbeddingType::int8, embedding).error().message == "embedding must be finite");

  const Workload odd({.seed = 3, .dim = 48});
  auto odd_rounding = WeightedRounding::calibrate(odd.model(), user_features(odd, 0, 4));
  REQUIRE(odd_rounding);
  CHECK(odd_rounding->quantize(EmbeddingType::int8_group32, odd.ad(0).embedding).error().message ==
        "int8_group32 needs d to be a multiple of 32, not 48");
  CHECK(odd_rounding->quantize(EmbeddingType::int8, odd.ad(0).embedding));  // one scale a row fits any d
}

}  // namespace kevo_tests::retrieval_weighted_rounding_test
