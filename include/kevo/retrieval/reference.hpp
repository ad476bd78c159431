// kevo/retrieval/reference.hpp: the CPU reference of the retrieval spec. It is exact (double
// accumulation), readable and multi-threaded; every GPU kernel is checked against it, and it is
// also the CPU backend's engine.
//
//   RequestVectors v = compute_request_vectors(model, request.features);
//   std::vector<ScoredAd> top = reference_search(pool, v, request);
//   if (auto ok = compare_with_reference(pool, v, request, gpu_top); !ok) fail(ok.error().message);
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

#include "kevo/retrieval/ad_pool.hpp"
#include "kevo/retrieval/half.hpp"
#include "kevo/retrieval/types.hpp"

namespace kevo::retrieval {

/// The per-request vectors u_e and g_e, already rounded to fp16 (held as the exact float values).
struct RequestVectors {
  int experts = 0;
  int dim = 0;
  std::vector<float> expert;  // u: (E, d)
  std::vector<float> gate;    // g: (E, d)
};

/// A dot product in fp32 in one fixed order: 32 lane-strided fused multiply-add chains, then a
/// butterfly (offsets 16, 8, 4, 2, 1), lane 0's sum. It is the order of the GPU's warp_dot, so
/// that the reference and the GPU round u_e and g_e to the same fp16 values, as the spec asks.
inline float ordered_dot(const float* row, const float* x, int n) {
  float lane[32] = {};
  for (int i = 0; i < n; ++i) lane[i % 32] = std::fma(row[i], x[i], lane[i % 32]);
  for (int offset = 16; offset > 0; offset /= 2) {
    float next[32];
    for (int l = 0; l < 32; ++l) next[l] = lane[l] + lane[l ^ offset];
    std::copy(next, next + 32, lane);
  }
  return lane[0];
}

/// Runs the user towers and gating projection: u_e = W2_e relu(W1_e x + c1_e) + c2_e,
/// g_e = P u_e / sqrt(d), each rounded to fp16.
inline RequestVectors compute_request_vectors(const Model& model, const std::vector<float>& features) {
  const int e_count = model.experts, h_count = model.hidden, f = model.features, d = model.dim;
  RequestVectors v{e_count, d, std::vector<float>(static_cast<std::size_t>(e_count) * d),
                   std::vector<float>(static_cast<std::size_t>(e_count) * d)};
  std::vector<float> hidden(static_cast<std::size_t>(h_count));
  std::vector<float> u(static_cast<std::size_t>(d));
  const float sqrt_d = std::sqrt(static_cast<float>(d));
  for (int e = 0; e < e_count; ++e) {
    for (int j = 0; j < h_count; ++j) {
      const std::size_t row = static_cast<std::size_t>(e) * h_count + j;
      hidden[static_cast<std::size_t>(j)] = std::max(ordered_dot(&model.w1[row * f], features.data(), f) + model.c1[row], 0.0f);
    }
    for (int j = 0; j < d; ++j) {
      const std::size_t row = static_cast<std::size_t>(e) * d + j;
      u[static_cast<std::size_t>(j)] = ordered_dot(&model.w2[row * h_count], hidden.data(), h_count) + model.c2[row];
    }
    for (int j = 0; j < d; ++j) {
      const float g = ordered_dot(&model.gate_projection[static_cast<std::size_t>(j) * d], u.data(), d) / sqrt_d;
      v.gate[static_cast<std::size_t>(e) * d + j] = round_to_half(g);
      v.expert[static_cast<std::size_t>(e) * d + j] = round_to_half(u[static_cast<std::size_t>(j)]);
    }
  }
  return v;
}

/// The error for a request whose u_e or g_e overflow fp16: the model computes no finite score for
/// it, so it is refused (the GPU reports the same from its towers).
inline constexpr const char* kVectorsOverflowMessage =
    "the request's features are too large for the model: its expert or gate vectors overflow fp16";

inline expected<void, Error> check_request_vectors(const RequestVectors& v) {
  for (const std::vector<float>* values : {&v.expert, &v.gate})
    for (float x : *values)
      if (!is_finite(x)) return make_error(kVectorsOverflowMessage);
  return {};
}

/// The request's targeting query as one sorted value list per category, for membership tests.
class QuerySets {
 public:
  QuerySets(int categories, const std::vector<CategoryQuery>& query) : sets_(static_cast<std::size_t>(categories)) {
    for (const CategoryQuery& q : query) {
      auto& set = sets_.at(q.category);
      set.insert(set.end(), q.values.begin(), q.values.end());
      std::sort(set.begin(), set.end());
    }
  }
  bool contains(std::uint32_t category, std::uint32_t value) const {
    const auto& set = sets_[category];
    return std::binary_search(set.begin(), set.end(), value);
  }

