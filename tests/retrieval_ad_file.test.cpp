// Ad files (ad_file.hpp): a pool written and read back is the same pool, searched the same; slices
// cover it in order; a damaged file is a clear error that names what is wrong.
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kevo/retrieval/retrieval.hpp"
#include "support/quantized_ads.hpp"

namespace kevo_tests::retrieval_ad_file_test {

using namespace kevo::retrieval;

namespace {

std::string temp_path(const char* name) { return (std::filesystem::temp_directory_path() / name).string(); }

std::vector<AdRecord> workload_ads(const Workload& w, int n) {
  std::vector<AdRecord> ads;
  for (int i = 0; i < n; ++i) ads.push_back(w.ad(static_cast<std::uint64_t>(i)));
  return ads;
}

bool same_ad(const AdRecord& a, const AdRecord& b) {
  if (a.id != b.id || a.bias != b.bias || a.live != b.live || a.embedding != b.embedding ||
      a.quantized.values != b.quantized.values || a.quantized.scales != b.quantized.scales ||
      a.clauses.size() != b.clauses.size())
    return false;
  for (std::size_t c = 0; c < a.clauses.size(); ++c)
    if (a.clauses[c].category != b.clauses[c].category || a.clauses[c].value != b.clauses[c].value ||
        a.clauses[c].exclude != b.clauses[c].exclude)
      return false;
  return true;
}

/// A file written tensor by tensor, for the damaged cases: `change` edits one tensor's values.
struct RawAdFile {
  std::vector<std::uint32_t> category_values{4, 8};
  std::vector<std::uint32_t> ids{10, 11, 12};
  std::vector<float> embeddings = std::vector<float>(3 * 2, 0.5f);  // d = 2
  std::vector<float> bias{0.1f, 0.2f, 0.3f};
  std::vector<std::uint8_t> live{1, 1, 0};
  std::vector<std::uint64_t> clause_offsets{0, 1, 1, 3};
  std::vector<std::uint32_t> clauses{0, 3, 0, /**/ 1, 7, 1, /**/ 1, 2, 0};
  std::string embeddings_dtype = "F32";
  std::vector<std::int8_t> int8_embeddings;  // written as I8 embeddings instead, where not empty
  std::vector<float> scales;                 // written as scales [N, size / N], where not empty
  std::map<std::string, std::string> metadata;  // none: a file written before ad files recorded their dtype

  template <class T>
  static detail::TensorWriter tensor(const char* name, const char* dtype, std::vector<std::int64_t> shape,
                                     const std::vector<T>& values) {
    return {name, dtype, std::move(shape), values.size() * sizeof(T), [&values](std::ostream& out) {
              out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(T)));
            }};
  }
  void write(const std::string& path) const {
    const auto n = static_cast<std::int64_t>(ids.size());
    std::vector<detail::TensorWriter> tensors{
        tensor("category_values", "U32", {static_cast<std::int64_t>(category_values.size())}, category_values),
        tensor("ids", "U32", {n}, ids),
        int8_embeddings.empty() ? tensor("embeddings", embeddings_dtype.c_str(), {n, 2}, embeddings)
                                : tensor("embeddings", "I8", {n, 2}, int8_embeddings),
        tensor("bias", "F32", {static_cast<std::int64_t>(bias.size())}, bias), tensor("live", "U8", {n}, live),
        tensor("clause_offsets", "U64", {static_cast<std::int64_t>(clause_offsets.size())}, clause_offsets),
        tensor("clauses", "U32", {static_cast<std::int64_t>(clauses.size() / 3), 3}, clauses)};
    if (!scales.empty()) tensors.push_back(tensor("scales", "F32", {n, static_cast<std::int64_t>(scales.size()) / n}, scales));
    REQUIRE(detail::write_safetensors(path, tensors, metadata));
  }
};

/// The error that opening and reading the whole file ends with ("" if it reads cleanly).
std::string read_error(const std::string& path) {
  auto file = AdFileReader::open(path);
  if (!file) return file.error().message;
  auto ads = file->read(0, file->size());
  return ads ? "" : ads.error().message;
}

}  // namespace

