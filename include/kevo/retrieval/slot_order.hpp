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

#include "kevo/config.hpp"
#include "kevo/retrieval/types.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace kevo::retrieval {

/// The order in which a bulk load hands its ads their slots: as they come (by id, in the
/// benchmarks' workloads), or grouped by targeting (targeting_order below). Scoring's best policy
/// can differ between the two, so a tuned policy records the order it was measured in.
enum class SlotOrder { by_id, by_targeting };

inline std::string_view to_string(SlotOrder order) { return order == SlotOrder::by_targeting ? "targeting" : "id"; }
inline std::optional<SlotOrder> slot_order_named(std::string_view name) {
  if (name == "id") return SlotOrder::by_id;
  if (name == "targeting") return SlotOrder::by_targeting;
  return std::nullopt;
}

/// Ads with fewer clauses first (those with none are eligible for every request, and form the
/// longest run), then by their two smallest (category, value) allow clauses. Whatever order an ad
/// lists its clauses in, the key is the same. Fed one clause at a time, so that the host (from
/// Clause values) and the device (from an ad's packed run, DeviceAdIndex::regroup) key alike.
class TargetingOrderKey {
 public:
  KEVO_HOST_DEVICE void add(std::uint32_t category, std::uint32_t value, bool exclude) {
    ++clauses_;
    if (exclude) return;
    const std::uint32_t capped = value < kValueLimit ? value : kValueLimit - 1;  // the schema allows up to 2^17 values
    const std::uint64_t pair = std::uint64_t{category & 31u} << kValueBits | capped;
    if (pair < smallest_[0]) smallest_[1] = smallest_[0], smallest_[0] = pair;
    else if (pair < smallest_[1]) smallest_[1] = pair;
  }
  KEVO_HOST_DEVICE std::uint64_t key() const {
    constexpr std::uint64_t kPairMask = (std::uint64_t{1} << (kValueBits + 5)) - 1;  // 22 bits a pair
    const std::uint64_t count = clauses_ < 63 ? clauses_ : 63;
    return count << 58 | (smallest_[0] & kPairMask) << 22 | (smallest_[1] & kPairMask);
  }

 private:
  static constexpr std::uint32_t kValueBits = 17, kValueLimit = 1u << kValueBits;
  std::uint64_t smallest_[2] = {~std::uint64_t{0}, ~std::uint64_t{0}};
  std::uint32_t clauses_ = 0;
};

inline std::uint64_t targeting_order_key(std::span<const Clause> clauses) {
  TargetingOrderKey key;
  for (const Clause& c : clauses) key.add(c.category, c.value, c.exclude);
  return key.key();
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