 private:
  std::vector<std::vector<std::uint32_t>> sets_;
};

/// Eligibility: live, and for every category (ANY or S ∩ Q ≠ ∅) and X ∩ Q = ∅.
inline bool is_eligible(const HostAdPool& pool, std::size_t slot, const QuerySets& query) {
  if (!pool.live(slot)) return false;
  std::uint32_t restricted = 0, satisfied = 0;
  for (std::uint32_t packed : pool.clauses(slot)) {
    const std::uint32_t c = clause_bits::category(packed);
    const bool member = query.contains(c, clause_bits::value(packed));
    if (packed & clause_bits::exclude) {
      if (member) return false;
    } else {
      restricted |= 1u << c;
      if (member) satisfied |= 1u << c;
    }
  }
  return restricted == satisfied;
}

/// A reference score; when the k_e-th and (k_e+1)-th gate logits lie within 1e-3, the spec lets an
/// implementation route either way, so the other routing's score comes too.
struct ReferenceScore {
  double score = 0.0;
  double alternative = 0.0;
  bool ambiguous = false;
};

inline constexpr double kRoutingTieTolerance = 1e-3;

inline ReferenceScore reference_score(const HostAdPool& pool, std::size_t slot, const RequestVectors& v, int routing) {
  const int e_count = v.experts, d = v.dim;
  std::vector<double> a(static_cast<std::size_t>(d));
  for (int k = 0; k < d; ++k) a[static_cast<std::size_t>(k)] = pool.embedding(slot, k);
  std::vector<double> expert_score(static_cast<std::size_t>(e_count)), logit(static_cast<std::size_t>(e_count));
  for (int e = 0; e < e_count; ++e) {
    const float* u = &v.expert[static_cast<std::size_t>(e) * d];
    const float* g = &v.gate[static_cast<std::size_t>(e) * d];
    double s = 0.0, l = 0.0;
    for (int k = 0; k < d; ++k) {
      s += a[static_cast<std::size_t>(k)] * u[k];
      l += a[static_cast<std::size_t>(k)] * g[k];
    }
    expert_score[static_cast<std::size_t>(e)] = s;
    logit[static_cast<std::size_t>(e)] = l;
  }
  // Experts by logit, largest first; ties go to the lower expert index.
  std::vector<int> order(static_cast<std::size_t>(e_count));
  for (int e = 0; e < e_count; ++e) order[static_cast<std::size_t>(e)] = e;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logit[a] > logit[b]; });
  auto mix = [&](const std::vector<int>& chosen) {
    double max_logit = -std::numeric_limits<double>::infinity();
    for (int e : chosen) max_logit = std::max(max_logit, logit[static_cast<std::size_t>(e)]);
    double total = 0.0, weighted = 0.0;
    for (int e : chosen) {
      const double w = std::exp(logit[static_cast<std::size_t>(e)] - max_logit);
      total += w;
      weighted += w * expert_score[static_cast<std::size_t>(e)];
    }
    return weighted / total + pool.bias(slot);
  };
  std::vector<int> chosen(order.begin(), order.begin() + routing);
  ReferenceScore result{mix(chosen), 0.0, false};
  if (routing < e_count &&
      logit[static_cast<std::size_t>(order[routing - 1])] - logit[static_cast<std::size_t>(order[routing])] <=
          kRoutingTieTolerance) {
    chosen.back() = order[static_cast<std::size_t>(routing)];
    result.alternative = mix(chosen);
    result.ambiguous = true;
  }
  return result;
}

/// Result order: score descending, ties by lower ad id.
inline bool ranks_before(const ScoredAd& a, const ScoredAd& b) {
  return a.score > b.score || (a.score == b.score && a.id < b.id);
}