TEST_CASE("an ad file holds the pool exactly, and the pool read back searches the same", "[retrieval][ad_file]") {
  const Workload w({.seed = 17, .dim = 64, .features = 32, .hidden = 32});
  const std::vector<AdRecord> ads = workload_ads(w, 5000);
  const std::string path = temp_path("kevo_ad_file_roundtrip.safetensors");
  REQUIRE(save_ads(w.schema(), ads, path));
  auto file = AdFileReader::open(path);
  REQUIRE(file);
  CHECK(file->size() == ads.size());
  CHECK(file->schema().category_values == w.schema().category_values);
  CHECK(file->schema().dim == 64);

  // Slices of an awkward size cover the pool in order, the last one short.
  std::vector<AdRecord> back;
  for (std::size_t first = 0; first < file->size(); first += 777) {
    auto slice = file->read(first, 777);
    REQUIRE(slice);
    CHECK(slice->size() == std::min<std::size_t>(777, ads.size() - first));
    back.insert(back.end(), slice->begin(), slice->end());
  }
  REQUIRE(back.size() == ads.size());
  std::size_t same = 0, with_clauses = 0, not_live = 0;
  for (std::size_t i = 0; i < ads.size(); ++i) {
    same += same_ad(ads[i], back[i]);
    with_clauses += !ads[i].clauses.empty();
    not_live += !ads[i].live;
  }
  CHECK(same == ads.size());
  CHECK(with_clauses > 1000);  // the check covered clauses and paused ads, not only the easy cases
  CHECK(not_live > 10);
  CHECK(file->read(ads.size(), 10)->empty());
  CHECK(!file->read(ads.size() + 1, 10));

  HostAdPool original(w.schema()), loaded(file->schema());
  for (const AdRecord& ad : ads) REQUIRE(original.upsert(ad));
  for (const AdRecord& ad : back) REQUIRE(loaded.upsert(ad));
  for (RequestKind kind : {RequestKind::typical, RequestKind::broad}) {
    const Request request = w.request(3, kind, 200);
    const RequestVectors v = compute_request_vectors(w.model(), request.features);
    const auto expected = reference_search(original, v, request);
    REQUIRE(expected.size() == 200u);
    CHECK(reference_search(loaded, v, request) == expected);
  }
  std::filesystem::remove(path);
}

TEST_CASE("an ad file can hold fp16 embeddings, half the bytes", "[retrieval][ad_file]") {
  const Workload w({.seed = 18, .dim = 128});
  const std::vector<AdRecord> ads = workload_ads(w, 1000);
  const std::string f32 = temp_path("kevo_ad_file_f32.safetensors"), f16 = temp_path("kevo_ad_file_f16.safetensors");
  REQUIRE(save_ads(w.schema(), ads, f32));
  REQUIRE(save_ads(w.schema(), ads, f16, {.fp16_embeddings = true}));
  const auto embedding_bytes = ads.size() * 128 * 2;
  CHECK(std::filesystem::file_size(f32) - std::filesystem::file_size(f16) == embedding_bytes);
  auto back = AdFileReader::open(f16)->read(0, ads.size());
  REQUIRE(back);
  std::size_t rounded = 0, changed = 0;
  for (std::size_t i = 0; i < ads.size(); ++i)
    for (int j = 0; j < 128; ++j) {
      rounded += (*back)[i].embedding[j] == round_to_half(ads[i].embedding[j]);
      changed += (*back)[i].embedding[j] != ads[i].embedding[j];
    }
  CHECK(rounded == ads.size() * 128);
  CHECK(changed > ads.size() * 64);  // the values really went through fp16
  std::filesystem::remove(f32);
  std::filesystem::remove(f16);
}

