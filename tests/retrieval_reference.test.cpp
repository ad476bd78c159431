// The CPU reference of the retrieval spec against a brute-force reading of the spec, plus the
// pieces around it: fp16 conversion, validation, the comparison rules, safetensors, the workload.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include "kevo/retrieval/retrieval.hpp"
#include "support/quantized_ads.hpp"

namespace kevo_tests::retrieval_reference_test {

using namespace kevo::retrieval;

namespace {

// Symmetric int8 as the spec states it: one fp32 scale = max|a| / 127, q = a / scale rounded
// (exact halves away from zero) into [-127, 127]; the float operations are the spec's, so q agrees
// with the pool's. quantize_int8 itself is checked against the spec below.
std::vector<double> dequantized(const std::vector<float>& embedding) {
  float max_abs = 0.0f;
  for (float a : embedding) max_abs = std::max(max_abs, std::fabs(a));
  std::vector<double> out(embedding.size(), 0.0);
  if (max_abs == 0.0f) return out;
  const float scale = max_abs / 127.0f;
  for (std::size_t k = 0; k < embedding.size(); ++k) {
    const long q = std::clamp(std::lround(embedding[k] / scale), -127l, 127l);
    out[k] = double(scale * float(q));  // a = scale * q, in fp32 as stored
  }
  return out;
}

// int8_group32 as the spec states it: per group of 32 consecutive values, scale = max|a| / 127 (in
// fp32) rounded to fp16 (one fp16 step lower where 127 * scale would pass 65504: ad_pool.hpp keeps
// the dequantised values within fp16's range), q = a / scale rounded (halves away from zero) into
// [-127, 127]; a group whose scale is 0 (all zeros, or too small for fp16) stays 0. Dequantised in
// fp16, the scale's type: a = scale * q rounded to fp16 (ad_pool.hpp says why).
// quantize_int8_group32 is checked against this rule below.
std::vector<double> dequantized_group32(const std::vector<float>& embedding) {
  std::vector<double> out(embedding.size(), 0.0);
  for (std::size_t begin = 0; begin + 32 <= embedding.size(); begin += 32) {
    float max_abs = 0.0f;
    for (std::size_t k = begin; k < begin + 32; ++k) max_abs = std::max(max_abs, std::fabs(embedding[k]));
    float scale = round_to_half(max_abs / 127.0f);
    if (127.0f * scale > 65504.0f) scale = half_to_float(static_cast<std::uint16_t>(float_to_half(scale) - 1));
    if (scale == 0.0f) continue;
    for (std::size_t k = begin; k < begin + 32; ++k) {
      const long q = std::clamp(std::lround(embedding[k] / scale), -127l, 127l);
      out[k] = double(round_to_half(scale * float(q)));
    }
  }
  return out;
}

// The spec read literally from AdRecords: sets, loops, a full sort; every eligible ad, ranked.
// Eligibility, int8 quantisation, scoring, routing and ranking are written here, not taken from
// reference.hpp or ad_pool.hpp; the towers (compute_request_vectors) and fp16 rounding
// (round_to_half) come from the library, and this file checks each of those on its own.
std::vector<ScoredAd> brute_force_ranking(const std::vector<AdRecord>& ads, const Schema& schema, const Model& model,
                                          const Request& request) {
  const int d = model.dim, e_count = model.experts;
  const RequestVectors v = compute_request_vectors(model, request.features);
  std::vector<std::vector<double>> u(e_count, std::vector<double>(d)), g(e_count, std::vector<double>(d));
  for (int e = 0; e < e_count; ++e)
    for (int j = 0; j < d; ++j) {
      u[e][j] = v.expert[e * d + j];
      g[e][j] = v.gate[e * d + j];
    }
  std::vector<std::set<std::uint32_t>> query(schema.categories());
  for (const auto& q : request.query) query[q.category].insert(q.values.begin(), q.values.end());

  std::vector<ScoredAd> all;
  for (const AdRecord& ad : ads) {
    if (!ad.live) continue;
    bool eligible = true;
    for (int c = 0; c < schema.categories() && eligible; ++c) {
      std::set<std::uint32_t> allow, exclude;
      for (const Clause& cl : ad.clauses)
        if (int(cl.category) == c) (cl.exclude ? exclude : allow).insert(cl.value);
      bool any_allowed = allow.empty(), excluded = false;
      for (std::uint32_t v : query[c]) {
        any_allowed = any_allowed || allow.count(v);
        excluded = excluded || exclude.count(v);
      }
      eligible = any_allowed && !excluded;
    }
    if (!eligible) continue;
    std::vector<double> a(d);
    if (schema.embedding_type == EmbeddingType::int8) a = dequantized(ad.embedding);
    else if (schema.embedding_type == EmbeddingType::int8_group32) a = dequantized_group32(ad.embedding);
    else
      for (int k = 0; k < d; ++k) a[k] = round_to_half(ad.embedding[k]);
    std::vector<std::pair<double, int>> logits;
    std::vector<double> s(e_count);
    for (int e = 0; e < e_count; ++e) {
      double l = 0;
      for (int k = 0; k < d; ++k) {
        s[e] += a[k] * u[e][k];
        l += a[k] * g[e][k];
      }
      logits.push_back({-l, e});  // sorting ascending on (-l, e): largest logit, then lower index
    }
    std::sort(logits.begin(), logits.end());
    double top = -logits[0].first, num = 0, den = 0;
    for (int r = 0; r < request.routing; ++r) {
      const double w = std::exp(-logits[r].first - top);
      num += w * s[logits[r].second];
      den += w;
    }
    all.push_back({ad.id, float(num / den + ad.bias)});
  }
  std::sort(all.begin(), all.end(),
            [](const ScoredAd& x, const ScoredAd& y) { return x.score > y.score || (x.score == y.score && x.id < y.id); });
  return all;
}

std::vector<ScoredAd> top_k(std::vector<ScoredAd> ranking, int k) {
  if (ranking.size() > std::size_t(k)) ranking.resize(std::size_t(k));
  return ranking;
}

// Both sides compute in double; they may differ by rounding only, far below the spec's tolerance.
bool same_score(double a, double b) { return std::fabs(a - b) <= 1e-5 * (1 + std::fabs(b)); }

// The reference's top-K against the brute force's full ranking: the same ids in the same places,
// score descending then id ascending, no duplicates; two ads may trade places only when their
// brute-force scores agree to rounding (a near-tie), and then each keeps its own score.
void require_same_top_k(const std::vector<ScoredAd>& reference, const std::vector<ScoredAd>& brute, int k) {
  REQUIRE(reference.size() == std::min(brute.size(), std::size_t(k)));
  std::map<std::uint32_t, float> brute_score;
  for (const ScoredAd& b : brute) brute_score.emplace(b.id, b.score);
  std::set<std::uint32_t> seen;
  for (std::size_t i = 0; i < reference.size(); ++i) {
    const ScoredAd& r = reference[i];
    INFO("position " << i << ": reference id " << r.id << " score " << r.score << ", brute force id " << brute[i].id
                     << " score " << brute[i].score);
    REQUIRE(seen.insert(r.id).second);
    REQUIRE(brute_score.count(r.id) == 1);  // eligible
    REQUIRE(same_score(r.score, brute_score[r.id]));
    if (i > 0)
      REQUIRE((reference[i - 1].score > r.score || (reference[i - 1].score == r.score && reference[i - 1].id < r.id)));
    if (r.id != brute[i].id) REQUIRE(same_score(brute_score[r.id], brute[i].score));
  }
}

struct Fixture {
  Workload workload;
  Model model;
  std::vector<AdRecord> ads;
  HostAdPool pool;
  Fixture(std::uint64_t seed, int n, EmbeddingType type, int dim = 64, double restrict_min = 0.01,
          double restrict_max = 0.10)
      : workload({.seed = seed, .dim = dim, .features = 32, .hidden = 48, .embedding_type = type,
                  .restrict_min = restrict_min, .restrict_max = restrict_max}),
        model(workload.model()),
        pool(workload.schema()) {
    for (int i = 0; i < n; ++i) {
      ads.push_back(workload.ad(std::uint64_t(i)));
      REQUIRE(pool.upsert(ads.back()));
    }
  }
};

}  // namespace

TEST_CASE("fp16 conversion is exact on halves and rounds to nearest even", "[retrieval][half]") {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaNs have many encodings
    REQUIRE(float_to_half(half_to_float(h)) == h);
  }
  Rng rng(5);
  for (int i = 0; i < 200000; ++i) {
    const float x = float(rng.normal() * std::pow(2.0, rng.between(-26, 13)));
    if (std::fabs(x) >= 65504.0f) continue;
    const std::uint16_t h = float_to_half(x);
    const double err = std::fabs(double(half_to_float(h)) - x);
    // No neighbouring half is closer; on a tie the even one wins.
    for (int step : {-1, 1}) {
      const auto n = static_cast<std::uint16_t>(h + step);
      if ((n & 0x7c00) == 0x7c00 || ((h ^ n) & 0x8000)) continue;
      const double nerr = std::fabs(double(half_to_float(n)) - x);
      REQUIRE(err <= nerr);
      if (err == nerr) REQUIRE((h & 1) == 0);
    }
  }
  CHECK(float_to_half(65520.0f) == 0x7c00);  // rounds up to infinity
  CHECK(float_to_half(65519.0f) == 0x7bff);
}