/// The cores this process may run on: its CPU affinity where the system says (taskset, a container's
/// cpuset), which hardware_concurrency() ignores, else every core of the machine.
inline unsigned default_thread_count() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return static_cast<unsigned>(std::max(1, CPU_COUNT(&set)));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

/// Runs body(part, begin, end) over [0, count) split into `parts` ranges, one std::thread each.
/// (Threads kept in an Asio pool were tried, run 134: waking them cost more than starting these.)
template <class Body>
void parallel_for_ranges(std::size_t count, unsigned parts, Body body) {
  std::vector<std::thread> workers;
  const std::size_t step = (count + parts - 1) / parts;
  for (unsigned part = 0; part < parts; ++part) {
    const std::size_t begin = std::min(count, part * step), end = std::min(count, begin + step);
    workers.emplace_back([&body, part, begin, end] { body(part, begin, end); });
  }
  for (std::thread& w : workers) w.join();
}

/// Threads for a batch's host work (checking, packing): about 512 ads each, up to every core this
/// process may use. Updates are bound by this work (run 125: 10,000-ad batches ran at 0.71 M ads/s
/// on 16 cores and 0.62 on 4 while it ran on few threads).
inline unsigned batch_threads(std::size_t ads) {
  return static_cast<unsigned>(std::clamp<std::size_t>(ads / 512, 1, default_thread_count()));
}

/// Runs check(i) for i = 0 .. n - 1 over batch_threads(n) threads, each part stopping at its first
/// problem (a non-empty message); the first part's problem, if any.
template <class Check>
expected<void, Error> first_problem(std::size_t n, Check check) {
  const unsigned parts = batch_threads(n);
  std::vector<std::string> problems(parts);
  parallel_for_ranges(n, parts, [&](unsigned part, std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end && problems[part].empty(); ++i) problems[part] = check(i);
  });
  for (const std::string& problem : problems)
    if (!problem.empty()) return make_error(problem);
  return {};
}

/// Every eligible ad with its reference score, in slot order.
struct EligibleScores {
  std::vector<std::size_t> slots;
  std::vector<ReferenceScore> scores;
};

inline EligibleScores score_eligible_ads(const HostAdPool& pool, const RequestVectors& v, const Request& request,
                                         unsigned threads = default_thread_count()) {
  const QuerySets query(pool.schema().categories(), request.query);
  // Small pools are not worth a thread each.
  const auto parts = static_cast<unsigned>(std::clamp<std::size_t>(pool.slots() / 4096, 1, std::max(1u, threads)));
  std::vector<EligibleScores> partial(parts);
  parallel_for_ranges(pool.slots(), parts, [&](unsigned part, std::size_t begin, std::size_t end) {
    EligibleScores& local = partial[part];
    for (std::size_t slot = begin; slot < end; ++slot) {
      if (!is_eligible(pool, slot, query)) continue;
      local.slots.push_back(slot);
      local.scores.push_back(reference_score(pool, slot, v, request.routing));
    }
  });
  EligibleScores all;
  for (EligibleScores& p : partial) {
    all.slots.insert(all.slots.end(), p.slots.begin(), p.slots.end());
    all.scores.insert(all.scores.end(), p.scores.begin(), p.scores.end());
  }
  return all;
}

/// The reference top-K: the K eligible ads with the highest scores, score descending, ties by lower id.
inline std::vector<ScoredAd> reference_search(const HostAdPool& pool, const RequestVectors& v, const Request& request,
                                              unsigned threads = default_thread_count()) {
  const EligibleScores eligible = score_eligible_ads(pool, v, request, threads);
  std::vector<ScoredAd> all(eligible.slots.size());
  for (std::size_t i = 0; i < all.size(); ++i)
    all[i] = {pool.id(eligible.slots[i]), static_cast<float>(eligible.scores[i].score)};
  const std::size_t k = std::min(all.size(), static_cast<std::size_t>(request.k));
  std::partial_sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(k), all.end(), ranks_before);
  all.resize(k);
  return all;
}

/// The spec's score tolerance: 1e-3 * (1 + |ref|).
inline double score_tolerance(double reference) { return 1e-3 * (1.0 + std::fabs(reference)); }

