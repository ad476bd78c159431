// kevo/retrieval/workload.hpp: the spec's benchmark workload, deterministic from a seed. Every ad
// is drawn from its own counter-seeded stream, so ads can be generated in parallel, in any order,
// and the same (seed, index) always gives the same ad.
//
//   Workload w({.seed = 7});
//   AdRecord ad = w.ad(42);                 // the 42nd ad of this workload
//   Request r = w.request(3, RequestKind::typical);
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "kevo/retrieval/types.hpp"

namespace kevo::retrieval {

/// A small counter-based generator (splitmix64): cheap to seed per ad, good enough for workloads.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  static std::uint64_t mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// A stream for one (seed, stream, index) triple.
  static Rng stream(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
    return Rng(mix(mix(seed ^ (stream * 0x9e3779b97f4a7c15ull)) + index));
  }
  std::uint64_t next() { return mix(state_ += 0x9e3779b97f4a7c15ull); }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }                // [0, 1)
  std::uint32_t below(std::uint32_t n) { return static_cast<std::uint32_t>(uniform() * n); }  // [0, n)
  int between(int lo, int hi) { return lo + static_cast<int>(below(static_cast<std::uint32_t>(hi - lo + 1))); }
  double normal() {  // Box-Muller
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  std::uint64_t state_;
};

/// Zipf(s) over 0..n-1 (value 0 the most popular), sampled by inverting its cumulative table.
class Zipf {
 public:
  Zipf(std::uint32_t n, double s) : cdf_(n) {
    double total = 0.0;
    for (std::uint32_t i = 0; i < n; ++i) cdf_[i] = total += std::pow(static_cast<double>(i + 1), -s);
    for (double& c : cdf_) c /= total;
  }
  std::uint32_t operator()(Rng& rng) const {
    const auto it = std::upper_bound(cdf_.begin(), cdf_.end(), rng.uniform());
    return static_cast<std::uint32_t>(std::min<std::ptrdiff_t>(it - cdf_.begin(), std::ssize(cdf_) - 1));
  }

 private:
  std::vector<double> cdf_;
};

/// What a request's targeting query looks like: the spec's typical user, and its two extremes.
enum class RequestKind {
  typical,  // 1..3 values per category, Zipf(1.1)
  broad,    // the 32 most popular values of every category (>= 80% of ads eligible)
  narrow,   // one unpopular value per category (<= 2% eligible on a pool with restrict 0.1..0.2)
};

struct WorkloadOptions {
  std::uint64_t seed = 1;
  int categories = 32;  // 8 small, 16 medium, 8 large when 32; scaled down proportionally otherwise
  int dim = 128;
  int features = 256;
  int hidden = 256;
  int experts = 8;
  EmbeddingType embedding_type = EmbeddingType::fp16;
  double restrict_min = 0.01;  // an ad restricts category c with probability p_c in [min, max]
  double restrict_max = 0.10;
  double exclude_fraction = 0.02;
  double dead_fraction = 0.01;
};

/// The workload: schema, per-category restriction probabilities and Zipf tables, and generators.
class Workload {
 public:
  explicit Workload(WorkloadOptions options) : options_(options) {
    Rng rng = Rng::stream(options.seed, 1, 0);
    const int c_count = options.categories;
    schema_.dim = options.dim;
    schema_.embedding_type = options.embedding_type;
    for (int c = 0; c < c_count; ++c) {
      // Small, medium, large in the spec's 8:16:8 proportion.
      const int small = c_count / 4, medium = c_count / 2;
      std::uint32_t values;
      if (c < small) values = static_cast<std::uint32_t>(rng.between(2, 16));
      else if (c < small + medium) values = static_cast<std::uint32_t>(rng.between(16, 1024));
      else values = static_cast<std::uint32_t>(rng.between(1024, 100000));
      schema_.category_values.push_back(values);
      restrict_probability_.push_back(options.restrict_min + rng.uniform() * (options.restrict_max - options.restrict_min));
      zipf_.emplace_back(values, 1.1);
    }
  }

  const Schema& schema() const { return schema_; }
  const WorkloadOptions& options() const { return options_; }