TEST_CASE("floats_to_halves rounds every value as float_to_half does, on F16C and off it", "[retrieval][half]") {
  // Every half exactly, the ties between neighbours (round to even), values past 65504 and below
  // the smallest subnormal, and random values over the whole range; lengths not a multiple of 8.
  std::vector<float> values;
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    if ((h & 0x7c00) == 0x7c00) continue;  // infinities and NaNs: embeddings are checked finite first
    values.push_back(half_to_float(h));
    if ((h & 0x7fff) != 0x7bff)  // the midpoint to the next half up
      values.push_back(float((double(half_to_float(h)) + double(half_to_float(static_cast<std::uint16_t>(h + 1)))) / 2));
  }
  for (float edge : {65519.0f, 65520.0f, 1e5f, -65520.0f, 0x1p-25f, 0x1.000002p-25f, 1e-30f, -0.0f})
    values.push_back(edge);
  Rng rng(9);
  for (int i = 0; i < 100000; ++i) values.push_back(float(rng.normal() * std::pow(2.0, rng.between(-30, 17))));
  for (std::size_t length : {values.size(), values.size() - 3, std::size_t{7}, std::size_t{1}}) {
    std::vector<std::uint16_t> out(length, 0xdead);
    floats_to_halves(values.data(), out.data(), length);
    for (std::size_t i = 0; i < length; ++i) {
      INFO("value " << values[i] << " at " << i);
      REQUIRE(out[i] == float_to_half(values[i]));
    }
  }
}

TEST_CASE("parallel_for_ranges runs every index once, from several callers at once and from inside its own body",
          "[retrieval][threads]") {
  // Each index of each call runs exactly once, whatever the part count and however many callers share
  // the host, and a call made inside a body finishes.
  constexpr std::size_t kCount = 10007;  // not a multiple of any part count
  std::vector<std::thread> callers;
  std::vector<std::vector<int>> runs(6, std::vector<int>(kCount, 0));
  std::atomic<int> bad_parts{0};  // counted, not asserted: Catch2's assertions are not thread-safe
  for (std::size_t c = 0; c < runs.size(); ++c)
    callers.emplace_back([&, c] {
      for (unsigned parts : {1u, 3u, 16u, 40u})
        parallel_for_ranges(kCount, parts, [&](unsigned part, std::size_t begin, std::size_t end) {
          if (part >= parts) ++bad_parts;
          for (std::size_t i = begin; i < end; ++i) ++runs[c][i];
        });
    });
  for (auto& t : callers) t.join();
  CHECK(bad_parts == 0);
  for (const auto& r : runs) CHECK(std::all_of(r.begin(), r.end(), [](int n) { return n == 4; }));

  std::vector<std::atomic<int>> nested(64 * 64);
  parallel_for_ranges(64, 64, [&](unsigned, std::size_t begin, std::size_t end) {
    for (std::size_t outer = begin; outer < end; ++outer)
      parallel_for_ranges(64, 8, [&](unsigned, std::size_t b, std::size_t e) {
        for (std::size_t inner = b; inner < e; ++inner) ++nested[outer * 64 + inner];
      });
  });
  CHECK(std::all_of(nested.begin(), nested.end(), [](const std::atomic<int>& n) { return n.load() == 1; }));
}

TEST_CASE("the reference equals a brute-force reading of the spec", "[retrieval][reference]") {
  const auto type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8, EmbeddingType::int8_group32);
  const auto kind = GENERATE(RequestKind::typical, RequestKind::broad, RequestKind::narrow);
  const std::uint64_t seed = GENERATE(1, 2, 3);
  // A narrow request is narrow (<= 2% eligible) on a pool that restricts more (workload.hpp).
  const bool narrow = kind == RequestKind::narrow;
  Fixture fx(seed, 3000, type, 64, narrow ? 0.1 : 0.01, narrow ? 0.2 : 0.1);
  for (int k : {1, 10, 700, 4096}) {
    for (int routing : {1, 2, 8}) {
      const Request request = fx.workload.request(seed * 100 + k, kind, k, routing);
      REQUIRE(validate_request(fx.pool.schema(), fx.model, request));
      const RequestVectors v = compute_request_vectors(fx.model, request.features);
      const std::vector<ScoredAd> reference = reference_search(fx.pool, v, request, 3);
      const std::vector<ScoredAd> brute = brute_force_ranking(fx.ads, fx.pool.schema(), fx.model, request);
      INFO("seed " << seed << " k " << k << " routing " << routing << " type " << to_string(type) << " kind "
                   << int(kind) << ": " << brute.size() << " eligible");
      REQUIRE(!brute.empty());
      // The kinds are what they say: broad >= 80% of the (about 99% live) ads, narrow <= 2%.
      if (kind == RequestKind::broad) REQUIRE(brute.size() >= 0.8 * 0.98 * 3000);
      if (narrow) REQUIRE(brute.size() <= 0.02 * 3000);
      require_same_top_k(reference, brute, k);
      // The comparison rules accept the brute-force answer.
      auto ok = compare_with_reference(fx.pool, v, request, top_k(brute, k));
      INFO((ok ? std::string("ok") : ok.error().message));
      REQUIRE(ok);
    }
  }
}

TEST_CASE("int8 quantisation follows the spec: a = scale * q, q in [-127, 127], one scale per ad",
          "[retrieval][int8]") {
  auto check = [](const std::vector<float>& a, const char* what) {
    INFO(what << ", d " << a.size());
    const QuantizedEmbedding q = quantize_int8(a);
    REQUIRE(q.values.size() == a.size());
    double max_abs = 0;
    for (float x : a) max_abs = std::max(max_abs, std::fabs(double(x)));
    REQUIRE(q.scales.size() == 1);  // one scale per ad
    const float scale = q.scales[0];
    if (max_abs == 0) {
      REQUIRE(scale == 0.0f);
      for (std::int8_t v : q.values) REQUIRE(v == 0);
      return;
    }
    // One fp32 division's rounding, no more.
    REQUIRE(std::fabs(scale - max_abs / 127) <= 1e-7 * max_abs / 127);
    int largest = 0;
    for (std::size_t k = 0; k < a.size(); ++k) {
      INFO("k " << k << ": a " << a[k] << ", q " << int(q.values[k]) << ", scale " << scale);
      REQUIRE(int(q.values[k]) >= -127);  // int8 holds -128, the spec does not
      largest = std::max(largest, std::abs(int(q.values[k])));
      // Rounded to nearest: within half a step (plus the rounding of a / scale in fp32).
      REQUIRE(std::fabs(double(scale) * q.values[k] - a[k]) <= double(scale) * (0.5 + 1e-5));
    }
    REQUIRE(largest == 127);
  };
  for (std::size_t d : {64u, 128u, 256u}) {
    for (unsigned seed : {1u, 2u, 3u, 4u}) {
      std::mt19937 gen(seed * 1000 + unsigned(d));
      std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(float(d)));
      std::vector<float> a(d);
      for (float& x : a) x = normal(gen);
      check(a, "normal");
      // One large outlier, of either sign: every other value lands within a few steps of zero.
      std::vector<float> outlier = a;
      outlier[gen() % d] = (seed % 2 ? 1.0f : -1.0f) * 1000.0f;
      check(outlier, "outlier");
      std::vector<float> tiny = a;
      for (float& x : tiny) x *= 1e-20f;
      check(tiny, "tiny");
      std::vector<float> constant(d, -0.3f);
      check(constant, "constant");
    }
    check(std::vector<float>(d, 0.0f), "zero");
    std::vector<float> one_value(d, 0.0f);
    one_value[d - 1] = -2.5f;
    check(one_value, "one nonzero value");
  }
}

