// kevo/retrieval/types.hpp: the model, ads, requests and results of the retrieval spec
// (shared/spec/retrieval-model.md), and the validation every backend applies to a request.
//
//   kevo::retrieval::Request request{.features = x, .query = {{0, {3}}, {7, {1, 2}}}, .k = 100};
//   auto checked = check_request(schema, model, request);   // once, where the request enters
//   if (!checked) reply_400(checked.error().message); else backend.search_checked(*checked);
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kevo/expected.hpp"
#include "kevo/retrieval/half.hpp"

namespace kevo::retrieval {

/// How embeddings are held: fp16; int8 with one fp32 scale per ad (a = scale * q); or int8 with one
/// fp16 scale per group of 32 consecutive values (the same rule per group: less rounding noise, for
/// recall, at d / 16 more bytes an ad).
enum class EmbeddingType { fp16, int8, int8_group32 };

inline const char* to_string(EmbeddingType type) {
  return type == EmbeddingType::fp16 ? "fp16" : type == EmbeddingType::int8 ? "int8" : "int8_group32";
}
/// The inverse of to_string (command lines, tuning and ad files); nullopt for any other name.
inline std::optional<EmbeddingType> embedding_type_named(std::string_view name) {
  for (EmbeddingType type : {EmbeddingType::fp16, EmbeddingType::int8, EmbeddingType::int8_group32})
    if (name == to_string(type)) return type;
  return std::nullopt;
}
/// The names to_string gives, for help texts and refusals.
inline constexpr std::string_view kEmbeddingTypeNames = "fp16, int8 or int8_group32";

inline bool is_int8(EmbeddingType type) { return type != EmbeddingType::fp16; }
/// Values that share one scale in int8_group32.
inline constexpr int kScaleGroup = 32;
/// The scales each ad carries: none (fp16), one (int8), one per group of 32 values (int8_group32).
inline int scales_per_ad(EmbeddingType type, int dim) {
  return type == EmbeddingType::fp16 ? 0 : type == EmbeddingType::int8 ? 1 : dim / kScaleGroup;
}

/// The largest K a request may ask for, and the largest category value a clause can hold.
inline constexpr int kMaxK = 4096;
inline constexpr std::uint32_t kMaxCategoryValues = 1u << 17;
inline constexpr int kMaxCategories = 32;
/// The widest embedding a pool holds.
inline constexpr int kMaxDim = 1024;

/// The targeting space and embedding width that an ad pool is built for.
struct Schema {
  std::vector<std::uint32_t> category_values;  // V_c for each category c; C = size()
  int dim = 128;                               // d
  EmbeddingType embedding_type = EmbeddingType::fp16;
  int categories() const { return static_cast<int>(category_values.size()); }
};

/// The MoE-gated interaction model's weights, fp32, row-major.
struct Model {
  int features = 256;  // f
  int hidden = 256;
  int dim = 128;       // d
  int experts = 8;     // E
  std::vector<float> w1;  // (E, hidden, f)
  std::vector<float> c1;  // (E, hidden)
  std::vector<float> w2;  // (E, d, hidden)
  std::vector<float> c2;  // (E, d)
  std::vector<float> gate_projection;  // P: (d, d)
};

/// One targeting clause: an allowed value, or an excluded one, of one category.
struct Clause {
  std::uint32_t category = 0;
  std::uint32_t value = 0;
  bool exclude = false;
};

/// Symmetric int8 quantisation of one embedding: a = scale * q, q in [-127, 127], with one scale
/// for the whole embedding (int8) or one per group of 32 consecutive values (int8_group32).
struct QuantizedEmbedding {
  std::vector<std::int8_t> values;
  std::vector<float> scales;  // int8: one; int8_group32: d / 32, each exact in fp16
};

/// An ad as a caller hands it in: a category with no allow clause targets ANY value. Its embedding
/// comes as d values, which the pool rounds to its storage, or, for an int8 pool, as that storage
/// itself (`quantized`, taken as it is: a caller that quantised its embeddings keeps its own q).
struct AdRecord {
  std::uint32_t id = 0;
  std::vector<float> embedding;  // (d), or empty where `quantized` is given
  float bias = 0.0f;
  std::vector<Clause> clauses;
  bool live = true;
  QuantizedEmbedding quantized;  // int8 pools only: q (d) and scales_per_ad scales, or empty (last: {id, embedding, ...} still reads as before)
};

/// The user's values of one category.
struct CategoryQuery {
  std::uint32_t category = 0;
  std::vector<std::uint32_t> values;
};

/// One retrieval request: user features, targeting query, K and the routing width k_e.
struct Request {
  std::vector<float> features;        // x: (f)
  std::vector<CategoryQuery> query;   // categories not listed have an empty Q_c
  int k = 1000;
  int routing = 2;                    // k_e, experts used per ad
};

/// One result: an ad id and its score.
struct ScoredAd {
  std::uint32_t id = 0;
  float score = 0.0f;
  friend bool operator==(const ScoredAd&, const ScoredAd&) = default;
};

/// Whether x is a finite number (written so that it holds under -ffast-math too).
inline bool is_finite(float x) { return x == x && x - x == 0.0f; }

/// The largest finite fp16 value: an fp16 pool's embeddings, and every request's u_e and g_e, are
/// rounded to fp16, and anything larger would become infinite.
inline constexpr float kMaxHalf = 65504.0f;

/// Checks one embedding value for the pool's storage: finite, and (fp16, int8_group32) within
/// fp16's range: int8_group32's scales are fp16, and the GPU scores its dequantised values in fp16.
inline expected<void, Error> check_embedding_value(const Schema& schema, float a) {
  if (!is_finite(a)) return make_error("embedding must be finite");
  if (schema.embedding_type != EmbeddingType::int8 && std::fabs(a) > kMaxHalf)
    return make_error("embedding value " + std::to_string(a) + " is beyond fp16's range (65504), which " +
                      to_string(schema.embedding_type) + " holds");
  return {};
}

/// Checks a model's shapes; a model that fails this is a caller's error, not a bug.
inline expected<void, Error> validate_model(const Model& model) {
  const auto e = static_cast<std::size_t>(model.experts), h = static_cast<std::size_t>(model.hidden);
  const auto f = static_cast<std::size_t>(model.features), d = static_cast<std::size_t>(model.dim);
  if (model.experts < 1 || model.hidden < 1 || model.features < 1 || model.dim < 1)
    return make_error("model: every dimension must be positive");
  if (model.w1.size() != e * h * f || model.c1.size() != e * h || model.w2.size() != e * d * h ||
      model.c2.size() != e * d || model.gate_projection.size() != d * d)
    return make_error("model: a weight tensor has the wrong number of values");
  for (const std::vector<float>* weights : {&model.w1, &model.c1, &model.w2, &model.c2, &model.gate_projection})
    for (float w : *weights)
      if (!is_finite(w)) return make_error("model: every weight must be finite");
  return {};
}

/// Checks a request against the pool's schema and the model; the messages are for the caller.
inline expected<void, Error> validate_request(const Schema& schema, const Model& model, const Request& request) {
  if (static_cast<int>(request.features.size()) != model.features)
    return make_error("wrong feature length: got " + std::to_string(request.features.size()) + ", the model takes " +
                      std::to_string(model.features));
  if (request.k < 1 || request.k > kMaxK)
    return make_error("K out of range: " + std::to_string(request.k) + " (1.." + std::to_string(kMaxK) + ")");
  if (request.routing < 1 || request.routing > model.experts)
    return make_error("routing width out of range: " + std::to_string(request.routing) + " (1.." +
                      std::to_string(model.experts) + ")");
  std::vector<bool> seen(schema.category_values.size(), false);
  for (const CategoryQuery& q : request.query) {
    if (q.category >= schema.category_values.size())
      return make_error("unknown category: " + std::to_string(q.category));
    if (seen[q.category]) return make_error("category listed twice: " + std::to_string(q.category));
    seen[q.category] = true;
    for (std::uint32_t v : q.values)
      if (v >= schema.category_values[q.category])
        return make_error("value out of range: category " + std::to_string(q.category) + " has " +
                          std::to_string(schema.category_values[q.category]) + " values, got " + std::to_string(v));
  }
  for (float x : request.features)
    if (!is_finite(x)) return make_error("features must be finite");
  return {};
}

/// A batch's error: what went wrong with the request at `index`, naming its place in the batch.
inline unexpected<Error> batch_error(std::size_t index, const Error& error) {
  return make_error("request " + std::to_string(index) + " of the batch: " + error.message, error.kind);
}

class CheckedRequest;
expected<CheckedRequest, Error> check_request(const Schema& schema, const Model& model, const Request& request);

/// A request that validate_request accepted for a schema and model: K in 1..kMaxK, a routing width
/// in 1..E, known categories and values, finite features of the model's length. Only check_request
/// makes one, where a request enters (a backend's search, the server, the pipeline's search); the
/// engines below take this form and neither check it again nor clamp. It refers to the request and
/// lives no longer than it does; it is valid for engines of the schema and model it was checked
/// against (a sharded pool's shards are alike).
class CheckedRequest {
 public:
  const Request& request() const { return *request_; }
  const Request* operator->() const { return request_; }
  const Request& operator*() const { return *request_; }

