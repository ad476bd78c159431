// kevo/retrieval/dispatch/device_ad_index.cuh: the ad pool on the GPU with real-time updates.
//
// Layout (struct of arrays, slot i of each belongs to one ad): ids, one targeting word (live bit,
// has-clauses bit, offset of the ad's clause run in 16-byte units), the embedding row (fp16, or
// int8 with a scale), the bias, and an append-only arena of packed clauses, each ad's run padded
// to 16 bytes; for matching, a header byte per slot and per-segment postings (below). The clause
// runs are what a reindex builds postings from, and what matching walks for ads not yet indexed.
//
// Replacing or expiring an ad leaves its old clause run in the arena; when a batch does not fit, the
// live runs are packed into a fresh arena (compact_clause_arena), as one more ordered update.
// `regroup` moves the live ads' rows into slots in targeting order (slot_order.hpp) the same way,
// once updates have scattered the order a bulk load gave them.
//
// Matching does not walk every ad's run: `reindex` builds, per segment of kSegmentSlots slots, an
// inverted index from query bit to the segment's ads (agent/matching.cuh), and a header byte per
// slot. An upserted ad is tested by walking its run until the next reindex, which upsert starts by
// itself once `reindex_after` ads have been written since the last one.
//
// No torn reads: updates and searches are ordered on the device by events. An update waits for
// every search enqueued before it, and every search enqueued after it waits for the update, so a
// search sees each ad wholly before or wholly after an update. An upsert or expire returns once
// its batch is enqueued (every later request sees it; `synchronize()` waits for the device), from
// one of two staging buffers, so the next batch stages on the host while this one may still wait
// behind a search. Updates run one at a time (update_mutex_); searches enqueue their device work
// under a second mutex, which an update holds only while it enqueues (an upsert from a compaction
// on), and a reindex only while it swaps the postings it built beside the live ones (so searches
// go on during the 66 ms a 100M-ad rebuild takes).
//
//   auto index = DeviceAdIndex::create(schema, {.capacity = 1 << 20});
//   (*index)->upsert(ads);
//   (*index)->expire(ids);
//
// Why one file of about 1000 lines: the device layout, the update kernels and the host-side packing
// must agree byte for byte.
#pragma once

#include <algorithm>
#include <bit>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <span>
#include <vector>

#include <boost/unordered/unordered_flat_map.hpp>
#include <boost/unordered/unordered_flat_set.hpp>

#include "kevo/retrieval/ad_pool.hpp"
#include "kevo/retrieval/checked_ads.hpp"
#include "kevo/retrieval/dispatch/index_kernels.cuh"
#include "kevo/retrieval/half.hpp"
#include "kevo/retrieval/portability.cuh"
#include "kevo/retrieval/reference.hpp"
#include "kevo/retrieval/types.hpp"

namespace kevo::retrieval {

/// Ads as arrays, for bulk loads: clauses in CSR form (already packed with clause_bits, the last
/// of each ad flagged). The rows come as d values an ad (`embeddings`, rounded to the pool's
/// storage), or for an int8 pool as that storage itself (`quantized_values` and `quantized_scales`,
/// taken as they are). Leaving both empty keeps the rows on the device as they are, for a caller
/// that fills them with its own kernel through DeviceAdIndex::embeddings().
struct PackedAds {
  std::vector<std::uint32_t> ids;
  std::vector<float> bias;
  std::vector<std::uint8_t> live;
  std::vector<std::uint32_t> clause_begin{0};  // (n + 1)
  std::vector<std::uint32_t> clauses;
  std::vector<float> embeddings;              // (n, d) or empty
  std::vector<std::int8_t> quantized_values;  // (n, d) or empty
  std::vector<float> quantized_scales;        // (n, scales_per_ad) or empty

  std::size_t size() const { return ids.size(); }
  /// Appends one ad, its embedding as it came: a batch takes every ad's embedding the same way.
  void push_back(const AdRecord& ad) {
    ids.push_back(ad.id);
    bias.push_back(ad.bias);
    live.push_back(ad.live ? 1 : 0);
    clauses.resize(clauses.size() + ad.clauses.size());
    pack_clauses(ad, clauses.data() + clause_begin.back());
    clause_begin.push_back(static_cast<std::uint32_t>(clauses.size()));
    embeddings.insert(embeddings.end(), ad.embedding.begin(), ad.embedding.end());
    quantized_values.insert(quantized_values.end(), ad.quantized.values.begin(), ad.quantized.values.end());
    quantized_scales.insert(quantized_scales.end(), ad.quantized.scales.begin(), ad.quantized.scales.end());
  }
  /// Checked ads of a pool of `schema`, packed over `parts` threads. In an int8 pool, a batch in
  /// which any ad came quantized is packed quantized (the others quantised as the pool would).
  /// `Ads`: anything with size() and [] giving AdRecords (a span, or a CheckedAds part read in place).
  template <class Ads>
  static PackedAds from(const Ads& ads, const Schema& schema, unsigned parts) {
    const std::size_t n = ads.size(), dim = static_cast<std::size_t>(schema.dim);
    bool quantized = false;
    for (std::size_t i = 0; i < n && !quantized; ++i) quantized = !ads[i].quantized.values.empty();
    const auto scales = static_cast<std::size_t>(scales_per_ad(schema.embedding_type, schema.dim));
    PackedAds p;
    p.ids.resize(n);
    p.bias.resize(n);
    p.live.resize(n);
    p.clause_begin.resize(n + 1);
    for (std::size_t i = 0; i < n; ++i)
      p.clause_begin[i + 1] = p.clause_begin[i] + static_cast<std::uint32_t>(ads[i].clauses.size());
    p.clauses.resize(p.clause_begin[n]);
    if (quantized) {
      p.quantized_values.resize(n * dim);
      p.quantized_scales.resize(n * scales);
    } else {
      p.embeddings.resize(n * dim);
    }
    parallel_for_ranges(n, parts, [&](unsigned, std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) {
        const AdRecord& ad = ads[i];
        p.ids[i] = ad.id;
        p.bias[i] = ad.bias;
        p.live[i] = ad.live ? 1 : 0;
        pack_clauses(ad, p.clauses.data() + p.clause_begin[i]);
        if (quantized) {
          write_stored_int8_form(schema.embedding_type, ad, std::span(p.quantized_values).subspan(i * dim, dim),
                                 std::span(p.quantized_scales).subspan(i * scales, scales));
        } else {
          std::copy(ad.embedding.begin(), ad.embedding.end(), p.embeddings.begin() + static_cast<std::ptrdiff_t>(i * dim));
        }
      }
    });
    return p;
  }

 private:
  /// An ad's clauses as the device holds them, the last one flagged.
  static void pack_clauses(const AdRecord& ad, std::uint32_t* out) {
    for (std::size_t c = 0; c < ad.clauses.size(); ++c)
      out[c] = clause_bits::pack(ad.clauses[c], c + 1 == ad.clauses.size());
  }
};

class DeviceAdIndex {
 public:
  struct Options {
    std::size_t capacity = 1u << 20;  // slots
    /// Packed clauses the arena starts with; 0 means 8 per slot. It grows on demand (doubling, up
    /// to max_clause_capacity), so this only saves the first growths' copies.
    std::size_t clause_capacity = 0;
    /// The arena's limit: 0 means as far as its 30-bit quad offsets reach (2^32 clauses, 16 GB).
    std::size_t max_clause_capacity = 0;
    /// Ads written since the last reindex that start the next one; 0 means max(capacity / 32, 65536),
    /// SIZE_MAX only explicit reindex() calls.
    std::size_t reindex_after = 0;
    /// Segments a reindex builds at once, 1 to 512: its temporaries grow with it (~22 B per
    /// posting of a slice: ~450 MB for 512 segments at the headline workload).
    std::uint32_t reindex_slice_segments = 512;
  };

