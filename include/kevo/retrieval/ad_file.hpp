// kevo/retrieval/ad_file.hpp: an ad pool as one safetensors file, so that a serving binary starts
// from a snapshot instead of replaying every upsert. It holds the targeting space and every ad:
//
//   category_values  U32 [C]        V_c of each category (the schema; d is the embeddings' width)
//   ids              U32 [N]
//   embeddings       F32 [N, d]     (or F16, half the bytes: a 100M-ad pool at d = 128 is 25.6 GB;
//                                   or, in an int8 pool given any ad quantized, I8: each ad's q, with
//   scales           F32 [N, s]      its scale (s = 1, int8) or its groups' (s = d / 32, int8_group32))
//   bias             F32 [N]
//   live             U8  [N]        0 or 1
//   clause_offsets   U64 [N + 1]    ad i's clauses are rows clause_offsets[i] .. clause_offsets[i + 1]
//   clauses          U32 [M, 3]     {category, value, exclude (0 or 1)}
//
// and, in the header's __metadata__, the pool's embedding type: {"embedding_type": "int8_group32"}
// (fp16, int8 or int8_group32; a file written before this was recorded reads as fp16).
//
// The reader reads any slice of ads without loading the rest, and checks each ad it returns
// against the file's schema, so a damaged file is a clear error, never a bad pool:
//
//   if (auto saved = save_ads(schema, ads, "pool.safetensors"); !saved) fail(saved.error().message);
//   auto file = AdFileReader::open("pool.safetensors");
//   for (std::size_t first = 0; first < file->size(); first += 10000)
//     pool.upsert(file->read(first, 10000).value());
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kevo/retrieval/ad_pool.hpp"
#include "kevo/retrieval/half.hpp"
#include "kevo/retrieval/safetensors.hpp"
#include "kevo/retrieval/types.hpp"

