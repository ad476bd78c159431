// int8_recall_study: where int8's recall@K against fp16 is lost, on the CPU (no GPU needed).
//
//   int8_recall_study [--n 1000000] [--requests 8] [--k 1000] [--first-request 100] [--dim 128]
//
// The spec stores int8 embeddings with one symmetric fp32 scale per ad (a = scale * q, q in
// [-127, 127]), or with one fp16 scale per group of 32 values (int8_group32), and the goal asks
// recall@1000 >= 0.99 against fp16. This scores the workload's ads (all eligible, so that N ads
// stand for N eligible ones) in double precision from fp16 and from int8 storages of the same
// embeddings, and reports each one's recall against fp16's top-K, the RMS of its score error and
// the share of its routings that differ from fp16's, both over fp16's top 5K:
//   - each storage rounded to nearest (the pools' own quantize()), and rounded by WeightedRounding
//     (calibrated on 256 users that the measured requests do not include);
//   - the nearest-rounded values scored with fp16's routing, which leaves only the rounding's own
//     noise (top-2 routing is discontinuous: a flip between the 2nd and 3rd expert moves a score a lot);
//   - per-ad int8 with dense softmax gating (k_e = E), which has no routing to flip.
// Recall is counted over fp16's top-K ids, as retrieval_benchmark counts it on the device.
#include <algorithm>
#include <array>
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
#include "kevo/retrieval/weighted_rounding.hpp"
#include "kevo/retrieval/workload.hpp"

using namespace kevo::retrieval;