  static expected<std::unique_ptr<DeviceAdIndex>, Error> create(const Schema& schema, Options options) {
    if (auto ok = validate_schema(schema); !ok) return unexpected(ok.error());
    if (schema.dim != 64 && schema.dim != 128 && schema.dim != 256)
      return make_error("the GPU index holds d = 64, 128 or 256");
    if (options.capacity == 0 || options.capacity > (1ull << 31)) return make_error("capacity from 1 to 2^31 slots");
    const std::size_t offset_limit = (std::size_t{targeting_bits::offset_mask} + 1) * 4;
    if (options.max_clause_capacity == 0) options.max_clause_capacity = offset_limit;
    if (options.max_clause_capacity > offset_limit) return make_error("max_clause_capacity above 2^32");
    if (options.clause_capacity == 0) options.clause_capacity = std::min(options.capacity * 8, options.max_clause_capacity);
    options.clause_capacity = (options.clause_capacity + 3) & ~std::size_t{3};
    options.max_clause_capacity &= ~std::size_t{3};
    if (options.clause_capacity > options.max_clause_capacity) return make_error("clause_capacity above max_clause_capacity");
    if (options.reindex_slice_segments < 1 || options.reindex_slice_segments > 512)
      return make_error("reindex_slice_segments from 1 to 512");
    if (options.reindex_after == 0) options.reindex_after = std::max<std::size_t>(options.capacity / 32, 65536);
    std::unique_ptr<DeviceAdIndex> index(new DeviceAdIndex(schema, options));
    if (auto ok = index->allocate(); !ok) return unexpected(ok.error());
    return index;
  }

  ~DeviceAdIndex() {
    // Updates still in flight read the staging (the buffers are freed after this, as members).
    if (update_stream_) (void)gpu_stream_synchronize(update_stream_);
    for (StagingBuffer& b : staging_)
      if (b.consumed) (void)gpu_event_destroy(b.consumed);
    for (auto& [stream, event] : search_events_) (void)gpu_event_destroy(event);
    if (updated_) (void)gpu_event_destroy(updated_);
    if (update_stream_) (void)gpu_stream_destroy(update_stream_);
  }
  DeviceAdIndex(const DeviceAdIndex&) = delete;
  DeviceAdIndex& operator=(const DeviceAdIndex&) = delete;

  const Schema& schema() const { return schema_; }
  std::size_t capacity() const { return options_.capacity; }
  std::size_t row_bytes() const {
    return static_cast<std::size_t>(schema_.dim) * (schema_.embedding_type == EmbeddingType::fp16 ? 2 : 1);
  }
  /// Device bytes each slot holds: row, id, targeting word, bias, scale (int8), match header, and
  /// its share of the arena and of matching's postings (2 bytes per indexed clause) and hash tables.
  std::size_t bytes_per_slot() const {
    std::lock_guard lock(update_mutex_);
    return row_bytes() + 9 + 4 * static_cast<std::size_t>(side_width()) +
           4 * options_.clause_capacity / options_.capacity +
           (slots_ ? (2 * postings_count_ + 8 * table_entries_) / slots_ : 0);
  }
  /// Ads that matching tests by walking their clause runs: those written since the last reindex,
  /// and those with more than 64 clauses. (An ad with more than 7 restricted categories is indexed
  /// by its first 7 and walked only when they are met.)
  std::size_t unindexed_count() const {
    std::lock_guard lock(update_mutex_);
    return walk_count_ + wide_count_;
  }
  std::size_t live_count() const {
    std::lock_guard lock(update_mutex_);
    return id_to_slot_.size();
  }
  /// The high-water mark of used slots: rows [0, slot_count()) belong to ads, live or not.
  std::size_t slot_count() const {
    std::lock_guard lock(update_mutex_);
    return slots_;
  }
  std::uint32_t total_query_bits() const { return total_query_bits_; }
  /// The first query-bitmap bit of each category, on the device and on the host.
  const std::uint32_t* category_offsets() const { return category_offsets_.get(); }
  const std::vector<std::uint32_t>& host_category_offsets() const { return host_category_offsets_; }
  /// Caller-visible rows, (capacity, d) of __half or int8, and each slot's side record, (capacity,
  /// side_width()) 32-bit words: the bias, then the scale words at its tail (views.cuh). For bulk fills.
  void* embeddings() { return embeddings_.get(); }
  float* side_values() { return side_.get(); }
  /// Each slot's ad id, (capacity) on the device: which ad a bulk fill's row belongs to.
  const std::uint32_t* slot_ids() const { return ids_.get(); }
  int side_width() const { return retrieval::side_width(schema_.embedding_type, schema_.dim); }
  int scale_words() const { return retrieval::scale_words(schema_.embedding_type, schema_.dim); }

  /// Inserts or replaces ads (all or none: a bad ad fails the batch before anything changes).
  /// Returns once the batch is enqueued: every search that starts later sees it, every search
  /// already enqueued does not. `synchronize()` waits until it is applied.
  expected<void, Error> upsert(std::span<const AdRecord> ads) {
    auto checked = check_ads(schema_, ads);
    if (!checked) return unexpected(checked.error());
    return upsert(*checked);
  }

  /// A batch that check_ads accepted for this pool's schema, packed and applied without a second
  /// check: validate_ad has checked what check_packed would, and packing cannot make ads wrong.
  expected<void, Error> upsert(const CheckedAds& ads) {
    if (!same_schema(ads.schema(), schema_)) return make_error("these ads were checked against another schema than this pool's");
    return upsert_checked(PackedAds::from(ads, schema_, batch_threads(ads.size())));
  }

  expected<void, Error> upsert(const PackedAds& ads) {
    if (auto ok = check_packed(ads); !ok) return ok;
    return upsert_checked(ads);
  }

