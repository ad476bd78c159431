// kevo/retrieval/ad_pool.hpp: the ad pool on the host, in the stored form that the GPU index mirrors
// (fp16 bits, or int8 with a scale per ad or per group of 32 values; targeting as packed clauses).
//
//   HostAdPool pool(schema);
//   if (auto ok = pool.upsert(ad); !ok) log(ok.error().message);
//   pool.expire(ad.id);
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kevo/retrieval/half.hpp"
#include "kevo/retrieval/types.hpp"

namespace kevo::retrieval {

/// One clause packed in 32 bits, the form that both the host pool and the GPU index hold:
/// value in bits 0..16, category in 17..21, exclude in 22, "last clause of this ad" in 23.
namespace clause_bits {
inline constexpr std::uint32_t value_mask = (1u << 17) - 1u;
inline constexpr int category_shift = 17;
inline constexpr std::uint32_t exclude = 1u << 22;
inline constexpr std::uint32_t last = 1u << 23;
inline std::uint32_t pack(const Clause& c, bool is_last) {
  return c.value | (c.category << category_shift) | (c.exclude ? exclude : 0u) | (is_last ? last : 0u);
}
inline std::uint32_t category(std::uint32_t packed) { return (packed >> category_shift) & 31u; }
inline std::uint32_t value(std::uint32_t packed) { return packed & value_mask; }
}  // namespace clause_bits

/// Checks a schema: 1..32 categories of 1..2^17 values, d from 1 to 1024.
inline expected<void, Error> validate_schema(const Schema& schema) {
  if (schema.categories() < 1 || schema.categories() > kMaxCategories)
    return make_error("schema: 1 to 32 categories");
  for (std::uint32_t v : schema.category_values)
    if (v < 1 || v > kMaxCategoryValues) return make_error("schema: a category has 1 to 131072 values");
  if (schema.dim < 1 || schema.dim > kMaxDim) return make_error("schema: d from 1 to " + std::to_string(kMaxDim));
  if (schema.embedding_type == EmbeddingType::int8_group32 && schema.dim % kScaleGroup != 0)
    return make_error("schema: int8_group32 needs d to be a multiple of 32, not " + std::to_string(schema.dim));
  return {};
}

namespace detail {
/// Rounds values[begin, end) to q at the max-abs scale `scale`.
inline void round_to_int8(std::span<const float> values, std::size_t begin, std::size_t end, float scale,
                          std::span<std::int8_t> q) {
  if (scale == 0.0f) {  // all zeros (or fp16's scale underflowed)
    std::fill(q.begin() + static_cast<std::ptrdiff_t>(begin), q.begin() + static_cast<std::ptrdiff_t>(end), std::int8_t{0});
    return;
  }
  for (std::size_t k = begin; k < end; ++k)
    q[k] = static_cast<std::int8_t>(std::clamp(std::lround(values[k] / scale), -127l, 127l));
}
inline float max_abs(std::span<const float> values, std::size_t begin, std::size_t end) {
  float m = 0.0f;
  for (std::size_t k = begin; k < end; ++k) m = std::max(m, std::fabs(values[k]));
  return m;
}
/// int8_group32's scale for a group whose largest |value| is `group_max`: group_max / 127 rounded
/// to fp16, one fp16 step lower where 127 times it would pass fp16's range.
inline float group_scale(float group_max) {
  std::uint16_t scale = float_to_half(group_max / 127.0f);
  if (127.0f * half_to_float(scale) > kMaxHalf) --scale;  // positive fp16 bits step down by one ulp
  return half_to_float(scale);
}
}  // namespace detail

/// Quantises one embedding (d values) into an int8 pool's stored form, written in place: q (d) and
/// scales_per_ad(type, d) scales. int8: one fp32 scale, max |a| / 127. int8_group32: one fp16 scale
/// per group of 32 values, the group's max |a| / 127 rounded to fp16 (the stored scale, so that q
/// is rounded against what is dequantised; q is clamped where that rounded down), and one fp16
/// step lower where 127 times it would pass fp16's range (the GPU's dequantised values are fp16).
inline void quantize_into(EmbeddingType type, std::span<const float> embedding, std::span<std::int8_t> values,
                          std::span<float> scales) {
  if (type == EmbeddingType::int8) {
    scales[0] = detail::max_abs(embedding, 0, embedding.size()) / 127.0f;
    detail::round_to_int8(embedding, 0, embedding.size(), scales[0], values);
    return;
  }
  for (std::size_t g = 0; g < embedding.size() / kScaleGroup; ++g) {
    const std::size_t begin = g * kScaleGroup, end = begin + kScaleGroup;
    scales[g] = detail::group_scale(detail::max_abs(embedding, begin, end));
    detail::round_to_int8(embedding, begin, end, scales[g], values);
  }
}

/// The quantisation an int8 pool of `type` stores, as a QuantizedEmbedding.
inline QuantizedEmbedding quantize(EmbeddingType type, std::span<const float> embedding) {
  const int d = static_cast<int>(embedding.size());
  QuantizedEmbedding q{std::vector<std::int8_t>(embedding.size()), std::vector<float>(static_cast<std::size_t>(scales_per_ad(type, d)))};
  quantize_into(type, embedding, q.values, q.scales);
  return q;
}
inline QuantizedEmbedding quantize_int8(std::span<const float> embedding) { return quantize(EmbeddingType::int8, embedding); }
inline QuantizedEmbedding quantize_int8_group32(std::span<const float> embedding) {
  return quantize(EmbeddingType::int8_group32, embedding);
}

/// What an int8 pool of `type` stores for a checked ad, written in place (q, d values, and
/// scales_per_ad scales): its own quantized form where it gave one, else its embedding quantised.
inline void write_stored_int8_form(EmbeddingType type, const AdRecord& ad, std::span<std::int8_t> values,
                                   std::span<float> scales) {
  if (ad.quantized.values.empty()) return quantize_into(type, ad.embedding, values, scales);
  std::copy(ad.quantized.values.begin(), ad.quantized.values.end(), values.begin());
  std::copy(ad.quantized.scales.begin(), ad.quantized.scales.end(), scales.begin());
}
/// The same, as a QuantizedEmbedding of its own.
inline QuantizedEmbedding stored_int8_form(EmbeddingType type, const AdRecord& ad) {
  return ad.quantized.values.empty() ? quantize(type, ad.embedding) : ad.quantized;
}

/// The ad pool on the host: slots hold ads; ids map to slots; expired slots are reused.
class HostAdPool {
 public:
  explicit HostAdPool(Schema schema) : schema_(std::move(schema)) {}