namespace {

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
  int requests = 8, k = 1000, first_request = 100, dim = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--n")) n = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--requests")) requests = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--k")) k = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--first-request")) first_request = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--dim")) dim = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--n ADS] [--requests R] [--k K] [--first-request I] [--dim D]\n", argv[0]);
      return 2;
    }
  }
  const std::size_t wide = 5 * static_cast<std::size_t>(k);  // where score errors and flips are counted
  if (n <= wide || k < 1 || requests < 1 || first_request < 0 || dim < 1) {
    std::fprintf(stderr, "int8_recall_study: need 1 <= K, 5 K < N, R >= 1, I >= 0 and D >= 1\n");
    return 2;
  }
  const Workload workload({.seed = 2026, .dim = dim});
  const Model model = workload.model();
  const int d = model.dim, experts = model.experts;
  if (experts < 2 || experts > kMaxExperts) {
    std::fprintf(stderr, "int8_recall_study: the workload's model has %d experts; 2 to %d are studied\n", experts, kMaxExperts);
    return 2;
  }
  if (d % kScaleGroup != 0) {
    std::fprintf(stderr, "int8_recall_study: d = %d is not a multiple of %d (int8_group32)\n", d, kScaleGroup);
    return 2;
  }
  std::vector<std::vector<float>> calibration_users;  // far from the measured requests' indices
  for (int r = 0; r < 256; ++r) calibration_users.push_back(workload.request(100'000'000 + r).features);
  const auto rounding = WeightedRounding::calibrate(model, calibration_users);
  if (!rounding) {
    std::fprintf(stderr, "int8_recall_study: %s\n", rounding.error().message.c_str());
    return 1;
  }

  // The same embeddings in five storages, dequantised (int8_group32 in fp16, as the pool does).
  enum Store { fp16, int8, int8_weighted, group32, group32_weighted, kStores };
  std::vector<std::vector<float>> stored(kStores, std::vector<float>(n * d));
  std::vector<float> bias(n);
  const unsigned threads = default_thread_count();
  std::fprintf(stderr, "int8_recall_study: quantising %zu ads on %u threads\n", n, threads);
  parallel_for_ranges(n, threads, [&](unsigned, std::size_t begin, std::size_t end) {
    auto write = [&](Store store, std::size_t i, const QuantizedEmbedding& q) {
      const int group = d / static_cast<int>(q.scales.size());
      for (int j = 0; j < d; ++j) {
        const float value = q.scales[j / group] * q.values[j];
        stored[store][i * d + j] = store == group32 || store == group32_weighted ? round_to_half(value) : value;
      }
    };
    for (std::size_t i = begin; i < end; ++i) {
      const AdRecord ad = workload.ad(i);
      bias[i] = ad.bias;
      for (int j = 0; j < d; ++j) stored[fp16][i * d + j] = round_to_half(ad.embedding[j]);
      write(int8, i, quantize_int8(ad.embedding));
      write(int8_weighted, i, rounding->quantize(EmbeddingType::int8, ad.embedding).value());
      write(group32, i, quantize_int8_group32(ad.embedding));
      write(group32_weighted, i, rounding->quantize(EmbeddingType::int8_group32, ad.embedding).value());
    }
  });

  struct Row {
    const char* name;
    Store store;
    Routing routing;
  };
  const std::array<Row, 7> rows{{
      {"int8, rounded to nearest (quantize_int8)", int8, Routing::own},
      {"int8, WeightedRounding", int8_weighted, Routing::own},
      {"int8_group32, rounded to nearest (quantize_int8_group32)", group32, Routing::own},
      {"int8_group32, WeightedRounding", group32_weighted, Routing::own},
      {"int8, rounded to nearest, scored with fp16's routing", int8, Routing::forced},
      {"int8_group32, rounded to nearest, scored with fp16's routing", group32, Routing::forced},
      {"int8, rounded to nearest, dense gating (k_e = E; against fp16 dense)", int8, Routing::dense},
  }};
  std::array<double, rows.size()> recall{}, square_error{}, flips{};
  for (int r = 0; r < requests; ++r) {
    const RequestVectors v = compute_request_vectors(model, workload.request(static_cast<std::uint64_t>(first_request + r)).features);
    std::vector<double> reference(n), reference_dense(n);
    std::vector<std::array<double, rows.size()>> score(n);
    std::vector<std::array<char, rows.size()>> flipped(n);
    parallel_for_ranges(n, threads, [&](unsigned, std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) {
        int fp16_experts[2], chosen[2];
        reference[i] = score_ad(&stored[fp16][i * d], v, bias[i], Routing::own, fp16_experts);
        reference_dense[i] = score_ad(&stored[fp16][i * d], v, bias[i], Routing::dense, chosen);
        for (std::size_t row = 0; row < rows.size(); ++row) {
          std::copy(fp16_experts, fp16_experts + 2, chosen);
          score[i][row] = score_ad(&stored[rows[row].store][i * d], v, bias[i], rows[row].routing, chosen);
          flipped[i][row] = rows[row].routing == Routing::own &&
                            std::minmax(chosen[0], chosen[1]) != std::minmax(fp16_experts[0], fp16_experts[1]);
        }
      }
    });
    const auto expected = top_ids(reference, k), expected_dense = top_ids(reference_dense, k);
    const auto watched = top_ids(reference, static_cast<int>(wide));
    for (std::size_t row = 0; row < rows.size(); ++row) {
      const bool dense = rows[row].routing == Routing::dense;
      std::vector<double> scores(n);
      for (std::size_t i = 0; i < n; ++i) scores[i] = score[i][row];
      recall[row] += overlap(dense ? expected_dense : expected, top_ids(scores, k)) / requests;
      const std::vector<std::uint32_t> dense_watched = dense ? top_ids(reference_dense, static_cast<int>(wide)) : std::vector<std::uint32_t>{};
      for (std::uint32_t id : dense ? dense_watched : watched) {
        const double error = scores[id] - (dense ? reference_dense[id] : reference[id]);
        square_error[row] += error * error / static_cast<double>(wide) / requests;
        flips[row] += static_cast<double>(flipped[id][row]) / static_cast<double>(wide) / requests;
      }
    }
    std::fprintf(stderr, "int8_recall_study: request %d of %d\n", r + 1, requests);
  }
  std::printf("# int8 recall@%d against fp16: %zu ads (all eligible), %d requests from %d, d = %d, E = %d\n\n", k, n, requests,
              first_request, d, experts);
  std::printf("| storage | recall@%d | RMS score error, fp16's top %zu | routings not fp16's, there |\n| --- | --- | --- | --- |\n", k, wide);
  for (std::size_t row = 0; row < rows.size(); ++row)
    std::printf("| %s | %.4f | %.4f | %.2f%% |\n", rows[row].name, recall[row], std::sqrt(square_error[row]), 100.0 * flips[row]);
  return 0;
}