namespace kevo::retrieval {

struct AdFileOptions {
  bool fp16_embeddings = false;  // store embeddings rounded to fp16 (what an fp16 pool holds anyway);
                                 // an int8 pool given any ad quantized is stored as I8 whatever this says
};

/// The __metadata__ key an ad file records its embedding type under.
inline constexpr const char* kAdFileEmbeddingTypeKey = "embedding_type";

/// Writes `ads`, the schema's targeting space and its embedding type; the schema and each ad are
/// checked first.
inline expected<void, Error> save_ads(const Schema& schema, std::span<const AdRecord> ads, const std::string& path,
                                      AdFileOptions options = {}) {
  if (auto ok = validate_schema(schema); !ok) return ok;
  for (const AdRecord& ad : ads)
    if (auto ok = validate_ad(schema, ad); !ok) return ok;
  const auto n = static_cast<std::int64_t>(ads.size());
  const std::int64_t d = schema.dim;
  std::uint64_t clauses = 0;
  for (const AdRecord& ad : ads) clauses += ad.clauses.size();
  // An ad handed in quantized keeps its q only in the stored form: the file then holds every ad's
  // (the others quantised as the pool would), so that reading it back gives the same pool.
  const bool stored_int8 = std::any_of(ads.begin(), ads.end(), [](const AdRecord& ad) { return !ad.quantized.values.empty(); });
  const std::int64_t scales = scales_per_ad(schema.embedding_type, schema.dim);
  // Each tensor is written by walking the ads, so nothing the size of the pool is copied.
  auto each_ad = [ads](auto write_one) {
    return [ads, write_one](std::ostream& out) {
      for (const AdRecord& ad : ads) write_one(out, ad);
    };
  };
  auto put = [](std::ostream& out, const auto& value) {
    out.write(reinterpret_cast<const char*>(&value), sizeof value);
  };
  const std::vector<std::uint32_t>& values = schema.category_values;
  std::vector<detail::TensorWriter> tensors = {
      {"category_values", "U32", {static_cast<std::int64_t>(values.size())}, values.size() * 4ull,
       [&values](std::ostream& out) {
         out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * 4));
       }},
      {"ids", "U32", {n}, ads.size() * 4ull, each_ad([put](std::ostream& out, const AdRecord& ad) { put(out, ad.id); })},
      stored_int8 ? detail::TensorWriter{"embeddings", "I8", {n, d}, ads.size() * static_cast<std::uint64_t>(d),
                                         each_ad([&schema, scales](std::ostream& out, const AdRecord& ad) {
                                           std::int8_t values[kMaxDim];
                                           float unused[kMaxDim / kScaleGroup];
                                           const auto width = static_cast<std::size_t>(schema.dim);
                                           write_stored_int8_form(schema.embedding_type, ad, std::span(values, width),
                                                                  std::span(unused, static_cast<std::size_t>(scales)));
                                           out.write(reinterpret_cast<const char*>(values), static_cast<std::streamsize>(width));
                                         })}
                  : detail::TensorWriter{"embeddings", options.fp16_embeddings ? "F16" : "F32", {n, d},
                                         ads.size() * static_cast<std::uint64_t>(d) * (options.fp16_embeddings ? 2 : 4),
                                         each_ad([put, fp16 = options.fp16_embeddings](std::ostream& out, const AdRecord& ad) {
                                           for (float a : ad.embedding) fp16 ? put(out, float_to_half(a)) : put(out, a);
                                         })},
      {"bias", "F32", {n}, ads.size() * 4ull, each_ad([put](std::ostream& out, const AdRecord& ad) { put(out, ad.bias); })},
      {"live", "U8", {n}, ads.size(), each_ad([put](std::ostream& out, const AdRecord& ad) {
         put(out, static_cast<std::uint8_t>(ad.live ? 1 : 0));
       })},
      {"clause_offsets", "U64", {n + 1}, (ads.size() + 1) * 8ull,
       [ads, put](std::ostream& out) {
         std::uint64_t at = 0;
         put(out, at);
         for (const AdRecord& ad : ads) put(out, at += ad.clauses.size());
       }},
      {"clauses", "U32", {static_cast<std::int64_t>(clauses), 3}, clauses * 12,
       each_ad([put](std::ostream& out, const AdRecord& ad) {
         for (const Clause& c : ad.clauses) {
           put(out, c.category);
           put(out, c.value);
           put(out, static_cast<std::uint32_t>(c.exclude ? 1 : 0));
         }
       })},
  };
  if (stored_int8)
    tensors.push_back({"scales", "F32", {n, scales}, ads.size() * static_cast<std::uint64_t>(scales) * 4,
                       // An ad given as floats is quantised again for its scales: holding every ad's
                       // from the values' pass would take 4 B a scale of the whole pool in memory.
                       each_ad([&schema, put, scales](std::ostream& out, const AdRecord& ad) {
                         std::int8_t unused[kMaxDim];
                         float stored[kMaxDim / kScaleGroup];
                         write_stored_int8_form(schema.embedding_type, ad, std::span(unused, static_cast<std::size_t>(schema.dim)),
                                                std::span(stored, static_cast<std::size_t>(scales)));
                         for (std::int64_t g = 0; g < scales; ++g) put(out, stored[g]);
                       })});
  return detail::write_safetensors(path, tensors, {{kAdFileEmbeddingTypeKey, to_string(schema.embedding_type)}});
}

/// An open ad file: its schema and ad count at once, and the ads a slice at a time.
class AdFileReader {
 public:
  static expected<AdFileReader, Error> open(const std::string& path) {
    auto file = detail::SafetensorsFile::open(path);
    if (!file) return unexpected(file.error());
    AdFileReader r(std::move(*file));
    if (auto ok = r.find_tensors(); !ok) return unexpected(ok.error());
    return r;
  }

  /// The targeting space, d and the embedding type the file records (fp16 where it records none).
  const Schema& schema() const { return schema_; }
  /// The embedding type the file records; nullopt for a file written before ad files recorded it.
  std::optional<EmbeddingType> recorded_embedding_type() const { return recorded_type_; }
  std::size_t size() const { return count_; }

