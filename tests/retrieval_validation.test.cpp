// What the CPU side refuses before it could compute a wrong answer or read out of bounds, and
// that an update is not starved by searches that keep coming.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "kevo/retrieval/retrieval.hpp"

namespace kevo_tests::retrieval_validation_test {

using namespace kevo::retrieval;

namespace {

const Workload& small_workload() {
  static const Workload w({.seed = 17, .dim = 64, .features = 32, .hidden = 48});
  return w;
}

}  // namespace

TEST_CASE("the CPU backend refuses a schema and model that disagree, as the GPU's create does", "[retrieval][validation]") {
  const Workload& w = small_workload();
  REQUIRE(CpuRetrievalBackend::create(w.schema(), w.model()));

  Schema narrower = w.schema();
  narrower.dim = 32;  // the model still computes d = 64 vectors: scoring would read past each row
  auto mismatched = CpuRetrievalBackend::create(narrower, w.model());
  REQUIRE(!mismatched);
  CHECK_THAT(mismatched.error().message, Catch::Contains("the model's d (64) is not the pool's (32)"));
  CHECK_THROWS_AS(CpuRetrievalBackend(narrower, w.model()), std::invalid_argument);

  Schema too_many = w.schema();
  too_many.category_values.resize(33, 2);  // a 33rd category would alias category 0 in the packed clauses
  auto refused_schema = CpuRetrievalBackend::create(too_many, w.model());
  REQUIRE(!refused_schema);
  CHECK_THAT(refused_schema.error().message, Catch::Contains("categories"));

  Model broken = w.model();
  broken.w2[7] = std::numeric_limits<float>::infinity();
  auto refused_model = CpuRetrievalBackend::create(w.schema(), broken);
  REQUIRE(!refused_model);
  CHECK_THAT(refused_model.error().message, Catch::Contains("every weight must be finite"));
}

TEST_CASE("an int8_group32 pool needs d to be a multiple of 32", "[retrieval][validation]") {
  const Workload& w = small_workload();  // d = 64: two groups
  Schema grouped = w.schema();
  grouped.embedding_type = EmbeddingType::int8_group32;
  CHECK(validate_schema(grouped));
  REQUIRE(CpuRetrievalBackend::create(grouped, w.model()));
  grouped.dim = 48;  // a group and a half
  auto refused = validate_schema(grouped);
  REQUIRE(!refused);
  CHECK_THAT(refused.error().message, Catch::Contains("int8_group32 needs d to be a multiple of 32, not 48"));
  const Model model48 = Workload({.seed = 17, .dim = 48, .features = 32, .hidden = 48}).model();
  auto backend = CpuRetrievalBackend::create(grouped, model48);  // the backend refuses it with the same reason
  REQUIRE(!backend);
  CHECK_THAT(backend.error().message, Catch::Contains("multiple of 32"));
  // The other storages take d = 48.
  for (EmbeddingType other : {EmbeddingType::fp16, EmbeddingType::int8}) {
    grouped.embedding_type = other;
    CHECK(validate_schema(grouped));
  }
}

TEST_CASE("values that would score NaN are refused with the reason", "[retrieval][validation]") {
  const Workload& w = small_workload();
  auto backend = CpuRetrievalBackend::create(w.schema(), w.model(), 1);
  REQUIRE(backend);
  std::vector<AdRecord> ads;
  for (int i = 0; i < 200; ++i) ads.push_back(w.ad(static_cast<std::uint64_t>(i)));
  REQUIRE((*backend)->upsert(ads));

  // An fp16 pool holds nothing past 65504 (rounded, it would be infinite); an int8 pool scales it.
  AdRecord wide = w.ad(500);
  wide.embedding[3] = 1e5f;
  auto refused = (*backend)->upsert(std::vector<AdRecord>{wide});
  REQUIRE(!refused);
  CHECK_THAT(refused.error().message, Catch::Contains("ad 500: embedding value 100000"));
  Schema int8_schema = w.schema();
  int8_schema.embedding_type = EmbeddingType::int8;
  CHECK(validate_ad(int8_schema, wide));
  // int8_group32's scales are fp16, and the GPU scores its dequantised values in fp16: fp16's range.
  Schema group_schema = w.schema();
  group_schema.embedding_type = EmbeddingType::int8_group32;
  CHECK(!validate_ad(group_schema, wide));
  wide.embedding[3] = 65504.0f;  // the largest a group may hold: q = 127 at fp16's largest / 127
  REQUIRE(validate_ad(group_schema, wide));
  HostAdPool group_pool(group_schema);
  wide.live = true;  // so that it takes slot 0
  REQUIRE(group_pool.upsert(wide));
  CHECK(std::fabs(group_pool.embedding(0, 3) - 65504.0f) <= 65504.0f / 127 / 2);
  CHECK(std::isfinite(group_pool.embedding(0, 4)));
  wide.embedding[3] = 1e7f;
  auto beyond = validate_ad(group_schema, wide);
  REQUIRE(!beyond);
  CHECK_THAT(beyond.error().message, Catch::Contains("beyond fp16's range (65504), which int8_group32 holds"));
  CHECK(validate_ad(int8_schema, wide));  // one fp32 scale per ad covers it

  // Features whose fp16 vectors overflow: an error, in a search and in a batch (naming its place).
  Request huge = w.request(3);
  huge.features.assign(huge.features.size(), 1e6f);
  REQUIRE(validate_request(w.schema(), w.model(), huge));  // finite, and the right length
  auto overflowing = (*backend)->search(huge);
  REQUIRE(!overflowing);
  CHECK_THAT(overflowing.error().message, Catch::Contains("overflow fp16"));
  auto batch = (*backend)->search_batch(std::vector<Request>{w.request(1), huge});
  REQUIRE(!batch);
  CHECK_THAT(batch.error().message, Catch::Contains("request 1 of the batch"));
  auto fine = (*backend)->search(w.request(1));
  REQUIRE(fine);
  for (const ScoredAd& r : *fine) CHECK(std::isfinite(r.score));
}

TEST_CASE("an update is not starved by searches that keep overlapping", "[retrieval][validation]") {
  // With a reader-preferring lock, four threads searching back to back held one upsert off for as
  // long as they searched (over 10 s); it must wait only for the searches already running.
  const Workload& w = small_workload();
  CpuRetrievalBackend backend(w.schema(), w.model(), 1);
  std::vector<AdRecord> ads;
  for (int i = 0; i < 3000; ++i) ads.push_back(w.ad(static_cast<std::uint64_t>(i)));
  REQUIRE(backend.upsert(ads));
  const Request request = w.request(5, RequestKind::broad, 100);
  std::atomic<bool> stop{false};
  std::atomic<int> searches{0};
  std::vector<std::thread> readers;
  // The readers give up after 10 s, so that a starved upsert ends (and fails the bound) instead of hanging.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int t = 0; t < 4; ++t)
    readers.emplace_back([&] {
      while (!stop && std::chrono::steady_clock::now() < give_up) {
        if (backend.search(request)) ++searches;
      }
    });
  while (searches < 8) std::this_thread::yield();  // the readers are overlapping by now
  AdRecord fresh = w.ad(9000);
  fresh.id = 777777;
  fresh.clauses.clear();
  fresh.live = true;
  fresh.bias = 100.0f;
  const auto start = std::chrono::steady_clock::now();
  const bool upserted = static_cast<bool>(backend.upsert(std::vector<AdRecord>{fresh}));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int searches_during = searches.load();
  auto after = backend.search(request);  // taken while the readers still run
  stop = true;
  for (std::thread& t : readers) t.join();
  REQUIRE(upserted);
  INFO("the upsert waited " << waited << " s; " << searches_during << " searches had run");
  CHECK(waited < 5.0);  // a liveness bound, far above the few searches' length it should wait
  REQUIRE(after);
  REQUIRE(!after->empty());
  CHECK(after->front().id == 777777u);  // and every search after it sees it
}

}  // namespace kevo_tests::retrieval_validation_test