TEST_CASE("a damaged ad file is a clear error", "[retrieval][ad_file]") {
  const std::string path = temp_path("kevo_ad_file_damaged.safetensors");
  RawAdFile good;
  good.write(path);
  REQUIRE(read_error(path).empty());

  auto fails_with = [&](RawAdFile raw, const char* expected) {
    raw.write(path);
    const std::string error = read_error(path);
    INFO("error: " << error);
    CHECK_THAT(error, Catch::Contains(expected));
  };
  RawAdFile raw;
  raw.clause_offsets = {0, 2, 1, 3};
  fails_with(raw, "clause_offsets of ad 1 run backwards");
  raw = {};
  raw.clause_offsets = {0, 1, 1, 4};
  fails_with(raw, "past the clauses");
  raw = {};
  raw.clauses[4] = 8;  // clause row 1 is ad 12's; category 1 has 8 values: 0..7
  fails_with(raw, "ad 12: value out of range in category 1");
  raw = {};
  raw.clauses[5] = 2;
  fails_with(raw, "a clause's exclude is 2");
  raw = {};
  raw.live[0] = 7;
  fails_with(raw, "ad 10: live is 7");
  raw = {};
  raw.embeddings[3] = std::numeric_limits<float>::infinity();
  fails_with(raw, "ad 11: embedding must be finite");
  raw = {};
  raw.bias.pop_back();
  fails_with(raw, "shapes disagree");
  raw = {};
  raw.embeddings_dtype = "I32";
  fails_with(raw, "needs a 2-d F32, F16 or I8 tensor embeddings");
  raw = {};
  raw.category_values = {};
  fails_with(raw, "0 categories");

  good.write(path);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4);
  CHECK_THAT(read_error(path), Catch::Contains("bad data offsets"));
  std::filesystem::remove(path);
  CHECK_THAT(read_error(path), Catch::Contains("cannot open"));

  // And save_ads refuses an ad its own schema would refuse.
  const Workload w({.seed = 19, .dim = 64, .features = 32, .hidden = 32});
  std::vector<AdRecord> ads = workload_ads(w, 3);
  ads[2].embedding.pop_back();
  auto saved = save_ads(w.schema(), ads, path);
  REQUIRE(!saved);
  CHECK_THAT(saved.error().message, Catch::Contains("embedding has 63 values"));
}

TEST_CASE("an ad file records its pool's embedding type, and one without it reads as fp16", "[retrieval][ad_file]") {
  const std::string path = temp_path("kevo_ad_file_dtype.safetensors");
  for (EmbeddingType type : {EmbeddingType::fp16, EmbeddingType::int8, EmbeddingType::int8_group32}) {
    INFO(to_string(type));
    const Workload w({.seed = 20, .dim = 64, .features = 32, .hidden = 32, .embedding_type = type});
    const std::vector<AdRecord> ads = workload_ads(w, 2000);
    REQUIRE(save_ads(w.schema(), ads, path));
    {  // in the safetensors header's __metadata__, a string as the format has it
      std::ifstream in(path, std::ios::binary);
      std::string start(4096, '\0');
      in.read(start.data(), static_cast<std::streamsize>(start.size()));
      CHECK_THAT(start, Catch::Contains(std::string("\"__metadata__\":{\"embedding_type\":\"") + to_string(type) + "\"}"));
    }
    auto file = AdFileReader::open(path);
    REQUIRE(file);
    CHECK(file->schema().embedding_type == type);
    CHECK(file->recorded_embedding_type() == std::optional<EmbeddingType>(type));
    auto back = file->read(0, file->size());
    REQUIRE(back);
    REQUIRE(back->size() == ads.size());
    // A pool of the file's schema is the pool that was saved: searched the same.
    HostAdPool original(w.schema()), loaded(file->schema());
    for (const AdRecord& ad : ads) REQUIRE(original.upsert(ad));
    for (const AdRecord& ad : *back) REQUIRE(loaded.upsert(ad));
    const Request request = w.request(4, RequestKind::broad, 300);
    const RequestVectors v = compute_request_vectors(w.model(), request.features);
    CHECK(reference_search(loaded, v, request) == reference_search(original, v, request));
  }
  std::filesystem::remove(path);
}