  /// Ads first .. first + count - 1 (fewer past the end), in file order, each checked against the schema.
  expected<std::vector<AdRecord>, Error> read(std::size_t first, std::size_t count) {
    if (first > count_) return make_error(where() + "ad " + std::to_string(first) + " is past the last");
    count = std::min(count, count_ - first);
    const auto d = static_cast<std::size_t>(schema_.dim);
    std::vector<std::uint32_t> ids(count);
    std::vector<float> bias(count);
    std::vector<std::uint8_t> live(count);
    std::vector<std::uint64_t> offsets(count + 1);
    const bool stored_int8 = embeddings_->dtype == "I8";
    const auto scales = static_cast<std::size_t>(scales_per_ad(schema_.embedding_type, schema_.dim));
    std::vector<float> embeddings(stored_int8 ? 0 : count * d), scale_values(stored_int8 ? count * scales : 0);
    std::vector<std::int8_t> values(stored_int8 ? count * d : 0);
    if (auto ok = read_slice(*ids_, first, ids); !ok) return unexpected(ok.error());
    if (auto ok = read_slice(*bias_, first, bias); !ok) return unexpected(ok.error());
    if (auto ok = read_slice(*live_, first, live); !ok) return unexpected(ok.error());
    if (auto ok = read_slice(*offsets_, first, offsets); !ok) return unexpected(ok.error());
    if (stored_int8) {
      if (auto ok = read_slice(*embeddings_, first * d, values); !ok) return unexpected(ok.error());
      if (auto ok = read_slice(*scales_, first * scales, scale_values); !ok) return unexpected(ok.error());
    } else if (embeddings_->dtype == "F16") {
      std::vector<std::uint16_t> halves(count * d);
      if (auto ok = read_slice(*embeddings_, first * d, halves); !ok) return unexpected(ok.error());
      std::transform(halves.begin(), halves.end(), embeddings.begin(), half_to_float);
    } else if (auto ok = read_slice(*embeddings_, first * d, embeddings); !ok) {
      return unexpected(ok.error());
    }
    for (std::size_t i = 0; i < count; ++i)
      if (offsets[i + 1] < offsets[i] || offsets[i + 1] > clause_count_)
        return make_error(where() + "clause_offsets of ad " + std::to_string(first + i) + " run backwards or past the clauses");
    std::vector<std::uint32_t> clauses((offsets[count] - offsets[0]) * 3);
    if (auto ok = read_slice(*clauses_, offsets[0] * 3, clauses); !ok) return unexpected(ok.error());
    std::vector<AdRecord> ads(count);
    for (std::size_t i = 0; i < count; ++i) {
      AdRecord& ad = ads[i];
      ad.id = ids[i];
      ad.bias = bias[i];
      if (live[i] > 1) return make_error(where() + "ad " + std::to_string(ad.id) + ": live is " + std::to_string(live[i]));
      ad.live = live[i] == 1;
      auto slice = [i](const auto& all, std::size_t width) {
        return std::vector(all.begin() + static_cast<std::ptrdiff_t>(i * width), all.begin() + static_cast<std::ptrdiff_t>((i + 1) * width));
      };
      if (stored_int8) ad.quantized = {slice(values, d), slice(scale_values, scales)};
      else ad.embedding = slice(embeddings, d);
      for (std::uint64_t c = offsets[i]; c < offsets[i + 1]; ++c) {
        const std::uint32_t* row = &clauses[(c - offsets[0]) * 3];
        if (row[2] > 1) return make_error(where() + "ad " + std::to_string(ad.id) + ": a clause's exclude is " + std::to_string(row[2]));
        ad.clauses.push_back({row[0], row[1], row[2] == 1});
      }
      if (auto ok = validate_ad(schema_, ad); !ok) return make_error(where() + ok.error().message);
    }
    return ads;
  }

 private:
  explicit AdFileReader(detail::SafetensorsFile file) : file_(std::move(file)) {}

  std::string where() const { return file_.path() + ": "; }

  template <class T>
  expected<void, Error> read_slice(const detail::TensorEntry& tensor, std::uint64_t first, std::vector<T>& out) {
    return file_.read(tensor, first * sizeof(T), out.data(), out.size() * sizeof(T));
  }

