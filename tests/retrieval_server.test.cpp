// The retrieval server on loopback with the CPU backend (the GPU's with KEVO_SERVER_TEST_BACKEND=gpu,
// support/serving_client.hpp): it answers searches like the backend itself, applies upserts and
// expiries, turns malformed requests into 400s with a message, and keeps serving after them. Every
// client operation has a timeout; every loop is bounded.
#include <catch2/catch.hpp>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <simdjson.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include "kevo/retrieval/retrieval.hpp"
#include "serving.hpp"  // examples/retrieval_server
#include "support/quantized_ads.hpp"
#include "support/serving_client.hpp"

namespace kevo_tests::retrieval_server_test {

using namespace kevo::retrieval;
using namespace kevo::test;
namespace beast = boost::beast;
namespace http = beast::http;
namespace asio = boost::asio;

namespace {

std::vector<ScoredAd> parse_results(const std::string& body) {
  simdjson::ondemand::parser parser;
  simdjson::padded_string input(body);
  auto doc = parser.iterate(input);
  std::vector<ScoredAd> out;
  for (auto r : doc["results"].get_array()) {
    ScoredAd s;
    s.id = static_cast<std::uint32_t>(std::uint64_t(r["id"]));
    s.score = static_cast<float>(double(r["score"]));
    out.push_back(s);
  }
  return out;
}

}  // namespace

TEST_CASE("the retrieval server answers on loopback with the CPU backend", "[retrieval][server]") {
  const Workload w({.seed = 4, .dim = 64, .features = 32, .hidden = 48});
  const auto engine = make_test_backend(w.schema(), w.model(), 2);
  RetrievalBackend& backend = *engine;
  std::vector<AdRecord> ads;
  for (int i = 0; i < 3000; ++i) ads.push_back(w.ad(i));
  REQUIRE(backend.upsert(ads));
  REQUIRE(backend.reindex());  // as the binary does after its load (nothing to do on the CPU)
  RunningServer running(backend);
  const unsigned short port = running.server.port();
  REQUIRE(port != 0);

  Reply health = call(port, http::verb::get, "/health", "");
  CHECK(health.status == 200);
  if (backend.kernel_policy().empty())
    CHECK(health.body == "{\"backend\":\"" + backend.name() + "\"}");  // the CPU's: {"backend":"cpu"}
  else  // the GPU's names its kernel policy too
    CHECK_THAT(health.body, Catch::StartsWith("{\"backend\":\"" + backend.name() + "\",\"kernel_policy\":\""));

  const Request request = w.request(1, RequestKind::broad, 25);
  Reply first = call(port, http::verb::post, "/search", search_body(request));
  REQUIRE(first.status == 200);
  const std::vector<ScoredAd> served = parse_results(first.body);
  auto direct = backend.search(request);
  REQUIRE(direct);
  REQUIRE(served.size() == 25);
  for (std::size_t i = 0; i < served.size(); ++i) {
    CHECK(served[i].id == (*direct)[i].id);
    CHECK(served[i].score == Approx((*direct)[i].score).epsilon(1e-5));
  }

  SECTION("malformed requests get a 400 with a message, and the server keeps serving") {
    const std::pair<std::string, std::string> bad[] = {
        {"{\"features\": [1, 2", "malformed JSON"},
        {"not json at all", "malformed JSON"},
        {"{\"features\":[1],\"k\":10}", "wrong feature length"},
        {"{\"colour\":3}", "unknown field"},
    };
    for (const auto& [body, message] : bad) {
      Reply r = call(port, http::verb::post, "/search", body);
      CHECK(r.status == 400);
      CHECK_THAT(r.body, Catch::Contains(message));
    }
    // Numbers of the wrong kind or range are refused, never wrapped into a value validation accepts
    // (4294967297 cast to an int is 1, a legal K).
    const std::string good = search_body(request);
    auto replaced = [&](const std::string& from, const std::string& to) {
      const std::size_t at = good.find(from);
      REQUIRE(at != std::string::npos);
      return std::string(good).replace(at, from.size(), to);
    };
    const std::string first_category = fmt::format("{{\"category\":{},", request.query.front().category);
    const std::pair<std::string, std::string> bad_numbers[] = {
        {replaced("\"k\":25", "\"k\":4294967297"), "k out of range"},
        {replaced("\"k\":25", "\"k\":-4294967295"), "k out of range"},
        {replaced(fmt::format("\"routing\":{}", request.routing), "\"routing\":4294967298"), "routing out of range"},
        {replaced("\"k\":25", "\"k\":\"25\""), "\\\"k\\\" must be an integer"},
        {replaced("\"k\":25", "\"k\":2.5"), "\\\"k\\\" must be an integer"},
        {replaced(first_category, "{\"category\":-1,"), "\\\"category\\\" must be a non-negative integer"},
        {replaced(first_category, "{\"category\":4294967296,"), "category out of range"},
    };
    for (const auto& [body, message] : bad_numbers) {
      Reply r = call(port, http::verb::post, "/search", body);
      CHECK(r.status == 400);
      CHECK_THAT(r.body, Catch::Contains(message));
    }
    Request too_many = request;
    too_many.k = 5000;
    Reply k = call(port, http::verb::post, "/search", search_body(too_many));
    CHECK(k.status == 400);
    CHECK_THAT(k.body, Catch::Contains("K out of range"));
    Request unknown = request;
    unknown.query.push_back({77, {1}});
    Reply category = call(port, http::verb::post, "/search", search_body(unknown));
    CHECK(category.status == 400);
    CHECK_THAT(category.body, Catch::Contains("unknown category"));
    CHECK(call(port, http::verb::post, "/nowhere", "{}").status == 404);
    CHECK(call(port, http::verb::put, "/search", "{}").status == 405);

    Reply again = call(port, http::verb::post, "/search", search_body(request));
    CHECK(again.status == 200);
    CHECK(parse_results(again.body).size() == 25);
  }

  SECTION("a body over the limit gets a 413, and the server keeps serving") {
    const std::string body = search_body(request);
    Request small_request = request;  // no query values and short numbers: a body far under the limit
    small_request.query.clear();
    small_request.features.assign(small_request.features.size(), 0.5f);
    const std::string small_body = search_body(small_request);
    REQUIRE(small_body.size() < body.size() / 2);
    RunningServer limited(backend, {.io_timeout = std::chrono::milliseconds(3000), .max_body_bytes = body.size() / 2});
    Reply refused = call(limited.server.port(), http::verb::post, "/search", body);
    CHECK(refused.status == 413);
    CHECK_THAT(refused.body, Catch::Contains("body limit exceeded"));
    Reply answered = call(limited.server.port(), http::verb::post, "/search", small_body);
    CHECK(answered.status == 200);
    auto direct_small = backend.search(small_request);
    REQUIRE(direct_small);
    CHECK(parse_results(answered.body).size() == direct_small->size());
  }

  SECTION("a batch of searches answers each request as /search does, in order") {
    std::vector<Request> batch{request, w.request(2, RequestKind::typical, 10, 1), w.request(3, RequestKind::narrow, 40)};
    std::string body;
    for (const Request& r : batch) body += (body.empty() ? "" : ",") + search_body(r);
    Reply answered = call(port, http::verb::post, "/search_batch", "{\"requests\":[" + body + "]}");
    REQUIRE(answered.status == 200);
    simdjson::ondemand::parser parser;
    simdjson::padded_string input(answered.body);
    auto doc = parser.iterate(input);
    std::size_t r = 0;
    for (auto answer : doc["answers"].get_array()) {
      REQUIRE(r < batch.size());
      auto direct_answer = backend.search(batch[r]);
      REQUIRE(direct_answer);
      std::size_t i = 0;
      for (auto result : answer["results"].get_array()) {
        REQUIRE(i < direct_answer->size());
        CHECK(static_cast<std::uint32_t>(std::uint64_t(result["id"])) == (*direct_answer)[i].id);
        CHECK(double(result["score"]) == Approx((*direct_answer)[i].score).epsilon(1e-5));
        ++i;
      }
      CHECK(i == direct_answer->size());
      ++r;
    }
    CHECK(r == batch.size());

    Request bad_k = request;
    bad_k.k = 0;
    Reply refused = call(port, http::verb::post, "/search_batch",
                         "{\"requests\":[" + search_body(request) + "," + search_body(bad_k) + "]}");
    CHECK(refused.status == 400);
    CHECK_THAT(refused.body, Catch::Contains("request 1 of the batch: K out of range"));
    Reply unknown_field = call(port, http::verb::post, "/search_batch", "{\"requests\":[{\"colour\":1}]}");
    CHECK(unknown_field.status == 400);
    CHECK_THAT(unknown_field.body, Catch::Contains("request 0 of the batch: unknown field"));
    CHECK(call(port, http::verb::post, "/search_batch", "{\"requests\":[]}").status == 400);
    std::string too_many;
    for (int i = 0; i < 65; ++i) too_many += (i ? "," : "") + search_body(request);
    Reply overflow = call(port, http::verb::post, "/search_batch", "{\"requests\":[" + too_many + "]}");
    CHECK(overflow.status == 400);
    CHECK_THAT(overflow.body, Catch::Contains("at most 64 requests"));
    CHECK(call(port, http::verb::post, "/search", search_body(request)).status == 200);  // still serving
  }

  SECTION("upserts and expiries apply to later searches") {
    // A new ad with ANY targeting and a large bias comes first; after its expiry it is gone.
    AdRecord ad = w.ad(5000);
    std::string embedding;
    for (float x : ad.embedding) embedding += fmt::format("{}{}", embedding.empty() ? "" : ",", x);
    const std::string body = fmt::format(
        "{{\"ads\":[{{\"id\":424242,\"embedding\":[{}],\"bias\":50.0,\"clauses\":[{{\"category\":0,\"value\":0,"
        "\"exclude\":true}}],\"live\":true}}]}}",
        embedding);
    Reply up = call(port, http::verb::post, "/ads", body);
    REQUIRE(up.status == 200);
    CHECK(up.body == "{\"upserted\":1}");
    Request req = request;
    req.query.clear();  // no value of category 0, so the exclusion does not apply
    std::vector<ScoredAd> top = parse_results(call(port, http::verb::post, "/search", search_body(req)).body);
    REQUIRE(!top.empty());
    CHECK(top[0].id == 424242u);
    Reply gone = call(port, http::verb::post, "/expire", "{\"ids\":[424242, 99999999]}");
    CHECK(gone.status == 200);
    CHECK(gone.body == "{\"expired\":1}");
    top = parse_results(call(port, http::verb::post, "/search", search_body(req)).body);
    for (const ScoredAd& s : top) CHECK(s.id != 424242u);
    Reply bad_ad = call(port, http::verb::post, "/ads", "{\"ads\":[{\"id\":1,\"embedding\":[1,2]}]}");
    CHECK(bad_ad.status == 400);
    CHECK_THAT(bad_ad.body, Catch::Contains("embedding"));

    // A field left out is refused, not taken as 0 (an ad with no id would replace ad 0).
    const std::string no_id = fmt::format("{{\"ads\":[{{\"embedding\":[{}],\"bias\":1.0}}]}}", embedding);
    Reply refused_ad = call(port, http::verb::post, "/ads", no_id);
    CHECK(refused_ad.status == 400);
    CHECK_THAT(refused_ad.body, Catch::Contains("an ad needs \\\"id\\\""));
    const std::string no_value = fmt::format(
        "{{\"ads\":[{{\"id\":7,\"embedding\":[{}],\"clauses\":[{{\"category\":0}}]}}]}}", embedding);
    Reply refused_clause = call(port, http::verb::post, "/ads", no_value);
    CHECK(refused_clause.status == 400);
    CHECK_THAT(refused_clause.body, Catch::Contains("a clause needs"));
    std::string no_category = search_body(req);  // (req has no query entries)
    no_category.replace(no_category.find("\"query\":[]"), std::string("\"query\":[]").size(), "\"query\":[{\"values\":[1]}]");
    Reply refused_query = call(port, http::verb::post, "/search", no_category);
    CHECK(refused_query.status == 400);
    CHECK_THAT(refused_query.body, Catch::Contains("a query entry needs"));
    // An fp16 pool cannot hold a value past 65504: refused, where it would have scored NaN.
    const std::string too_large = fmt::format(
        "{{\"ads\":[{{\"id\":7,\"embedding\":[1e5{}],\"bias\":1.0}}]}}", embedding.substr(embedding.find(',')));
    Reply refused_range = call(port, http::verb::post, "/ads", too_large);
    CHECK(refused_range.status == 400);
    CHECK_THAT(refused_range.body, Catch::Contains("beyond fp16's range"));
    // An fp16 pool holds no int8 form.
    Reply refused_quantized = call(port, http::verb::post, "/ads",
                                   "{\"ads\":[{\"id\":7,\"quantized\":{\"values\":[1,2],\"scales\":[0.5]}}]}");
    CHECK(refused_quantized.status == 400);
    CHECK_THAT(refused_quantized.body, Catch::Contains("a quantized embedding needs an int8 pool"));
    // Features so large that the request's fp16 vectors overflow: a 400 with the reason, not NaN scores.
    Request huge = request;
    huge.features.assign(huge.features.size(), 1e6f);
    Reply overflowing = call(port, http::verb::post, "/search", search_body(huge));
    CHECK(overflowing.status == 400);
    CHECK_THAT(overflowing.body, Catch::Contains("overflow fp16"));
    CHECK(call(port, http::verb::post, "/search", search_body(request)).status == 200);
  }
}

TEST_CASE("a connection that sends garbage gets a 400 and the server goes on", "[retrieval][server]") {
  const Workload w({.seed = 4, .dim = 64, .features = 32, .hidden = 48});
  const auto backend = make_test_backend(w.schema(), w.model(), 1);
  RunningServer running(*backend);
  {
    asio::io_context io;
    beast::tcp_stream stream(io);
    stream.expires_after(std::chrono::seconds(5));
    stream.connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), running.server.port()));
    const std::string garbage = "THIS IS NOT HTTP\r\n\r\n";
    asio::write(stream.socket(), asio::buffer(garbage));
    beast::flat_buffer buffer;
    http::response<http::string_body> response;
    stream.expires_after(std::chrono::seconds(5));
    http::read(stream, buffer, response);
    CHECK(response.result_int() == 400);
  }
  CHECK(call(running.server.port(), http::verb::get, "/health", "").status == 200);
}