/// Checks a result against the reference under the spec's rules: scores within tolerance (either
/// routing where the routing is ambiguous), the reference's top-K except for ads within tolerance
/// of the K-th score, ordered, and no missing, extra, ineligible or duplicate ad. An ad with an
/// ambiguous routing ranks by the routing it was scored with: where it was returned, the one its
/// score matches; where it was not, the lower (the kernel may have taken either).
inline expected<void, Error> compare_with_reference(const HostAdPool& pool, const RequestVectors& v,
                                                    const Request& request, const std::vector<ScoredAd>& result,
                                                    unsigned threads = default_thread_count()) {
  const EligibleScores eligible = score_eligible_ads(pool, v, request, threads);
  std::unordered_map<std::uint32_t, std::size_t> index_of_id;  // id -> index into eligible
  for (std::size_t i = 0; i < eligible.slots.size(); ++i) index_of_id[pool.id(eligible.slots[i])] = i;
  auto fail = [](std::string why) { return make_error(std::move(why)); };

  // Each eligible ad's score under the routing it was taken with.
  std::vector<double> ranked_score(eligible.scores.size());
  for (std::size_t i = 0; i < ranked_score.size(); ++i) {
    const ReferenceScore& ref = eligible.scores[i];
    ranked_score[i] = ref.ambiguous ? std::min(ref.score, ref.alternative) : ref.score;
  }
  std::unordered_set<std::uint32_t> returned;
  for (std::size_t i = 0; i < result.size(); ++i) {
    const ScoredAd& r = result[i];
    if (!returned.insert(r.id).second) return fail("duplicate id " + std::to_string(r.id));
    auto it = index_of_id.find(r.id);
    if (it == index_of_id.end()) return fail("id " + std::to_string(r.id) + " is not an eligible ad");
    const ReferenceScore& ref = eligible.scores[it->second];
    const bool primary = std::fabs(r.score - ref.score) <= score_tolerance(ref.score);
    const bool alternative = ref.ambiguous && std::fabs(r.score - ref.alternative) <= score_tolerance(ref.alternative);
    if (!primary && !alternative)
      return fail("id " + std::to_string(r.id) + " scored " + std::to_string(r.score) + ", reference " +
                  std::to_string(ref.score));
    ranked_score[it->second] = primary ? ref.score : ref.alternative;
    if (i > 0 && !ranks_before(result[i - 1], r))
      return fail("results out of order at position " + std::to_string(i));
  }

  std::vector<ScoredAd> reference(eligible.slots.size());
  for (std::size_t i = 0; i < reference.size(); ++i)
    reference[i] = {pool.id(eligible.slots[i]), static_cast<float>(ranked_score[i])};
  const std::size_t k = std::min(reference.size(), static_cast<std::size_t>(request.k));
  std::partial_sort(reference.begin(), reference.begin() + static_cast<std::ptrdiff_t>(k), reference.end(),
                    ranks_before);
  reference.resize(k);
  if (result.size() != k)
    return fail("returned " + std::to_string(result.size()) + " ads, expected " + std::to_string(k));
  if (k == 0 || k == eligible.slots.size()) {
    for (const ScoredAd& ref : reference)
      if (!returned.count(ref.id)) return fail("eligible id " + std::to_string(ref.id) + " is missing");
    return {};
  }
  // Ads may swap in or out of the top-K only at the K-th score, within tolerance.
  const double kth = reference.back().score;
  auto near_boundary = [&](std::uint32_t id) {
    return std::fabs(ranked_score[index_of_id.at(id)] - kth) <= score_tolerance(kth);
  };
  std::unordered_set<std::uint32_t> in_reference;
  for (const ScoredAd& ref : reference) {
    in_reference.insert(ref.id);
    if (!returned.count(ref.id) && !near_boundary(ref.id))
      return fail("id " + std::to_string(ref.id) + " (reference score " + std::to_string(ref.score) +
                  ") is missing from the top-K");
  }
  for (const ScoredAd& r : result)
    if (!in_reference.count(r.id) && !near_boundary(r.id))
      return fail("id " + std::to_string(r.id) + " is not in the reference top-K");
  return {};
}

}  // namespace kevo::retrieval