TEST_CASE("int8_group32 quantisation follows the spec: per 32 values a = scale * q, the scale max|a| / 127 in fp16",
          "[retrieval][int8]") {
  int normal_groups = 0, subnormal_groups = 0, underflowed_groups = 0, zero_groups = 0, clamped = 0, stepped_down = 0;
  auto check = [&](const std::vector<float>& a, const char* what) {
    INFO(what << ", d " << a.size());
    const QuantizedEmbedding q = quantize_int8_group32(a);
    REQUIRE(q.values.size() == a.size());
    REQUIRE(q.scales.size() == a.size() / 32);
    for (std::size_t g = 0; g < q.scales.size(); ++g) {
      float max_abs = 0.0f;
      for (std::size_t k = g * 32; k < g * 32 + 32; ++k) max_abs = std::max(max_abs, std::fabs(a[k]));
      const float target = max_abs / 127.0f;  // the spec's division, in fp32
      const float s = q.scales[g];
      INFO("group " << g << ": max |a| " << max_abs << ", max |a| / 127 " << target << ", scale " << s);
      // fp16-exact, and the nearest fp16 to max|a| / 127 (no neighbouring half is closer; a tie: the
      // even one), or the half below it where 127 times the nearest would pass fp16's 65504.
      REQUIRE(s >= 0.0f);
      const std::uint16_t h = float_to_half(s);
      REQUIRE(half_to_float(h) == s);
      REQUIRE(127.0 * s <= 65504.0);
      auto nearest = [&](std::uint16_t bits) {
        const double here = std::fabs(double(half_to_float(bits)) - target);
        for (int step : {-1, 1}) {
          if (bits == 0 && step < 0) continue;
          const auto n = static_cast<std::uint16_t>(bits + step);
          if ((n & 0x7c00) == 0x7c00) continue;
          const double there = std::fabs(double(half_to_float(n)) - target);
          if (there < here || (there == here && (bits & 1))) return false;
        }
        return true;
      };
      if (!nearest(h)) {
        ++stepped_down;
        REQUIRE(nearest(static_cast<std::uint16_t>(h + 1)));
        REQUIRE(127.0 * half_to_float(static_cast<std::uint16_t>(h + 1)) > 65504.0);
      }
      if (s == 0.0f) {  // all zeros, or max|a| / 127 below half of fp16's least subnormal: every q is 0
        (max_abs == 0.0f ? zero_groups : underflowed_groups)++;
        REQUIRE(double(target) <= std::ldexp(1.0, -25));
        for (std::size_t k = g * 32; k < g * 32 + 32; ++k) REQUIRE(q.values[k] == 0);
        continue;
      }
      const bool normal = s >= std::ldexp(1.0f, -14);
      (normal ? normal_groups : subnormal_groups)++;
      int largest = 0;
      for (std::size_t k = g * 32; k < g * 32 + 32; ++k) {
        const int v = q.values[k];
        INFO("k " << k << ": a " << a[k] << ", q " << v);
        REQUIRE(v >= -127);  // int8 holds -128, the spec does not
        REQUIRE(v <= 127);
        largest = std::max(largest, std::abs(v));
        const double error = std::fabs(double(s) * v - a[k]);
        // Rounded to nearest: within half a step (plus the rounding of a / scale in fp32); where the
        // fp16 scale rounded below max|a| / 127 far enough that a / scale passes 127.5, the value is
        // clamped to 127 steps and the error is what lies past them.
        if (std::fabs(double(a[k]) / s) > 127.5) {
          ++clamped;
          REQUIRE(std::abs(v) == 127);
          REQUIRE(error <= (double(max_abs) - 127.0 * s) * (1 + 1e-6));
        } else {
          REQUIRE(error <= double(s) * (0.5 + 1e-5));
        }
      }
      // fp16 rounds max|a| / 127 by at most 2^-11 of it where the scale is normal, so the largest value takes q = ±127.
      if (normal) REQUIRE(largest == 127);
    }
  };
  for (std::size_t d : {64u, 128u, 256u}) {
    for (unsigned seed : {11u, 12u, 13u, 14u}) {
      std::mt19937 gen(seed * 7919 + unsigned(d));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::uniform_real_distribution<float> decades(-9.0f, 4.5f);
      std::vector<float> a(d);
      for (float& x : a) x = normal(gen) / std::sqrt(float(d));
      check(a, "normal");
      // Each group at its own magnitude, from far below fp16's least scale to near 10^4.5.
      std::vector<float> spread = a;
      for (std::size_t g = 0; g < d / 32; ++g) {
        const float magnitude = std::pow(10.0f, decades(gen));
        for (std::size_t k = g * 32; k < g * 32 + 32; ++k) spread[k] *= magnitude;
      }
      check(spread, "groups of different magnitudes");
      // One outlier in one group: the other groups keep their own fine steps.
      std::vector<float> outlier = a;
      outlier[gen() % d] = (seed % 2 ? 1.0f : -1.0f) * 1000.0f;
      check(outlier, "outlier");
      // One group all zeros among nonzero ones.
      std::vector<float> hole = a;
      std::fill(hole.begin() + 32, hole.begin() + 64, 0.0f);
      check(hole, "a zero group");
      const QuantizedEmbedding q = quantize_int8_group32(hole);
      CHECK(q.scales[1] == 0.0f);
      CHECK(q.scales[0] > 0.0f);
      // Scales whose fp16 is subnormal, where rounding the scale moves it by up to a third: some
      // values round past 127 steps and are clamped.
      for (float m : {2e-7f, 3e-6f, 5e-6f, 1e-5f, 3e-5f}) {
        std::vector<float> small = a;
        for (float& x : small) x *= m * std::sqrt(float(d));
        check(small, "subnormal scales");
      }
    }
    check(std::vector<float>(d, 0.0f), "zero");
    std::vector<float> constant(d, -0.3f);
    check(constant, "constant");
    // At fp16's limit: max|a| / 127 rounds to a half whose 127 steps pass 65504, so the scale is one step lower.
    for (float top : {65504.0f, -65502.0f, 65500.5f, 65000.0f}) {
      std::vector<float> limit(d, 0.0f);
      for (std::size_t k = 0; k < d; ++k) limit[k] = top * float(int(k % 7) - 3) / 3.0f;
      check(limit, "fp16's limit");
    }
  }
  INFO(normal_groups << " normal, " << subnormal_groups << " subnormal, " << underflowed_groups << " underflowed, "
                     << zero_groups << " zero groups (" << stepped_down << " stepped down); " << clamped << " values clamped");
  // Every case above was met, not only the easy ones.
  CHECK(normal_groups > 150);
  CHECK(subnormal_groups > 50);
  CHECK(underflowed_groups > 10);
  CHECK(zero_groups > 20);
  CHECK(clamped > 10);
  CHECK(stepped_down > 10);
}

TEST_CASE("an int8_group32 pool dequantises each value with its own group's scale, in fp16", "[retrieval][int8]") {
  const Workload w({.seed = 61, .dim = 128, .features = 32, .hidden = 48, .embedding_type = EmbeddingType::int8_group32});
  HostAdPool pool(w.schema());
  REQUIRE(scales_per_ad(EmbeddingType::int8_group32, 128) == 4);
  // Groups of very different magnitudes, so that a value dequantised with another group's scale, or
  // with one scale for the ad, is far off.
  auto ad_of = [&](std::uint64_t index, std::uint32_t id) {
    AdRecord ad = w.ad(index);
    ad.id = id;
    ad.live = true;
    for (int k = 0; k < 128; ++k) ad.embedding[k] *= std::pow(8.0f, float(k / 32));
    return ad;
  };
  std::map<std::uint32_t, AdRecord> truth;
  for (std::uint32_t id = 0; id < 400; ++id) truth[id] = ad_of(id, id);
  for (const auto& [id, ad] : truth) REQUIRE(pool.upsert(ad));
  for (std::uint32_t id = 0; id < 400; id += 3) {  // freed slots, then reused by new ads and replacements
    REQUIRE(pool.expire(id));
    truth.erase(id);
  }
  for (std::uint32_t id = 1000; id < 1100; ++id) truth[id] = ad_of(5000 + id, id);
  for (std::uint32_t id = 1; id < 400; id += 9) truth[id] = ad_of(9000 + id, id);
  for (const auto& [id, ad] : truth)
    if (id >= 1000 || id % 9 == 1) REQUIRE(pool.upsert(ad));
  REQUIRE(pool.live_count() == truth.size());
  REQUIRE(pool.scales().size() == pool.slots() * 4);
  REQUIRE(pool.int8_values().size() == pool.slots() * 128);
  CHECK(pool.fp16_values().empty());
  std::size_t values = 0;
  for (const auto& [id, ad] : truth) {
    const auto slot = pool.slot_of(id);
    REQUIRE(slot);
    const std::vector<double> spec = dequantized_group32(ad.embedding);
    const QuantizedEmbedding q = quantize_int8_group32(ad.embedding);
    for (int g = 0; g < 4; ++g) REQUIRE(pool.scales()[*slot * 4 + g] == q.scales[g]);
    REQUIRE(pool.scales()[*slot * 4 + 3] > 100 * pool.scales()[*slot * 4]);  // the groups' scales differ
    for (int k = 0; k < 128; ++k) {
      INFO("ad " << id << " slot " << *slot << " value " << k);
      const float scale = pool.scales()[*slot * 4 + k / 32];
      const std::int8_t stored = pool.int8_values()[*slot * 128 + k];
      REQUIRE(pool.embedding(*slot, k) == round_to_half(scale * float(stored)));
      REQUIRE(double(pool.embedding(*slot, k)) == spec[k]);
      ++values;
    }
  }
  CHECK(values == truth.size() * 128);
}

TEST_CASE("the CPU backend's answers on an int8_group32 pool pass compare_with_reference", "[retrieval][int8][backend]") {
  const Workload w({.seed = 71, .dim = 64, .features = 32, .hidden = 48, .embedding_type = EmbeddingType::int8_group32});
  CpuRetrievalBackend backend(w.schema(), w.model(), 2);
  HostAdPool pool(w.schema());
  Schema per_ad = w.schema();
  per_ad.embedding_type = EmbeddingType::int8;
  HostAdPool per_ad_pool(per_ad);  // the same ads at one scale per ad: a control the answers must fail
  std::vector<AdRecord> ads;
  for (int i = 0; i < 6000; ++i) ads.push_back(w.ad(std::uint64_t(i)));
  REQUIRE(backend.upsert(ads));
  for (const AdRecord& ad : ads) {
    REQUIRE(pool.upsert(ad));
    REQUIRE(per_ad_pool.upsert(ad));
  }
  int checked = 0, refused_by_control = 0;
  for (RequestKind kind : {RequestKind::typical, RequestKind::broad}) {
    for (int k : {1, 100, 1000}) {
      for (int routing : {1, 2, 8}) {
        const Request request = w.request(std::uint64_t(k * 10 + routing), kind, k, routing);
        auto answer = backend.search(request);
        REQUIRE(answer);
        REQUIRE(!answer->empty());
        const RequestVectors v = compute_request_vectors(w.model(), request.features);
        auto ok = compare_with_reference(pool, v, request, *answer);
        INFO("kind " << int(kind) << " k " << k << " routing " << routing << ": " << (ok ? std::string("ok") : ok.error().message));
        REQUIRE(ok);
        CHECK(*answer == reference_search(pool, v, request));
        refused_by_control += !compare_with_reference(per_ad_pool, v, request, *answer);
        ++checked;
      }
    }
  }
  INFO(refused_by_control << " of " << checked << " answers refused against the per-ad int8 pool");
  CHECK(refused_by_control > checked / 2);  // the comparison sees which storage scored them
}

