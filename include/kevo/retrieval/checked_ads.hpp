// kevo/retrieval/checked_ads.hpp: a batch of ads that validate_ad accepted for one schema. Only
// check_ads makes one, so an engine handed a CheckedAds applies it without checking it again. A
// sharded pool checks each shard's part once, on that shard's thread, and applies none until every
// part passed: a bad ad still changes nothing, and no ad is checked twice.
//
//   expected<CheckedAds, Error> checked = check_ads(schema, ads);  // the first bad ad's message
//   if (checked) backend.upsert_checked(*checked);
//
// A CheckedAds refers to the ads and the schema it was checked against: it lives no longer than
// they do. A shard's part is the positions of its ads in the batch, so routing copies no ad.
#pragma once

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kevo/retrieval/ad_pool.hpp"
#include "kevo/retrieval/reference.hpp"
#include "kevo/retrieval/types.hpp"

namespace kevo::retrieval {

/// Whether ads checked against `a` are valid in a pool of `b`.
inline bool same_schema(const Schema& a, const Schema& b) {
  return &a == &b || (a.dim == b.dim && a.embedding_type == b.embedding_type && a.category_values == b.category_values);
}

/// Ads of one batch that check_ads accepted: the whole batch, or the ads at chosen positions in it
/// (a shard's part), read in place: a part is never copied out of its batch.
class CheckedAds {
 public:
  std::size_t size() const { return whole_ ? batch_.size() : picked_.size(); }
  const AdRecord& operator[](std::size_t i) const { return whole_ ? batch_[i] : batch_[picked_[i]]; }
  const Schema& schema() const { return *schema_; }
  /// The ads as one span: the batch itself when it is whole, else copies of the part in `scratch`
  /// (for an engine that takes only a span; the GPU index reads the part in place).
  std::span<const AdRecord> contiguous(std::vector<AdRecord>& scratch) const {
    if (whole_) return batch_;
    scratch.clear();
    scratch.reserve(picked_.size());
    for (std::uint32_t i : picked_) scratch.push_back(batch_[i]);
    return scratch;
  }

 private:
  CheckedAds(const Schema& schema, std::span<const AdRecord> batch, std::vector<std::uint32_t> picked, bool whole)
      : schema_(&schema), batch_(batch), picked_(std::move(picked)), whole_(whole) {}
  friend expected<CheckedAds, Error> check_ads(const Schema& schema, std::span<const AdRecord> ads);
  friend expected<CheckedAds, Error> check_ads(const Schema& schema, std::span<const AdRecord> ads,
                                               std::vector<std::uint32_t> picked);

  const Schema* schema_;
  std::span<const AdRecord> batch_;
  std::vector<std::uint32_t> picked_;  // positions in batch_, where not whole_
  bool whole_;
};

namespace detail {
/// The first bad ad's message among ads[at(0)], ads[at(1)], ... ads[at(n - 1)], checked over threads.
template <class Position>
expected<void, Error> first_bad_ad(const Schema& schema, std::span<const AdRecord> ads, std::size_t n, Position at) {
  return first_problem(n, [&](std::size_t i) {
    auto checked = validate_ad(schema, ads[at(i)]);
    return checked ? std::string() : checked.error().message;
  });
}
}  // namespace detail

/// Every ad of the batch checked against `schema` (over threads: it is most of a batch's host
/// work); the first bad ad's message, or the batch.
inline expected<CheckedAds, Error> check_ads(const Schema& schema, std::span<const AdRecord> ads) {
  if (auto ok = detail::first_bad_ad(schema, ads, ads.size(), [](std::size_t i) { return i; }); !ok)
    return unexpected(ok.error());
  return CheckedAds(schema, ads, {}, true);
}

/// The ads at positions `picked` of the batch (a shard's part), checked the same way; the others
/// are neither checked nor part of the result.
inline expected<CheckedAds, Error> check_ads(const Schema& schema, std::span<const AdRecord> ads,
                                             std::vector<std::uint32_t> picked) {
  for (std::uint32_t i : picked)
    if (i >= ads.size())
      return make_error("position " + std::to_string(i) + " is past a batch of " + std::to_string(ads.size()) + " ads",
                        ErrorKind::bug);
  if (auto ok = detail::first_bad_ad(schema, ads, picked.size(), [&](std::size_t i) { return picked[i]; }); !ok)
    return unexpected(ok.error());
  return CheckedAds(schema, ads, std::move(picked), false);
}

}  // namespace kevo::retrieval