  const Schema& schema() const { return schema_; }
  std::size_t slots() const { return ids_.size(); }
  std::size_t live_count() const { return id_to_slot_.size(); }

  /// Inserts the ad, or replaces every field of the ad with that id.
  expected<void, Error> upsert(const AdRecord& ad) {
    if (auto ok = validate_ad(schema_, ad); !ok) return ok;
    std::size_t slot;
    if (auto it = id_to_slot_.find(ad.id); it != id_to_slot_.end()) {
      slot = it->second;
    } else if (!ad.live) {
      return {};  // a new ad that is not live takes no slot
    } else if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      slot = grow();
    }
    write_slot(slot, ad);
    if (ad.live) id_to_slot_[ad.id] = slot;
    else release(slot, ad.id);
    return {};
  }

  /// Takes the ad out of every later request; false when no live ad has that id.
  bool expire(std::uint32_t id) {
    auto it = id_to_slot_.find(id);
    if (it == id_to_slot_.end()) return false;
    release(it->second, id);
    return true;
  }

  std::optional<std::size_t> slot_of(std::uint32_t id) const {
    auto it = id_to_slot_.find(id);
    if (it == id_to_slot_.end()) return std::nullopt;
    return it->second;
  }

  std::uint32_t id(std::size_t slot) const { return ids_[slot]; }
  bool live(std::size_t slot) const { return live_[slot] != 0; }
  float bias(std::size_t slot) const { return bias_[slot]; }
  const std::vector<std::uint32_t>& clauses(std::size_t slot) const { return clauses_[slot]; }