namespace {

using kevo::Error;
using kevo::ErrorKind;
using kevo::expected;
using kevo::make_error;

/// A CPU engine whose searches and upserts fail, while `failure` is set, with that kind of error.
class FailingEngine final : public RetrievalBackend {
 public:
  explicit FailingEngine(const Workload& w) : engine_(w.schema(), w.model(), 1) {}
  std::string name() const override { return "failing"; }
  const Schema& schema() const override { return engine_.schema(); }
  const Model& model() const override { return engine_.model(); }
  expected<std::vector<ScoredAd>, Error> search_checked(const CheckedRequest& r) override {
    if (failure) return make_error("search refused", *failure);
    return engine_.search_checked(r);
  }
  expected<void, Error> upsert(std::span<const AdRecord> ads) override {
    if (failure) return make_error("upsert refused", *failure);
    return engine_.upsert(ads);
  }
  expected<std::size_t, Error> expire(std::span<const std::uint32_t> ids) override { return engine_.expire(ids); }
  expected<void, Error> regroup() override {
    ++regroups;
    if (failure) return make_error("regroup refused", *failure);
    return {};
  }
  std::optional<ErrorKind> failure;
  std::atomic<int> regroups{0};

 private:
  CpuRetrievalBackend engine_;
};

/// A CPU engine that says it serves with a kernel policy, as the GPU backend does after --tuning.
class TunedEngine final : public RetrievalBackend {
 public:
  explicit TunedEngine(const Workload& w) : engine_(w.schema(), w.model(), 1) {}
  std::string name() const override { return "tuned"; }
  std::string kernel_policy() const override { return "tuned for d=64 on \"this GPU\": scoring.stages=2"; }
  const Schema& schema() const override { return engine_.schema(); }
  const Model& model() const override { return engine_.model(); }
  expected<std::vector<ScoredAd>, Error> search_checked(const CheckedRequest& r) override { return engine_.search_checked(r); }
  expected<void, Error> upsert(std::span<const AdRecord> ads) override { return engine_.upsert(ads); }
  expected<std::size_t, Error> expire(std::span<const std::uint32_t> ids) override { return engine_.expire(ids); }

