// The LLM client and synthesizer against a real HTTP server on 127.0.0.1: a Beast server on an
// ephemeral port, in a thread of this process, replays recorded exchanges (tests/data/llm/) and
// injects faults. Each fault must end in its documented, bounded outcome.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"  // designated initializers name only what matters
#include <kevo/problem_loader.hpp>
#include <kevo/knowledge/knowledge_base.hpp>
#include <kevo/knowledge/llm_skill_writer.hpp>
#include <kevo/memory/operators.hpp>
#include <kevo/net/llm_client.hpp>
#include <kevo/search/greedy.hpp>
#include <kevo/default_search_loop.hpp>
#include <kevo/store/sqlite_store.hpp>
#include <kevo/synth/llm_synthesizer.hpp>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <catch2/catch.hpp>
#include <support/fake_llm_server.hpp>
#include <support/variant_evaluator.hpp>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <iomanip>
#include <locale>
#include <sstream>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <unistd.h>

namespace kevo_tests::llm_client_test {

using namespace kevo;
using namespace std::chrono_literals;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;
using kevo::testing::LoopbackServer;
using kevo::testing::Received;
using kevo::testing::Reply;
using kevo::testing::accept_until_stopped;
using net::LlmErrorKind;
using net::WireFormat;

namespace {

std::string recorded(std::string_view name) {
  std::ifstream in(std::string(KEVO_TEST_DATA_DIR) + "/llm/" + std::string(name), std::ios::binary);
  REQUIRE(in);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

constexpr const char* key_variable = "KEVO_TEST_LLM_KEY";
constexpr const char* secret_key = "sk-kevo-test-0123456789abcdef";

/// Options for quick tests: short timeouts and backoffs, a log that we inspect.
net::LlmClientOptions quick_options(const LoopbackServer& server, WireFormat format, std::vector<std::string>* log) {
  ::setenv(key_variable, secret_key, 1);
  net::LlmClientOptions o;
  o.base_url = format == WireFormat::openai ? server.url() + "/v1" : server.url();  // both URL conventions
  o.wire_format = format;
  o.model = "kevo-test-model";
  o.api_key_env = key_variable;
  o.timeouts = {.connect = 2000ms, .write = 2000ms, .read = 2000ms, .request = 10'000ms};
  o.retry = {.max_attempts = 4, .initial_backoff = 20ms, .max_backoff = 100ms, .max_retry_after = 2000ms};
  o.jitter_seed = 7;
  if (log) o.log = [log](std::string_view line) { log->emplace_back(line); };
  return o;
}

std::string rewrite_file(WireFormat f) { return f == WireFormat::openai ? "openai/rewrite.json" : "anthropic/rewrite.json"; }

net::ChatRequest hello() { return {.system = "You write kernels.", .messages = {{"user", "Make it faster."}}, .max_tokens = 777}; }

bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

TEST_CASE("a recorded answer round-trips in each wire format") {
  const auto format = GENERATE(WireFormat::openai, WireFormat::anthropic);
  LoopbackServer server;
  server.script({{.body = recorded(rewrite_file(format))}});
  auto client = net::BlockingLlmClient::create(quick_options(server, format, nullptr));
  REQUIRE(client);
  auto r = client->complete(hello());
  REQUIRE(r);
  CHECK(contains(r->text, "```cpp"));
  CHECK(contains(r->text, "void kernel(const Shape& shape"));
  CHECK(r->model == "kevo-test-model");
  CHECK(r->attempts == 1);
  CHECK_FALSE(r->truncated());

  const auto got = server.received();
  REQUIRE(got.size() == 1);
  const auto& req = got[0];
  CHECK(req.headers.at("content-type") == "application/json");
  if (format == WireFormat::openai) {
    CHECK(req.target == "/v1/chat/completions");
    CHECK(req.headers.at("authorization") == std::string("Bearer ") + secret_key);
    CHECK(contains(req.body, R"("messages":[{"role":"system","content":"You write kernels."},{"role":"user")"));
    CHECK(r->usage.input_tokens == 1834);
    CHECK(r->usage.output_tokens == 612);
    CHECK(r->finish_reason == "stop");
  } else {
    CHECK(req.target == "/v1/messages");
    CHECK(req.headers.at("x-api-key") == secret_key);
    CHECK(req.headers.at("anthropic-version") == "2023-06-01");
    CHECK_FALSE(req.headers.contains("authorization"));
    CHECK(contains(req.body, R"("system":"You write kernels.")"));
    CHECK(contains(req.body, R"("messages":[{"role":"user","content":"Make it faster."}])"));
    CHECK(r->usage.input_tokens == 1901);
    CHECK(r->finish_reason == "end_turn");
  }
  CHECK(contains(req.body, R"("max_tokens":777)"));
  CHECK(contains(req.body, R"("model":"kevo-test-model")"));
  const auto usage = client->usage();
  CHECK(usage.requests == 1);
  CHECK(usage.total_tokens() == r->usage.input_tokens + r->usage.output_tokens);
}

/// An HTTP date (IMF-fixdate), as a server writes Retry-After.
std::string http_date(std::time_t at) {
  std::tm utc{};
  gmtime_r(&at, &utc);
  std::ostringstream date;
  date.imbue(std::locale::classic());
  date << std::put_time(&utc, "%a, %d %b %Y %H:%M:%S GMT");
  return date.str();
}

TEST_CASE("429 with Retry-After (seconds or an HTTP date) is retried after the server's delay, then succeeds") {
  const auto format = GENERATE(WireFormat::openai, WireFormat::anthropic);
  const bool as_date = GENERATE(false, true);
  LoopbackServer server;
  const std::string error_body = recorded(format == WireFormat::openai ? "openai/error_429.json" : "anthropic/error_429.json");
  // As a date: three seconds ahead, to the second, so more than two whatever the fraction of the
  // second now and the time the client takes to start (the options cap the wait at two).
  const std::string retry_after = as_date ? http_date(std::time(nullptr) + 3) : "1";
  server.script({{.status = 429, .body = error_body, .headers = {{"retry-after", retry_after}}},
                 {.body = recorded(rewrite_file(format))}});
  std::vector<std::string> log;
  auto client = net::BlockingLlmClient::create(quick_options(server, format, &log));
  REQUIRE(client);
  const auto start = std::chrono::steady_clock::now();
  auto r = client->complete(hello());
  const double took = seconds_since(start);
  INFO("Retry-After: " << retry_after);
  REQUIRE(r);
  CHECK(r->attempts == 2);
  CHECK(took >= 0.95);  // the server's delay, not the 20 ms backoff
  CHECK(took < 3.0);
  CHECK(server.received().size() == 2);
  CHECK(client->usage().retries == 1);
  REQUIRE(log.size() == 1);
  CHECK(contains(log[0], "HTTP 429"));
  if (!as_date) CHECK(contains(log[0], "retrying in 1000 ms"));
}

TEST_CASE("5xx (500, and Anthropic's 529 overloaded) is retried with backoff, then succeeds") {
  const auto format = GENERATE(WireFormat::openai, WireFormat::anthropic);
  LoopbackServer server;
  const unsigned status = format == WireFormat::openai ? 500 : 529;
  const std::string error_body = recorded(format == WireFormat::openai ? "openai/error_500.json" : "anthropic/error_529.json");
  server.script({{.status = status, .body = error_body}, {.status = status, .body = error_body}, {.body = recorded(rewrite_file(format))}});
  std::vector<std::string> log;
  auto client = net::BlockingLlmClient::create(quick_options(server, format, &log));
  REQUIRE(client);
  auto r = client->complete(hello());
  REQUIRE(r);
  CHECK(r->attempts == 3);
  CHECK(client->usage().retries == 2);
  CHECK(log.size() == 2);
  CHECK(contains(log[0], format == WireFormat::openai ? "server_error" : "overloaded_error"));
}

TEST_CASE("a persistent 500 ends after the allowed attempts with a clear error") {
  LoopbackServer server;
  server.always({.status = 500, .body = recorded("openai/error_500.json")});
  auto options = quick_options(server, WireFormat::openai, nullptr);
  options.retry.max_attempts = 3;
  auto client = net::BlockingLlmClient::create(options);
  REQUIRE(client);
  auto r = client->complete(hello());
  REQUIRE_FALSE(r);
  CHECK(r.error().kind == LlmErrorKind::retries_exhausted);
  CHECK(r.error().attempts == 3);
  CHECK(contains(r.error().message, "gave up after 3 attempts"));
  CHECK(contains(r.error().message, "HTTP 500"));
  CHECK(server.received().size() == 3);
  CHECK(client->usage().failed_requests == 1);
}

TEST_CASE("Retry-After is read as seconds, as milliseconds or as an HTTP date") {
  using std::chrono::milliseconds;
  using net::LlmClient;
  CHECK(LlmClient::parse_retry_after("2", "") == milliseconds(2000));
  CHECK(LlmClient::parse_retry_after("0.3", "") == milliseconds(300));
  CHECK(LlmClient::parse_retry_after("2", "50") == milliseconds(50));  // the finer header wins
  const auto now = std::chrono::system_clock::from_time_t(784111777);  // Sun, 06 Nov 1994 08:49:37 GMT
  CHECK(LlmClient::parse_retry_after("Sun, 06 Nov 1994 08:49:40 GMT", "", now) == milliseconds(3000));
  CHECK(LlmClient::parse_retry_after("Sun, 06 Nov 1994 08:49:30 GMT", "", now) == milliseconds(0));  // past: now
  CHECK(!LlmClient::parse_retry_after("soon", "", now));
  CHECK(!LlmClient::parse_retry_after("1.5 seconds", "", now));
  CHECK(!LlmClient::parse_retry_after("-1", "", now));
  CHECK(!LlmClient::parse_retry_after("", "", now));
}

TEST_CASE("the request timeout bounds retries, whatever Retry-After asks") {
  LoopbackServer server;
  server.always({.status = 503, .body = "{}", .headers = {{"retry-after", "0.3"}}});
  auto options = quick_options(server, WireFormat::openai, nullptr);
  options.retry.max_attempts = 50;
  options.timeouts.request = 1000ms;
  auto client = net::BlockingLlmClient::create(options);
  REQUIRE(client);
  const auto start = std::chrono::steady_clock::now();
  auto r = client->complete(hello());
  CHECK(seconds_since(start) < 2.5);  // the 1 s request timeout, plus slack for a loaded CI machine
  REQUIRE_FALSE(r);
  CHECK(r.error().kind == LlmErrorKind::retries_exhausted);
  CHECK(contains(r.error().message, "would pass the request timeout"));
  CHECK(server.received().size() <= 4);
}

TEST_CASE("a connection reset is retried, then succeeds") {
  const auto format = GENERATE(WireFormat::openai, WireFormat::anthropic);
  LoopbackServer server;
  server.script({{.fault = Reply::Fault::reset}, {.body = recorded(rewrite_file(format))}});
  std::vector<std::string> log;
  auto client = net::BlockingLlmClient::create(quick_options(server, format, &log));
  REQUIRE(client);
  auto r = client->complete(hello());
  REQUIRE(r);
  CHECK(r->attempts == 2);
  REQUIRE(log.size() == 1);
  CHECK(contains(log[0], "read to 127.0.0.1"));
}

TEST_CASE("a body slower than the read timeout ends in a timeout error") {
  const auto format = GENERATE(WireFormat::openai, WireFormat::anthropic);
  LoopbackServer server;
  server.script({{.body = recorded(rewrite_file(format)), .fault = Reply::Fault::slow_body, .delay = 900ms}});
  auto options = quick_options(server, format, nullptr);
  options.timeouts.read = 300ms;
  auto client = net::BlockingLlmClient::create(options);
  REQUIRE(client);
  const auto start = std::chrono::steady_clock::now();
  auto r = client->complete(hello());
  const double took = seconds_since(start);
  REQUIRE_FALSE(r);
  CHECK(r.error().kind == LlmErrorKind::timeout);
  CHECK(contains(r.error().message, "during read"));
  CHECK(took >= 0.25);
  CHECK(took < 2.0);  // bounded: well before a slow server would have finished
  CHECK(server.received().size() == 1);  // not retried: the server was working, a retry would pay again
}

TEST_CASE("malformed JSON, empty choices and error statuses are clear errors, not retried") {
  LoopbackServer server;
  std::vector<std::string> log;
  auto client = net::BlockingLlmClient::create(quick_options(server, WireFormat::openai, &log));
  REQUIRE(client);

  server.script({{.body = recorded("openai/malformed.json")}});
  auto malformed = client->complete(hello());
  REQUIRE_FALSE(malformed);
  CHECK(malformed.error().kind == LlmErrorKind::malformed_response);

  server.script({{.body = recorded("openai/empty_choices.json")}});
  auto empty = client->complete(hello());
  REQUIRE_FALSE(empty);
  CHECK(empty.error().kind == LlmErrorKind::empty_response);
  CHECK(contains(empty.error().message, "no answer text"));

  server.script({{.body = R"({"id":"x","object":"chat.completion"})"}});
  auto no_choices = client->complete(hello());
  REQUIRE_FALSE(no_choices);
  CHECK(contains(no_choices.error().message, "no 'choices'"));

  server.script({{.status = 401, .body = recorded("openai/error_401.json")}});
  auto unauthorized = client->complete(hello());
  REQUIRE_FALSE(unauthorized);
  CHECK(unauthorized.error().kind == LlmErrorKind::http_status);
  CHECK(unauthorized.error().http_status == 401);
  CHECK(contains(unauthorized.error().message, "invalid_request_error: Incorrect API key provided"));

  CHECK(server.received().size() == 4);  // one attempt each
  CHECK(client->usage().failed_requests == 4);
  CHECK(client->usage().retries == 0);
}

TEST_CASE("the API key never appears in logs or errors, even when the server echoes it") {
  const auto format = GENERATE(WireFormat::openai, WireFormat::anthropic);
  LoopbackServer server;
  const std::string echo = recorded("openai/error_401.json");
  server.script({{.status = 500, .body = echo}, {.status = 500, .body = echo}, {.status = 401, .body = echo}});
  std::vector<std::string> log;
  auto client = net::BlockingLlmClient::create(quick_options(server, format, &log));
  REQUIRE(client);
  auto r = client->complete(hello());
  REQUIRE_FALSE(r);
  REQUIRE(log.size() == 3);  // two retries and the failure
  for (const auto& line : log) {
    CHECK_FALSE(contains(line, secret_key));
    CHECK(contains(line, "[redacted]"));
  }
  // The server did receive it, as a header: it is used, just never written anywhere.
  CHECK(contains(server.received().at(0).headers.at(format == WireFormat::openai ? "authorization" : "x-api-key"), secret_key));
  for (const auto& req : server.received()) CHECK_FALSE(contains(req.body, secret_key));
  // Error texts are logged and stored by callers (the search records failed generations), so they
  // are redacted too.
  CHECK(contains(r.error().message, "Incorrect API key provided: [redacted]"));
  CHECK_FALSE(contains(r.error().message, secret_key));
}

TEST_CASE("a huge answer is refused at the body limit") {
  LoopbackServer server;
  std::string huge = R"({"choices":[{"message":{"content":")" + std::string(3u << 20, 'x') + R"("},"finish_reason":"stop"}]})";
  server.script({{.body = huge}});
  auto options = quick_options(server, WireFormat::openai, nullptr);
  options.max_response_bytes = 1u << 20;
  auto client = net::BlockingLlmClient::create(options);
  REQUIRE(client);
  auto r = client->complete(hello());
  REQUIRE_FALSE(r);
  CHECK(r.error().kind == LlmErrorKind::response_too_large);
  CHECK(contains(r.error().message, "1048576-byte limit"));
}

TEST_CASE("no more than max_in_flight requests reach the server at once") {
  LoopbackServer server;
  server.always({.body = recorded("openai/rewrite.json"), .delay = 150ms});
  auto options = quick_options(server, WireFormat::openai, nullptr);
  options.max_in_flight = 2;
  asio::io_context io;
  auto client = net::LlmClient::create(io.get_executor(), options);
  REQUIRE(client);
  std::atomic<int> succeeded = 0, finished = 0;
  for (int i = 0; i < 6; ++i)
    client->async_complete(hello(), [&](net::LlmClient::Result r) {
      ++finished;
      succeeded += r.has_value();
    });
  const auto start = std::chrono::steady_clock::now();
  std::thread second_runner([&] { io.run(); });  // the client keeps its state on a strand, so two threads are safe
  io.run();
  second_runner.join();
  CHECK(finished == 6);
  CHECK(succeeded == 6);
  CHECK(server.max_concurrent() <= 2);  // the cap (== 2 unless the machine is too loaded to overlap them)
  CHECK(seconds_since(start) >= 0.4);  // three waves of 150 ms
  CHECK(client->usage().requests == 6);
}

TEST_CASE("a spent token budget stops requests before they are sent") {
  LoopbackServer server;
  server.always({.body = recorded("openai/rewrite.json")});
  auto options = quick_options(server, WireFormat::openai, nullptr);
  options.budget.max_total_tokens = 3000;  // one recorded answer uses 2446
  options.pricing = {.input_per_million = 3.0, .output_per_million = 15.0};
  auto client = net::BlockingLlmClient::create(options);
  REQUIRE(client);
  REQUIRE(client->complete(hello()));
  CHECK_FALSE(client->budget_exhausted());
  REQUIRE(client->complete(hello()));  // starts under budget, ends over it
  CHECK(client->budget_exhausted());
  auto third = client->complete(hello());
  REQUIRE_FALSE(third);
  CHECK(third.error().kind == LlmErrorKind::budget_exhausted);
  CHECK(contains(third.error().message, "4892 of 3000 tokens"));
  CHECK(server.received().size() == 2);
  CHECK(client->usage().cost_usd == Approx(2 * (1834 * 3.0 + 612 * 15.0) / 1e6));
}

TEST_CASE("configuration errors are reported before any request") {
  ::unsetenv("KEVO_TEST_UNSET_KEY");
  auto missing = net::BlockingLlmClient::create({.base_url = "http://127.0.0.1:9/v1", .model = "m", .api_key_env = "KEVO_TEST_UNSET_KEY"});
  REQUIRE_FALSE(missing);
  CHECK(missing.error().kind == LlmErrorKind::configuration);
  CHECK(contains(missing.error().message, "KEVO_TEST_UNSET_KEY"));
  auto bad_url = net::BlockingLlmClient::create({.base_url = "ftp://example.com", .model = "m"});
  REQUIRE_FALSE(bad_url);
  CHECK(contains(bad_url.error().message, "http:// or https://"));
  auto creds = net::parse_endpoint("https://user:pw@example.com/v1");
  CHECK_FALSE(creds);
  auto ep = net::parse_endpoint("https://api.anthropic.com");
  REQUIRE(ep);
  CHECK(ep->tls);
  CHECK(ep->port == "443");
  CHECK(ep->request_path(WireFormat::anthropic) == "/v1/messages");
  CHECK(net::parse_endpoint("http://[::1]:8000/v1/")->request_path(WireFormat::openai) == "/v1/chat/completions");
}

TEST_CASE("an https URL never falls back to plain text") {
  // A plain-HTTP server cannot complete a TLS handshake: the client must fail there.
  LoopbackServer server;
  server.always({.body = recorded("openai/rewrite.json")});
  auto options = quick_options(server, WireFormat::openai, nullptr);
  options.base_url = "https" + server.url().substr(4) + "/v1";
  options.retry.max_attempts = 1;
  auto client = net::BlockingLlmClient::create(options);
  REQUIRE(client);
  auto r = client->complete(hello());
  REQUIRE_FALSE(r);
  CHECK(contains(r.error().message, "TLS handshake"));
}


namespace {

/// A self-signed certificate for 127.0.0.1 (as a subjectAltName), made fresh for each test run.
struct SelfSignedCertificate {
  std::string certificate_pem, key_pem;

  SelfSignedCertificate() {
    EVP_PKEY* key = EVP_EC_gen("prime256v1");
    REQUIRE(key);
    X509* cert = X509_new();
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
    X509_gmtime_adj(X509_getm_notBefore(cert), -60);
    X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
    X509_set_pubkey(cert, key);
    X509_NAME* name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("kevo loopback"), -1, -1, 0);
    X509_set_issuer_name(cert, name);
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, cert, cert, nullptr, nullptr, 0);
    for (auto [nid, value] : {std::pair{NID_subject_alt_name, "IP:127.0.0.1"}, std::pair{NID_basic_constraints, "critical,CA:TRUE"}}) {
      X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
      REQUIRE(ext);
      X509_add_ext(cert, ext, -1);
      X509_EXTENSION_free(ext);
    }
    REQUIRE(X509_sign(cert, key, EVP_sha256()) > 0);
    certificate_pem = to_pem([&](BIO* b) { return PEM_write_bio_X509(b, cert); });
    key_pem = to_pem([&](BIO* b) { return PEM_write_bio_PrivateKey(b, key, nullptr, nullptr, 0, nullptr, nullptr); });
    X509_free(cert);
    EVP_PKEY_free(key);
  }

  template <class Write>
  static std::string to_pem(Write write) {
    BIO* bio = BIO_new(BIO_s_mem());
    REQUIRE(write(bio) == 1);
    char* data = nullptr;
    const long size = BIO_get_mem_data(bio, &data);
    std::string pem(data, static_cast<std::size_t>(size));
    BIO_free(bio);
    return pem;
  }
};

/// Answers one HTTPS request per connection with `body`, presenting `cert`.
class LoopbackTlsServer {
 public:
  LoopbackTlsServer(const SelfSignedCertificate& cert, std::string body)
      : tls_(asio::ssl::context::tls_server), acceptor_(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)), body_(std::move(body)) {
    tls_.use_certificate_chain(asio::buffer(cert.certificate_pem));
    tls_.use_private_key(asio::buffer(cert.key_pem), asio::ssl::context::pem);
    thread_ = std::thread([this] {
      accept_until_stopped(io_, acceptor_, stopping_, [this](tcp::socket socket) {
        beast::ssl_stream<tcp::socket> stream(std::move(socket), tls_);
        beast::error_code ec;
        stream.handshake(asio::ssl::stream_base::server, ec);
        if (ec) {
          ++failed_handshakes_;
          return;
        }
        beast::flat_buffer buffer;
        http::request<http::string_body> req;
        http::read(stream, buffer, req, ec);
        if (ec) return;
        ++served_;
        http::response<http::string_body> res{http::status::ok, 11};
        res.set(http::field::content_type, "application/json");
        res.body() = body_;
        res.prepare_payload();
        http::write(stream, res, ec);
        stream.shutdown(ec);
      });
    });
  }
  ~LoopbackTlsServer() {
    stopping_ = true;
    beast::error_code ignored;
    tcp::socket poke(io_);
    poke.connect(acceptor_.local_endpoint(), ignored);
    thread_.join();
  }
  std::string url() const { return fmt::format("https://127.0.0.1:{}/v1", acceptor_.local_endpoint().port()); }
  int served() const { return served_; }

 private:
  asio::io_context io_;
  asio::ssl::context tls_;
  tcp::acceptor acceptor_;
  std::string body_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> served_{0}, failed_handshakes_{0};
  std::thread thread_;
};

}  // namespace

TEST_CASE("HTTPS verifies the server's certificate against the trusted roots") {
  SelfSignedCertificate cert;
  LoopbackTlsServer server(cert, recorded("openai/rewrite.json"));
  LoopbackServer unused;
  auto options = quick_options(unused, WireFormat::openai, nullptr);
  options.base_url = server.url();
  options.retry.max_attempts = 1;

  SECTION("an unknown issuer is rejected") {
    auto client = net::BlockingLlmClient::create(options);
    REQUIRE(client);
    auto r = client->complete(hello());
    REQUIRE_FALSE(r);
    CHECK(r.error().kind == LlmErrorKind::transport);
    CHECK(contains(r.error().message, "TLS handshake"));
    CHECK(contains(r.error().message, "certificate verify failed"));
    CHECK(server.served() == 0);
  }
  SECTION("the same certificate, trusted through ca_file, is accepted and the answer decoded") {
    const std::string ca = fmt::format("{}/kevo-test-ca-{}.pem", std::filesystem::temp_directory_path().string(), ::getpid());
    std::ofstream(ca) << cert.certificate_pem;
    options.ca_file = ca;
    auto client = net::BlockingLlmClient::create(options);
    REQUIRE(client);
    auto r = client->complete(hello());
    std::filesystem::remove(ca);
    REQUIRE(r);
    CHECK(contains(r->text, "void kernel("));
    CHECK(server.served() == 1);
  }
}



TEST_CASE("the LLM synthesizer over HTTP: candidates from recorded answers, failures with reasons") {
  const auto format = GENERATE(WireFormat::openai, WireFormat::anthropic);
  auto problem = load_problem(std::string(KEVO_SOURCE_DIR) + "/problems/cpu_scoring");
  REQUIRE(problem);
  LoopbackServer server;
  std::string no_code = format == WireFormat::openai ? recorded("openai/no_code.json") : recorded("anthropic/refusal.json");
  // The same answer twice would be a repeat (the synthesizer re-asks); the last one differs.
  std::string second_variant = recorded(rewrite_file(format));
  second_variant.replace(second_variant.find("// Each ad is read once"), 23, "// Variant 2: each ad is read once");
  server.script({{.body = recorded(rewrite_file(format))},
                 {.body = no_code},
                 {.status = 500, .body = "{}"},
                 {.fault = Reply::Fault::reset},
                 {.body = second_variant}});
  auto client = net::BlockingLlmClient::create(quick_options(server, format, nullptr));
  REQUIRE(client);
  std::vector<std::string> prompts;
  synth::LlmSynthesizer synth(std::move(*client), {.on_exchange = [&](const synth::Prompt& p, std::string_view) {
                                                     prompts.push_back(p.system + "\n" + p.user);
                                                   }});
  GenerationRequest request;
  request.problem = &*problem;
  request.parent = Attempt{0, std::make_shared<const Candidate>(Candidate{problem->render(problem->default_knobs()), problem->default_knobs(), "template defaults"}),
                           Evaluation{.speedup = 1.0}};
  request.parent.evaluation.diagnostics.bottleneck = Bottleneck::compute;
  request.knowledge = {{.title = "Optimizing compute-bound kernels: Break dependency chains", .category = "optimization", .text = "Keep several accumulators."}};

  auto first = synth.generate(request);
  REQUIRE(first);
  CHECK(contains(first->source, "float s[4] = {0, 0, 0, 0}"));
  CHECK(contains(first->origin, "llm rewrite: The parent is compute-bound"));

  // No code: asked once more, with the reason; that request's 500 and reset are retried inside it.
  auto second = synth.generate(request);
  REQUIRE(second);
  CHECK(contains(second->source, "Variant 2"));
  CHECK(server.received().size() == 5);
  CHECK(contains(server.received()[2].body, "held no usable code"));
  CHECK(contains(server.received()[2].body, format == WireFormat::openai ? "no fenced code block" : "declined"));
  CHECK(synth.failures().total == 0);

  REQUIRE(prompts.size() == 3);
  CHECK(contains(prompts[0], "Break dependency chains"));
  CHECK(contains(prompts[0], "compute-bound"));
  for (const auto& p : prompts) CHECK_FALSE(contains(p, secret_key));
  CHECK(synth.completer().usage().requests == 3);
}

namespace {

using kevo::test::VariantEvaluator;

}  // namespace

TEST_CASE("a search with the LLM synthesizer rides out every fault and learns skills") {
  auto problem = load_problem(std::string(KEVO_SOURCE_DIR) + "/problems/cpu_scoring");
  REQUIRE(problem);
  LoopbackServer server;
  const std::string rewrite = recorded("openai/rewrite.json");
  server.script({{.status = 429, .body = recorded("openai/error_429.json"), .headers = {{"retry-after-ms", "50"}}},
                 {.fault = Reply::Fault::reset},
                 {.body = recorded("openai/malformed.json")},
                 {.body = recorded("openai/empty_choices.json")},
                 {.body = recorded("openai/no_code.json")},
                 {.body = rewrite, .fault = Reply::Fault::slow_body, .delay = 600ms},
                 {.status = 401, .body = recorded("openai/error_401.json")}});
  std::atomic<int> variant{0};
  server.respond_with([&](const Received& r) {
    if (contains(r.body, "distil lessons"))  // the skill writer's request
      return Reply{.body = R"({"choices":[{"message":{"content":"Reading each ad once for all experts cut memory traffic."},"finish_reason":"stop"}],"usage":{"prompt_tokens":100,"completion_tokens":12}})"};
    std::string body = rewrite;
    const int n = ++variant;
    const std::string marker = n % 5 == 0 ? "scratch_total += 1; // Variant" : "// Variant";
    body.replace(body.find("// Each ad is read once"), 23, fmt::format("{} {}: each ad is read once", marker, n));
    return Reply{.body = body};
  });

  auto options = quick_options(server, WireFormat::openai, nullptr);
  options.timeouts.read = 300ms;
  auto llm = net::BlockingLlmClient::create(options);
  REQUIRE(llm);
  auto kb = knowledge::KnowledgeBase::open({.folders = {std::string(KEVO_SOURCE_DIR) + "/knowledge"}});
  REQUIRE(kb);
  std::mutex prompts_mutex;
  std::vector<std::string> prompts;
  synth::LlmSynthesizer synth(*llm, {.on_exchange = [&](const synth::Prompt& p, std::string_view) {
                                       std::lock_guard lock(prompts_mutex);
                                       prompts.push_back(p.user);
                                     }});
  knowledge::LlmSkillWriter skills(*kb, *llm);
  auto store = store::SqliteStore::open(":memory:");
  REQUIRE(store);
  VariantEvaluator evaluator;
  // Repairs off: this search is about faults and what prompts show of siblings and failures, which
  // a repaired failure would change; repairs have their own tests (tests/repair_moves.test.cpp).
  SearchLoop<decltype(synth), search::Greedy, memory::Combined, VariantEvaluator, decltype(skills), store::SqliteStore> loop(
      *problem, std::move(synth), search::Greedy({.repair_share = 0}), memory::Combined{}, evaluator, skills, *store,
      {.jobs = 1, .max_evaluations = 14, .warm_start = 0});  // one job: the prompts' order, and so the faults', is the same every run
  auto result = loop.run(Candidate{problem->render(problem->default_knobs()), problem->default_knobs(), "template defaults"});
  REQUIRE(result);
  CHECK(result->stopped_because == StopReason::evaluation_budget);
  CHECK(result->evaluations == 15);  // the seed and the 14 children: faults cost attempts, never the run
  // Malformed, empty, the re-ask after no code timing out, 401: failed generations, counted apart
  // from the budget, which they do not spend.
  const auto failed = loop.synthesizer().failures();
  CHECK(failed.total >= 3);
  CHECK(failed[synth::AnswerFault::request_failed] >= 1);
  CHECK(failed[synth::AnswerFault::malformed] == 1);
  CHECK(result->failures[FailureKind::generation_failed] == 0);
  CHECK(result->failures[FailureKind::compile_error] >= 1);
  CHECK(result->best_speedup > 1.5);
  CHECK(kb->size("skill") >= 1);
  auto learned = kb->retrieve({.bottleneck = Bottleneck::memory, .problem_words = "cpu_scoring"});
  REQUIRE(!learned.empty());
  CHECK(learned[0].category == "skill");
  CHECK(contains(learned[0].text, "cut memory traffic"));  // the LLM's summary
  const auto usage = loop.synthesizer().completer().usage();
  CHECK(usage.retries >= 2);  // the 429 and the reset
  std::lock_guard lock(prompts_mutex);
  // Later prompts carry what the search learned: the line so far, and the siblings that failed.
  auto any_prompt = [&](std::string_view part) {
    return std::any_of(prompts.begin(), prompts.end(), [&](const std::string& p) { return contains(p, part); });
  };
  CHECK(any_prompt("How this line developed"));
  CHECK(any_prompt("Other children of the current implementation"));
  CHECK(any_prompt("Failed (avoid these mistakes):\n- node"));
  CHECK(any_prompt("failed: compile_error (does not compile)"));
  CHECK(std::any_of(prompts.begin(), prompts.end(), [](const std::string& p) { return contains(p, "Retrieved knowledge"); }));
}

TEST_CASE("a spent token budget stops the search cleanly") {
  auto problem = load_problem(std::string(KEVO_SOURCE_DIR) + "/problems/cpu_scoring");
  REQUIRE(problem);
  LoopbackServer server;
  const std::string rewrite = recorded("openai/rewrite.json");  // 2446 tokens each
  std::atomic<int> variant{0};
  server.respond_with([&](const Received&) {
    std::string body = rewrite;
    body.replace(body.find("// Each ad is read once"), 23, fmt::format("// Variant {}: each ad is read once", ++variant));
    return Reply{.body = body};
  });
  auto options = quick_options(server, WireFormat::openai, nullptr);
  options.budget.max_total_tokens = 3 * 2446;
  auto llm = net::BlockingLlmClient::create(options);
  REQUIRE(llm);
  auto store = store::SqliteStore::open(":memory:");
  REQUIRE(store);
  VariantEvaluator evaluator;
  SearchLoop<synth::LlmSynthesizer<net::BlockingLlmClient>, search::Greedy, memory::Combined, VariantEvaluator,
             knowledge::NullRetriever, store::SqliteStore>
      loop(*problem, synth::LlmSynthesizer(*llm), search::Greedy{}, memory::Combined{}, evaluator, knowledge::NullRetriever{}, *store,
           {.jobs = 1, .max_evaluations = 50, .warm_start = 0});
  auto result = loop.run(Candidate{problem->render(problem->default_knobs()), problem->default_knobs(), "template defaults"});
  REQUIRE(result);
  CHECK(result->stopped_because == StopReason::synthesizer_exhausted);
  CHECK(result->evaluations < 10);
  CHECK(server.received().size() == 3);  // not one request past the budget
  CHECK(llm->budget_exhausted());
}

}  // namespace kevo_tests::llm_client_test