 private:
  explicit CheckedRequest(const Request& request) : request_(&request) {}
  friend expected<CheckedRequest, Error> check_request(const Schema&, const Model&, const Request&);
  const Request* request_;
};

inline expected<CheckedRequest, Error> check_request(const Schema& schema, const Model& model, const Request& request) {
  if (auto ok = validate_request(schema, model, request); !ok) return unexpected(ok.error());
  return CheckedRequest(request);
}

/// Every request of a batch checked before any runs; the first bad one's error names its place.
inline expected<std::vector<CheckedRequest>, Error> check_requests(const Schema& schema, const Model& model,
                                                                  std::span<const Request> requests) {
  std::vector<CheckedRequest> checked;
  checked.reserve(requests.size());
  for (std::size_t r = 0; r < requests.size(); ++r) {
    auto one = check_request(schema, model, requests[r]);
    if (!one) return batch_error(r, one.error());
    checked.push_back(*one);
  }
  return checked;
}

/// Checks one scale of an int8 pool's stored form: finite and not negative, and for int8_group32
/// an fp16 value (the stored scale; kevo does not round a caller's scale for it) with 127 times it
/// within fp16's range (the GPU takes the dequantised values in fp16).
inline expected<void, Error> check_scale(EmbeddingType type, float scale) {
  if (!is_finite(scale) || scale < 0.0f) return make_error("a scale must be finite and not negative, not " + std::to_string(scale));
  if (type == EmbeddingType::int8_group32 && round_to_half(scale) != scale)
    return make_error("int8_group32's scales are fp16: " + std::to_string(scale) + " is not one (round it to fp16 first)");
  if (type == EmbeddingType::int8_group32 && 127.0f * scale > kMaxHalf)
    return make_error("scale " + std::to_string(scale) + " times 127 is beyond fp16's range (65504), which int8_group32 holds");
  if (type == EmbeddingType::int8 && !is_finite(127.0f * scale)) return make_error("scale " + std::to_string(scale) + " times 127 overflows");
  return {};
}

/// Checks an embedding handed in as an int8 pool's stored form: d values in [-127, 127] and the
/// storage's scales (spans, so that a packed batch's rows are checked where they lie).
inline expected<void, Error> check_quantized_embedding(const Schema& schema, std::span<const std::int8_t> values,
                                                       std::span<const float> scales) {
  if (!is_int8(schema.embedding_type))
    return make_error("a quantized embedding needs an int8 pool; this one holds fp16 (give embedding instead)");
  if (static_cast<int>(values.size()) != schema.dim)
    return make_error("quantized embedding has " + std::to_string(values.size()) + " values, the pool holds " +
                      std::to_string(schema.dim));
  const int wanted = scales_per_ad(schema.embedding_type, schema.dim);
  if (static_cast<int>(scales.size()) != wanted)
    return make_error("quantized embedding has " + std::to_string(scales.size()) + " scales, " +
                      to_string(schema.embedding_type) + " at d = " + std::to_string(schema.dim) + " takes " +
                      std::to_string(wanted));
  for (std::int8_t v : values)
    if (v == -128) return make_error("quantized values run from -127 to 127, not -128");
  for (float scale : scales)
    if (auto ok = check_scale(schema.embedding_type, scale); !ok) return ok;
  return {};
}
inline expected<void, Error> check_quantized_embedding(const Schema& schema, const QuantizedEmbedding& q) {
  return check_quantized_embedding(schema, q.values, q.scales);
}

/// Checks an ad against the schema before it enters a pool.
inline expected<void, Error> validate_ad(const Schema& schema, const AdRecord& ad) {
  const bool quantized = !ad.quantized.values.empty() || !ad.quantized.scales.empty();
  if (quantized && !ad.embedding.empty())
    return make_error("ad " + std::to_string(ad.id) + ": give embedding or quantized, not both");
  if (quantized) {
    if (auto ok = check_quantized_embedding(schema, ad.quantized); !ok)
      return make_error("ad " + std::to_string(ad.id) + ": " + ok.error().message);
  } else if (static_cast<int>(ad.embedding.size()) != schema.dim) {
    return make_error("ad " + std::to_string(ad.id) + ": embedding has " + std::to_string(ad.embedding.size()) +
                      " values, the pool holds " + std::to_string(schema.dim));
  }
  for (const Clause& c : ad.clauses) {
    if (c.category >= schema.category_values.size())
      return make_error("ad " + std::to_string(ad.id) + ": unknown category " + std::to_string(c.category));
    if (c.value >= schema.category_values[c.category])
      return make_error("ad " + std::to_string(ad.id) + ": value out of range in category " +
                        std::to_string(c.category));
  }
  for (float a : ad.embedding)
    if (auto ok = check_embedding_value(schema, a); !ok) return make_error("ad " + std::to_string(ad.id) + ": " + ok.error().message);
  if (!is_finite(ad.bias)) return make_error("ad " + std::to_string(ad.id) + ": bias must be finite");
  return {};
}

}  // namespace kevo::retrieval