 private:
  CpuRetrievalBackend engine_;
};

}  // namespace

TEST_CASE("/health names the kernel policy the backend serves with, through the batching layer", "[retrieval][server]") {
  const Workload w({.seed = 4, .dim = 64, .features = 32, .hidden = 48});
  TunedEngine engine(w);
  BatchingBackend batching(engine, {.max_batch = 4});
  RunningServer running(batching);
  Reply health = call(running.server.port(), http::verb::get, "/health", "");
  CHECK(health.status == 200);
  CHECK(health.body == "{\"backend\":\"tuned\",\"kernel_policy\":\"tuned for d=64 on \\\"this GPU\\\": scoring.stages=2\"}");
}

TEST_CASE("a backend's error is answered by its kind: the caller's 400, capacity 503, the backend's or a bug 500",
          "[retrieval][server]") {
  const Workload w({.seed = 4, .dim = 64, .features = 32, .hidden = 48});
  FailingEngine backend(w);
  std::vector<AdRecord> ads;
  for (int i = 0; i < 500; ++i) ads.push_back(w.ad(i));
  REQUIRE(backend.upsert(ads));
  RunningServer running(backend);
  const unsigned short port = running.server.port();
  const Request request = w.request(1, RequestKind::broad, 10);
  const AdRecord ad = w.ad(9000);
  std::string embedding;
  for (float x : ad.embedding) embedding += fmt::format("{}{}", embedding.empty() ? "" : ",", x);
  const std::string upsert = fmt::format("{{\"ads\":[{{\"id\":9000,\"embedding\":[{}],\"bias\":0.5,\"clauses\":[],\"live\":true}}]}}", embedding);

  for (auto [kind, status] : {std::pair{ErrorKind::caller, 400u}, {ErrorKind::capacity, 503u}, {ErrorKind::backend, 500u}, {ErrorKind::bug, 500u}}) {
    INFO(to_string(kind));
    backend.failure = kind;
    Reply searched = call(port, http::verb::post, "/search", search_body(request));
    CHECK(searched.status == status);
    CHECK_THAT(searched.body, Catch::Contains("search refused"));
    Reply upserted = call(port, http::verb::post, "/ads", upsert);
    CHECK(upserted.status == status);
    CHECK_THAT(upserted.body, Catch::Contains("upsert refused"));
    Reply regrouped = call(port, http::verb::post, "/regroup", "");
    CHECK(regrouped.status == status);
    CHECK_THAT(regrouped.body, Catch::Contains("regroup refused"));
  }
  backend.failure.reset();
  CHECK(call(port, http::verb::post, "/search", search_body(request)).status == 200);
  CHECK(call(port, http::verb::post, "/ads", upsert).status == 200);
  const Reply regrouped = call(port, http::verb::post, "/regroup", "");
  CHECK(regrouped.status == 200);
  CHECK(regrouped.body == "{\"regrouped\":true}");
  CHECK(backend.regroups == 5);  // each POST reached the backend once
  CHECK(call(port, http::verb::get, "/regroup", "").status == 405);
  CHECK_THAT(call(port, http::verb::get, "/metrics", "").body, Catch::Contains("endpoint=\"/regroup\",status=\"200\""));
}

