// kevo/retrieval/weighted_rounding.hpp: int8 rounding that puts its error where requests look least.
//
//   auto rounding = WeightedRounding::calibrate(model, sample_features);  // once, from logged users
//   ad.quantized = rounding->quantize(EmbeddingType::int8_group32, ad.embedding).value();
//   ad.embedding.clear();                                                 // the pool takes q as it is
//
// The pool's own rounding (quantize()) takes each value to the nearest step. Within the same
// storage rule (q in [-127, 127], the same kind of scales) another choice of q can leave a smaller
// error in the directions the requests' expert and gating vectors take, which is what moves scores
// and flips top-2 routing. This rounds coordinate by coordinate, pushing each error onto the
// coordinates still to come (the sequential rounding of the GPTQ paper), then moves single values
// by one step while that lowers the error, both in the metric H = E[u u^T] + gate_weight E[g g^T]
// over the sample requests. The CPU study (benchmarks/RESULTS.md, "Where int8's recall goes")
// measured what it gives. It costs O(d^2) a call: for ads encoded off the update path.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "kevo/retrieval/ad_pool.hpp"
#include "kevo/retrieval/reference.hpp"
#include "kevo/retrieval/types.hpp"

namespace kevo::retrieval {

namespace detail {
// Dense Cholesky of a d x d matrix (d <= 1024): kevo's dependencies hold no linear algebra
// library, and these 20 lines are all it needs.
using DenseMatrix = std::vector<double>;  // row-major, n x n

/// Lower factor L of a symmetric positive-definite A = L L^T.
inline DenseMatrix cholesky_lower(const DenseMatrix& a, int n) {
  DenseMatrix l(a.size(), 0.0);
  for (int j = 0; j < n; ++j) {
    double diagonal = a[j * n + j];
    for (int k = 0; k < j; ++k) diagonal -= l[j * n + k] * l[j * n + k];
    l[j * n + j] = std::sqrt(diagonal);
    for (int i = j + 1; i < n; ++i) {
      double t = a[i * n + j];
      for (int k = 0; k < j; ++k) t -= l[i * n + k] * l[j * n + k];
      l[i * n + j] = t / l[j * n + j];
    }
  }
  return l;
}

/// The upper factor U of A^-1 = U^T U, as GPTQ's error propagation wants it. Since
/// A^-1 = L^-T L^-1, U is the transpose of the lower Cholesky factor of L^-T L^-1.
inline DenseMatrix inverse_upper_factor(const DenseMatrix& a, int n) {
  const DenseMatrix l = cholesky_lower(a, n);
  DenseMatrix inverse(a.size(), 0.0);
  std::vector<double> y(static_cast<std::size_t>(n));
  for (int column = 0; column < n; ++column) {  // solve L L^T x = e_column
    for (int i = 0; i < n; ++i) {
      double s = i == column ? 1.0 : 0.0;
      for (int k = 0; k < i; ++k) s -= l[i * n + k] * y[k];
      y[i] = s / l[i * n + i];
    }
    for (int i = n - 1; i >= 0; --i) {
      double s = y[i];
      for (int k = i + 1; k < n; ++k) s -= l[k * n + i] * inverse[k * n + column];
      inverse[i * n + column] = s / l[i * n + i];
    }
  }
  const DenseMatrix lower = cholesky_lower(inverse, n);
  DenseMatrix upper(a.size());
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) upper[i * n + j] = lower[j * n + i];
  return upper;
}
}  // namespace detail

struct WeightedRoundingOptions {
  double gate_weight = 8.0;  ///< how much more a gating direction counts than an expert one (CPU study: 4-8 best)
  double damping = 0.01;     ///< added to H's diagonal, times its mean, before it is inverted (as GPTQ does)
  int descent_passes = 6;    ///< the most passes of single-step moves after the sequential rounding
};

class WeightedRounding {
 public:
  /// H from the model's expert and gating vectors for each sample user's features (f values each).
  /// The samples should be users the pool serves; they need not be the requests it will see.
  static expected<WeightedRounding, Error> calibrate(const Model& model, std::span<const std::vector<float>> sample_features,
                                                     WeightedRoundingOptions options = {}) {
    if (auto ok = validate_model(model); !ok) return unexpected(ok.error());
    if (sample_features.empty()) return make_error("weighted rounding: calibrating needs at least one sample user");
    if (!(options.gate_weight >= 0.0) || !(options.damping > 0.0) || options.descent_passes < 0)
      return make_error("weighted rounding: gate_weight >= 0, damping > 0 and descent_passes >= 0, please");
    const int d = model.dim, experts = model.experts;
    detail::DenseMatrix metric(static_cast<std::size_t>(d) * d, 0.0);
    for (std::size_t r = 0; r < sample_features.size(); ++r) {
      if (sample_features[r].size() != static_cast<std::size_t>(model.features))
        return make_error("weighted rounding: sample user " + std::to_string(r) + " has " + std::to_string(sample_features[r].size()) +
                          " features, the model takes " + std::to_string(model.features));
      const RequestVectors v = compute_request_vectors(model, sample_features[r]);
      for (int e = 0; e < experts; ++e) {
        const float* u = &v.expert[static_cast<std::size_t>(e) * d];
        const float* g = &v.gate[static_cast<std::size_t>(e) * d];
        for (int i = 0; i < d; ++i)
          for (int j = 0; j < d; ++j) metric[i * d + j] += double{u[i]} * u[j] + options.gate_weight * double{g[i]} * g[j];
      }
    }
    double trace = 0.0;
    for (int i = 0; i < d; ++i) trace += metric[i * d + i];
    if (!(trace > 0.0) || !std::isfinite(trace)) return make_error("weighted rounding: the sample users' request vectors are all zero");
    for (double& m : metric) m /= trace;  // only H's shape matters; this keeps the damping's scale fixed
    detail::DenseMatrix damped = metric;
    for (int i = 0; i < d; ++i) damped[i * d + i] += options.damping / d;
    return WeightedRounding(d, std::move(metric), detail::inverse_upper_factor(damped, d), options);
  }

