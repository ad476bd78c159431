// kevo/retrieval/answer_comparison.hpp: whether two engines' answers to one request agree under the
// spec's comparison rules, without the reference's own scores at hand: the policy tuner checks a
// candidate policy against the defaults with it, the sharded benchmark a sharded pool against one
// GPU holding every ad.
//
//   if (std::string why = answers_differ(reference, answer); !why.empty()) fail(why);
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kevo/retrieval/reference.hpp"
#include "kevo/retrieval/types.hpp"

namespace kevo::retrieval {

/// Whether `answer` is `reference`'s answer to the same request up to the spec's tolerance: the
/// same count, the scores rank by rank within 1e-3 (1 + |s|), and the same ads except those within
/// tolerance of the K-th score (ties there may fall either way). Empty when they agree, else why.
inline std::string answers_differ(const std::vector<ScoredAd>& reference, const std::vector<ScoredAd>& answer) {
  if (answer.size() != reference.size())
    return "returned " + std::to_string(answer.size()) + " ads where the reference returns " + std::to_string(reference.size());
  for (std::size_t i = 0; i < answer.size(); ++i)
    if (std::fabs(answer[i].score - reference[i].score) > score_tolerance(reference[i].score))
      return "rank " + std::to_string(i) + " scored " + std::to_string(answer[i].score) + " where the reference scores " +
             std::to_string(reference[i].score);
  if (answer.empty()) return {};
  const double kth = reference.back().score;
  std::map<std::uint32_t, float> returned;
  for (const ScoredAd& a : answer) returned[a.id] = a.score;
  for (const ScoredAd& r : reference)
    if (!returned.count(r.id) && std::fabs(r.score - kth) > score_tolerance(kth))
      return "ad " + std::to_string(r.id) + " (score " + std::to_string(r.score) + ") is missing";
  return {};
}

}  // namespace kevo::retrieval
