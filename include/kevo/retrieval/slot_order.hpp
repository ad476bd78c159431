// kevo/retrieval/slot_order.hpp: the order in which to hand a bulk load its ads. A new ad takes the
// next free slot, and scoring gathers a request's eligible ads in slot order. Grouping ads by their
// targeting puts the ads that one request finds eligible in runs of neighbouring slots, which the
// GPU reads closer to streaming speed: on the benchmark's workload the mean run grows from 1.6 ads
// to about 10, and at 100M ads the gather of 64-byte int8 rows went from 65% to 79% of the
// roofline (benchmarks/RESULTS.md, run 136). Answers do not depend on the order.
//
//   std::vector<std::size_t> order = targeting_order(ads);  // positions into ads
//   for (std::size_t i : order) packed.push_back(ads[i]);      // then one upsert of the batch
//
// The order holds only while slots keep their ads: a replacement keeps its slot whatever its new
// targeting, and a new ad takes a freed slot wherever one is.
#pragma once

#include "kevo/retrieval/types.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

namespace kevo::retrieval {

/// Ads with fewer clauses first (those with none are eligible for every request, and form the
/// longest run), then by their two smallest (category, value) allow clauses. Whatever order an ad
/// lists its clauses in, the key is the same.
inline std::uint64_t targeting_order_key(std::span<const Clause> clauses) {
  constexpr std::uint32_t kValueBits = 17;  // a category's values fit (the schema allows up to 2^17)
  std::uint64_t smallest[2] = {~std::uint64_t{0}, ~std::uint64_t{0}};
  for (const Clause& c : clauses) {
    if (c.exclude) continue;
    const std::uint64_t pair = std::uint64_t{c.category & 31u} << kValueBits | std::min(c.value, (1u << kValueBits) - 1);
    if (pair < smallest[0]) smallest[1] = smallest[0], smallest[0] = pair;
    else if (pair < smallest[1]) smallest[1] = pair;
  }
  constexpr std::uint64_t kPairMask = (std::uint64_t{1} << (kValueBits + 5)) - 1;  // 22 bits a pair
  return std::uint64_t{std::min<std::size_t>(clauses.size(), 63)} << 58 | (smallest[0] & kPairMask) << 22 |
         (smallest[1] & kPairMask);
}

/// Positions 0 .. keys.size() - 1 in the order of their keys; equal keys keep their order.
inline std::vector<std::size_t> order_by_key(std::span<const std::uint64_t> keys) {
  std::vector<std::size_t> order(keys.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return keys[a] < keys[b]; });
  return order;
}

/// Positions into `ads` in targeting_order_key order; ads with equal keys keep their order.
inline std::vector<std::size_t> targeting_order(std::span<const AdRecord> ads) {
  std::vector<std::uint64_t> keys(ads.size());
  for (std::size_t i = 0; i < ads.size(); ++i) keys[i] = targeting_order_key(ads[i].clauses);
  return order_by_key(keys);
}

}  // namespace kevo::retrieval