TEST_CASE("an int8 pool keeps an ad's quantized form as it was handed in", "[retrieval][int8]") {
  const EmbeddingType type = GENERATE(EmbeddingType::int8, EmbeddingType::int8_group32);
  INFO(to_string(type));
  const Workload w({.seed = 83, .dim = 64, .features = 32, .hidden = 48, .embedding_type = type});
  HostAdPool pool(w.schema());
  CpuRetrievalBackend backend(w.schema(), w.model(), 2);
  std::vector<AdRecord> ads;
  for (int i = 0; i < 4000; ++i)  // every other ad handed in quantized, the rest as values
    ads.push_back(i % 2 ? kevo_tests::handed_in_quantized(type, w.ad(std::uint64_t(i))) : w.ad(std::uint64_t(i)));
  for (const AdRecord& ad : ads) REQUIRE(pool.upsert(ad));
  REQUIRE(backend.upsert(ads));
  const std::size_t scales = static_cast<std::size_t>(scales_per_ad(type, 64));
  int kept = 0;
  for (const AdRecord& ad : ads) {
    const auto slot = pool.slot_of(ad.id);
    if (ad.quantized.values.empty() || !slot) continue;
    for (int k = 0; k < 64; ++k) {
      const std::int8_t q = ad.quantized.values[std::size_t(k)];
      const float scale = ad.quantized.scales[std::size_t(k) / (64 / scales)];
      REQUIRE(pool.int8_values()[*slot * 64 + std::size_t(k)] == q);  // |q| <= 90: quantised again, it would reach 127
      REQUIRE(pool.embedding(*slot, k) == (type == EmbeddingType::int8 ? scale * q : round_to_half(scale * q)));
    }
    for (std::size_t g = 0; g < scales; ++g) REQUIRE(pool.scales()[*slot * scales + g] == ad.quantized.scales[g]);
    ++kept;
  }
  CHECK(kept > 1900);
  for (RequestKind kind : {RequestKind::typical, RequestKind::broad}) {
    const Request request = w.request(7, kind, 200);
    auto answer = backend.search(request);
    REQUIRE(answer);
    REQUIRE(answer->size() == 200);
    auto ok = compare_with_reference(pool, compute_request_vectors(w.model(), request.features), request, *answer);
    INFO((ok ? "" : ok.error().message));
    REQUIRE(ok);
  }
}

TEST_CASE("a quantized embedding that does not fit the pool is refused with the reason", "[retrieval][int8][validation]") {
  const Workload w({.seed = 89, .dim = 64, .features = 32, .hidden = 48, .embedding_type = EmbeddingType::int8_group32});
  const AdRecord good = kevo_tests::handed_in_quantized(EmbeddingType::int8_group32, w.ad(1));
  REQUIRE(validate_ad(w.schema(), good));
  auto refused = [&](const Schema& schema, AdRecord ad, const char* why) {
    auto ok = validate_ad(schema, ad);
    REQUIRE(!ok);
    CHECK_THAT(ok.error().message, Catch::Contains(why));
    HostAdPool pool(schema);
    CHECK(!pool.upsert(ad));
    CHECK(pool.live_count() == 0);
  };
  Schema fp16 = w.schema();
  fp16.embedding_type = EmbeddingType::fp16;
  refused(fp16, good, "a quantized embedding needs an int8 pool; this one holds fp16");
  AdRecord both = good;
  both.embedding = w.ad(1).embedding;
  refused(w.schema(), both, "give embedding or quantized, not both");
  AdRecord short_values = good;
  short_values.quantized.values.pop_back();
  refused(w.schema(), short_values, "quantized embedding has 63 values, the pool holds 64");
  AdRecord one_scale = good;
  one_scale.quantized.scales.resize(1);
  refused(w.schema(), one_scale, "has 1 scales, int8_group32 at d = 64 takes 2");
  AdRecord minus_128 = good;
  minus_128.quantized.values[5] = -128;
  refused(w.schema(), minus_128, "from -127 to 127, not -128");
  AdRecord negative = good;
  negative.quantized.scales[1] = -0.5f;
  refused(w.schema(), negative, "finite and not negative");
  AdRecord not_fp16 = good;
  not_fp16.quantized.scales[0] = 0.1f;  // 0.1 is not an fp16 value: the pool would store another scale
  refused(w.schema(), not_fp16, "int8_group32's scales are fp16: 0.100000 is not one");
  AdRecord too_large = good;
  too_large.quantized.scales[0] = 1024.0f;  // an fp16 value, but 127 x 1024 is past 65504
  refused(w.schema(), too_large, "times 127 is beyond fp16's range");
  Schema per_ad = w.schema();
  per_ad.embedding_type = EmbeddingType::int8;
  AdRecord per_ad_good = kevo_tests::handed_in_quantized(EmbeddingType::int8, w.ad(1));
  REQUIRE(validate_ad(per_ad, per_ad_good));
  per_ad_good.quantized.scales[0] = 0.1f;  // int8's one scale is fp32: any finite one will do
  CHECK(validate_ad(per_ad, per_ad_good));
  refused(per_ad, good, "has 2 scales, int8 at d = 64 takes 1");
}

TEST_CASE("int8_group32's recall@100 against fp16 is above per-ad int8's", "[retrieval][int8][recall]") {
  // The same ads in three pools; recall is the share of fp16's top 100 ids that a pool's top 100
  // holds, averaged over broad requests. The gain is small (0.983 to 0.987 here, better on 62 requests
  // and worse on 20: most of int8's loss is routing flips, which group scales do not remove;
  // int8_recall_study breaks it down), but it held on every seed tried with 64 requests or more
  // (seeds 1 to 3 and 2026, 20000 and 50000 ads); with 16 to 32 requests it did not always.
  const Workload w({.seed = 2026, .dim = 128, .features = 32, .hidden = 48});
  Schema schema = w.schema();
  HostAdPool fp16(schema);
  schema.embedding_type = EmbeddingType::int8;
  HostAdPool per_ad(schema);
  schema.embedding_type = EmbeddingType::int8_group32;
  HostAdPool grouped(schema);
  for (std::uint64_t i = 0; i < 20000; ++i) {
    const AdRecord ad = w.ad(i);
    REQUIRE(fp16.upsert(ad));
    REQUIRE(per_ad.upsert(ad));
    REQUIRE(grouped.upsert(ad));
  }
  const int requests = 128;
  double per_ad_recall = 0, grouped_recall = 0;
  int better = 0, worse = 0;
  for (int r = 0; r < requests; ++r) {
    const Request request = w.request(500 + std::uint64_t(r), RequestKind::broad, 100, 2);
    const RequestVectors v = compute_request_vectors(w.model(), request.features);
    std::set<std::uint32_t> truth;
    for (const ScoredAd& s : reference_search(fp16, v, request)) truth.insert(s.id);
    REQUIRE(truth.size() == 100);
    auto recall = [&](const HostAdPool& pool) {
      int found = 0;
      for (const ScoredAd& s : reference_search(pool, v, request)) found += int(truth.count(s.id));
      return found / 100.0;
    };
    const double a = recall(per_ad), b = recall(grouped);
    per_ad_recall += a / requests;
    grouped_recall += b / requests;
    better += b > a;
    worse += b < a;
  }
  INFO("recall@100 against fp16: int8 " << per_ad_recall << ", int8_group32 " << grouped_recall << "; int8_group32 better on "
                                        << better << " requests, worse on " << worse);
  CHECK(per_ad_recall > 0.95);  // both are close to fp16: the pools hold the same ads
  CHECK(grouped_recall > per_ad_recall);
  CHECK(better > worse);
}

