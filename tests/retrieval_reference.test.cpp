// The CPU reference of the retrieval spec against a brute-force reading of the spec, plus the
// pieces around it: fp16 conversion, validation, the comparison rules, safetensors, the workload.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "kevo/retrieval/retrieval.hpp"

using namespace kevo::retrieval;

namespace {

// The spec read literally from AdRecords: sets, loops, a full sort. Shares no code with reference.hpp.
std::vector<ScoredAd> brute_force_search(const std::vector<AdRecord>& ads, const Schema& schema, const Model& model,
                                         const Request& request) {
  // The towers come from the reference (checked on their own against double precision below).
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
    if (schema.embedding_type == EmbeddingType::fp16) {
      for (int k = 0; k < d; ++k) a[k] = round_to_half(ad.embedding[k]);
    } else {
      const QuantizedEmbedding q = quantize_int8(ad.embedding);
      for (int k = 0; k < d; ++k) a[k] = q.scale * float(q.values[k]);
    }
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
  if (all.size() > std::size_t(request.k)) all.resize(request.k);
  return all;
}

struct Fixture {
  Workload workload;
  Model model;
  std::vector<AdRecord> ads;
  HostAdPool pool;
  Fixture(std::uint64_t seed, int n, EmbeddingType type, int dim = 64)
      : workload({.seed = seed, .dim = dim, .features = 32, .hidden = 48, .embedding_type = type}),
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
  const std::uint64_t seed = GENERATE(1, 2, 3);
  Fixture fx(seed, 3000, type);
  for (int k : {1, 10, 700, 4096}) {
    for (int routing : {1, 2, 8}) {
      const Request request = fx.workload.request(seed * 100 + k, RequestKind::typical, k, routing);
      REQUIRE(validate_request(fx.pool.schema(), fx.model, request));
      const RequestVectors v = compute_request_vectors(fx.model, request.features);
      const std::vector<ScoredAd> reference = reference_search(fx.pool, v, request, 3);
      const std::vector<ScoredAd> brute = brute_force_search(fx.ads, fx.pool.schema(), fx.model, request);
      INFO("seed " << seed << " k " << k << " routing " << routing << " type " << to_string(type));
      REQUIRE(reference.size() == brute.size());
      REQUIRE(!reference.empty());
      for (std::size_t i = 0; i < reference.size(); ++i) {
        REQUIRE(std::fabs(reference[i].score - brute[i].score) <= 1e-5 * (1 + std::fabs(brute[i].score)));
      }
      // The comparison rules accept the brute-force answer.
      auto ok = compare_with_reference(fx.pool, v, request, brute);
      INFO((ok ? std::string("ok") : ok.error().message));
      REQUIRE(ok);
    }
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
