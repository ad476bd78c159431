// int8_recall_study: where int8's recall@K against fp16 is lost, on the CPU (no GPU needed).
//
//   int8_recall_study [--n 1000000] [--requests 8] [--k 1000]
//
// The spec stores int8 embeddings with one symmetric fp32 scale per ad (a = scale * q, q in
// [-127, 127]), or with one fp16 scale per group of 32 values (int8_group32), and the goal asks
// recall@1000 >= 0.99 against fp16. This scores the workload's ads (all eligible, so that N ads
// stand for N eligible ones) in double precision from five storages of the same embeddings and
// reports each one's recall against fp16's top-K:
//   - the library's quantiser (quantize_int8: max-abs scale, round to nearest);
//   - the library's group quantiser (quantize_int8_group32: the same per group of 32 values, each
//     group's scale rounded to fp16), the int8_group32 pool's storage;
//   - the same int8 values scored with fp16's routing, which leaves only the rounding's own noise
//     (top-2 routing is discontinuous: a flip between the 2nd and 3rd expert moves a score a lot);
//   - the same with dense softmax gating (k_e = E), which has no routing to flip;
//   - an error-weighted rounding within the same storage rule: coordinates rounded one at a time,
//     each rounding error pushed onto the coordinates not yet rounded so that the total error
//     stays small in the directions the request vectors take (the sequential rounding of the
//     GPTQ paper, weighted by H = E[u u^T] + 8 E[g g^T] over sample requests and experts).
// Recall is counted over fp16's top-K ids, as retrieval_benchmark counts it on the device.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "kevo/retrieval/ad_pool.hpp"
#include "kevo/retrieval/half.hpp"
#include "kevo/retrieval/reference.hpp"
#include "kevo/retrieval/workload.hpp"

using namespace kevo::retrieval;