TEST_CASE("equal scores rank by lower id, whatever the order of the slots", "[retrieval][reference]") {
  const auto type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8, EmbeddingType::int8_group32);
  const Workload w({.seed = 31, .dim = 64, .features = 32, .hidden = 48, .embedding_type = type});
  const Model model = w.model();
  // Ordinary ads take even ids; two groups of identical twins (same embedding, bias, ANY targeting)
  // take odd ids, interleaved with them; everything goes in in shuffled order, over enough slots
  // that the reference splits the pool between 3 threads.
  std::mt19937 gen(7);
  std::vector<std::uint32_t> odd(20000);
  for (std::uint32_t i = 0; i < odd.size(); ++i) odd[i] = 2 * i + 1;
  std::shuffle(odd.begin(), odd.end(), gen);
  const std::vector<std::uint32_t> top_twins(odd.begin(), odd.begin() + 300);
  const std::vector<std::uint32_t> middle_twins(odd.begin() + 300, odd.begin() + 500);
  std::vector<AdRecord> ads;
  for (std::uint32_t i = 0; i < 13000; ++i) {
    ads.push_back(w.ad(i));
    ads.back().id = 2 * i;
  }
  auto twin = [&](std::uint64_t index, float bias) {
    AdRecord ad = w.ad(index);
    ad.bias = bias;
    ad.clauses.clear();
    ad.live = true;
    return ad;
  };
  // Bias 50: above every ordinary ad; bias 1: among the ordinary ads, within the first few thousand.
  const AdRecord top = twin(900001, 50.0f), middle = twin(900002, 1.0f);
  for (std::uint32_t id : top_twins) (ads.push_back(top), ads.back().id = id);
  for (std::uint32_t id : middle_twins) (ads.push_back(middle), ads.back().id = id);
  std::shuffle(ads.begin(), ads.end(), gen);
  HostAdPool pool(w.schema());
  for (const AdRecord& ad : ads) REQUIRE(pool.upsert(ad));
  REQUIRE(pool.slots() >= 3 * 4096);

  std::vector<std::uint32_t> top_sorted = top_twins, middle_sorted = middle_twins;
  std::sort(top_sorted.begin(), top_sorted.end());
  std::sort(middle_sorted.begin(), middle_sorted.end());
  for (int k : {50, 300, 1000}) {
    const Request request = w.request(std::uint64_t(k), RequestKind::broad, k, 2);
    const RequestVectors v = compute_request_vectors(model, request.features);
    const std::vector<ScoredAd> reference = reference_search(pool, v, request, 3);
    INFO("k " << k << " type " << to_string(type));
    REQUIRE(reference.size() == std::size_t(k));
    // The first min(k, 300) places: the smallest twin ids, ascending, one score.
    const std::size_t twins_first = std::min<std::size_t>(std::size_t(k), top_sorted.size());
    for (std::size_t i = 0; i < twins_first; ++i) {
      REQUIRE(reference[i].id == top_sorted[i]);
      REQUIRE(reference[i].score == reference[0].score);
    }
    require_same_top_k(reference, brute_force_ranking(ads, pool.schema(), model, request), k);
  }
  // The middle group among ordinary ads, with the K-th place inside it: the lowest ids get in.
  Request request = w.request(7, RequestKind::broad, 4096, 2);
  const std::vector<ScoredAd> brute = brute_force_ranking(ads, pool.schema(), model, request);
  const auto first = std::size_t(std::find_if(brute.begin(), brute.end(), [&](const ScoredAd& b) {
                                   return std::binary_search(middle_sorted.begin(), middle_sorted.end(), b.id);
                                 }) - brute.begin());
  REQUIRE(first > 0);
  REQUIRE(first + middle_sorted.size() + 4 <= brute.size());
  for (std::size_t i = 0; i < middle_sorted.size(); ++i) REQUIRE(brute[first + i].id == middle_sorted[i]);
  request.k = int(first + 100);
  INFO("type " << to_string(type) << ": the middle twins start at place " << first);
  REQUIRE(request.k <= kMaxK);
  const std::vector<ScoredAd> reference = reference_search(pool, compute_request_vectors(model, request.features), request, 3);
  REQUIRE(reference.size() == std::size_t(request.k));
  for (std::size_t i = 0; i < 100; ++i) {
    REQUIRE(reference[first + i].id == middle_sorted[i]);
    REQUIRE(reference[first + i].score == reference[first].score);
  }
  require_same_top_k(reference, brute, request.k);
}

TEST_CASE("hand-built eligibility cases agree with a brute-force reading of the spec", "[retrieval][reference]") {
  const auto type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8, EmbeddingType::int8_group32);
  // 32 categories, so the last one is category 31; category 5 has the most values a clause holds.
  Schema schema{std::vector<std::uint32_t>(32, 4), 64, type};
  schema.category_values[1] = 8;
  schema.category_values[2] = 6;
  schema.category_values[5] = kMaxCategoryValues;
  const Model model = Workload({.seed = 41, .dim = 64, .features = 32, .hidden = 48}).model();
  // Q: c0 {1, 2}, c2 {5}, c3 listed but empty, c5 {131071}, c31 {3}; every other category empty.
  Request request{Workload({.seed = 41, .dim = 64, .features = 32, .hidden = 48}).request(0).features,
                  {{0, {1, 2}}, {2, {5}}, {3, {}}, {5, {kMaxCategoryValues - 1}}, {31, {3}}}, 100, 2};
  REQUIRE(validate_request(schema, model, request));

  struct Case {
    std::vector<Clause> clauses;
    bool eligible;
    const char* why;
  };
  const std::vector<Case> cases = {
      {{}, true, "ANY everywhere"},
      {{{1, 3, false}}, false, "restricted category with an empty Q_c (not listed)"},
      {{{3, 0, false}}, false, "restricted category with an empty Q_c (listed)"},
      {{{31, 3, false}}, true, "category C-1, allowed value asked"},
      {{{31, 2, false}}, false, "category C-1, allowed value not asked"},
      {{{31, 0, false}, {31, 3, false}}, true, "category C-1, one of two allowed values asked"},
      {{{0, 3, true}}, true, "exclusion only, value not asked"},
      {{{0, 2, true}}, false, "exclusion only, value asked"},
      {{{1, 0, true}}, true, "exclusion only, empty Q_c"},
      {{{0, 1, false}, {0, 1, true}}, false, "the same value allowed and excluded, asked"},
      {{{0, 3, false}, {0, 3, true}}, false, "the same value allowed and excluded, not asked"},
      {{{0, 1, false}, {0, 3, false}, {0, 3, true}}, true, "allowed value asked, excluded value not"},
      {{{31, 3, true}}, false, "category C-1 excluded value asked"},
      {{{31, 0, true}, {31, 3, false}}, true, "category C-1, allowed asked, excluded not"},
      {{{31, 3, false}, {0, 2, false}, {2, 5, false}}, true, "three categories, clauses out of order, all met"},
      {{{31, 3, false}, {0, 2, false}, {2, 4, false}}, false, "three categories, one not met"},
      {{{0, 2, false}, {2, 5, true}}, false, "allowed in one category, excluded in another"},
      {{{5, kMaxCategoryValues - 1, false}}, true, "largest value a clause holds, asked"},
      {{{5, kMaxCategoryValues - 2, false}}, false, "second largest value, not asked"},
  };
  Workload embeddings({.seed = 42, .dim = 64, .features = 32, .hidden = 48});
  HostAdPool pool(schema);
  std::map<std::uint32_t, AdRecord> truth;  // what the pool should hold, for the brute force
  std::set<std::uint32_t> expected;         // written by hand above
  auto put = [&](AdRecord ad) {
    REQUIRE(pool.upsert(ad));
    truth[ad.id] = ad;
  };
  for (std::uint32_t i = 0; i < cases.size(); ++i) {
    AdRecord ad = embeddings.ad(i);
    ad.id = 100 + i;
    ad.clauses = cases[i].clauses;
    ad.live = true;
    put(ad);
    if (cases[i].eligible) expected.insert(ad.id);
  }
  // Ads changed after going in; then ads that are not live, last, so their slots stay empty.
  AdRecord opened = embeddings.ad(53);
  opened.id = 203, opened.clauses = {{0, 3, false}}, opened.live = true;
  put(opened);
  opened.clauses = {};  // replaced: now ANY
  put(opened);
  expected.insert(203);
  AdRecord closed = embeddings.ad(54);
  closed.id = 204, closed.clauses = {}, closed.live = true;
  put(closed);
  closed.clauses = {{2, 5, true}};  // replaced: now excludes an asked value
  put(closed);
  AdRecord never_live = embeddings.ad(50);
  never_live.id = 200, never_live.clauses = {}, never_live.live = false;
  put(never_live);
  AdRecord paused = embeddings.ad(51), expired = embeddings.ad(52);
  paused.id = 201, paused.clauses = {}, paused.live = true;
  expired.id = 202, expired.clauses = {}, expired.live = true;
  put(paused);
  put(expired);
  paused.live = false;
  put(paused);
  REQUIRE(pool.expire(202));
  truth.erase(202);
  REQUIRE(pool.slots() == cases.size() + 4);  // 201's and 202's slots are there, not live

  std::vector<AdRecord> records;
  for (const auto& [id, ad] : truth) records.push_back(ad);
  const std::vector<ScoredAd> brute = brute_force_ranking(records, schema, model, request);
  std::set<std::uint32_t> brute_ids;
  for (const ScoredAd& b : brute) brute_ids.insert(b.id);
  REQUIRE(brute_ids == expected);  // the brute force reads the spec as the hand-written cases do

  const RequestVectors v = compute_request_vectors(model, request.features);
  const int eligible = int(expected.size());
  for (int k : {100, eligible, 3, 1}) {  // K above the eligible count gives fewer results
    INFO("k " << k << " type " << to_string(type));
    request.k = k;
    const std::vector<ScoredAd> reference = reference_search(pool, v, request, 2);
    require_same_top_k(reference, brute, k);
  }
}

