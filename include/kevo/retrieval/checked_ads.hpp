// kevo/retrieval/checked_ads.hpp: a batch of ads that validate_ad accepted for one schema. Only
// check_ads makes one, so an engine handed a CheckedAds applies it without checking it again. A
// sharded pool checks each shard's part once, on that shard's thread, and applies none until every
// part passed: a bad ad still changes nothing, and no ad is checked twice.
//
//   expected<CheckedAds, Error> checked = check_ads(schema, ads);  // the first bad ad's message
//   if (checked) backend.upsert_checked(*checked);
//
// A CheckedAds refers to the ads and the schema it was checked against: it lives no longer than
// they do.
#pragma once

#include <span>

#include "kevo/retrieval/ad_pool.hpp"
#include "kevo/retrieval/reference.hpp"
#include "kevo/retrieval/types.hpp"

namespace kevo::retrieval {

/// Whether ads checked against `a` are valid in a pool of `b`.
inline bool same_schema(const Schema& a, const Schema& b) {
  return &a == &b || (a.dim == b.dim && a.embedding_type == b.embedding_type && a.category_values == b.category_values);
}

class CheckedAds {
 public:
  std::span<const AdRecord> ads() const { return ads_; }
  const Schema& schema() const { return *schema_; }
  std::size_t size() const { return ads_.size(); }

 private:
  CheckedAds(const Schema& schema, std::span<const AdRecord> ads) : schema_(&schema), ads_(ads) {}
  friend expected<CheckedAds, Error> check_ads(const Schema& schema, std::span<const AdRecord> ads);

  const Schema* schema_;
  std::span<const AdRecord> ads_;
};

/// Every ad of the batch checked against `schema` (over threads: it is most of a batch's host
/// work); the first bad ad's message, or the batch.
inline expected<CheckedAds, Error> check_ads(const Schema& schema, std::span<const AdRecord> ads) {
  if (auto ok = first_problem(ads.size(), [&](std::size_t i) {
        auto checked = validate_ad(schema, ads[i]);
        return checked ? std::string() : checked.error().message;
      });
      !ok)
    return unexpected(ok.error());
  return CheckedAds(schema, ads);
}

}  // namespace kevo::retrieval