TEST_CASE("an ad file's embedding type must be one the library knows and fit the file's d", "[retrieval][ad_file]") {
  const std::string path = temp_path("kevo_ad_file_dtype_raw.safetensors");
  RawAdFile legacy;  // no __metadata__: as written before ad files recorded their embedding type
  legacy.write(path);
  {
    auto file = AdFileReader::open(path);
    REQUIRE(file);
    CHECK(file->schema().embedding_type == EmbeddingType::fp16);
    CHECK_FALSE(file->recorded_embedding_type());
    CHECK(read_error(path).empty());
  }
  RawAdFile other_keys;  // metadata without the key: the same
  other_keys.metadata = {{"written_by", "a \"quoted\" tool\\"}};
  other_keys.write(path);
  CHECK(read_error(path).empty());
  CHECK_FALSE(AdFileReader::open(path)->recorded_embedding_type());

  RawAdFile int8;
  int8.metadata = {{"embedding_type", "int8"}};
  int8.write(path);
  CHECK(AdFileReader::open(path)->schema().embedding_type == EmbeddingType::int8);
  CHECK(read_error(path).empty());

  RawAdFile unknown;
  unknown.metadata = {{"embedding_type", "int4"}};
  unknown.write(path);
  std::string error = read_error(path);
  CHECK_THAT(error, Catch::Contains(path));
  CHECK_THAT(error, Catch::Contains("embedding_type is 'int4', not fp16, int8 or int8_group32"));
  unknown.metadata = {{"embedding_type", "INT8"}};  // names are exact
  unknown.write(path);
  CHECK_THAT(read_error(path), Catch::Contains("embedding_type is 'INT8'"));

  RawAdFile grouped;  // d = 2: not whole groups of 32
  grouped.metadata = {{"embedding_type", "int8_group32"}};
  grouped.write(path);
  error = read_error(path);
  CHECK_THAT(error, Catch::Contains(path));
  CHECK_THAT(error, Catch::Contains("int8_group32 needs d to be a multiple of 32, and the embeddings have d = 2"));

  // save_ads refuses to write what the reader would refuse.
  const Workload w({.seed = 21, .dim = 48, .features = 32, .hidden = 32});
  Schema schema = w.schema();
  schema.embedding_type = EmbeddingType::int8_group32;
  auto saved = save_ads(schema, workload_ads(w, 3), path);
  REQUIRE(!saved);
  CHECK_THAT(saved.error().message, Catch::Contains("int8_group32 needs d to be a multiple of 32, not 48"));
  std::filesystem::remove(path);
}

TEST_CASE("an int8 pool's file keeps the ads handed in quantized, and reads back the same pool", "[retrieval][ad_file][int8]") {
  const EmbeddingType type = GENERATE(EmbeddingType::int8, EmbeddingType::int8_group32);
  INFO(to_string(type));
  const std::string path = temp_path("kevo_ad_file_quantized.safetensors");
  const Workload w({.seed = 27, .dim = 64, .features = 32, .hidden = 32, .embedding_type = type});
  std::vector<AdRecord> ads = workload_ads(w, 300);
  for (std::size_t i = 0; i < ads.size(); i += 3) ads[i] = kevo_tests::handed_in_quantized(type, ads[i]);
  REQUIRE(save_ads(w.schema(), ads, path));
  // Every ad's stored form, 1 byte a value and its scales: (64 + 4 s) bytes an ad, s = 1 or 2.
  auto file = AdFileReader::open(path);
  REQUIRE(file);
  CHECK(file->schema().embedding_type == type);
  auto back = file->read(0, file->size());
  REQUIRE(back);
  REQUIRE(back->size() == ads.size());
  HostAdPool original(w.schema()), reread(w.schema());
  for (std::size_t i = 0; i < ads.size(); ++i) {
    AdRecord expected = ads[i];
    expected.quantized = stored_int8_form(type, ads[i]);  // the others come back as the pool stores them
    expected.embedding.clear();
    INFO("ad " << i);
    REQUIRE(same_ad((*back)[i], expected));
    REQUIRE(original.upsert(ads[i]));
    REQUIRE(reread.upsert((*back)[i]));
  }
  CHECK(reread.int8_values() == original.int8_values());
  CHECK(reread.scales() == original.scales());

  // I8 embeddings are a stored form: they need an int8 type and that type's scales.
  RawAdFile raw;
  raw.int8_embeddings = {1, -2, 3, -4, 5, -6};
  raw.scales = {0.5f, 0.25f, 0.125f};
  raw.write(path);  // no __metadata__: fp16
  CHECK_THAT(read_error(path), Catch::Contains("I8 embeddings need __metadata__ embedding_type int8 or int8_group32"));
  raw.metadata = {{"embedding_type", "int8"}};
  raw.write(path);
  CHECK(read_error(path).empty());
  CHECK(AdFileReader::open(path)->read(0, 1)->front().quantized.scales == std::vector<float>{0.5f});
  raw.scales = {};
  raw.write(path);
  CHECK_THAT(read_error(path), Catch::Contains("I8 embeddings need a 2-d F32 tensor scales"));
  raw.scales = {0.5f, 0.25f, 0.125f, 1.0f, 1.0f, 1.0f};  // two a row: int8 takes one
  raw.write(path);
  CHECK_THAT(read_error(path), Catch::Contains("scales is [3, 2]; int8 at d = 2 takes [3, 1]"));
  raw.scales = {0.5f, -0.25f, 0.125f};
  raw.write(path);
  CHECK_THAT(read_error(path), Catch::Contains("finite and not negative"));
  std::filesystem::remove(path);
}

}  // namespace kevo_tests::retrieval_ad_file_test