TEST_CASE("the reference follows inserts, replacements, pauses and expiries", "[retrieval][reference]") {
  const auto type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8, EmbeddingType::int8_group32);
  const Workload w({.seed = 51, .dim = 64, .features = 32, .hidden = 48, .embedding_type = type,
                    .restrict_min = 0.02, .restrict_max = 0.15});
  const Model model = w.model();
  HostAdPool pool(w.schema());
  std::map<std::uint32_t, AdRecord> truth;  // inserted and not expired; paused ones have live = false
  std::vector<Request> requests = {w.request(0, RequestKind::typical, 25, 2), w.request(1, RequestKind::broad, 4096, 1)};
  std::vector<RequestVectors> vectors;
  for (const Request& r : requests) vectors.push_back(compute_request_vectors(model, r.features));

  std::mt19937 gen(type == EmbeddingType::fp16 ? 3 : 4);
  std::uint64_t draws = 0;
  auto fresh = [&](std::uint32_t id) {  // new embedding, bias and clauses for this id
    AdRecord ad = w.ad(100000 + draws++);
    ad.id = id;
    ad.live = true;
    return ad;
  };
  int inserts = 0, replacements = 0, pauses = 0, resumes = 0, expiries = 0, refused_expiries = 0;
  for (int step = 0; step < 400; ++step) {
    const std::uint32_t id = gen() % 120;  // a small id space, so operations hit existing ads
    const auto known = truth.find(id);
    const unsigned op = gen() % 10;
    std::string what;
    if (op < 4) {  // insert, or replace every field
      what = known == truth.end() ? "insert" : "replace";
      (known == truth.end() ? inserts : replacements)++;
      truth[id] = fresh(id);
      REQUIRE(pool.upsert(truth[id]));
    } else if (op < 6) {  // pause: upsert with live = false
      what = "pause";
      AdRecord ad = known == truth.end() ? fresh(id) : known->second;
      ad.live = false;
      if (op == 5) ad.bias += 1.0f;  // a paused replacement
      truth[id] = ad;
      REQUIRE(pool.upsert(ad));
      ++pauses;
    } else if (op < 8) {
      what = "expire";
      const bool live = known != truth.end() && known->second.live;
      REQUIRE(pool.expire(id) == live);  // true only for a live ad
      (live ? expiries : refused_expiries)++;
      truth.erase(id);
    } else {  // resume a paused ad as it was, or replace a live one's clauses only
      what = "resume or retarget";
      if (known == truth.end()) continue;
      AdRecord ad = known->second;
      if (ad.live) ad.clauses = fresh(id).clauses;
      else ++resumes;
      ad.live = true;
      truth[id] = ad;
      REQUIRE(pool.upsert(ad));
    }
    std::vector<AdRecord> records;
    std::size_t live = 0;
    for (const auto& [i, ad] : truth) {
      records.push_back(ad);
      live += ad.live;
    }
    INFO("step " << step << ": " << what << " " << id << " type " << to_string(type));
    REQUIRE(pool.live_count() == live);
    for (std::size_t r = 0; r < requests.size(); ++r) {
      const std::vector<ScoredAd> reference = reference_search(pool, vectors[r], requests[r], 1);
      const std::vector<ScoredAd> brute = brute_force_ranking(records, pool.schema(), model, requests[r]);
      require_same_top_k(reference, brute, requests[r].k);
    }
  }
  // The sequence exercised every kind of step.
  CHECK(inserts > 20);
  CHECK(replacements > 20);
  CHECK(pauses > 20);
  CHECK(resumes > 5);
  CHECK(expiries > 10);
  CHECK(refused_expiries > 10);
}

TEST_CASE("equal gate logits route to the lowest expert indices", "[retrieval][reference]") {
  // A model small enough to score by hand: W1 = 0 and c1 = 1, so the hidden layer is all ones;
  // W2 = 0, so u_e = c2_e. u_e = base + (e + 1) * unit_0, and P (with column 0 zero) sends every
  // u_e to the same gating key: every logit ties. Every value is exact in fp16.
  const int d = 16, e_count = 4;
  Model model{.features = 4, .hidden = 2, .dim = d, .experts = e_count};
  model.w1.assign(std::size_t(e_count * 2 * 4), 0.0f);
  model.c1.assign(std::size_t(e_count * 2), 1.0f);
  model.w2.assign(std::size_t(e_count * d * 2), 0.0f);
  std::vector<double> base(d);
  for (int k = 1; k < d; ++k) base[k] = (k % 3 - 1) * 0.5;
  for (int e = 0; e < e_count; ++e)
    for (int k = 0; k < d; ++k) model.c2.push_back(float(k == 0 ? e + 1 : base[k]));
  const auto zero_gate = GENERATE(true, false);
  model.gate_projection.assign(std::size_t(d * d), 0.0f);
  if (!zero_gate)  // identity but for column 0: g_e = base / 4, logits equal and nonzero
    for (int k = 1; k < d; ++k) model.gate_projection[std::size_t(k * d + k)] = 1.0f;
  REQUIRE(validate_model(model));
  const Schema schema{{2}, d, EmbeddingType::fp16};
  HostAdPool pool(schema);
  std::vector<AdRecord> ads;
  for (std::uint32_t id : {1u, 2u}) {
    AdRecord ad{id, std::vector<float>(d), 0.25f, {}, true};
    for (int k = 1; k < d; ++k) ad.embedding[k] = float(((k * 5) % 7 - 3) * 0.125);
    ad.embedding[0] = id == 1 ? 0.5f : -0.5f;  // expert scores rise with e for ad 1, fall for ad 2
    ads.push_back(ad);
    REQUIRE(pool.upsert(ad));
  }
  for (int routing = 1; routing <= e_count; ++routing) {
    const Request request{{1.0f, -2.0f, 0.5f, 3.0f}, {}, 10, routing};
    const RequestVectors v = compute_request_vectors(model, request.features);
    const std::vector<ScoredAd> reference = reference_search(pool, v, request, 1);
    REQUIRE(reference.size() == 2);
    for (const AdRecord& ad : ads) {
      // By hand: s_e = a . u_e; equal logits give equal weights over experts 0..routing-1.
      double logit0 = 0, mean = 0, other = 0;
      for (int e = 0; e < e_count; ++e) {
        double s = 0, logit = 0;
        for (int k = 0; k < d; ++k) {
          s += double(ad.embedding[k]) * (k == 0 ? e + 1 : base[k]);
          if (!zero_gate && k > 0) logit += double(ad.embedding[k]) * base[k] / 4;
        }
        if (e == 0) logit0 = logit;
        REQUIRE(logit == logit0);
        if (e < routing) mean += s / routing;
        if (e >= e_count - routing) other += s / routing;  // the highest indices instead
      }
      const double expected = mean + ad.bias;
      if (routing < e_count) REQUIRE(std::fabs(other - mean) > 100 * score_tolerance(expected));
      const auto it = std::find_if(reference.begin(), reference.end(), [&](const ScoredAd& r) { return r.id == ad.id; });
      REQUIRE(it != reference.end());
      INFO("ad " << ad.id << " routing " << routing << (zero_gate ? " P = 0" : " P ties"));
      REQUIRE(std::fabs(it->score - expected) <= 1e-6 * (1 + std::fabs(expected)));
    }
    require_same_top_k(reference, brute_force_ranking(ads, schema, model, request), request.k);
  }
}

TEST_CASE("the towers match a double-precision reading to fp16 rounding", "[retrieval][reference]") {
  const Workload w({.seed = 5, .dim = 128, .features = 256, .hidden = 256});
  const Model model = w.model();
  const std::vector<float> x = w.request(0).features;
  const RequestVectors v = compute_request_vectors(model, x);
  const int d = model.dim, h = model.hidden, f = model.features;
  for (int e = 0; e < model.experts; ++e) {
    std::vector<double> hidden(h), u(d);
    for (int j = 0; j < h; ++j) {
      double acc = model.c1[e * h + j];
      for (int i = 0; i < f; ++i) acc += double(model.w1[(e * h + j) * f + i]) * x[i];
      hidden[j] = std::max(acc, 0.0);
    }
    for (int j = 0; j < d; ++j) {
      double acc = model.c2[e * d + j];
      for (int i = 0; i < h; ++i) acc += double(model.w2[(e * d + j) * h + i]) * hidden[i];
      u[j] = acc;
    }
    for (int j = 0; j < d; ++j) {
      double g = 0;
      for (int i = 0; i < d; ++i) g += double(model.gate_projection[j * d + i]) * u[i];
      g /= std::sqrt(double(d));
      // fp16 keeps 11 significant bits: one rounding step is at most 2^-11 relative.
      REQUIRE(std::fabs(v.expert[e * d + j] - u[j]) <= 1e-3 * std::fabs(u[j]) + 1e-6);
      REQUIRE(std::fabs(v.gate[e * d + j] - g) <= 1e-3 * std::fabs(g) + 1e-6);
    }
  }
}

TEST_CASE("the reference is the same on one thread and many", "[retrieval][reference]") {
  Fixture fx(9, 20000, EmbeddingType::fp16);
  const Request request = fx.workload.request(1, RequestKind::typical, 500);
  const RequestVectors v = compute_request_vectors(fx.model, request.features);
  CHECK(reference_search(fx.pool, v, request, 1) == reference_search(fx.pool, v, request, 7));
}

TEST_CASE("the comparison rejects every departure the spec forbids", "[retrieval][compare]") {
  Fixture fx(4, 4000, EmbeddingType::fp16);
  const Request request = fx.workload.request(8, RequestKind::typical, 200);
  const RequestVectors v = compute_request_vectors(fx.model, request.features);
  const std::vector<ScoredAd> good = reference_search(fx.pool, v, request);
  REQUIRE(good.size() == 200);
  REQUIRE(compare_with_reference(fx.pool, v, request, good));

  auto rejected = [&](std::vector<ScoredAd> r) { return !compare_with_reference(fx.pool, v, request, r); };
  SECTION("a score off by more than the tolerance") {
    auto r = good;
    r[10].score += float(2e-3 * (1 + std::fabs(r[10].score)));
    std::sort(r.begin(), r.end(), ranks_before);
    CHECK(rejected(r));
  }
  SECTION("a missing ad") {
    auto r = good;
    r.pop_back();
    CHECK(rejected(r));
  }
  SECTION("a duplicate") {
    auto r = good;
    r[1] = r[0];
    CHECK(rejected(r));
  }
  SECTION("out of order") {
    auto r = good;
    std::swap(r[3], r[4]);
    CHECK(rejected(r));
  }
  SECTION("an ineligible ad in place of the last") {
    const QuerySets q(fx.pool.schema().categories(), request.query);
    std::size_t slot = 0;
    while (is_eligible(fx.pool, slot, q)) ++slot;
    auto r = good;
    r.back() = {fx.pool.id(slot), r.back().score};
    CHECK(rejected(r));
  }
  SECTION("a lower-ranked eligible ad in place of the 50th") {
    Request wider = request;
    wider.k = 1000;
    const auto more = reference_search(fx.pool, v, wider);
    REQUIRE(std::fabs(more.back().score - more[199].score) > 1e-3 * (1 + std::fabs(more[199].score)));
    auto r = good;
    r.erase(r.begin() + 50);
    r.push_back(more.back());
    CHECK(rejected(r));
  }
}