  /// The embedding value the reference uses: fp16 widened, or int8 dequantised: scale * q in fp32
  /// (int8), or in fp16 (int8_group32, whose scales are fp16: scale * q rounded to fp16, the value
  /// the GPU's tensor cores take; in fp32 the product needs up to 18 bits, and fp16 rounding noise,
  /// 2^-12 of a value, adds up past the score tolerance for request vectors of |u| ~ 5).
  float embedding(std::size_t slot, int k) const {
    const std::size_t at = slot * static_cast<std::size_t>(schema_.dim) + static_cast<std::size_t>(k);
    if (schema_.embedding_type == EmbeddingType::fp16) return half_to_float(fp16_[at]);
    if (schema_.embedding_type == EmbeddingType::int8) return scale_[slot] * static_cast<float>(int8_[at]);
    const float scale = scale_[slot * scales_per_slot() + static_cast<std::size_t>(k / kScaleGroup)];
    return half_to_float(float_to_half(scale * static_cast<float>(int8_[at])));
  }

  // The stored form, for uploads to a device index.
  const std::vector<std::uint16_t>& fp16_values() const { return fp16_; }
  const std::vector<std::int8_t>& int8_values() const { return int8_; }
  /// (slots, scales_per_ad()): each ad's scale, or its groups' scales.
  const std::vector<float>& scales() const { return scale_; }

 private:
  std::size_t scales_per_slot() const { return static_cast<std::size_t>(scales_per_ad(schema_.embedding_type, schema_.dim)); }

  std::size_t grow() {
    const std::size_t slot = ids_.size();
    const auto d = static_cast<std::size_t>(schema_.dim);
    ids_.push_back(0);
    live_.push_back(0);
    bias_.push_back(0.0f);
    scale_.resize(scale_.size() + scales_per_slot(), 0.0f);
    clauses_.emplace_back();
    if (schema_.embedding_type == EmbeddingType::fp16) fp16_.resize(fp16_.size() + d);
    else int8_.resize(int8_.size() + d);
    return slot;
  }

  void write_slot(std::size_t slot, const AdRecord& ad) {
    const auto d = static_cast<std::size_t>(schema_.dim);
    ids_[slot] = ad.id;
    live_[slot] = ad.live ? 1 : 0;
    bias_[slot] = ad.bias;
    if (schema_.embedding_type == EmbeddingType::fp16) {
      floats_to_halves(ad.embedding.data(), fp16_.data() + slot * d, d);
    } else {
      write_stored_int8_form(schema_.embedding_type, ad, std::span(int8_).subspan(slot * d, d),
                             std::span(scale_).subspan(slot * scales_per_slot(), scales_per_slot()));
    }
    std::vector<std::uint32_t>& packed = clauses_[slot];
    packed.clear();
    for (std::size_t c = 0; c < ad.clauses.size(); ++c)
      packed.push_back(clause_bits::pack(ad.clauses[c], c + 1 == ad.clauses.size()));
  }

  void release(std::size_t slot, std::uint32_t id) {
    live_[slot] = 0;
    id_to_slot_.erase(id);
    free_slots_.push_back(slot);
  }

  Schema schema_;
  std::vector<std::uint32_t> ids_;
  std::vector<std::uint8_t> live_;
  std::vector<float> bias_;
  std::vector<float> scale_;  // (slots, scales_per_slot())
  std::vector<std::uint16_t> fp16_;
  std::vector<std::int8_t> int8_;
  std::vector<std::vector<std::uint32_t>> clauses_;
  std::unordered_map<std::uint32_t, std::size_t> id_to_slot_;
  std::vector<std::size_t> free_slots_;
};

}  // namespace kevo::retrieval