TEST_CASE("an int8 pool's server takes ads already quantized, and refuses a form that does not fit", "[retrieval][server][int8]") {
  const Workload w({.seed = 6, .dim = 64, .features = 32, .hidden = 48, .embedding_type = EmbeddingType::int8_group32});
  const auto engine = make_test_backend(w.schema(), w.model(), 2);
  HostAdPool host(w.schema());  // the reference's copy of the pool
  std::vector<AdRecord> ads;
  for (int i = 0; i < 2000; ++i) ads.push_back(w.ad(i));
  REQUIRE(engine->upsert(ads));
  REQUIRE(engine->reindex());
  for (const AdRecord& ad : ads) REQUIRE(host.upsert(ad));
  RunningServer running(*engine);
  const unsigned short port = running.server.port();

  AdRecord given = kevo_tests::handed_in_quantized(EmbeddingType::int8_group32, w.ad(5000));
  given.id = 424243;
  given.bias = 50.0f;  // first in any answer it is eligible for
  given.clauses.clear();
  given.live = true;
  REQUIRE(host.upsert(given));
  auto body = [&](const std::string& values, const std::string& scales) {
    return fmt::format("{{\"ads\":[{{\"id\":424243,\"quantized\":{{\"values\":[{}],\"scales\":[{}]}},\"bias\":50.0,"
                       "\"clauses\":[],\"live\":true}}]}}", values, scales);
  };
  const std::string values = fmt::format("{}", fmt::join(given.quantized.values, ","));
  const std::string scales = fmt::format("{}", fmt::join(given.quantized.scales, ","));
  Reply up = call(port, http::verb::post, "/ads", body(values, scales));
  REQUIRE(up.status == 200);
  CHECK(up.body == "{\"upserted\":1}");
  for (RequestKind kind : {RequestKind::typical, RequestKind::broad}) {
    const Request request = w.request(3, kind, 50);
    const std::vector<ScoredAd> top = parse_results(call(port, http::verb::post, "/search", search_body(request)).body);
    REQUIRE(top.size() == 50);
    CHECK(top[0].id == 424243u);
    auto ok = compare_with_reference(host, compute_request_vectors(w.model(), request.features), request, top);
    INFO((ok ? "" : ok.error().message));
    CHECK(ok);
  }
  const std::pair<std::string, std::string> bad[] = {
      {body("200" + values.substr(values.find(',')), scales), "from -127 to 127"},
      {body(values, "0.1" + scales.substr(scales.find(','))), "int8_group32's scales are fp16: 0.100000 is not one"},
      {body(values, scales.substr(0, scales.find(','))), "has 1 scales, int8_group32 at d = 64 takes 2"},
      {"{\"ads\":[{\"id\":1,\"quantized\":{\"values\":[1],\"zero_point\":[3]}}]}", "unknown field in quantized: zero_point"},
  };
  for (const auto& [request_body, message] : bad) {
    Reply r = call(port, http::verb::post, "/ads", request_body);
    CHECK(r.status == 400);
    CHECK_THAT(r.body, Catch::Contains(message));
  }
}

}  // namespace kevo_tests::retrieval_server_test