  /// Ad `index` of the pool (its id is the index), drawn from its own stream.
  AdRecord ad(std::uint64_t index) const {
    Rng rng = Rng::stream(options_.seed, 2, index);
    AdRecord ad;
    ad.id = static_cast<std::uint32_t>(index);
    ad.embedding.resize(static_cast<std::size_t>(options_.dim));
    const double sigma = 1.0 / std::sqrt(static_cast<double>(options_.dim));
    for (float& a : ad.embedding) a = static_cast<float>(rng.normal() * sigma);
    ad.bias = ad_bias(index);
    ad.clauses = ad_targeting(index);
    ad.live = ad_live(index);
    return ad;
  }

  /// Targeting alone, for pools whose embeddings are filled elsewhere (on the device).
  std::vector<Clause> ad_targeting(std::uint64_t index) const {
    Rng rng = Rng::stream(options_.seed, 3, index);
    return targeting(rng);
  }
  bool ad_live(std::uint64_t index) const {
    return Rng::stream(options_.seed, 4, index).uniform() >= options_.dead_fraction;
  }
  float ad_bias(std::uint64_t index) const { return static_cast<float>(Rng::stream(options_.seed, 5, index).normal() * 0.1); }

  /// The model's weights: scaled so that u_e, g_e and the scores are O(1).
  Model model() const {
    Rng rng = Rng::stream(options_.seed, 6, 0);
    Model m;
    m.features = options_.features;
    m.hidden = options_.hidden;
    m.dim = options_.dim;
    m.experts = options_.experts;
    auto fill = [&](std::vector<float>& w, std::size_t n, double sigma) {
      w.resize(n);
      for (float& x : w) x = static_cast<float>(rng.normal() * sigma);
    };
    const auto e = static_cast<std::size_t>(m.experts), h = static_cast<std::size_t>(m.hidden);
    const auto f = static_cast<std::size_t>(m.features), d = static_cast<std::size_t>(m.dim);
    fill(m.w1, e * h * f, std::sqrt(2.0 / static_cast<double>(f)));
    fill(m.c1, e * h, 0.1);
    fill(m.w2, e * d * h, 1.0 / std::sqrt(static_cast<double>(h)));
    fill(m.c2, e * d, 0.1);
    fill(m.gate_projection, d * d, 1.0);
    return m;
  }

  /// Request `index` of the given kind.
  Request request(std::uint64_t index, RequestKind kind = RequestKind::typical, int k = 1000, int routing = 2) const {
    Rng rng = Rng::stream(options_.seed, 7 + static_cast<std::uint64_t>(kind), index);
    Request r;
    r.k = k;
    r.routing = routing;
    r.features.resize(static_cast<std::size_t>(options_.features));
    for (float& x : r.features) x = static_cast<float>(rng.normal());
    for (std::uint32_t c = 0; c < schema_.category_values.size(); ++c) {
      CategoryQuery q{c, {}};
      const std::uint32_t values = schema_.category_values[c];
      if (kind == RequestKind::typical) q.values = distinct_zipf(rng, c, rng.between(1, 3));
      else if (kind == RequestKind::broad)
        for (std::uint32_t v = 0; v < std::min<std::uint32_t>(values, 32); ++v) q.values.push_back(v);
      else q.values.push_back(values - 1 - rng.below(std::max<std::uint32_t>(1, values / 2)));
      r.query.push_back(std::move(q));
    }
    return r;
  }

 private:
  std::vector<std::uint32_t> distinct_zipf(Rng& rng, std::uint32_t category, int count) const {
    std::vector<std::uint32_t> out;
    const int wanted = std::min<int>(count, static_cast<int>(schema_.category_values[category]));
    for (int attempt = 0; static_cast<int>(out.size()) < wanted && attempt < 64; ++attempt) {
      const std::uint32_t v = zipf_[category](rng);
      if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  std::vector<Clause> targeting(Rng& rng) const {
    std::vector<Clause> clauses;
    for (std::uint32_t c = 0; c < schema_.category_values.size(); ++c) {
      if (rng.uniform() >= restrict_probability_[c]) continue;
      for (std::uint32_t v : distinct_zipf(rng, c, rng.between(1, 5))) clauses.push_back({c, v, false});
    }
    if (rng.uniform() < options_.exclude_fraction) {
      const int excluded = rng.between(1, 3);
      for (int i = 0; i < excluded; ++i) {
        const std::uint32_t c = rng.below(static_cast<std::uint32_t>(schema_.category_values.size()));
        clauses.push_back({c, zipf_[c](rng), true});
      }
    }
    return clauses;
  }

  WorkloadOptions options_;
  Schema schema_;
  std::vector<double> restrict_probability_;
  std::vector<Zipf> zipf_;
};

}  // namespace kevo::retrieval