TEST_CASE("an ad whose routing is a near-tie may rank by either routing, and only by the one it was scored with",
          "[retrieval][compare]") {
  // Find an eligible ad whose 2nd and 3rd logits are within the spec's 1e-3 and whose two routings
  // score far apart, and a K whose K-th reference score falls between them.
  Fixture fx(5, 20000, EmbeddingType::fp16);
  for (std::uint64_t r = 0; r < 64; ++r) {
    Request request = fx.workload.request(r, RequestKind::broad, 1);
    const RequestVectors v = compute_request_vectors(fx.model, request.features);
    const EligibleScores eligible = score_eligible_ads(fx.pool, v, request);
    std::vector<double> primary;
    for (const ReferenceScore& s : eligible.scores) primary.push_back(s.score);
    std::sort(primary.begin(), primary.end(), std::greater<>());
    for (std::size_t i = 0; i < eligible.scores.size(); ++i) {
      const ReferenceScore& x = eligible.scores[i];
      if (!x.ambiguous || x.alternative - x.score < 0.05) continue;
      // K = the ads scoring above the midpoint; the K-th must lie clear of both routings.
      const double middle = (x.score + x.alternative) / 2;
      const auto k = static_cast<std::size_t>(std::count_if(primary.begin(), primary.end(), [&](double p) { return p > middle; }));
      if (k == 0 || k > 4096) continue;
      const double kth = primary[k - 1];
      if (kth - x.score <= 2 * score_tolerance(kth) || x.alternative - kth <= 2 * score_tolerance(kth)) continue;

      request.k = static_cast<int>(k);
      const std::vector<ScoredAd> top = reference_search(fx.pool, v, request);
      const std::uint32_t id = fx.pool.id(eligible.slots[i]);
      REQUIRE(std::none_of(top.begin(), top.end(), [&](const ScoredAd& a) { return a.id == id; }));
      REQUIRE(compare_with_reference(fx.pool, v, request, top));
      // Scored with its other routing, the ad outranks the K-th: the kernel must return it.
      auto with_alternative = top;
      with_alternative.back() = {id, static_cast<float>(x.alternative)};
      std::sort(with_alternative.begin(), with_alternative.end(), ranks_before);
      CHECK(compare_with_reference(fx.pool, v, request, with_alternative));
      // With the score of its primary routing it does not belong there.
      auto with_primary = top;
      with_primary.back() = {id, static_cast<float>(x.score)};
      std::sort(with_primary.begin(), with_primary.end(), ranks_before);
      CHECK_FALSE(compare_with_reference(fx.pool, v, request, with_primary));
      return;
    }
  }
  FAIL("no ad with an ambiguous routing whose two scores straddle a K-th score");
}

TEST_CASE("requests are validated with messages a caller can act on", "[retrieval][validation]") {
  Fixture fx(2, 10, EmbeddingType::fp16);
  Request r = fx.workload.request(1);
  REQUIRE(validate_request(fx.pool.schema(), fx.model, r));
  auto message = [&](const Request& bad) {
    auto ok = validate_request(fx.pool.schema(), fx.model, bad);
    return ok ? std::string() : ok.error().message;
  };
  Request bad = r;
  bad.query.push_back({40, {1}});
  CHECK_THAT(message(bad), Catch::Contains("unknown category"));
  bad = r;
  bad.query[0].values.push_back(fx.pool.schema().category_values[0]);
  CHECK_THAT(message(bad), Catch::Contains("value out of range"));
  bad = r;
  bad.k = 0;
  CHECK_THAT(message(bad), Catch::Contains("K out of range"));
  bad.k = 4097;
  CHECK_THAT(message(bad), Catch::Contains("K out of range"));
  bad = r;
  bad.features.pop_back();
  CHECK_THAT(message(bad), Catch::Contains("wrong feature length"));
  bad = r;
  bad.routing = 9;
  CHECK_THAT(message(bad), Catch::Contains("routing"));
}

TEST_CASE("safetensors round-trips the model and rejects damaged files", "[retrieval][safetensors]") {
  const Model model = Workload({.seed = 3, .dim = 64, .features = 32, .hidden = 48}).model();
  const auto dir = std::filesystem::temp_directory_path();
  const std::string path = (dir / "kevo_retrieval_model.safetensors").string();
  REQUIRE(save_model(model, path));
  auto loaded = load_model(path);
  REQUIRE(loaded);
  CHECK(loaded->w1 == model.w1);
  CHECK(loaded->w2 == model.w2);
  CHECK(loaded->c1 == model.c1);
  CHECK(loaded->c2 == model.c2);
  CHECK(loaded->gate_projection == model.gate_projection);
  CHECK(loaded->dim == 64);
  CHECK(loaded->experts == model.experts);

  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4);
  CHECK(!load_model(path));
  {
    std::ofstream out(path, std::ios::binary);
    const char header[8] = {9, 0, 0, 0, 0, 0, 0, 0};
    out.write(header, 8);
    out << "{\"w1\":[1}";
  }
  auto broken = load_model(path);
  REQUIRE(!broken);
  CHECK_THAT(broken.error().message, Catch::Contains("malformed"));
  std::filesystem::remove(path);
  CHECK(!load_model(path));
}

TEST_CASE("safetensors __metadata__ round-trips strings, escapes included, and must be a map of strings",
          "[retrieval][safetensors]") {
  const std::string path = (std::filesystem::temp_directory_path() / "kevo_retrieval_metadata.safetensors").string();
  const std::vector<float> one{1.5f};
  const std::vector<detail::TensorWriter> writers = {
      {"x", "F32", {1}, 4, [&one](std::ostream& out) { out.write(reinterpret_cast<const char*>(one.data()), 4); }}};
  const std::map<std::string, std::string> metadata = {
      {"embedding_type", "int8_group32"},
      {"quote \" and backslash \\", "line\nbreak\ttab \x01, \xc3\xbc and \xe2\x82\xac"},
      {"empty", ""}};
  REQUIRE(detail::write_safetensors(path, writers, metadata));
  {
    auto file = detail::SafetensorsFile::open(path);
    REQUIRE(file);
    CHECK(file->metadata() == metadata);
    CHECK(file->tensor("x", "F32", 4, 1));
  }
  REQUIRE(detail::write_safetensors(path, writers));  // none given: none written, none read
  CHECK(detail::SafetensorsFile::open(path)->metadata().empty());

  // Headers as another writer may put them: \u escapes (a surrogate pair too) and "\/".
  auto with_header = [&](const std::string& header) {
    std::ofstream out(path, std::ios::binary);
    std::uint64_t length = header.size();
    out.write(reinterpret_cast<const char*>(&length), 8);  // little-endian on the machines kevo runs on
    out << header;
    out.write(reinterpret_cast<const char*>(one.data()), 4);
    out.close();
    return detail::SafetensorsFile::open(path);
  };
  const std::string x = R"("x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  auto escaped = with_header("{" + x + R"(, "__metadata__" : {"a":"\u00fc\ud83d\ude00\/\"","b\n":"c"}})");
  REQUIRE(escaped);
  CHECK(escaped->metadata() == std::map<std::string, std::string>{{"a", "\xc3\xbc\xf0\x9f\x98\x80/\""}, {"b\n", "c"}});
  for (const std::string bad : {R"("__metadata__":{"a":1})", R"("__metadata__":{"a":["b"]})", R"("__metadata__":"a")",
                                R"("__metadata__":{"a":"\ud83d"})", R"("__metadata__":{"a":"\q"})",
                                R"("__metadata__":{},"__metadata__":{})"}) {
    INFO(bad);
    auto refused = with_header("{" + bad + "," + x + "}");
    REQUIRE(!refused);
    CHECK_THAT(refused.error().message, Catch::Contains("malformed safetensors header"));
  }
  std::filesystem::remove(path);
}