 private:
  /// A PackedAds batch as a caller built it: everything matching and scoring rely on (the rows'
  /// values over threads: 1.3 M of them in a 10,000-ad batch).
  expected<void, Error> check_packed(const PackedAds& ads) const {
    const std::size_t n = ads.size(), d = static_cast<std::size_t>(schema_.dim);
    const auto scales = static_cast<std::size_t>(scales_per_ad(schema_.embedding_type, schema_.dim));
    const bool quantized = !ads.quantized_values.empty() || !ads.quantized_scales.empty();
    if (ads.bias.size() != n || ads.live.size() != n || ads.clause_begin.size() != n + 1 ||
        (!ads.embeddings.empty() && ads.embeddings.size() != n * d) ||
        (quantized && (ads.quantized_values.size() != n * d || ads.quantized_scales.size() != n * scales)))
      return make_error("PackedAds: arrays of different lengths");
    if (quantized && !ads.embeddings.empty())
      return make_error("PackedAds: give every ad's embedding the same way: embeddings or quantized_values, not both");
    if (quantized && !is_int8(schema_.embedding_type))
      return make_error("PackedAds: quantized_values need an int8 pool; this one holds fp16 (give embeddings instead)");
    if (ads.clause_begin.front() != 0 || ads.clause_begin.back() != ads.clauses.size())
      return make_error("PackedAds: clause_begin must run from 0 to the number of clauses");
    for (std::size_t i = 0; i < n; ++i)
      if (ads.clause_begin[i + 1] < ads.clause_begin[i])
        return make_error("PackedAds: clause_begin runs backwards at ad " + std::to_string(i));
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t begin = ads.clause_begin[i], end = ads.clause_begin[i + 1];
      // Matching walks a run until its flagged last clause: a run flagged anywhere else would read
      // into the next ad's clauses.
      for (std::uint32_t c = begin; c < end; ++c)
        if (((ads.clauses[c] & clause_bits::last) != 0) != (c + 1 == end))
          return make_error("PackedAds: ad " + std::to_string(i) + "'s clauses must flag their last one, and only it");
    }
    for (std::uint32_t packed : ads.clauses) {
      const std::uint32_t c = clause_bits::category(packed);
      if (c >= schema_.category_values.size() || clause_bits::value(packed) >= schema_.category_values[c])
        return make_error("PackedAds: a clause is outside the schema");
    }
    for (std::size_t i = 0; i < n; ++i)
      if (!is_finite(ads.bias[i])) return make_error("PackedAds: ad " + std::to_string(i) + "'s bias must be finite");
    if (quantized)
      return first_problem(n, [&](std::size_t i) {
        auto ok = check_quantized_embedding(schema_, std::span(ads.quantized_values).subspan(i * d, d),
                                            std::span(ads.quantized_scales).subspan(i * scales, scales));
        return ok ? std::string() : "PackedAds: ad " + std::to_string(i) + ": " + ok.error().message;
      });
    if (ads.embeddings.empty()) return {};
    return first_problem(n, [&](std::size_t i) {
      for (std::size_t k = i * d; k < (i + 1) * d; ++k)
        if (auto ok = check_embedding_value(schema_, ads.embeddings[k]); !ok)
          return "PackedAds: ad " + std::to_string(i) + ": " + ok.error().message;
      return std::string();
    });
  }

  /// Inserts or replaces a checked batch (the two upserts' common part).
  expected<void, Error> upsert_checked(const PackedAds& ads) {
    const std::size_t n = ads.size();
    std::lock_guard update(update_mutex_);
    // Searches run on while the batch is staged on the host; they are held off only while it is
    // enqueued, or from a compaction on (the runs it drops would read as ANY until the batch is in).
    // The call does not wait for the device: the batch stages into one of two buffers while the
    // other's batch may still be waiting behind a search (runs 20-21 of benchmarks/RESULTS.md
    // measured what waiting cost: 0.91 M ads/s while searching).
    std::unique_lock<std::mutex> held(mutex_, std::defer_lock);
    // One write per slot per batch (the scatter kernel writes slots in parallel): the last entry of
    // an id wins, a new id that is not live takes no slot, and slots freed here are reused only by
    // later batches.
    std::vector<char> last_of_id(n, 0);
    {
      boost::unordered_flat_set<std::uint32_t> seen;
      seen.reserve(n);
      for (std::size_t i = n; i-- > 0;) last_of_id[i] = seen.insert(ads.ids[i]).second;
    }
    // The id map is large and cold: look each id up once, over threads (finds only, which may run
    // at once). current[i]: the slot ad i replaces, if any.
    constexpr std::uint32_t no_slot = ~0u;
    std::vector<std::uint32_t> current(n, no_slot);
    const unsigned lookup_parts = batch_threads(n);
    std::vector<std::size_t> fresh_in_part(lookup_parts, 0);
    parallel_for_ranges(n, lookup_parts, [&](unsigned part, std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) {
        if (!last_of_id[i]) continue;
        if (auto it = id_to_slot_.find(ads.ids[i]); it != id_to_slot_.end()) current[i] = it->second;
        else if (ads.live[i]) ++fresh_in_part[part];
      }
    });
    const std::size_t fresh = std::accumulate(fresh_in_part.begin(), fresh_in_part.end(), std::size_t{0});
    if (fresh > free_slots_.size() + (options_.capacity - slots_)) return make_error("the index is full", ErrorKind::capacity);
    // Each ad's clause run starts on a 16-byte boundary (matching reads runs four clauses at a time).
    std::vector<std::uint32_t> padded_begin(n + 1, 0);
    for (std::size_t i = 0; i < n; ++i)
      padded_begin[i + 1] = padded_begin[i] + ((ads.clause_begin[i + 1] - ads.clause_begin[i] + 3u) & ~3u);
    const std::size_t padded_clauses = padded_begin[n];
    // Staging first: once a compaction has dropped this batch's old runs, nothing may fail on the host.
    const bool quantized_rows = !ads.quantized_values.empty();
    const auto scales_per_row = static_cast<std::size_t>(scales_per_ad(schema_.embedding_type, schema_.dim));
    const bool with_rows = !ads.embeddings.empty() || quantized_rows;
    Staging s = staging_layout(n, padded_clauses, with_rows);
    auto staging = take_staging(s.total);
    if (!staging) return unexpected(staging.error());
    unsigned char* const host_staging = (*staging)->host.get();
    if (arena_tail_ + padded_clauses > options_.clause_capacity) {
      // Replaced and expired ads left their runs behind. Count what stays live once this batch is in
      // (its own replaced ads' runs become garbage too), and pack it into a fresh arena: twice as
      // large (up to the limit) when it would be more than 7/8 full, so that a full arena is not
      // packed again on every batch. Past the limit, refuse the batch with nothing changed.
      std::vector<std::uint32_t> replaced;
      std::size_t kept = live_clauses_;
      for (std::size_t i = 0; i < n; ++i)
        if (current[i] != no_slot) {
          replaced.push_back(current[i]);
          kept -= run_clauses_[current[i]];
        }
      const std::size_t needed = kept + padded_clauses;
      if (needed > options_.max_clause_capacity)
        return make_error("the clause arena is full: live ads hold " + std::to_string(kept) + " packed clauses, this batch needs " +
                          std::to_string(padded_clauses) + " more, and the arena's limit is " +
                          std::to_string(options_.max_clause_capacity) + " (max_clause_capacity)",
                          ErrorKind::capacity);
      std::size_t capacity = options_.clause_capacity;
      if (needed > capacity / 8 * 7)
        capacity = std::min(options_.max_clause_capacity, std::max(2 * capacity, (needed + needed / 4 + 3) & ~std::size_t{3}));
      held.lock();
      if (auto ok = compact_clause_arena(replaced, capacity); !ok) return ok;
    }

    auto* slots = reinterpret_cast<std::uint32_t*>(host_staging + s.slots);
    auto* ids = reinterpret_cast<std::uint32_t*>(host_staging + s.ids);
    auto* targeting = reinterpret_cast<std::uint32_t*>(host_staging + s.targeting);
    auto* bias = reinterpret_cast<float*>(host_staging + s.bias);
    auto* scale = reinterpret_cast<float*>(host_staging + s.scale);  // (n, scale_words())
    auto* run = reinterpret_cast<std::uint32_t*>(host_staging + s.clauses);
    std::fill(run, run + padded_clauses, 0u);
    for (std::size_t i = 0; i < n; ++i)
      std::copy(ads.clauses.begin() + ads.clause_begin[i], ads.clauses.begin() + ads.clause_begin[i + 1],
                run + padded_begin[i]);
    // Slots first, in order (the id map is not shared across threads); then the rows, in parallel.
    std::size_t high_water = slots_;
    std::vector<std::uint32_t> freed;
    std::vector<std::pair<std::size_t, std::uint32_t>> entries;  // (ad, slot) in staging order
    entries.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (!last_of_id[i]) continue;
      std::uint32_t slot;
      if (current[i] != no_slot) {
        slot = current[i];
        if (!ads.live[i]) {
          id_to_slot_.erase(ads.ids[i]);
          freed.push_back(slot);
        }
      } else if (!ads.live[i]) {
        continue;
      } else if (!free_slots_.empty()) {
        slot = free_slots_.back();
        free_slots_.pop_back();
        id_to_slot_[ads.ids[i]] = slot;
      } else {
        slot = static_cast<std::uint32_t>(high_water++);
        id_to_slot_[ads.ids[i]] = slot;
      }
      entries.emplace_back(i, slot);
    }
    const std::size_t written = entries.size();
    const unsigned parts = batch_threads(written);
    std::vector<std::int64_t> clause_delta(parts, 0);  // per part: change in live_clauses_
    parallel_for_ranges(written, parts, [&](unsigned part, std::size_t begin, std::size_t end) {
      for (std::size_t w = begin; w < end; ++w) {
        const auto [i, slot] = entries[w];
        slots[w] = slot;
        ids[w] = ads.ids[i];
        bias[w] = ads.bias[i];
        const bool has_clauses = ads.clause_begin[i + 1] > ads.clause_begin[i];
        const std::uint32_t run = ads.live[i] ? padded_begin[i + 1] - padded_begin[i] : 0u;
        clause_delta[part] += static_cast<std::int64_t>(run) - run_clauses_[slot];
        run_clauses_[slot] = run;  // distinct slots: no race
        targeting[w] = (ads.live[i] ? targeting_bits::live : 0u) |
                       (has_clauses ? targeting_bits::has_clauses |
                                          static_cast<std::uint32_t>((arena_tail_ + padded_begin[i]) / 4) : 0u);
        unsigned char* row = host_staging + s.rows + w * row_bytes();
        float* words = scale + w * static_cast<std::size_t>(scale_words());
        if (quantized_rows)
          write_stored_row(ads.quantized_values.data() + i * schema_.dim,
                           ads.quantized_scales.data() + i * scales_per_row, row, words);
        else if (with_rows)
          write_row(ads.embeddings.data() + i * schema_.dim, row, words);
      }
    });
    for (std::int64_t delta : clause_delta) live_clauses_ = static_cast<std::size_t>(static_cast<std::int64_t>(live_clauses_) + delta);
    for (const auto& [i, slot] : entries) walk_count_ += ads.live[i] ? 1 : 0;
    free_slots_.insert(free_slots_.end(), freed.begin(), freed.end());
    auto ok = enqueue_batch(held, **staging, [&]() -> expected<void, Error> {
      slots_ = high_water;
      auto* d = (*staging)->device.get();
      KEVO_GPU_TRY(gpu_copy_async(d, host_staging, s.total, update_stream_));
      if (padded_clauses > 0)
        KEVO_GPU_TRY(gpu_copy_async(clauses_.get() + arena_tail_, d + s.clauses, padded_clauses * 4, update_stream_));
      arena_tail_ += padded_clauses;
      if (written > 0)
        kernels::scatter_ads<<<static_cast<unsigned>((written * gpu_logical_warp_size + 255) / 256), 256, 0, update_stream_>>>(
            static_cast<std::uint32_t>(written), reinterpret_cast<std::uint32_t*>(d + s.slots),
            reinterpret_cast<std::uint32_t*>(d + s.ids), reinterpret_cast<std::uint32_t*>(d + s.targeting),
            reinterpret_cast<float*>(d + s.bias), with_rows ? reinterpret_cast<float*>(d + s.scale) : nullptr,
            with_rows ? reinterpret_cast<const uint4*>(d + s.rows) : nullptr, static_cast<int>(row_bytes() / 16), ids_.get(),
            targeting_.get(), side_.get(), side_width(), scale_words(), static_cast<uint4*>(embeddings_.get()), headers_.get());
      KEVO_GPU_TRY(gpu_last_error());
      return {};
    });
    if (!ok) return ok;
    if (walk_count_ < options_.reindex_after) return {};
    if (auto ok = reindex_locked(); !ok)
      return make_error("the batch is enqueued, but the reindex it started failed: " + ok.error().message, ok.error().kind);
    return {};
  }

 public:
  /// Rebuilds matching's postings from every slot's clause run, so that matching reads a header
  /// byte per ad and only the postings of the user's values. Ordered like an update (searches before
  /// it see the old postings, searches after it the new); until it returns, upserted ads are simply
  /// tested by walking their runs. Call it after a bulk load.
  expected<void, Error> reindex() {
    std::lock_guard update(update_mutex_);
    return reindex_locked();
  }

  /// What a regroup did: the live ads it placed, and the slots that expired ads had left free.
  struct Regrouped {
    std::size_t ads = 0;
    std::size_t dropped_slots = 0;
  };

  /// Moves the live ads into slots 0 .. live_count() - 1 in targeting order (targeting_order_key,
  /// slot_order.hpp; equal keys keep their slots' order) and rebuilds matching's postings for them.
  /// Updates scatter a bulk load's grouping (a replacement keeps its slot whatever its new
  /// targeting, a new ad takes whichever slot is free), and scoring reads a pool whose eligible ads
  /// lie in runs closer to streaming speed; this gathers them again, and drops the slots expired
  /// ads left free. Ordered like an update: searches enqueued before it read the old slots, those
  /// after it the new, and no answer changes (ties go to the lower id, not the lower slot).
  /// Searches go on while it works; updates wait. It needs device memory for a second copy of
  /// the rows, ids, targeting and side records, and 24 bytes a slot while it sorts; without it,
  /// it fails with ErrorKind::capacity and changes nothing. Rows move: a caller that keeps
  /// embeddings() or side_values() must ask again.
  expected<Regrouped, Error> regroup() {
    std::lock_guard update(update_mutex_);
    const auto n = static_cast<std::uint32_t>(slots_);
    const auto live = static_cast<std::uint32_t>(id_to_slot_.size());
    const std::size_t capacity = options_.capacity;
    // Everything it needs first, so that a device without room fails with nothing changed.
    DeviceBuffer<std::uint32_t> ids, targeting;
    DeviceBuffer<void> rows;
    DeviceBuffer<float> side;
    GpuScratch scratch;
    std::uint64_t *keys = nullptr, *sorted_keys = nullptr;
    std::uint32_t *slot_of_key = nullptr, *from = nullptr;
    unsigned char* sort_temp = nullptr;
    std::size_t sort_bytes = 0;
    KEVO_GPU_TRY(gpu_cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, sorted_keys, slot_of_key, from, n));
    const std::size_t side_bytes = capacity * 4 * static_cast<std::size_t>(side_width());
    for (gpu_error_t e : {gpu_allocate(ids, capacity * 4), gpu_allocate(targeting, capacity * 4), gpu_allocate(rows, capacity * row_bytes()),
                          gpu_allocate(side, side_bytes), scratch.allocate(keys, n), scratch.allocate(sorted_keys, n),
                          scratch.allocate(slot_of_key, n), scratch.allocate(from, n), scratch.allocate(sort_temp, sort_bytes)})
      if (e != gpu_success) {
        (void)gpu_last_error();  // an allocation's failure is not sticky: later launches must not report it
        return make_error("regroup needs device memory for a second copy of the pool (" +
                              std::to_string(capacity * (8 + row_bytes()) + side_bytes + std::size_t{n} * 24 + sort_bytes) +
                              " bytes): " + gpu_error_string(e),
                          ErrorKind::capacity);
      }
    // Only reads of the index's arrays, which searches never write: no need to wait for them. The
    // updates before it are on this stream.
    gpu_stream_t stream = update_stream_;
    KEVO_GPU_TRY(gpu_memset_async(targeting.get(), 0, capacity * 4, stream));  // slots past the live ads hold none
    if (n > 0) {
      const unsigned grid = std::max(1u, std::min(8192u, (n + 255) / 256));
      kernels::regroup_keys<<<grid, 256, 0, stream>>>(targeting_.get(), clauses_.get(), n, keys, slot_of_key);
      KEVO_GPU_TRY(gpu_cub::DeviceRadixSort::SortPairs(sort_temp, sort_bytes, keys, sorted_keys, slot_of_key, from, n, 0, 64, stream));
      kernels::regroup_gather<<<std::max(1u, std::min(65536u, (live + 7) / 8)), 256, 0, stream>>>(
          from, live, ids_.get(), targeting_.get(), side_.get(), side_width(), static_cast<const uint4*>(embeddings_.get()),
          static_cast<int>(row_bytes() / 16), ids.get(), targeting.get(), side.get(), static_cast<uint4*>(rows.get()));
      KEVO_GPU_TRY(gpu_last_error());
    }
    // The host's bookkeeping for the new slots, prepared before anything is published (the id
    // map's values are rewritten in place after, which cannot fail).
    std::vector<std::uint32_t> moved_from(live), new_slot_of(n, 0);
    std::vector<std::uint32_t> run_clauses(capacity, 0);
    if (live > 0) KEVO_GPU_TRY(gpu_copy_async(moved_from.data(), from, std::size_t{live} * 4, stream));
    KEVO_GPU_TRY(gpu_stream_synchronize(stream));
    parallel_for_ranges(live, batch_threads(live), [&](unsigned, std::size_t begin, std::size_t end) {
      for (std::size_t j = begin; j < end; ++j) {  // distinct old slots: no two threads write one
        new_slot_of[moved_from[j]] = static_cast<std::uint32_t>(j);
        run_clauses[j] = run_clauses_[moved_from[j]];
      }
    });
    const std::size_t old_segments = (std::size_t{n} + kSegmentSlots - 1) / kSegmentSlots;
    const std::size_t new_segments = (std::size_t{live} + kSegmentSlots - 1) / kSegmentSlots;
    bool swapped = false;
    auto published = rebuild_postings(targeting.get(), live, [&]() -> expected<void, Error> {
      // Slots past the live ads hold none, and segments past them have no postings (their tables
      // are freed with the old ones): an upsert may fill them later, to be walked until a reindex.
      if (n > live) KEVO_GPU_TRY(gpu_memset_async(headers_.get() + live, match_header::not_live, n - live, stream));
      if (old_segments > new_segments)
        KEVO_GPU_TRY(gpu_memset_async(segments_.get() + new_segments, 0, (old_segments - new_segments) * sizeof(SegmentDirectory), stream));
      std::swap(ids_, ids);
      std::swap(targeting_, targeting);
      std::swap(embeddings_, rows);
      std::swap(side_, side);
      slots_ = live;
      swapped = true;
      return {};
    });
    if (swapped) {  // the host follows the device, even where waiting for it failed after the swap
      for (auto& [id, slot] : id_to_slot_) slot = new_slot_of[slot];
      run_clauses_.swap(run_clauses);
      free_slots_.clear();
    }
    if (!published) return unexpected(published.error());
    return Regrouped{live, n - live};  // the old arrays are freed here: every search that read them is done
  }

  /// Packed clauses in use in the arena (live runs plus those that replaced or expired ads left
  /// behind until the next compaction), and its capacity.
  std::size_t clause_arena_used() const {
    std::lock_guard lock(update_mutex_);
    return arena_tail_;
  }
  std::size_t clause_arena_capacity() const {
    std::lock_guard lock(update_mutex_);
    return options_.clause_capacity;
  }

  /// Takes ads out of every later search; returns how many of the ids were live.
  expected<std::size_t, Error> expire(std::span<const std::uint32_t> ids) {
    std::lock_guard update(update_mutex_);
    Staging s = staging_layout(ids.size(), 0, false);
    auto staging = take_staging(s.total);
    if (!staging) return unexpected(staging.error());
    auto* slots = reinterpret_cast<std::uint32_t*>((*staging)->host.get() + s.slots);
    auto* targeting = reinterpret_cast<std::uint32_t*>((*staging)->host.get() + s.targeting);
    std::size_t n = 0;
    for (std::uint32_t id : ids) {
      auto it = id_to_slot_.find(id);
      if (it == id_to_slot_.end()) continue;
      slots[n] = it->second;
      targeting[n] = 0;  // not live
      live_clauses_ -= run_clauses_[it->second];
      run_clauses_[it->second] = 0;
      free_slots_.push_back(it->second);
      id_to_slot_.erase(it);
      ++n;
    }
    if (n == 0) return std::size_t{0};
    std::unique_lock<std::mutex> held(mutex_, std::defer_lock);
    auto ok = enqueue_batch(held, **staging, [&]() -> expected<void, Error> {
      auto* d = (*staging)->device.get();
      KEVO_GPU_TRY(gpu_copy_async(d, (*staging)->host.get(), s.total, update_stream_));
      kernels::scatter_ads<<<static_cast<unsigned>((n * gpu_logical_warp_size + 255) / 256), 256, 0, update_stream_>>>(
          static_cast<std::uint32_t>(n), reinterpret_cast<std::uint32_t*>(d + s.slots), nullptr,
          reinterpret_cast<std::uint32_t*>(d + s.targeting), nullptr, nullptr, nullptr, 0, ids_.get(), targeting_.get(), side_.get(),
          side_width(), 0, static_cast<uint4*>(embeddings_.get()), headers_.get());
      KEVO_GPU_TRY(gpu_last_error());
      return {};
    });
    if (!ok) return unexpected(ok.error());
    return n;
  }

  /// Waits until every update enqueued so far is applied on the device (before a caller writes
  /// rows through embeddings() with its own kernels, or reads the index's arrays itself).
  expected<void, Error> synchronize() {
    KEVO_GPU_TRY(gpu_stream_synchronize(update_stream_));
    return {};
  }

  /// Orders a search on `stream` after every update enqueued so far; returns the view it may read.
  /// Call with the lock from `search_lock()` held, then `after_search(stream)` once enqueued.
  /// The index keeps one event for each stream that has ever searched, and every update waits on
  /// all of them: search from a fixed set of streams (a pool), not a new stream per request.
  std::unique_lock<std::mutex> search_lock() const { return std::unique_lock<std::mutex>(mutex_); }
  expected<IndexView, Error> before_search(gpu_stream_t stream) {
    KEVO_GPU_TRY(gpu_stream_wait_event(stream, updated_));
    return IndexView{ids_.get(), targeting_.get(), clauses_.get(), embeddings_.get(), side_.get(), PostingsView{headers_.get(), postings_.get(), segments_.get()},
                     static_cast<std::uint32_t>(slots_)};
  }
  expected<void, Error> after_search(gpu_stream_t stream) {
    auto it = std::find_if(search_events_.begin(), search_events_.end(), [&](auto& p) { return p.first == stream; });
    if (it == search_events_.end()) {
      gpu_event_t event;
      KEVO_GPU_TRY(gpu_event_create(&event));
      search_events_.emplace_back(stream, event);
      it = std::prev(search_events_.end());
    }
    KEVO_GPU_TRY(gpu_event_record(it->second, stream));
    return {};
  }

 private:
  DeviceAdIndex(Schema schema, Options options) : schema_(std::move(schema)), options_(options) {
    id_to_slot_.reserve(options.capacity);
    run_clauses_.assign(options.capacity, 0);
  }

  expected<void, Error> allocate() {
    const std::size_t n = options_.capacity;
    KEVO_GPU_TRY(gpu_allocate(ids_, n * 4));
    KEVO_GPU_TRY(gpu_allocate(targeting_, n * 4));
    KEVO_GPU_TRY(gpu_allocate(clauses_, options_.clause_capacity * 4));
    KEVO_GPU_TRY(gpu_allocate(embeddings_, n * row_bytes()));
    KEVO_GPU_TRY(gpu_allocate(side_, n * 4 * static_cast<std::size_t>(side_width())));
    KEVO_GPU_TRY(gpu_memset(targeting_.get(), 0, n * 4));  // nothing live
    const std::size_t segments = (n + kSegmentSlots - 1) / kSegmentSlots;
    KEVO_GPU_TRY(gpu_allocate(headers_, segments * kSegmentSlots));  // whole segments: matching reads 16 at a time
    KEVO_GPU_TRY(gpu_memset(headers_.get(), 0, segments * kSegmentSlots));
    KEVO_GPU_TRY(gpu_allocate(segments_, segments * sizeof(SegmentDirectory)));
    KEVO_GPU_TRY(gpu_memset(segments_.get(), 0, segments * sizeof(SegmentDirectory)));  // no postings yet
    host_category_offsets_.assign(kMaxCategories, 0);
    std::uint32_t bit = 0;
    for (int c = 0; c < schema_.categories(); ++c) {
      host_category_offsets_[static_cast<std::size_t>(c)] = bit;
      bit += schema_.category_values[static_cast<std::size_t>(c)];
    }
    total_query_bits_ = bit;
    KEVO_GPU_TRY(gpu_allocate(category_offsets_, kMaxCategories * 4));
    KEVO_GPU_TRY(gpu_copy(category_offsets_.get(), host_category_offsets_.data(), kMaxCategories * 4));
    KEVO_GPU_TRY(gpu_stream_create(&update_stream_));
    KEVO_GPU_TRY(gpu_event_create(&updated_));
    KEVO_GPU_TRY(gpu_event_record(updated_, update_stream_));
    for (StagingBuffer& b : staging_) KEVO_GPU_TRY(gpu_event_create(&b.consumed));
    return {};
  }

  struct Staging {
    std::size_t slots, ids, targeting, bias, scale, clauses, rows, total;
  };
  Staging staging_layout(std::size_t n, std::size_t clauses, bool with_rows) const {
    auto round = [](std::size_t b) { return (b + 255) & ~std::size_t{255}; };
    Staging s{};
    std::size_t at = 0;
    s.slots = at; at += round(n * 4);
    s.ids = at; at += round(n * 4);
    s.targeting = at; at += round(n * 4);
    s.bias = at; at += round(n * 4);
    s.scale = at; at += round(n * 4 * static_cast<std::size_t>(scale_words()));
    s.clauses = at; at += round(clauses * 4);
    s.rows = at; at += with_rows ? round(n * row_bytes()) : 0;
    s.total = at;
    return s;
  }
  /// A batch's staging, on the host (pinned) and on the device. Two take turns, so that a batch can
  /// be staged while the one before waits on the device; `consumed` marks when the device has read one.
  struct StagingBuffer {
    PinnedBuffer<unsigned char> host;
    DeviceBuffer<unsigned char> device;
    std::size_t bytes = 0;
    gpu_event_t consumed = nullptr;
  };
  /// The next staging buffer, once the device has read it, with room for `bytes`.
  expected<StagingBuffer*, Error> take_staging(std::size_t bytes) {
    StagingBuffer& b = staging_[next_staging_];
    next_staging_ ^= 1;
    KEVO_GPU_TRY(gpu_event_synchronize(b.consumed));
    if (bytes <= b.bytes) return &b;
    b.host.reset();
    b.device.reset();
    b.bytes = 0;
    const std::size_t grown = std::max<std::size_t>(bytes, 1u << 20);
    KEVO_GPU_TRY(gpu_allocate(b.host, grown));
    KEVO_GPU_TRY(gpu_allocate(b.device, grown));
    b.bytes = grown;
    return &b;
  }
  /// One ad's row and its scale words (views.cuh), in the pool's storage.
  void write_row(const float* embedding, unsigned char* out, float* scale_words) const {
    const int d = schema_.dim;
    if (schema_.embedding_type == EmbeddingType::fp16) {
      floats_to_halves(embedding, reinterpret_cast<std::uint16_t*>(out), static_cast<std::size_t>(d));
      return;
    }
    std::int8_t values[kMaxDim];
    float scales[kMaxDim / kScaleGroup];
    const auto n = static_cast<std::size_t>(d);
    quantize_into(schema_.embedding_type, std::span(embedding, n), std::span(values, n),
                  std::span(scales, static_cast<std::size_t>(scales_per_ad(schema_.embedding_type, d))));
    write_stored_row(values, scales, out, scale_words);
  }
  /// An int8 row as stored: its d values, and its scale (int8) or its groups' fp16 scales, two a
  /// word, the lower group first (int8_group32).
  void write_stored_row(const std::int8_t* values, const float* scales, unsigned char* out, float* scale_words) const {
    std::memcpy(out, values, static_cast<std::size_t>(schema_.dim));
    if (schema_.embedding_type == EmbeddingType::int8) {
      scale_words[0] = scales[0];
      return;
    }
    for (int w = 0; w < scales_per_ad(schema_.embedding_type, schema_.dim) / 2; ++w) {
      const std::uint32_t word = float_to_half(scales[2 * w]) | static_cast<std::uint32_t>(float_to_half(scales[2 * w + 1])) << 16;
      std::memcpy(scale_words + w, &word, 4);
    }
  }
  /// Moves the live ads' clause runs to the front of a fresh arena of `capacity` clauses, ordered
  /// like any update: after every search enqueued before, before any enqueued after. Upsert calls
  /// it, with both locks held (searches stay out until the batch itself is in), when a batch does
  /// not fit, naming the slots the batch is about to overwrite (their runs are dropped; no search
  /// runs between this and the overwrite). The fresh arena is allocated beside the old one for the
  /// copy, first, so that a device without room for it fails the batch with nothing changed.
  expected<void, Error> compact_clause_arena(const std::vector<std::uint32_t>& overwritten, std::size_t capacity) {
    const auto n = static_cast<std::uint32_t>(slots_);
    GpuScratch scratch;
    std::uint32_t *quads = nullptr, *offsets = nullptr, *fresh = nullptr, *dropped = nullptr;
    unsigned char* scan_temp = nullptr;
    std::size_t scan_bytes = 0;
    KEVO_GPU_TRY(gpu_cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, quads, offsets, n + 1));
    KEVO_GPU_TRY(scratch.allocate(quads, n + 1ull));
    KEVO_GPU_TRY(scratch.allocate(offsets, n + 1ull));
    KEVO_GPU_TRY(scratch.allocate(scan_temp, scan_bytes));
    if (auto ok = scratch.allocate(fresh, capacity); ok != gpu_success) {
      (void)gpu_last_error();  // an allocation's failure is not sticky: later launches must not report it
      return make_error("the clause arena needs room for " + std::to_string(capacity) + " packed clauses: " +
                            gpu_error_string(ok), ErrorKind::capacity);
    }
    KEVO_GPU_TRY(wait_for_searches());
    const unsigned grid = std::max(1u, std::min(4096u, (n + 255) / 256));
    if (!overwritten.empty()) {
      KEVO_GPU_TRY(scratch.allocate(dropped, overwritten.size()));
      KEVO_GPU_TRY(gpu_copy_async(dropped, overwritten.data(), overwritten.size() * 4, update_stream_));
      const auto count = static_cast<std::uint32_t>(overwritten.size());
      kernels::drop_clause_runs<<<std::max(1u, std::min(4096u, (count + 255) / 256)), 256, 0, update_stream_>>>(
          dropped, count, targeting_.get());
    }
    KEVO_GPU_TRY(gpu_memset_async(quads + n, 0, 4, update_stream_));
    if (n > 0)
      kernels::arena_run_quads<<<grid, 256, 0, update_stream_>>>(targeting_.get(), reinterpret_cast<const uint4*>(clauses_.get()),
                                                                  n, quads);
    KEVO_GPU_TRY(gpu_cub::DeviceScan::ExclusiveSum(scan_temp, scan_bytes, quads, offsets, n + 1, update_stream_));
    if (n > 0)
      kernels::arena_move_runs<<<grid, 256, 0, update_stream_>>>(
          targeting_.get(), reinterpret_cast<const uint4*>(clauses_.get()), reinterpret_cast<uint4*>(fresh), quads, offsets, n);
    KEVO_GPU_TRY(gpu_last_error());
    std::uint32_t total_quads = 0;
    KEVO_GPU_TRY(gpu_copy_async(&total_quads, offsets + n, 4, update_stream_));
    KEVO_GPU_TRY(gpu_stream_synchronize(update_stream_));  // searches that read the old arena are done too
    // The fresh arena becomes the index's; the old one is freed with the temporaries.
    scratch.release(fresh);
    scratch.adopt(clauses_.release());
    clauses_.reset(fresh);
    options_.clause_capacity = capacity;
    arena_tail_ = static_cast<std::size_t>(total_quads) * 4;
    for (std::uint32_t slot : overwritten) {
      live_clauses_ -= run_clauses_[slot];
      run_clauses_[slot] = 0;
    }
    return {};
  }

  /// The reindex, with the lock held. Works slice by slice (reindex_slice_segments segments) so that its
  /// temporaries stay small: emit each indexed ad's postings keyed by (segment, query bit), sort
  /// them (stable, so slot order holds within a bit), run-length encode the keys, and insert each
  /// distinct key into its segment's hash table, sized 2x its keys. Everything is built beside
  /// the live postings; only headers and directory are copied over, after the searches before.
  expected<void, Error> reindex_locked() {
    return rebuild_postings(targeting_.get(), slots_, []() -> expected<void, Error> { return {}; });
  }
  /// The reindex over `slots` slots of `targeting` (the index's own, or regroup's new arrays), which
  /// calls `also_publish` on update_stream_ as the new postings replace the old, between two searches.
  template <class AlsoPublish>
  expected<void, Error> rebuild_postings(const std::uint32_t* targeting, std::size_t slots, AlsoPublish&& also_publish) {
    const std::uint32_t slice_segments = options_.reindex_slice_segments;
    const auto n = static_cast<std::uint32_t>(slots);
    const std::uint32_t segments = (n + kSegmentSlots - 1) / kSegmentSlots;
    gpu_stream_t stream = update_stream_;
    GpuScratch scratch;
    std::uint8_t* headers = nullptr;
    std::uint32_t *counts = nullptr, *offsets = nullptr, *starts = nullptr, *wide = nullptr;
    KEVO_GPU_TRY(scratch.allocate(headers, n));
    KEVO_GPU_TRY(scratch.allocate(counts, n + 1ull));
    KEVO_GPU_TRY(scratch.allocate(offsets, n + 1ull));
    KEVO_GPU_TRY(scratch.allocate(starts, segments + 1ull));
    KEVO_GPU_TRY(scratch.allocate(wide, 1));
    KEVO_GPU_TRY(gpu_memset_async(wide, 0, 4, stream));
    const unsigned grid = std::max(1u, std::min(8192u, (n + 255) / 256));
    KEVO_GPU_TRY(gpu_memset_async(counts + n, 0, 4, stream));
    if (n > 0) kernels::postings_count<<<grid, 256, 0, stream>>>(targeting, clauses_.get(), n, headers, counts, wide);
    std::size_t scan_bytes = 0;
    unsigned char* scan_temp = nullptr;
    KEVO_GPU_TRY(gpu_cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, counts, offsets, n + 1));
    KEVO_GPU_TRY(scratch.allocate(scan_temp, scan_bytes));
    KEVO_GPU_TRY(gpu_cub::DeviceScan::ExclusiveSum(scan_temp, scan_bytes, counts, offsets, n + 1, stream));
    kernels::postings_segment_starts<<<std::max(1u, (segments + 256) / 256), 256, 0, stream>>>(offsets, n, segments, starts);
    KEVO_GPU_TRY(gpu_last_error());
    std::vector<std::uint32_t> host_starts(segments + 1ull);
    std::uint32_t wide_count = 0;
    KEVO_GPU_TRY(gpu_copy_async(host_starts.data(), starts, host_starts.size() * 4, stream));
    KEVO_GPU_TRY(gpu_copy_async(&wide_count, wide, 4, stream));
    KEVO_GPU_TRY(gpu_stream_synchronize(stream));

    std::uint32_t slice_entries = 0;  // the most postings of any slice: sizes the slice temporaries
    for (std::uint32_t s0 = 0; s0 < segments; s0 += slice_segments)
      slice_entries = std::max(slice_entries, host_starts[std::min(segments, s0 + slice_segments)] - host_starts[s0]);
    std::uint16_t *values = nullptr, *postings = nullptr;
    std::uint32_t *keys = nullptr, *sorted_keys = nullptr, *unique_keys = nullptr, *run_counts = nullptr,
                  *run_starts = nullptr, *runs = nullptr, *segment_bits = nullptr, *slice_tables = nullptr;
    KEVO_GPU_TRY(scratch.allocate(postings, host_starts[segments] + 8ull));  // matching reads whole 16-byte chunks
    KEVO_GPU_TRY(scratch.allocate(values, slice_entries));
    for (std::uint32_t** p : {&keys, &sorted_keys, &unique_keys, &run_counts, &run_starts})
      KEVO_GPU_TRY(scratch.allocate(*p, slice_entries));
    KEVO_GPU_TRY(scratch.allocate(runs, 1));
    KEVO_GPU_TRY(scratch.allocate(segment_bits, slice_segments));
    KEVO_GPU_TRY(scratch.allocate(slice_tables, 3 * (slice_segments + 1)));  // segment starts, table offsets, sizes
    std::size_t sort_bytes = 0, encode_bytes = 0, run_scan_bytes = 0;
    KEVO_GPU_TRY(gpu_cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, sorted_keys, values, postings, slice_entries));
    KEVO_GPU_TRY(gpu_cub::DeviceRunLengthEncode::Encode(nullptr, encode_bytes, sorted_keys, unique_keys, run_counts, runs,
                                                        slice_entries));
    KEVO_GPU_TRY(gpu_cub::DeviceScan::ExclusiveSum(nullptr, run_scan_bytes, run_counts, run_starts, slice_entries));
    std::size_t slice_temp_bytes = std::max({sort_bytes, encode_bytes, run_scan_bytes});
    unsigned char* slice_temp = nullptr;
    KEVO_GPU_TRY(scratch.allocate(slice_temp, slice_temp_bytes));

    std::vector<SegmentDirectory> directory(segments);
    std::vector<DeviceBuffer<void>> tables;  // the new hash tables, one buffer per slice
    std::size_t table_entries = 0;
    auto build_slice = [&](std::uint32_t s0, std::uint32_t s1) -> expected<void, Error> {
      const std::uint32_t entries = host_starts[s1] - host_starts[s0];
      for (std::uint32_t s = s0; s < s1; ++s) directory[s].postings_base = host_starts[s];
      if (entries == 0) return {};
      const std::uint32_t first = s0 * kSegmentSlots, end = std::min<std::uint64_t>(n, std::uint64_t{s1} * kSegmentSlots);
      kernels::postings_emit<<<std::max(1u, std::min(8192u, (end - first + 255) / 256)), 256, 0, stream>>>(
          targeting, clauses_.get(), category_offsets_.get(), offsets, first, end, keys, values);
      const int end_bit = 22 + std::bit_width(s1 - s0 - 1);
      std::size_t bytes = slice_temp_bytes;
      KEVO_GPU_TRY(gpu_cub::DeviceRadixSort::SortPairs(slice_temp, bytes, keys, sorted_keys, values,
                                                       postings + host_starts[s0], entries, 0, end_bit, stream));
      bytes = slice_temp_bytes;
      KEVO_GPU_TRY(gpu_cub::DeviceRunLengthEncode::Encode(slice_temp, bytes, sorted_keys, unique_keys, run_counts, runs,
                                                          entries, stream));
      std::uint32_t distinct = 0;
      KEVO_GPU_TRY(gpu_copy_async(&distinct, runs, 4, stream));
      KEVO_GPU_TRY(gpu_stream_synchronize(stream));
      bytes = slice_temp_bytes;
      KEVO_GPU_TRY(gpu_cub::DeviceScan::ExclusiveSum(slice_temp, bytes, run_counts, run_starts, distinct, stream));
      KEVO_GPU_TRY(gpu_memset_async(segment_bits, 0, slice_segments * 4, stream));
      const unsigned run_grid = std::max(1u, std::min(8192u, (distinct + 255) / 256));
      kernels::postings_count_bits<<<run_grid, 256, 0, stream>>>(unique_keys, runs, segment_bits);
      std::vector<std::uint32_t> bits(s1 - s0), slice(3 * (slice_segments + 1), 0);
      KEVO_GPU_TRY(gpu_copy_async(bits.data(), segment_bits, bits.size() * 4, stream));
      KEVO_GPU_TRY(gpu_stream_synchronize(stream));
      std::uint32_t* segment_starts = slice.data();
      std::uint32_t* table_offsets = segment_starts + slice_segments + 1;
      std::uint32_t* table_sizes = table_offsets + slice_segments + 1;
      std::uint32_t slice_table = 0;
      for (std::uint32_t s = s0; s < s1; ++s) {
        const std::uint32_t b = bits[s - s0];
        segment_starts[s - s0] = host_starts[s] - host_starts[s0];
        table_offsets[s - s0] = slice_table;
        table_sizes[s - s0] = b ? 2 * b + 1 : 0;  // under half full: a probe for an absent bit ends in ~2.5 reads
        slice_table += table_sizes[s - s0];
      }
      DeviceBuffer<void> buffer;
      KEVO_GPU_TRY(gpu_allocate(buffer, std::max<std::size_t>(slice_table, 1) * 8));
      auto* table = static_cast<unsigned long long*>(buffer.get());
      tables.push_back(std::move(buffer));
      table_entries += slice_table;
      KEVO_GPU_TRY(gpu_memset_async(table, 0, std::max<std::size_t>(slice_table, 1) * 8, stream));
      KEVO_GPU_TRY(gpu_copy_async(slice_tables, slice.data(), slice.size() * 4, stream));
      kernels::postings_fill_tables<<<run_grid, 256, 0, stream>>>(unique_keys, run_counts, run_starts, runs, slice_tables,
                                                                  slice_tables + slice_segments + 1,
                                                                  slice_tables + 2 * (slice_segments + 1), table);
      KEVO_GPU_TRY(gpu_last_error());
      for (std::uint32_t s = s0; s < s1; ++s) {
        directory[s].table = reinterpret_cast<const std::uint64_t*>(table + table_offsets[s - s0]);
        directory[s].table_size = table_sizes[s - s0];
      }
      KEVO_GPU_TRY(gpu_stream_synchronize(stream));  // `slice` is reused by the next one
      return {};
    };
    for (std::uint32_t s0 = 0; s0 < segments; s0 += slice_segments)
      if (auto ok = build_slice(s0, std::min(segments, s0 + slice_segments)); !ok) return ok;

    // Searches ran on while this was built; the new postings replace the old between two of them.
    scratch.release(postings);
    DeviceBuffer<std::uint16_t> built(postings);  // the new postings; after the swap below, the old
    std::unique_lock<std::mutex> held(mutex_, std::defer_lock);
    auto published = publish(held, [&]() -> expected<void, Error> {
      if (n > 0) KEVO_GPU_TRY(gpu_copy_async(headers_.get(), headers, n, stream));
      if (segments > 0)
        KEVO_GPU_TRY(gpu_copy_async(segments_.get(), directory.data(), segments * sizeof(SegmentDirectory), stream));
      std::swap(postings_, built);
      std::swap(table_buffers_, tables);
      return also_publish();
    });
    // The old postings and tables once published (every search that read them is done), else the new.
    built.reset();
    tables.clear();
    if (!published) return published;
    postings_count_ = host_starts[segments];
    table_entries_ = table_entries;
    walk_count_ = 0;
    wide_count_ = wide_count;
    return {};
  }

  /// Enqueues an update's device work (`enqueue`, on update_stream_) after every search enqueued
  /// so far and before any enqueued later. Searches are held off only while it enqueues: `lock`
  /// (on mutex_) is taken here unless the caller holds it already, and released on return.
  template <class Enqueue>
  expected<void, Error> enqueue_update(std::unique_lock<std::mutex>& lock, Enqueue&& enqueue) {
    if (!lock.owns_lock()) lock.lock();
    auto enqueued = [&]() -> expected<void, Error> {
      KEVO_GPU_TRY(wait_for_searches());
      if (auto ok = enqueue(); !ok) return ok;
      KEVO_GPU_TRY(gpu_event_record(updated_, update_stream_));
      return {};
    }();
    lock.unlock();
    return enqueued;
  }
  /// enqueue_update, then waits for the device to finish it.
  template <class Enqueue>
  expected<void, Error> publish(std::unique_lock<std::mutex>& lock, Enqueue&& enqueue) {
    if (auto ok = enqueue_update(lock, enqueue); !ok) return ok;
    KEVO_GPU_TRY(gpu_event_synchronize(updated_));
    return {};
  }
  /// enqueue_update for a batch read from `staging`, which is marked for reuse once read; does not wait.
  template <class Enqueue>
  expected<void, Error> enqueue_batch(std::unique_lock<std::mutex>& lock, StagingBuffer& staging, Enqueue&& enqueue) {
    return enqueue_update(lock, [&]() -> expected<void, Error> {
      if (auto ok = enqueue(); !ok) return ok;
      KEVO_GPU_TRY(gpu_event_record(staging.consumed, update_stream_));
      return {};
    });
  }

  gpu_error_t wait_for_searches() {
    for (auto& [stream, event] : search_events_)
      if (gpu_error_t e = gpu_stream_wait_event(update_stream_, event); e != gpu_success) return e;
    return gpu_success;
  }

  Schema schema_;
  Options options_;
  mutable std::mutex update_mutex_;  // one update at a time; the host bookkeeping below
  mutable std::mutex mutex_;         // held briefly: while a search or an update enqueues device work
  DeviceBuffer<std::uint32_t> ids_;
  DeviceBuffer<std::uint32_t> targeting_;
  DeviceBuffer<std::uint32_t> clauses_;
  DeviceBuffer<void> embeddings_;
  DeviceBuffer<float> side_;  // (capacity, side_width()): bias, then the scale words
  DeviceBuffer<std::uint32_t> category_offsets_;
  std::vector<std::uint32_t> host_category_offsets_;
  std::uint32_t total_query_bits_ = 0;
  std::size_t slots_ = 0;
  std::size_t arena_tail_ = 0;
  std::vector<std::uint32_t> run_clauses_;  // (capacity) padded clauses of each slot's live run
  std::size_t live_clauses_ = 0;            // their sum: what a compaction keeps
  boost::unordered_flat_map<std::uint32_t, std::uint32_t> id_to_slot_;  // open addressing: one cold miss a lookup
  std::vector<std::uint32_t> free_slots_;
  StagingBuffer staging_[2];
  int next_staging_ = 0;
  gpu_stream_t update_stream_ = nullptr;
  gpu_event_t updated_ = nullptr;
  std::vector<std::pair<gpu_stream_t, gpu_event_t>> search_events_;
  // Matching's postings (reindex_locked).
  DeviceBuffer<std::uint8_t> headers_;             // (capacity in whole segments) match_header
  DeviceBuffer<std::uint16_t> postings_;           // (postings_count_)
  DeviceBuffer<SegmentDirectory> segments_;        // (capacity in segments)
  std::vector<DeviceBuffer<void>> table_buffers_;  // the hash tables that segments_ points into
  std::size_t postings_count_ = 0;
  std::size_t table_entries_ = 0;
  std::size_t walk_count_ = 0;             // live ads written since the last reindex
  std::size_t wide_count_ = 0;             // ads the last reindex could not index (too many clauses)
};

}  // namespace kevo::retrieval