  int dim() const { return dim_; }

  /// The stored form of `embedding` for an int8 pool of `type`, with quantize()'s kinds of scales
  /// (int8: max |a| / 127; int8_group32: each group's max / 127 in fp16, taken as the rounding
  /// reaches the group) and q chosen to leave the least error in H. It changes nothing in `this`:
  /// threads may share one WeightedRounding.
  expected<QuantizedEmbedding, Error> quantize(EmbeddingType type, std::span<const float> embedding) const {
    if (type == EmbeddingType::fp16) return make_error("weighted rounding makes int8 storage; an fp16 pool takes the embedding itself");
    if (embedding.size() != static_cast<std::size_t>(dim_))
      return make_error("weighted rounding: the embedding has " + std::to_string(embedding.size()) + " values, calibrated for d = " +
                        std::to_string(dim_));
    if (type == EmbeddingType::int8_group32 && dim_ % kScaleGroup != 0)
      return make_error("int8_group32 needs d to be a multiple of 32, not " + std::to_string(dim_));
    const Schema storage{.dim = dim_, .embedding_type = type};  // what check_embedding_value reads
    for (float a : embedding)
      if (auto ok = check_embedding_value(storage, a); !ok) return unexpected(ok.error());  // as the pools check it
    const int group = type == EmbeddingType::int8 ? dim_ : kScaleGroup;
    QuantizedEmbedding q{std::vector<std::int8_t>(embedding.size()), std::vector<float>(static_cast<std::size_t>(dim_ / group))};
    round_sequentially(embedding, group, q);
    descend(embedding, group, q);
    return q;
  }

 private:
  WeightedRounding(int dim, detail::DenseMatrix metric, detail::DenseMatrix factor, WeightedRoundingOptions options)
      : dim_(dim), metric_(std::move(metric)), factor_(std::move(factor)), options_(options) {}

  static std::int8_t nearest_step(double value, double scale) {
    return scale > 0.0 ? static_cast<std::int8_t>(std::clamp(std::round(value / scale), -127.0, 127.0)) : std::int8_t{0};
  }

  /// GPTQ's pass: each coordinate's error, scaled by the factor, moves onto those after it. A
  /// group's scale comes from its values as they stand when the pass reaches it, so that the
  /// errors pushed into it still fit; one scale for the whole row comes from the row itself.
  void round_sequentially(std::span<const float> a, int group, QuantizedEmbedding& q) const {
    const int d = dim_;
    std::vector<double> rest(a.begin(), a.end());
    for (int j = 0; j < d; ++j) {
      if (j % group == 0) {
        float group_max = 0.0f;
        for (int k = j; k < j + group; ++k) group_max = std::max(group_max, static_cast<float>(std::fabs(group == d ? a[k] : rest[k])));
        q.scales[j / group] = group == d ? group_max / 127.0f : detail::group_scale(group_max);
      }
      const double scale = q.scales[j / group];
      q.values[j] = nearest_step(rest[j], scale);
      const double error = (rest[j] - scale * q.values[j]) / factor_[j * d + j];
      for (int k = j + 1; k < d; ++k) rest[k] -= error * factor_[j * d + k];
    }
  }

  /// Single-step moves of one q at a time while the error e = a - s q shrinks in H: moving q_j by
  /// `step` changes e^T H e by -2 step s_j (H e)_j + s_j^2 H_jj.
  void descend(std::span<const float> a, int group, QuantizedEmbedding& q) const {
    const int d = dim_;
    std::vector<double> error(static_cast<std::size_t>(d)), weighted(static_cast<std::size_t>(d), 0.0);  // e, H e
    for (int j = 0; j < d; ++j) error[j] = a[j] - double{q.scales[j / group]} * q.values[j];
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < d; ++j) weighted[i] += metric_[i * d + j] * error[j];
    for (int pass = 0; pass < options_.descent_passes; ++pass) {
      bool moved = false;
      for (int j = 0; j < d; ++j) {
        const double s = q.scales[j / group];
        for (int step : {1, -1}) {
          if (q.values[j] + step > 127 || q.values[j] + step < -127) continue;
          if (-2.0 * step * s * weighted[j] + s * s * metric_[j * d + j] >= 0.0) continue;
          q.values[j] = static_cast<std::int8_t>(q.values[j] + step);
          for (int i = 0; i < d; ++i) weighted[i] -= step * s * metric_[i * d + j];
          moved = true;
          break;
        }
      }
      if (!moved) break;
    }
  }

  int dim_;
  detail::DenseMatrix metric_;  // H, normalised to trace 1
  detail::DenseMatrix factor_;  // upper Cholesky factor of (H + damping)^-1
  WeightedRoundingOptions options_;
};

}  // namespace kevo::retrieval
