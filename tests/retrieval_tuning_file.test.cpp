// The pipeline's tuning file: policies a search found, keyed by GPU, CUDA version and shape class,
// read back as written; the pipeline's choice falls back to the defaults, with the reason, for a
// foreign, stale, malformed or missing file.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "kevo/retrieval/tuning/tuning_file.hpp"

namespace kevo_tests::retrieval_tuning_file_test {

using namespace kevo;
using namespace kevo::retrieval;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("kevo-tuning-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

TuningFile h200_file() {
  TuningFile file{.gpu = "NVIDIA H200", .cuda = "13.0"};
  PipelinePolicy fp16_100m;
  fp16_100m.scoring.blocks_per_sm = 6;
  fp16_100m.scoring.stages = 3;
  PipelinePolicy fp16_1m;
  fp16_1m.scoring.tiles_per_chunk = 4;
  fp16_1m.topk.boundary_cap = 4096;
  file.entries.push_back({.shape = {128, EmbeddingType::fp16, pool_class(100'000'000)}, .policy = fp16_100m,
                          .default_seconds = 2.5e-3, .tuned_seconds = 2.3e-3, .evaluations = 40});
  file.entries.push_back({.shape = {128, EmbeddingType::fp16, pool_class(1'000'000)}, .policy = fp16_1m, .evaluations = 12});
  return file;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

}  // namespace

TEST_CASE("pools are tuned per decade of size", "[retrieval][tuning]") {
  CHECK(pool_class(1'000'000) == 6);
  CHECK(pool_class(3'000'000) == 6);
  CHECK(pool_class(4'000'000) == 7);
  CHECK(pool_class(100'000'000) == 8);
  CHECK(pool_class_name(8) == "100M");
  CHECK(pool_class_name(9) == "1G");
  CHECK(pool_class_name(3) == "1000");
}

TEST_CASE("a tuning file reads back as written", "[retrieval][tuning]") {
  const fs::path path = scratch("roundtrip.json");
  REQUIRE(write_tuning_file(path, h200_file()));
  auto back = read_tuning_file(path);
  REQUIRE(back);
  CHECK(back->gpu == "NVIDIA H200");
  CHECK(back->cuda == "13.0");
  REQUIRE(back->entries.size() == 2);
  CHECK(back->entries[0].shape == ShapeClass{128, EmbeddingType::fp16, 8});
  CHECK(back->entries[0].policy == h200_file().entries[0].policy);
  CHECK(back->entries[0].evaluations == 40);
  CHECK(back->entries[0].tuned_seconds == Approx(2.3e-3));
  CHECK(back->entries[1].policy == h200_file().entries[1].policy);
}

TEST_CASE("a tuning file keys entries by every embedding type, and names one it does not know", "[retrieval][tuning]") {
  TuningFile file = h200_file();
  PipelinePolicy grouped;
  grouped.scoring.stages = 4;
  file.entries.push_back({.shape = {128, EmbeddingType::int8_group32, 8}, .policy = grouped, .evaluations = 7});
  file.entries.push_back({.shape = {128, EmbeddingType::int8, 8}, .evaluations = 3});
  const fs::path path = scratch("dtypes.json");
  REQUIRE(write_tuning_file(path, file));
  auto back = read_tuning_file(path);
  REQUIRE(back);
  REQUIRE(back->entries.size() == 4);
  CHECK(back->entries[2].shape == ShapeClass{128, EmbeddingType::int8_group32, 8});
  CHECK(back->entries[2].policy == grouped);
  CHECK(back->entries[3].shape == ShapeClass{128, EmbeddingType::int8, 8});
  const PolicyChoice chosen = choose_policy(path, {"NVIDIA H200", "13.0"}, {128, EmbeddingType::int8_group32, 8}, PipelinePolicy{});
  CHECK(chosen.tuned);
  CHECK(chosen.policy == grouped);
  CHECK_THAT(chosen.origin, Catch::Contains("tuned for d = 128, int8_group32, ~100M ads"));

  std::string text = tuning_file_json(file);
  const std::string named = "\"dtype\": \"int8_group32\"";
  REQUIRE(text.find(named) != std::string::npos);
  text.replace(text.find(named), named.size(), "\"dtype\": \"int4\"");
  write_text(path, text);
  auto refused = read_tuning_file(path);
  REQUIRE(!refused);
  CHECK_THAT(refused.error().message, Catch::Contains("entry 2: dtype 'int4' is not fp16, int8 or int8_group32"));
}

TEST_CASE("the pipeline takes the tuned policy for its device and shape, and the defaults otherwise, saying why", "[retrieval][tuning]") {
  const fs::path path = scratch("choice.json");
  REQUIRE(write_tuning_file(path, h200_file()));
  const DeviceIdentity h200{"NVIDIA H200", "13.0"};
  const PipelinePolicy defaults{};

  SECTION("the same GPU and CUDA, the nearest decade of the same d and dtype") {
    const PolicyChoice big = choose_policy(path, h200, {128, EmbeddingType::fp16, pool_class(200'000'000)}, defaults);
    CHECK(big.tuned);
    CHECK(big.policy == h200_file().entries[0].policy);
    CHECK_THAT(big.origin, Catch::Contains("tuned for d = 128, fp16, ~100M ads, loaded by id on NVIDIA H200"));
    CHECK_THAT(big.origin, Catch::Contains("scoring{block_threads=256,tiles_per_chunk=16,blocks_per_sm=6,tiles_in_flight=2,stages=3}"));
    const PolicyChoice small = choose_policy(path, h200, {128, EmbeddingType::fp16, pool_class(2'000'000)}, defaults);
    CHECK(small.policy == h200_file().entries[1].policy);
  }
  auto refused = [&](const fs::path& file, const DeviceIdentity& device, const ShapeClass& shape) {
    const PolicyChoice c = choose_policy(file, device, shape, defaults);
    CHECK_FALSE(c.tuned);
    CHECK(c.policy == defaults);
    CHECK_THAT(c.origin, Catch::StartsWith("defaults ("));
    return c.origin;
  };
  const ShapeClass fp16_100m{128, EmbeddingType::fp16, 8};
  SECTION("another GPU, or another CUDA version") {
    CHECK_THAT(refused(path, {"NVIDIA H100 80GB HBM3", "13.0"}, fp16_100m), Catch::Contains("was tuned on NVIDIA H200 with CUDA 13.0, and this is NVIDIA H100"));
    CHECK_THAT(refused(path, {"NVIDIA H200", "12.8"}, fp16_100m), Catch::Contains("this is NVIDIA H200 with CUDA 12.8"));
  }
  SECTION("no entry for the shape") {
    CHECK_THAT(refused(path, h200, {256, EmbeddingType::int8, 8}), Catch::Contains("has no entry for d = 256, int8"));
  }
  SECTION("no file, an unreadable one, a malformed one") {
    CHECK_THAT(refused({}, h200, fp16_100m), Catch::Contains("no tuning file"));
    CHECK_THAT(refused(scratch("missing.json"), h200, fp16_100m), Catch::Contains("cannot be read"));
    const fs::path bad = scratch("bad.json");
    write_text(bad, "{\"format\": \"kevo-pipeline-tuning\", \"version\": 1, \"gpu\": ");
    CHECK_THAT(refused(bad, h200, fp16_100m), Catch::Contains("malformed tuning file"));
    write_text(bad, tuning_file_json(h200_file()) + "{}");
    CHECK_THAT(refused(bad, h200, fp16_100m), Catch::Contains("malformed tuning file"));  // a second object after the first
    write_text(bad, "{\"format\": \"something-else\"}");
    CHECK_THAT(refused(bad, h200, fp16_100m), Catch::Contains("not a kevo pipeline tuning file"));
  }
  SECTION("a stale file: a field no longer legal, or one that no longer exists") {
    std::string text = tuning_file_json(h200_file());
    const fs::path stale = scratch("stale.json");
    std::string illegal = text;
    illegal.replace(illegal.find("\"scoring.stages\":\"3\""), 20, "\"scoring.stages\":\"5\"");
    write_text(stale, illegal);
    CHECK_THAT(refused(stale, h200, fp16_100m), Catch::Contains("entry 0 (d = 128, fp16, ~100M ads, loaded by id): scoring.stages = '5' is not one of {0, 2, 3, 4}"));
    std::string renamed = text;
    renamed.replace(renamed.find("\"scoring.stages\""), 16, "\"scoring.ring\"");
    write_text(stale, renamed);
    CHECK_THAT(refused(stale, h200, fp16_100m), Catch::Contains("'scoring.ring' is not a knob of the retrieval pipeline's policy"));
  }
}

TEST_CASE("a tuned policy records the load order it was measured in, and the pool's own order wins", "[retrieval][tuning]") {
  TuningFile file = h200_file();  // fp16 entries at 100M and 1M, tuned on pools loaded by id
  PipelinePolicy grouped_100m;
  grouped_100m.scoring.tiles_per_chunk = 8;
  file.entries.push_back({.shape = {128, EmbeddingType::fp16, 8, SlotOrder::by_targeting}, .policy = grouped_100m, .evaluations = 17});
  const fs::path path = scratch("orders.json");
  REQUIRE(write_tuning_file(path, file));
  auto back = read_tuning_file(path);
  REQUIRE(back);
  REQUIRE(back->entries.size() == 3);
  CHECK(back->entries[0].shape.load_order == SlotOrder::by_id);
  CHECK(back->entries[2].shape == ShapeClass{128, EmbeddingType::fp16, 8, SlotOrder::by_targeting});
  const DeviceIdentity h200{"NVIDIA H200", "13.0"};

  // The pipeline asks by id; the chooser over the file asks for the order its caller loads in.
  const ShapeClass asked{128, EmbeddingType::fp16, pool_class(100'000'000)};
  const PolicyChoice by_id = tuned_policies(path)(h200, asked);
  CHECK(by_id.policy == h200_file().entries[0].policy);
  const PolicyChoice grouped = tuned_policies(path, SlotOrder::by_targeting)(h200, asked);
  CHECK(grouped.policy == grouped_100m);
  CHECK_THAT(grouped.origin, Catch::Contains("tuned for d = 128, fp16, ~100M ads, loaded by targeting on NVIDIA H200"));
  // The same order outranks a nearer size class: a 1M pool loaded by targeting takes the 100M
  // entry tuned so, not the 1M one tuned by id.
  const PolicyChoice small_grouped = tuned_policies(path, SlotOrder::by_targeting)(h200, {128, EmbeddingType::fp16, pool_class(1'000'000)});
  CHECK(small_grouped.policy == grouped_100m);
  // Where the file has only the other order, its policy is still a legal one for the pool: taken, and said so.
  REQUIRE(write_tuning_file(path, h200_file()));
  const PolicyChoice other = tuned_policies(path, SlotOrder::by_targeting)(h200, asked);
  CHECK(other.tuned);
  CHECK(other.policy == h200_file().entries[0].policy);
  CHECK_THAT(other.origin, Catch::Contains("loaded by id (this pool is loaded by targeting; the file has no entry tuned so)"));

  SECTION("a file from before the order was recorded was tuned by id") {
    std::string text = tuning_file_json(h200_file());
    for (std::size_t at; (at = text.find("\"load_order\": \"id\", ")) != std::string::npos;) text.erase(at, 20);
    REQUIRE(text.find("load_order") == std::string::npos);
    write_text(path, text);
    auto old = read_tuning_file(path);
    REQUIRE(old);
    CHECK(old->entries[0].shape.load_order == SlotOrder::by_id);
  }
  SECTION("an order it does not know is named") {
    std::string text = tuning_file_json(h200_file());
    text.replace(text.find("\"load_order\": \"id\""), 18, "\"load_order\": \"random\"");
    write_text(path, text);
    auto refused = read_tuning_file(path);
    REQUIRE(!refused);
    CHECK_THAT(refused.error().message, Catch::Contains("entry 0: load_order 'random' is not id or targeting"));
  }
}

TEST_CASE("the tuning files this repository ships read back, each entry legal, with the load order it was tuned in", "[retrieval][tuning]") {
  const fs::path shipped = fs::path(KEVO_SOURCE_DIR) / "benchmarks" / "tuning";
  int files = 0, grouped = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(shipped)) {
    if (entry.path().extension() != ".json") continue;
    INFO(entry.path().string());
    auto file = read_tuning_file(entry.path());
    REQUIRE(file);
    CHECK(file->gpu == "NVIDIA H200");
    CHECK_FALSE(file->entries.empty());
    for (const TuningEntry& e : file->entries) grouped += e.shape.load_order == SlotOrder::by_targeting;
    ++files;
  }
  CHECK(files >= 3);
  CHECK(grouped >= 2);  // h200-100m-by-targeting.json: run 142's pools loaded by targeting
}

}  // namespace kevo_tests::retrieval_tuning_file_test