  /// Finds every tensor and checks that their shapes agree with one another.
  expected<void, Error> find_tensors() {
    auto values = file_.tensor("category_values", "U32", 4, 1);
    if (!values) return unexpected(values.error());
    const auto categories = static_cast<std::size_t>((*values)->shape[0]);
    if (categories == 0 || categories > static_cast<std::size_t>(kMaxCategories))
      return make_error(where() + "the file has " + std::to_string(categories) + " categories (1.." +
                        std::to_string(kMaxCategories) + ")");
    schema_.category_values.resize(categories);
    if (auto ok = read_slice(**values, 0, schema_.category_values); !ok) return ok;
    for (std::uint32_t v : schema_.category_values)
      if (v == 0 || v > kMaxCategoryValues) return make_error(where() + "a category has " + std::to_string(v) + " values");
    auto ids = file_.tensor("ids", "U32", 4, 1);
    if (!ids) return unexpected(ids.error());
    ids_ = *ids;
    count_ = static_cast<std::size_t>(ids_->shape[0]);
    auto embeddings = file_.tensor("embeddings", "F32", 4, 2);
    if (!embeddings) embeddings = file_.tensor("embeddings", "F16", 2, 2);
    if (!embeddings) embeddings = file_.tensor("embeddings", "I8", 1, 2);
    if (!embeddings) return make_error(where() + "needs a 2-d F32, F16 or I8 tensor embeddings");
    embeddings_ = *embeddings;
    schema_.dim = static_cast<int>(embeddings_->shape[1]);
    auto bias = file_.tensor("bias", "F32", 4, 1);
    auto live = file_.tensor("live", "U8", 1, 1);
    auto offsets = file_.tensor("clause_offsets", "U64", 8, 1);
    auto clauses = file_.tensor("clauses", "U32", 4, 2);
    if (!bias) return unexpected(bias.error());
    if (!live) return unexpected(live.error());
    if (!offsets) return unexpected(offsets.error());
    if (!clauses) return unexpected(clauses.error());
    bias_ = *bias, live_ = *live, offsets_ = *offsets, clauses_ = *clauses;
    const auto n = static_cast<std::int64_t>(count_);
    if (embeddings_->shape[0] != n || schema_.dim < 1 || bias_->shape[0] != n || live_->shape[0] != n ||
        offsets_->shape[0] != n + 1 || clauses_->shape[1] != 3)
      return make_error(where() + "the tensors' shapes disagree (N = " + std::to_string(count_) + ")");
    clause_count_ = static_cast<std::uint64_t>(clauses_->shape[0]);
    if (auto ok = read_embedding_type(); !ok) return ok;
    return find_scales();
  }

  /// I8 embeddings are an int8 pool's stored form, and need that storage's scales beside them.
  expected<void, Error> find_scales() {
    if (embeddings_->dtype != "I8") return {};
    if (!is_int8(schema_.embedding_type))
      return make_error(where() + "I8 embeddings need __metadata__ " + kAdFileEmbeddingTypeKey + " int8 or int8_group32");
    auto scales = file_.tensor("scales", "F32", 4, 2);
    if (!scales) return make_error(where() + "I8 embeddings need a 2-d F32 tensor scales");
    scales_ = *scales;
    const int per_ad = scales_per_ad(schema_.embedding_type, schema_.dim);
    if (scales_->shape[0] != static_cast<std::int64_t>(count_) || scales_->shape[1] != per_ad)
      return make_error(where() + "scales is [" + std::to_string(scales_->shape[0]) + ", " + std::to_string(scales_->shape[1]) +
                        "]; " + to_string(schema_.embedding_type) + " at d = " + std::to_string(schema_.dim) + " takes [" +
                        std::to_string(count_) + ", " + std::to_string(per_ad) + "]");
    return {};
  }

  /// The embedding type from __metadata__, checked to be one the library knows and to fit d.
  expected<void, Error> read_embedding_type() {
    const auto& metadata = file_.metadata();
    const auto it = metadata.find(kAdFileEmbeddingTypeKey);
    if (it == metadata.end()) return {};  // written before ad files recorded it: fp16, as before
    const std::optional<EmbeddingType> type = embedding_type_named(it->second);
    if (!type)
      return make_error(where() + "__metadata__ " + kAdFileEmbeddingTypeKey + " is '" + it->second + "', not " +
                        std::string(kEmbeddingTypeNames));
    schema_.embedding_type = *type;
    recorded_type_ = *type;
    if (*type == EmbeddingType::int8_group32 && schema_.dim % kScaleGroup != 0)
      return make_error(where() + "embedding_type int8_group32 needs d to be a multiple of " + std::to_string(kScaleGroup) +
                        ", and the embeddings have d = " + std::to_string(schema_.dim));
    return {};
  }

  detail::SafetensorsFile file_;
  Schema schema_;
  std::size_t count_ = 0;
  std::uint64_t clause_count_ = 0;
  std::optional<EmbeddingType> recorded_type_;
  const detail::TensorEntry *ids_ = nullptr, *embeddings_ = nullptr, *bias_ = nullptr, *live_ = nullptr,
                            *offsets_ = nullptr, *clauses_ = nullptr, *scales_ = nullptr;
};

}  // namespace kevo::retrieval