namespace {

using Matrix = std::vector<double>;  // d x d, row-major

/// Lower Cholesky factor of a symmetric positive-definite matrix.
Matrix cholesky_lower(const Matrix& a, int n) {
  Matrix l(a.size(), 0.0);
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

Matrix inverse_spd(const Matrix& a, int n) {
  const Matrix l = cholesky_lower(a, n);
  Matrix inverse(a.size(), 0.0);
  std::vector<double> y(n);
  for (int column = 0; column < n; ++column) {  // L L^T x = e_column
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
  return inverse;
}

/// The upper Cholesky factor U of H^-1 (H^-1 = U^T U) that sequential rounding propagates with.
Matrix rounding_factor(Matrix h, int d) {
  double trace = 0.0;
  for (int i = 0; i < d; ++i) trace += h[i * d + i];
  for (int i = 0; i < d; ++i) h[i * d + i] += 0.01 * trace / d;  // damping, as GPTQ does
  const Matrix l = cholesky_lower(inverse_spd(h, d), d);
  Matrix u(h.size());
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) u[i * d + j] = l[j * d + i];
  return u;
}

/// int8 within the spec's rule (q in [-127, 127] at `scale`, quantize_int8's max-abs scale),
/// rounded coordinate by coordinate with each error spread over the coordinates still to come.
void quantize_error_weighted(const std::vector<float>& a, float scale, const Matrix& u, float* dequantized) {
  const int d = static_cast<int>(a.size());
  std::vector<double> rest(a.begin(), a.end());
  for (int j = 0; j < d; ++j) {
    const double q = scale > 0 ? std::clamp(std::round(rest[j] / scale), -127.0, 127.0) : 0.0;
    const double error = (rest[j] - scale * q) / u[j * d + j];
    for (int k = j + 1; k < d; ++k) rest[k] -= error * u[j * d + k];
    dequantized[j] = scale * static_cast<float>(q);
  }
}

enum class Routing { own, forced, dense };
constexpr int kMaxExperts = 16;

/// One ad's score in double precision. `forced`: route to `experts` (fp16's choice) instead of
/// this row's own top two logits. Returns the two experts it routed to through `chosen`.
double score_ad(const float* a, const RequestVectors& v, float bias, Routing routing, int (&chosen)[2]) {
  const int experts = v.experts, d = v.dim;
  double score[kMaxExperts] = {}, logit[kMaxExperts] = {};
  for (int e = 0; e < experts; ++e) {
    double s = 0.0, l = 0.0;
    for (int k = 0; k < d; ++k) {
      s += static_cast<double>(a[k]) * v.expert[e * d + k];
      l += static_cast<double>(a[k]) * v.gate[e * d + k];
    }
    score[e] = s;
    logit[e] = l;
  }
  if (routing == Routing::dense) {
    const double top = *std::max_element(logit, logit + experts);
    double total = 0.0, weighted = 0.0;
    for (int e = 0; e < experts; ++e) {
      total += std::exp(logit[e] - top);
      weighted += std::exp(logit[e] - top) * score[e];
    }
    return weighted / total + bias;
  }
  if (routing == Routing::own) {
    chosen[0] = 0;
    for (int e = 1; e < experts; ++e)
      if (logit[e] > logit[chosen[0]]) chosen[0] = e;
    chosen[1] = chosen[0] == 0 ? 1 : 0;
    for (int e = 0; e < experts; ++e)
      if (e != chosen[0] && logit[e] > logit[chosen[1]]) chosen[1] = e;
  }
  const double top = std::max(logit[chosen[0]], logit[chosen[1]]);
  const double w0 = std::exp(logit[chosen[0]] - top), w1 = std::exp(logit[chosen[1]] - top);
  return (w0 * score[chosen[0]] + w1 * score[chosen[1]]) / (w0 + w1) + bias;
}

/// The ids of the K highest scores (ties: lower id), sorted by id.
std::vector<std::uint32_t> top_ids(const std::vector<double>& scores, int k) {
  std::vector<std::uint32_t> ids(scores.size());
  std::iota(ids.begin(), ids.end(), 0u);
  std::nth_element(ids.begin(), ids.begin() + k, ids.end(), [&](std::uint32_t x, std::uint32_t y) {
    return scores[x] > scores[y] || (scores[x] == scores[y] && x < y);
  });
  ids.resize(static_cast<std::size_t>(k));
  std::sort(ids.begin(), ids.end());
  return ids;
}

double overlap(const std::vector<std::uint32_t>& a, const std::vector<std::uint32_t>& b) {
  std::vector<std::uint32_t> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  return static_cast<double>(both.size()) / static_cast<double>(a.size());
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t n = 1'000'000;
  int requests = 8, k = 1000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--n")) n = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--requests")) requests = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--k")) k = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--n ADS] [--requests R] [--k K]\n", argv[0]);
      return 2;
    }
  }
  if (n <= static_cast<std::size_t>(k) || k < 1) {
    std::fprintf(stderr, "int8_recall_study: need 1 <= K < N\n");
    return 2;
  }
  const Workload workload({.seed = 2026});
  const Model model = workload.model();
  const int d = model.dim, experts = model.experts;
  if (experts < 2 || experts > kMaxExperts) {
    std::fprintf(stderr, "int8_recall_study: the workload's model has %d experts; 2 to %d are studied\n", experts, kMaxExperts);
    return 2;
  }

  // The weighting of the error-weighted rounding, from requests the measured ones do not include.
  Matrix expert_moment(d * d, 0.0), gate_moment(d * d, 0.0);
  const int samples = 256;
  for (int r = 0; r < samples; ++r) {
    const RequestVectors v = compute_request_vectors(model, workload.request(100'000 + r).features);
    for (int e = 0; e < experts; ++e)
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) {
          expert_moment[i * d + j] += double{v.expert[e * d + i]} * v.expert[e * d + j] / (samples * experts);
          gate_moment[i * d + j] += double{v.gate[e * d + i]} * v.gate[e * d + j] / (samples * experts);
        }
  }
  Matrix weighting(d * d);
  for (int i = 0; i < d * d; ++i) weighting[i] = expert_moment[i] + 8.0 * gate_moment[i];
  const Matrix factor = rounding_factor(weighting, d);

  if (d % kScaleGroup != 0) {
    std::fprintf(stderr, "int8_recall_study: d = %d is not a multiple of %d (int8_group32)\n", d, kScaleGroup);
    return 2;
  }
  // The same embeddings (the workload's ads) in four storages, dequantised.
  std::vector<float> fp16(n * d), int8(n * d), group32(n * d), weighted(n * d), bias(n);
  const unsigned threads = default_thread_count();
  parallel_for_ranges(n, threads, [&](unsigned, std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) {
      const AdRecord ad = workload.ad(i);
      bias[i] = ad.bias;
      const QuantizedEmbedding q = quantize_int8(ad.embedding);
      const QuantizedEmbedding g = quantize_int8_group32(ad.embedding);
      for (int j = 0; j < d; ++j) {
        fp16[i * d + j] = round_to_half(ad.embedding[j]);
        int8[i * d + j] = q.scales[0] * q.values[j];
        group32[i * d + j] = round_to_half(g.scales[j / kScaleGroup] * g.values[j]);  // dequantised in fp16, as the pool does
      }
      quantize_error_weighted(ad.embedding, q.scales[0], factor, &weighted[i * d]);
    }
  });

  const char* names[] = {"int8, max-abs (quantize_int8)", "int8, scored with fp16's routing",
                         "int8, error-weighted rounding", "int8, dense gating (k_e = E; against fp16 dense)",
                         "int8_group32, max-abs per 32 values, fp16 scales (quantize_int8_group32)"};
  constexpr int kRows = 5;
  double recall[kRows] = {};
  for (int r = 0; r < requests; ++r) {
    const RequestVectors v = compute_request_vectors(model, workload.request(100 + r).features);
    std::vector<double> reference(n), reference_dense(n), own(n), forced(n), error_weighted(n), dense(n), grouped(n);
    parallel_for_ranges(n, threads, [&](unsigned, std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) {
        int fp16_experts[2], chosen[2];
        reference[i] = score_ad(&fp16[i * d], v, bias[i], Routing::own, fp16_experts);
        reference_dense[i] = score_ad(&fp16[i * d], v, bias[i], Routing::dense, chosen);
        own[i] = score_ad(&int8[i * d], v, bias[i], Routing::own, chosen);
        forced[i] = score_ad(&int8[i * d], v, bias[i], Routing::forced, fp16_experts);
        error_weighted[i] = score_ad(&weighted[i * d], v, bias[i], Routing::own, chosen);
        dense[i] = score_ad(&int8[i * d], v, bias[i], Routing::dense, chosen);
        grouped[i] = score_ad(&group32[i * d], v, bias[i], Routing::own, chosen);
      }
    });
    const auto expected = top_ids(reference, k), expected_dense = top_ids(reference_dense, k);
    recall[0] += overlap(expected, top_ids(own, k)) / requests;
    recall[1] += overlap(expected, top_ids(forced, k)) / requests;
    recall[2] += overlap(expected, top_ids(error_weighted, k)) / requests;
    recall[3] += overlap(expected_dense, top_ids(dense, k)) / requests;
    recall[4] += overlap(expected, top_ids(grouped, k)) / requests;
  }
  std::printf("# int8 recall@%d against fp16: %zu ads (all eligible), %d requests, d = %d, E = %d\n\n", k, n, requests,
              d, experts);
  std::puts("| storage | recall |\n| --- | --- |");
  for (int i = 0; i < kRows; ++i) std::printf("| %s | %.4f |\n", names[i], recall[i]);
  return 0;
}
