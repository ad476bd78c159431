// The CPU reference of the retrieval spec against a brute-force reading of the spec, plus the
// pieces around it: fp16 conversion, validation, the comparison rules, safetensors, the workload.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "kevo/retrieval/retrieval.hpp"

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

TEST_CASE("the reference equals a brute-force reading of the spec", "[retrieval][reference]") {
  const auto type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8);
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
    if (max_abs == 0) {
      REQUIRE(q.scale == 0.0f);
      for (std::int8_t v : q.values) REQUIRE(v == 0);
      return;
    }
    // One fp32 division's rounding, no more.
    REQUIRE(std::fabs(q.scale - max_abs / 127) <= 1e-7 * max_abs / 127);
    int largest = 0;
    for (std::size_t k = 0; k < a.size(); ++k) {
      INFO("k " << k << ": a " << a[k] << ", q " << int(q.values[k]) << ", scale " << q.scale);
      REQUIRE(int(q.values[k]) >= -127);  // int8 holds -128, the spec does not
      largest = std::max(largest, std::abs(int(q.values[k])));
      // Rounded to nearest: within half a step (plus the rounding of a / scale in fp32).
      REQUIRE(std::fabs(double(q.scale) * q.values[k] - a[k]) <= double(q.scale) * (0.5 + 1e-5));
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

TEST_CASE("equal scores rank by lower id, whatever the order of the slots", "[retrieval][reference]") {
  const auto type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8);
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
  const auto type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8);
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
  const auto type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8);
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