TEST_CASE("load_model names the tensor that is missing, of the wrong type or misshapen", "[retrieval][safetensors]") {
  const Model model = Workload({.seed = 3, .dim = 64, .features = 32, .hidden = 48}).model();
  const std::string path = (std::filesystem::temp_directory_path() / "kevo_retrieval_model_bad.safetensors").string();
  // Writes the model's tensors, with `edit` applied to the list first.
  auto write_with = [&](auto edit) {
    Model copy = model;
    std::vector<detail::NamedTensor> tensors = detail::model_tensors(copy);
    std::vector<detail::TensorWriter> writers;
    for (const detail::NamedTensor& t : tensors) {
      const std::vector<float>* values = t.values;
      writers.push_back({t.name, "F32", t.shape, values->size() * 4,
                         [values](std::ostream& out) { out.write(reinterpret_cast<const char*>(values->data()), static_cast<std::streamsize>(values->size() * 4)); }});
    }
    edit(writers);
    REQUIRE(detail::write_safetensors(path, writers));
    auto loaded = load_model(path);
    REQUIRE_FALSE(loaded);
    return loaded.error().message;
  };
  auto named = [](std::vector<detail::TensorWriter>& w, const std::string& name) -> detail::TensorWriter& {
    return *std::find_if(w.begin(), w.end(), [&](auto& t) { return t.name == name; });
  };
  CHECK_THAT(write_with([&](auto& w) { w.erase(w.begin() + 3); }), Catch::Contains("missing tensor c2"));
  CHECK_THAT(write_with([&](auto& w) { named(w, "w2").name = "W2"; }), Catch::Contains("missing tensor w2"));
  CHECK_THAT(write_with([&](auto& w) {
               auto& w1 = named(w, "w1");
               w1.dtype = "F16";
               w1.bytes /= 2;
               w1.write = [bytes = w1.bytes](std::ostream& out) { out << std::string(bytes, '\0'); };
             }),
             Catch::Contains("tensor w1 is F16, expected F32"));
  const std::string shape = write_with([&](auto& w) {
    auto& g = named(w, "gate_projection");
    g.shape = {32, 128};  // as many values, the wrong shape
  });
  CHECK_THAT(shape, Catch::Contains("tensor gate_projection has shape [32, 128], expected [64, 64] (from w1 [" ));
  std::filesystem::remove(path);
}

TEST_CASE("the workload is deterministic and near the spec's eligible fractions", "[retrieval][workload]") {
  Workload a({.seed = 11}), b({.seed = 11}), c({.seed = 12});
  CHECK(a.ad(77).embedding == b.ad(77).embedding);
  CHECK(a.ad(77).embedding != c.ad(77).embedding);
  CHECK(a.schema().category_values == b.schema().category_values);
  REQUIRE(a.schema().categories() == 32);
  for (int ci = 0; ci < 32; ++ci) {
    const auto v = a.schema().category_values[ci];
    if (ci < 8) CHECK((v >= 2 && v <= 16));
    else if (ci < 24) CHECK((v >= 16 && v <= 1024));
    else CHECK((v >= 1024 && v <= 100000));
  }
  HostAdPool pool(a.schema());
  const int n = 20000;
  int live = 0;
  for (int i = 0; i < n; ++i) {
    const AdRecord ad = a.ad(i);
    live += ad.live;
    REQUIRE(pool.upsert(ad));
  }
  CHECK(live > n * 0.98);
  CHECK(live < n * 0.995);
  auto fraction = [&](const Request& r) {
    const QuerySets q(32, r.query);
    int eligible = 0;
    for (std::size_t s = 0; s < pool.slots(); ++s) eligible += is_eligible(pool, s, q);
    return double(eligible) / n;
  };
  double typical = 0;
  for (int r = 0; r < 5; ++r) typical += fraction(a.request(r)) / 5;
  CHECK(typical > 0.2);
  CHECK(typical < 0.4);
  CHECK(fraction(a.request(0, RequestKind::broad)) >= 0.8);
  Workload narrow_pool({.seed = 11, .restrict_min = 0.1, .restrict_max = 0.2});
  HostAdPool narrow(narrow_pool.schema());
  for (int i = 0; i < n; ++i) REQUIRE(narrow.upsert(narrow_pool.ad(i)));
  const QuerySets q(32, narrow_pool.request(0, RequestKind::narrow).query);
  int eligible = 0;
  for (std::size_t s = 0; s < narrow.slots(); ++s) eligible += is_eligible(narrow, s, q);
  CHECK(eligible > 0);
  CHECK(eligible <= n * 0.02);
}

TEST_CASE("the CPU backend applies upserts and expiries to later searches", "[retrieval][backend]") {
  Workload w({.seed = 21, .dim = 64, .features = 32, .hidden = 48});
  CpuRetrievalBackend backend(w.schema(), w.model(), 2);
  std::vector<AdRecord> ads;
  for (int i = 0; i < 2000; ++i) ads.push_back(w.ad(i));
  REQUIRE(backend.upsert(ads));
  Request request = w.request(0, RequestKind::broad, 10);
  auto first = backend.search(request);
  REQUIRE(first);
  REQUIRE(first->size() == 10);

  const std::uint32_t top_id = (*first)[0].id;
  const std::uint32_t expire_ids[] = {top_id, 999999};
  auto expired = backend.expire(expire_ids);
  REQUIRE(expired);
  CHECK(*expired == 1);
  auto second = backend.search(request);
  REQUIRE(second);
  for (const ScoredAd& r : *second) CHECK(r.id != top_id);

  // Replacing an ad with a large bias and ANY targeting puts it first.
  AdRecord boosted = w.ad(1234);
  boosted.bias = 100.0f;
  boosted.clauses.clear();
  boosted.live = true;
  REQUIRE(backend.upsert(std::span<const AdRecord>(&boosted, 1)));
  auto third = backend.search(request);
  REQUIRE(third);
  CHECK((*third)[0].id == 1234u);
  CHECK((*third)[0].score > 90.0f);

  AdRecord bad = boosted;
  bad.embedding.pop_back();
  CHECK(!backend.upsert(std::span<const AdRecord>(&bad, 1)));
  request.k = 0;
  auto refused = backend.search(request);
  REQUIRE(!refused);
  CHECK_THAT(refused.error().message, Catch::Contains("K out of range"));
}

namespace {
/// Mean length of the runs of neighbouring slots that hold ads eligible for `request`.
double mean_eligible_run(const HostAdPool& pool, const Request& request) {
  const QuerySets query(pool.schema().category_values.size(), request.query);
  std::size_t eligible = 0, runs = 0;
  bool previous = false;
  for (std::size_t slot = 0; slot < pool.slots(); ++slot) {
    const bool now = is_eligible(pool, slot, query);
    eligible += now;
    runs += now && !previous;
    previous = now;
  }
  REQUIRE(runs > 0);
  return double(eligible) / double(runs);
}
}  // namespace

TEST_CASE("ads loaded in targeting order answer as in id order, with a request's eligible ads in longer runs", "[retrieval][slot_order]") {
  const Workload w({.seed = 2026, .dim = 64, .features = 32, .hidden = 48});
  std::vector<AdRecord> ads;
  for (std::uint64_t i = 0; i < 40'000; ++i) ads.push_back(w.ad(i));
  const std::vector<std::size_t> order = targeting_order(ads);

  // A permutation, in key order, ties in their input order.
  REQUIRE(order.size() == ads.size());
  std::vector<std::size_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) REQUIRE(sorted[i] == i);
  for (std::size_t i = 1; i < order.size(); ++i) {
    const auto before = targeting_order_key(ads[order[i - 1]].clauses), after = targeting_order_key(ads[order[i]].clauses);
    REQUIRE(before <= after);
    if (before == after) REQUIRE(order[i - 1] < order[i]);
  }
  CHECK(targeting_order_key(ads[order.front()].clauses) >> 58 == 0);  // ads without clauses come first

  HostAdPool by_id(w.schema()), by_targeting(w.schema());
  for (const AdRecord& ad : ads) REQUIRE(by_id.upsert(ad));
  for (std::size_t i : order) REQUIRE(by_targeting.upsert(ads[i]));
  for (std::uint64_t r = 0; r < 3; ++r) {
    const Request request = w.request(r, RequestKind::typical, 300);
    const double id_run = mean_eligible_run(by_id, request), targeting_run = mean_eligible_run(by_targeting, request);
    INFO("request " << r << ": mean eligible run " << id_run << " ads in id order, " << targeting_run << " in targeting order");
    CHECK(id_run < 2.5);
    CHECK(targeting_run > 3 * id_run);
    const RequestVectors v = compute_request_vectors(w.model(), request.features);
    const auto a = reference_search(by_id, v, request), b = reference_search(by_targeting, v, request);
    REQUIRE(a.size() == 300);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i].id == b[i].id);
      CHECK(a[i].score == b[i].score);
    }
  }
}

TEST_CASE("an ad's targeting order key ignores the order of its clauses and its exclusions' values", "[retrieval][slot_order]") {
  const std::vector<Clause> listed{{3, 7}, {1, 40}, {1, 2}, {9, 5, true}};
  const std::vector<Clause> reordered{{9, 5, true}, {1, 2}, {3, 7}, {1, 40}};
  const std::vector<Clause> other_exclusion{{1, 40}, {3, 7}, {1, 2}, {0, 1, true}};
  CHECK(targeting_order_key(listed) == targeting_order_key(reordered));
  CHECK(targeting_order_key(listed) == targeting_order_key(other_exclusion));
  // Fewer clauses sort first; then the smallest allow clauses decide.
  CHECK(targeting_order_key(std::vector<Clause>{}) < targeting_order_key(std::vector<Clause>{{0, 0}}));
  CHECK(targeting_order_key(std::vector<Clause>{{31, 99999}}) < targeting_order_key(std::vector<Clause>{{0, 0}, {0, 1}}));
  CHECK(targeting_order_key(std::vector<Clause>{{2, 5}}) < targeting_order_key(std::vector<Clause>{{2, 6}}));
  CHECK(targeting_order_key(std::vector<Clause>{{2, 6}}) < targeting_order_key(std::vector<Clause>{{3, 0}}));
  CHECK(targeting_order_key(std::vector<Clause>{{1, 2}, {1, 40}}) < targeting_order_key(std::vector<Clause>{{1, 2}, {3, 7}}));
}

}  // namespace kevo_tests::retrieval_reference_test
