// serving.hpp (examples/retrieval_server): a Boost.Beast HTTP front end for any RetrievalBackend.
// An example's library, not kevo's: a serving binary links the pipeline (kevo::retrieval,
// kevo::retrieval_cuda) into a server of its own, as Beast keeps its servers in example/. kevo's
// server and its tests use this one, and the installed package does not carry it. JSON in
// (simdjson), JSON out; every network operation has a timeout; a malformed request gets a 400
// with a message and the server keeps serving. Host-only: a GPU backend is passed in as a
// RetrievalBackend.
//
//   POST /search  {"features":[...], "query":[{"category":0,"values":[1,2]}], "k":100, "routing":2}
//              -> {"results":[{"id":7,"score":1.25}, ...]}
//   POST /search_batch  {"requests":[{...as /search...}, ...]}   (at most ServingOptions::max_batch_requests)
//              -> {"answers":[{"results":[...]}, ...]}   (in order; one bad request: a 400 naming it)
//   POST /ads     {"ads":[{"id":7,"embedding":[...],"bias":0.1,"clauses":[{"category":3,"value":5,"exclude":false}],"live":true}]}
//              -> {"upserted":1}
//   POST /expire  {"ids":[7]} -> {"expired":1}
//   POST /regroup (no body) -> {"regrouped":true}   (the live ads back into targeting order, RetrievalBackend::regroup)
//   GET  /health  -> {"backend":"cpu"}   (a GPU backend adds "kernel_policy": the policy it serves with, and where from)
//   GET  /metrics -> the Prometheus text format: answers and latency histograms per endpoint, shed
//                    requests by reason, queue depth, connections, /search_batch sizes, BatchingBackend's batches
//
// Status: 400 for a request the caller got wrong (with its reason, naming the field of a wrong
// type), 405 with `Allow` for another method, 413 for a body over the limit, 500 where the backend
// failed a valid search, 503 (with `Retry-After`) where it could not apply a valid update (such
// as a full index), and where the server sheds load: its queue is full, a request waited past its
// deadline, the connection or in-flight body-byte cap is reached, or it is draining.
//
// Threads: the I/O threads (those running the io_context) only read, parse and write. Searches
// and batches run on a pool of their own (ServingOptions::search_threads), updates on one more
// thread in arrival order, so `/health` and a large upsert's body are read at once under any
// search load.
//
//   RetrievalHttpServer server(io, backend, {asio::ip::make_address("127.0.0.1"), 0});
//   server.start();   // then io.run(); server.port() is the bound port
//   server.drain(std::chrono::seconds(10), [&](bool finished) { io.stop(); });   // on SIGTERM
//
// Why one file of about 930 lines: the sessions, the worker queue, the drain and the metrics share
// the server's state; a request's path reads from top to bottom.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <string>
#include <utility>
#include <vector>

#include "kevo/detail/json_text.hpp"
#include "kevo/retrieval/backend.hpp"
#include "kevo/retrieval/types.hpp"

namespace kevo::retrieval {

namespace serving_detail {

namespace json = simdjson::ondemand;

/// Thrown for a request the caller got wrong; becomes a 400 with this message.
struct BadRequest {
  std::string message;
};

inline std::uint32_t to_u32(std::uint64_t v, const char* what) {
  if (v > 0xffffffffull) throw BadRequest{std::string(what) + " out of range"};
  return static_cast<std::uint32_t>(v);
}

/// A JSON integer that must fit an int (k, routing): a larger one is refused here, not wrapped
/// into a different value that validation would then accept.
inline int to_int(std::int64_t v, const char* what) {
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
    throw BadRequest{std::string(what) + " out of range"};
  return static_cast<int>(v);
}

/// The value of `result`, or a 400 naming the field (`"k" must be an integer`) where the JSON holds
/// a value of another type there; other errors (malformed JSON) pass on as simdjson's.
template <class T, class Result>
T get(Result&& result, const char* field, const char* kind) {
  T value{};
  const simdjson::error_code e = std::forward<Result>(result).get(value);
  if (e == simdjson::INCORRECT_TYPE || e == simdjson::NUMBER_OUT_OF_RANGE || e == simdjson::NUMBER_ERROR)
    throw BadRequest{"\"" + std::string(field) + "\" must be " + kind};
  if (e) throw simdjson::simdjson_error(e);
  return value;
}
template <class Result>
json::array array_of(Result&& r, const char* field, const char* kind) { return get<json::array>(std::forward<Result>(r), field, kind); }
template <class Result>
json::object object_of(Result&& r, const char* field) { return get<json::object>(std::forward<Result>(r), field, "an object"); }
template <class Result>
std::uint32_t u32_of(Result&& r, const char* field) {
  return to_u32(get<std::uint64_t>(std::forward<Result>(r), field, "a non-negative integer"), field);
}

/// The body's one JSON object.
inline json::object root_object(json::document& doc) {
  json::object object;
  if (doc.get_object().get(object)) throw BadRequest{"malformed JSON: the body must be one JSON object"};
  return object;
}

/// Refuses anything after the one JSON value (`{...}{...}`: the second object would be ignored).
inline void expect_end(json::document& doc) {
  if (doc.current_location().error() == simdjson::SUCCESS) throw BadRequest{"trailing content after the JSON value"};
}

inline std::vector<float> float_array(json::value v, const char* field) {
  std::vector<float> out;
  for (auto x : array_of(v, field, "an array of numbers"))
    out.push_back(static_cast<float>(get<double>(x, field, "an array of numbers")));
  return out;
}

inline CategoryQuery parse_query_entry(json::object entry) {
  CategoryQuery q;
  bool has_category = false;
  for (auto f : entry) {
    const std::string_view k = f.unescaped_key();
    if (k == "category") q.category = u32_of(f.value(), "category"), has_category = true;
    else if (k == "values")
      for (auto v : array_of(f.value(), "values", "an array of non-negative integers")) q.values.push_back(u32_of(v, "value"));
    else throw BadRequest{"unknown field in query: " + std::string(k)};
  }
  if (!has_category) throw BadRequest{"a query entry needs \"category\""};
  return q;
}

inline Request parse_search(json::object object) {
  Request r;
  for (auto field : object) {
    const std::string_view key = field.unescaped_key();
    if (key == "features") {
      r.features = float_array(field.value(), "features");
    } else if (key == "query") {
      for (auto entry : array_of(field.value(), "query", "an array of objects"))
        r.query.push_back(parse_query_entry(object_of(entry, "query")));
    } else if (key == "k") {
      r.k = to_int(get<std::int64_t>(field.value(), "k", "an integer"), "k");
    } else if (key == "routing") {
      r.routing = to_int(get<std::int64_t>(field.value(), "routing", "an integer"), "routing");
    } else {
      throw BadRequest{"unknown field: " + std::string(key)};
    }
  }
  return r;
}

inline Request parse_search(json::document& doc) {
  Request r = parse_search(root_object(doc));
  expect_end(doc);
  return r;
}

inline std::vector<Request> parse_search_batch(json::document& doc, std::size_t most) {
  std::vector<Request> requests;
  for (auto field : root_object(doc)) {
    if (std::string_view(field.unescaped_key()) != "requests") throw BadRequest{"expected {\"requests\": [...]}"};
    for (auto entry : array_of(field.value(), "requests", "an array of objects")) {
      if (requests.size() == most) throw BadRequest{"a batch holds at most " + std::to_string(most) + " requests"};
      try {
        requests.push_back(parse_search(object_of(entry, "requests")));
      } catch (const BadRequest& e) {
        throw BadRequest{batch_error(requests.size(), Error{e.message}).error().message};
      }
    }
  }
  expect_end(doc);
  if (requests.empty()) throw BadRequest{"a batch needs at least one request"};
  return requests;
}

inline Clause parse_clause(json::object object) {
  Clause clause;
  bool has_category = false, has_value = false;
  for (auto cf : object) {
    const std::string_view ck = cf.unescaped_key();
    if (ck == "category") clause.category = u32_of(cf.value(), "category"), has_category = true;
    else if (ck == "value") clause.value = u32_of(cf.value(), "value"), has_value = true;
    else if (ck == "exclude") clause.exclude = get<bool>(cf.value(), "exclude", "true or false");
    else throw BadRequest{"unknown field in clause: " + std::string(ck)};
  }
  if (!has_category || !has_value) throw BadRequest{"a clause needs \"category\" and \"value\""};
  return clause;
}

/// An int8 pool's stored form of one embedding: {"values": [d integers], "scales": [numbers]}.
inline QuantizedEmbedding parse_quantized(json::object object) {
  QuantizedEmbedding q;
  for (auto f : object) {
    const std::string_view k = f.unescaped_key();
    if (k == "values") {
      for (auto v : array_of(f.value(), "values", "an array of integers from -127 to 127")) {
        const auto value = get<std::int64_t>(v, "values", "an array of integers from -127 to 127");
        if (value < -127 || value > 127) throw BadRequest{"\"values\" must be an array of integers from -127 to 127"};
        q.values.push_back(static_cast<std::int8_t>(value));
      }
    } else if (k == "scales") {
      q.scales = float_array(f.value(), "scales");
    } else {
      throw BadRequest{"unknown field in quantized: " + std::string(k)};
    }
  }
  return q;
}

inline AdRecord parse_ad(json::object object) {
  AdRecord ad;
  bool has_id = false;
  for (auto f : object) {
    const std::string_view k = f.unescaped_key();
    if (k == "id") ad.id = u32_of(f.value(), "id"), has_id = true;
    else if (k == "embedding") ad.embedding = float_array(f.value(), "embedding");
    else if (k == "quantized") ad.quantized = parse_quantized(object_of(f.value(), "quantized"));
    else if (k == "bias") ad.bias = static_cast<float>(get<double>(f.value(), "bias", "a number"));
    else if (k == "live") ad.live = get<bool>(f.value(), "live", "true or false");
    else if (k == "clauses")
      for (auto c : array_of(f.value(), "clauses", "an array of objects")) ad.clauses.push_back(parse_clause(object_of(c, "clauses")));
    else throw BadRequest{"unknown field in ad: " + std::string(k)};
  }
  if (!has_id) throw BadRequest{"an ad needs \"id\" (an upsert without one would replace ad 0)"};
  return ad;
}

inline std::vector<AdRecord> parse_ads(json::document& doc) {
  std::vector<AdRecord> ads;
  for (auto field : root_object(doc)) {
    if (std::string_view(field.unescaped_key()) != "ads") throw BadRequest{"expected {\"ads\": [...]}"};
    for (auto entry : array_of(field.value(), "ads", "an array of objects")) ads.push_back(parse_ad(object_of(entry, "ads")));
  }
  expect_end(doc);
  return ads;
}

inline std::vector<std::uint32_t> parse_ids(json::document& doc) {
  std::vector<std::uint32_t> ids;
  for (auto field : root_object(doc)) {
    if (std::string_view(field.unescaped_key()) != "ids") throw BadRequest{"expected {\"ids\": [...]}"};
    for (auto v : array_of(field.value(), "ids", "an array of non-negative integers")) ids.push_back(u32_of(v, "id"));
  }
  expect_end(doc);
  return ids;
}

/// The shortest text that reads back as the same number (std::to_chars).
template <class T>
std::string number(T value) {
  char buffer[64];
  const auto end = std::to_chars(buffer, buffer + sizeof buffer, value).ptr;
  return std::string(buffer, end);
}

/// {"results":[{"id":..,"score":..}, ...]}
inline std::string results_json(const std::vector<ScoredAd>& top) {
  std::string out = "{\"results\":[";
  for (std::size_t i = 0; i < top.size(); ++i) {
    if (!is_finite(top[i].score)) throw std::runtime_error("a score is not finite (a bug)");  // JSON has no NaN
    out += (i ? ",{\"id\":" : "{\"id\":") + number(top[i].id) + ",\"score\":" + number(top[i].score) + "}";
  }
  return out + "]}";
}

/// What `/metrics` reports, in the Prometheus text format: answers and their latency (read of the
/// header to the answer written) per endpoint, the requests the server shed and why, the sizes of
/// /search_batch requests. Thread-safe; one lock, held for a few additions.
class ServingMetrics {
 public:
  static constexpr const char* kEndpoints[] = {"/search", "/search_batch", "/ads", "/expire", "/regroup", "/health", "/metrics", "other"};
  static constexpr double kSeconds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  static constexpr double kBatch[] = {1, 2, 4, 8, 16, 32, 64};
  static constexpr const char* kReasons[] = {"queue_full", "deadline", "draining", "connections", "body_bytes"};
  enum Reason { queue_full, deadline, draining, connections, body_bytes };

  static std::size_t endpoint(std::string_view target) {
    for (std::size_t e = 0; e + 1 < std::size(kEndpoints); ++e)
      if (target == kEndpoints[e]) return e;
    return std::size(kEndpoints) - 1;
  }
  void answered(std::string_view target, unsigned status, double seconds) {
    const std::size_t e = endpoint(target);
    std::lock_guard lock(mutex_);
    ++status_counts_[{e, status}];
    latency_[e].add(seconds, kSeconds);
  }
  void rejected(Reason reason) {
    std::lock_guard lock(mutex_);
    ++rejected_[reason];
  }
  void batch(std::size_t requests) {
    std::lock_guard lock(mutex_);
    batch_sizes_.add(static_cast<double>(requests), kBatch);
  }
  /// The exposition; `gauges` are name, help and value lines added as they are.
  std::string text(const std::vector<std::tuple<std::string, std::string, double>>& gauges) const {
    std::lock_guard lock(mutex_);
    std::string out = "# HELP kevo_http_requests_total Requests answered, by endpoint and status.\n"
                      "# TYPE kevo_http_requests_total counter\n";
    for (const auto& [key, n] : status_counts_)
      out += "kevo_http_requests_total{endpoint=\"" + std::string(kEndpoints[key.first]) + "\",status=\"" +
             std::to_string(key.second) + "\"} " + std::to_string(n) + "\n";
    out += "# HELP kevo_http_request_duration_seconds From a request's header read to its answer written.\n"
           "# TYPE kevo_http_request_duration_seconds histogram\n";
    for (std::size_t e = 0; e < std::size(kEndpoints); ++e)
      latency_[e].write(out, "kevo_http_request_duration_seconds", "endpoint=\"" + std::string(kEndpoints[e]) + "\",", kSeconds);
    out += "# HELP kevo_rejected_requests_total Requests answered 503 to shed load, by reason.\n"
           "# TYPE kevo_rejected_requests_total counter\n";
    for (std::size_t r = 0; r < std::size(kReasons); ++r)
      out += "kevo_rejected_requests_total{reason=\"" + std::string(kReasons[r]) + "\"} " + std::to_string(rejected_[r]) + "\n";
    out += "# HELP kevo_search_batch_requests Requests per POST /search_batch.\n"
           "# TYPE kevo_search_batch_requests histogram\n";
    batch_sizes_.write(out, "kevo_search_batch_requests", "", kBatch);
    for (const auto& [name, help, value] : gauges)
      out += "# HELP " + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + " " + number(value) + "\n";
    return out;
  }

 private:
  struct Histogram {
    std::vector<std::uint64_t> buckets;  // cumulative counts are summed when written
    double sum = 0;
    std::uint64_t count = 0;
    template <std::size_t N>
    void add(double x, const double (&bounds)[N]) {
      buckets.resize(N);
      for (std::size_t b = 0; b < N; ++b)
        if (x <= bounds[b]) {
          ++buckets[b];
          break;
        }
      sum += x, ++count;
    }
    template <std::size_t N>
    void write(std::string& out, const std::string& name, const std::string& labels, const double (&bounds)[N]) const {
      std::uint64_t below = 0;
      for (std::size_t b = 0; b < N; ++b) {
        below += b < buckets.size() ? buckets[b] : 0;
        out += name + "_bucket{" + labels + "le=\"" + number(bounds[b]) + "\"} " + std::to_string(below) + "\n";
      }
      out += name + "_bucket{" + labels + "le=\"+Inf\"} " + std::to_string(count) + "\n";
      const std::string plain = labels.empty() ? "" : "{" + labels.substr(0, labels.size() - 1) + "}";
      out += name + "_sum" + plain + " " + number(sum) + "\n" + name + "_count" + plain + " " + std::to_string(count) + "\n";
    }
  };
  mutable std::mutex mutex_;
  std::map<std::pair<std::size_t, unsigned>, std::uint64_t> status_counts_;
  Histogram latency_[std::size(kEndpoints)];
  std::uint64_t rejected_[std::size(kReasons)] = {};
  Histogram batch_sizes_;
};

}  // namespace serving_detail

struct ServingOptions {
  std::chrono::milliseconds io_timeout{10000};  // a whole request's read (header and body), and each write
  std::size_t max_body_bytes = 64u << 20;       // a larger body: 413
  std::size_t max_batch_requests = 64;          // per POST /search_batch
  unsigned search_threads = 8;                  // the pool that runs searches and batches
  std::size_t max_queued = 1024;                // searches, batches and updates queued or running; more: 503
  std::chrono::milliseconds request_deadline{30000};  // one still queued after this: 503, not run
  std::size_t max_connections = 1024;           // more: 503 and closed
  std::size_t max_body_bytes_in_flight = std::size_t{1} << 30;  // declared bodies being read or served; more: 503
};

/// The answer to one request: status and JSON body.
using HttpAnswer = std::pair<boost::beast::http::status, std::string>;

/// One HTTP server over one backend; its I/O runs on the io_context it is given (any number of
/// threads), its backend calls on pools of its own.
class RetrievalHttpServer {
 public:
  RetrievalHttpServer(boost::asio::io_context& io, RetrievalBackend& backend, boost::asio::ip::tcp::endpoint endpoint,
                      ServingOptions options = {})
      : RetrievalHttpServer(io, backend, boost::asio::ip::tcp::acceptor(io, endpoint), options) {}
  /// Over an acceptor already listening: a binary binds its port before loading its pool, so that
  /// a port in use is reported at once.
  RetrievalHttpServer(boost::asio::io_context& io, RetrievalBackend& backend, boost::asio::ip::tcp::acceptor acceptor,
                      ServingOptions options = {})
      : io_(io), acceptor_(std::move(acceptor)), backend_(backend), options_(options), drain_timer_(io),
        searches_(std::max(1u, options.search_threads)), updates_(1) {}

  unsigned short port() const { return acceptor_.local_endpoint().port(); }
  void start() { accept(); }
  void stop() {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
  }

  /// Graceful drain (on SIGTERM): stops accepting, answers new requests on open connections 503
  /// with `Connection: close`, runs what is queued until shortly before `deadline` (what is still
  /// queued then is answered 503), and calls done(true) once every request taken has been
  /// answered, or done(false) at the deadline (a search still running). Runs on the io_context:
  /// the caller then stops it.
  void drain(std::chrono::milliseconds deadline, std::function<void(bool finished)> done) {
    boost::asio::post(io_, [this, deadline, done = std::move(done)]() mutable {
      // What is still queued at the cutoff is answered 503 then, so that its answer is written
      // before the deadline.
      drain_deadline_ = std::chrono::steady_clock::now() + deadline;
      drain_cutoff_ = drain_deadline_ - std::min<std::chrono::milliseconds>(deadline / 4, std::chrono::milliseconds(200));
      drain_cut_running_ = drain_deadline_ - std::min<std::chrono::milliseconds>(deadline / 8, std::chrono::milliseconds(100));
      draining_ = true;
      take_backlog();
      stop();
      poll_drain(std::move(done), 0);
    });
  }

  /// Requests taken (header read) and not yet answered; searches and updates queued or running.
  std::size_t active_requests() const { return gauges_->active_requests; }
  std::size_t queued() const { return queued_; }
  std::size_t connections() const { return gauges_->connections; }

  /// The answer to one request, run on the calling thread. Public so that it can be tested without sockets.
  HttpAnswer handle(boost::beast::http::verb method, std::string_view target, const std::string& body,
                    simdjson::ondemand::parser& parser) {
    Prepared prepared = prepare(method, target, body, parser);
    return prepared.answer ? std::move(*prepared.answer) : run(prepared.work);
  }

  /// The methods `target` takes, for a 405's `Allow`.
  static const char* allowed_methods(std::string_view target) {
    return target == "/health" || target == "/metrics" ? "GET" : "POST";
  }

  /// GET /metrics: the Prometheus text exposition (ServingMetrics, and the queue and caps now).
  std::string metrics_text() const {
    std::vector<std::tuple<std::string, std::string, double>> gauges{
        {"kevo_queue_depth", "Searches, batches and updates queued or running.", static_cast<double>(queued_)},
        {"kevo_active_requests", "Requests read and not yet answered.", static_cast<double>(gauges_->active_requests)},
        {"kevo_connections", "Open connections.", static_cast<double>(gauges_->connections)},
        {"kevo_body_bytes_in_flight", "Declared body bytes of requests being read or served.", static_cast<double>(gauges_->body_bytes)},
        {"kevo_draining", "1 while the server drains.", draining_ ? 1.0 : 0.0}};
    std::string out = metrics_.text(gauges);
    if (const auto* batching = dynamic_cast<const BatchingBackend*>(&backend_)) {  // the engine's batches
      const BatchingBackend::Counts c = batching->counts();
      out += "# HELP kevo_batched_searches_total Searches answered through BatchingBackend.\n"
             "# TYPE kevo_batched_searches_total counter\nkevo_batched_searches_total " + std::to_string(c.searches) +
             "\n# HELP kevo_search_batches_total Batches BatchingBackend formed (searches / batches: the mean batch size).\n"
             "# TYPE kevo_search_batches_total counter\nkevo_search_batches_total " + std::to_string(c.batches) +
             "\n# HELP kevo_search_batches_retried_total Batches the engine failed, retried one search at a time.\n"
             "# TYPE kevo_search_batches_retried_total counter\nkevo_search_batches_retried_total " +
             std::to_string(c.batches_retried) + "\n";
    }
    return out;
  }

 private:
  /// Counts that sessions change; shared, since a session may outlive the server (destroyed with
  /// the io_context's pending handlers).
  struct Gauges {
    std::atomic<std::size_t> connections{0}, active_requests{0}, body_bytes{0};
  };

  /// A parsed, validated request: answered at once, or a backend call for a worker.
  struct Prepared {
    std::optional<HttpAnswer> answer;
    std::function<HttpAnswer()> work;
    bool update = false;  // on the update thread, in arrival order, not behind searches
  };

  /// The answer's status from whose fault an error is: the caller's 400, capacity 503, else 500.
  static boost::beast::http::status status_for(ErrorKind kind) {
    using boost::beast::http::status;
    switch (kind) {
      case ErrorKind::caller: return status::bad_request;
      case ErrorKind::capacity: return status::service_unavailable;
      case ErrorKind::backend:
      case ErrorKind::bug: break;
    }
    return status::internal_server_error;
  }

  static HttpAnswer error(boost::beast::http::status s, std::string_view message) {
    return {s, "{\"error\":" + kevo::detail::json_quote(message) + "}"};
  }
  static Prepared answer(HttpAnswer a) { return {std::move(a), {}, false}; }

  /// {"backend":"cuda","kernel_policy":"tuned for ..."}: the backend, and the kernel policy it serves
  /// with where it has one.
  std::string health_json() const {
    namespace sd = serving_detail;
    std::string json = "{\"backend\":" + kevo::detail::json_quote(backend_.name());
    if (const std::string policy = backend_.kernel_policy(); !policy.empty()) json += ",\"kernel_policy\":" + kevo::detail::json_quote(policy);
    return json + "}";
  }

  Prepared prepare(boost::beast::http::verb method, std::string_view target, const std::string& body,
                   simdjson::ondemand::parser& parser) {
    using boost::beast::http::status;
    using boost::beast::http::verb;
    namespace sd = serving_detail;
    if (target == "/health")
      return answer(method == verb::get ? HttpAnswer{status::ok, health_json()} : error(status::method_not_allowed, "use GET"));
    if (target == "/metrics")
      return answer(method == verb::get ? HttpAnswer{status::ok, metrics_text()} : error(status::method_not_allowed, "use GET"));
    if (target != "/search" && target != "/search_batch" && target != "/ads" && target != "/expire" && target != "/regroup")
      return answer(error(status::not_found, "no such path"));
    if (method != verb::post) return answer(error(status::method_not_allowed, "use POST"));
    if (target == "/regroup")  // an update like the others: on the update thread, in arrival order; no body to read
      return {std::nullopt, [this] {
                if (auto ok = backend_.regroup(); !ok) return error(status_for(ok.error().kind), ok.error().message);
                return HttpAnswer{status::ok, "{\"regrouped\":true}"};
              }, true};
    try {
      // The padded copy and the document live together in this scope; no view outlives them.
      const simdjson::padded_string input(body);
      simdjson::ondemand::document doc = parser.iterate(input);
      if (target == "/search") return prepare_search(sd::parse_search(doc));
      if (target == "/search_batch") return prepare_batch(sd::parse_search_batch(doc, options_.max_batch_requests));
      if (target == "/ads") return prepare_upsert(sd::parse_ads(doc));
      std::vector<std::uint32_t> ids = sd::parse_ids(doc);
      return {std::nullopt, [this, ids = std::move(ids)] {
                auto expired = backend_.expire(std::span<const std::uint32_t>(ids.data(), ids.size()));
                if (!expired) return error(status::service_unavailable, expired.error().message);
                return HttpAnswer{status::ok, "{\"expired\":" + sd::number(*expired) + "}"};
              }, true};
    } catch (const sd::BadRequest& e) {
      return answer(error(status::bad_request, e.message));
    } catch (const simdjson::simdjson_error& e) {
      return answer(error(status::bad_request, std::string("malformed JSON: ") + e.what()));
    } catch (const std::exception& e) {  // (out of memory): this request fails, the server goes on
      return answer(error(status::internal_server_error, std::string("internal error: ") + e.what()));
    }
  }

  // The request is checked before it is queued, so that what the backend refuses after these checks
  // is its own failure (500, 503), not the caller's (400); a request too large for the model's fp16
  // vectors is found only by running its towers, and is the caller's.
  static HttpAnswer search_failed(const Error& e) { return error(status_for(e.kind), e.message); }

  // The request is checked once, here, and the backend takes the checked form (search_checked). A
  // CheckedRequest refers to its request, so the request is held where it will not move again.
  Prepared prepare_search(Request request) {
    using boost::beast::http::status;
    auto held = std::make_shared<const Request>(std::move(request));
    auto checked = check_request(backend_.schema(), backend_.model(), *held);
    if (!checked) return answer(error(status::bad_request, checked.error().message));
    return {std::nullopt, [this, held, checked = *checked] {
              auto top = backend_.search_checked(checked);
              if (!top) return search_failed(top.error());
              return HttpAnswer{status::ok, serving_detail::results_json(*top)};
            }, false};
  }

  Prepared prepare_batch(std::vector<Request> requests) {
    using boost::beast::http::status;
    auto held = std::make_shared<const std::vector<Request>>(std::move(requests));
    auto checked = check_requests(backend_.schema(), backend_.model(), *held);
    if (!checked) return answer(error(status::bad_request, checked.error().message));
    metrics_.batch(held->size());
    return {std::nullopt, [this, held, checked = std::move(*checked)] {
              auto answers = backend_.search_batch_checked(checked);
              if (!answers) return search_failed(answers.error());
              std::string out = "{\"answers\":[";
              for (std::size_t r = 0; r < answers->size(); ++r)
                out += (r ? "," : "") + serving_detail::results_json((*answers)[r]);
              return HttpAnswer{status::ok, out + "]}"};
            }, false};
  }

  Prepared prepare_upsert(std::vector<AdRecord> ads) {
    using boost::beast::http::status;
    for (const AdRecord& ad : ads)
      if (auto ok = validate_ad(backend_.schema(), ad); !ok) return answer(error(status::bad_request, ok.error().message));
    return {std::nullopt, [this, ads = std::move(ads)] {
              if (auto ok = backend_.upsert(std::span<const AdRecord>(ads.data(), ads.size())); !ok)
                return error(status_for(ok.error().kind), ok.error().message);  // 503 for a full index
              return HttpAnswer{status::ok, "{\"upserted\":" + serving_detail::number(ads.size()) + "}"};
            }, true};
  }

  static HttpAnswer run(const std::function<HttpAnswer()>& work) {
    try {
      return work();
    } catch (const std::exception& e) {  // (out of memory, no thread to start): this request fails, the server goes on
      return error(boost::beast::http::status::internal_server_error, std::string("internal error: ") + e.what());
    }
  }

  /// A backend call waiting for (or taken by) a worker; answered exactly once: by the worker, or
  /// during a drain with a 503 (still queued at the cutoff, or still running near the deadline).
  struct Job {
    std::function<HttpAnswer()> work;
    std::function<void(HttpAnswer)> done;
    std::chrono::steady_clock::time_point queued_at;
    std::atomic<bool> taken{false}, answered{false};
    bool finish(HttpAnswer a) {
      if (answered.exchange(true)) return false;
      done(std::move(a));
      return true;
    }
  };

  /// Queues `prepared.work` on its pool, or answers 503 where the queue is full; `done` gets the
  /// answer on a worker thread.
  void submit(Prepared prepared, std::function<void(HttpAnswer)> done) {
    using boost::beast::http::status;
    if (queued_.fetch_add(1) >= options_.max_queued) {
      --queued_;
      metrics_.rejected(serving_detail::ServingMetrics::queue_full);
      return done(error(status::service_unavailable, "the server is busy: " + std::to_string(options_.max_queued) +
                                                         " requests are queued; retry later"));
    }
    auto job = std::make_shared<Job>();
    job->work = std::move(prepared.work);
    job->done = std::move(done);
    job->queued_at = std::chrono::steady_clock::now();
    {
      std::lock_guard lock(jobs_mutex_);
      jobs_.push_back(job);
    }
    auto run_job = [this, job] {
      if (job->taken.exchange(true)) return;  // answered at the drain cutoff
      const auto now = std::chrono::steady_clock::now();
      const bool late = now - job->queued_at > options_.request_deadline, cut = draining_ && now >= drain_cutoff_;
      if (late || cut) metrics_.rejected(late ? serving_detail::ServingMetrics::deadline : serving_detail::ServingMetrics::draining);
      HttpAnswer a = late
                         ? error(status::service_unavailable, "the request waited past its deadline (" +
                                                                  std::to_string(options_.request_deadline.count()) + " ms)")
                     : cut ? error(status::service_unavailable, "the server is draining")
                                                           : run(job->work);
      job->work = nullptr;  // what the request holds (a large upsert's ads) goes before the answer
      forget(job);
      --queued_;
      job->finish(std::move(a));
    };
    if (prepared.update) boost::asio::post(updates_, std::move(run_job));
    else boost::asio::post(searches_, std::move(run_job));
  }

  void forget(const std::shared_ptr<Job>& job) {
    std::lock_guard lock(jobs_mutex_);
    std::erase(jobs_, job);
  }

  /// At the drain's cutoff: every job no worker has taken is answered 503 now; and near its
  /// deadline (`running_too`), every job still running (its worker's answer is then dropped).
  void answer_queued_jobs(bool running_too) {
    using boost::beast::http::status;
    std::vector<std::shared_ptr<Job>> jobs;
    {
      std::lock_guard lock(jobs_mutex_);
      jobs = jobs_;
    }
    for (auto& job : jobs) {
      const bool queued = !job->taken.exchange(true);
      if (queued) forget(job), --queued_;
      if ((queued || running_too) &&
          job->finish(error(status::service_unavailable, queued ? "the server is draining"
                                                                : "the server is draining: the search was cut off")))
        metrics_.rejected(serving_detail::ServingMetrics::draining);
    }
  }

  /// Finished once nothing is active for a few polls in a row: a request whose bytes have arrived
  /// but whose read has not completed yet is not counted, and gets a moment to be.
  void poll_drain(std::function<void(bool)> done, int quiet_polls) {
    quiet_polls = gauges_->active_requests == 0 && queued_ == 0 && !request_waiting() ? quiet_polls + 1 : 0;
    if (quiet_polls >= 4) return done(true);
    const auto now = std::chrono::steady_clock::now();
    if (now >= drain_cutoff_) answer_queued_jobs(now >= drain_cut_running_);
    if (now >= drain_deadline_) return done(false);
    drain_timer_.expires_after(std::chrono::milliseconds(5));
    drain_timer_.async_wait([this, done = std::move(done), quiet_polls](boost::system::error_code ec) mutable {
      if (!ec) poll_drain(std::move(done), quiet_polls);
    });
  }

  /// Whether a connection waiting for its next request has bytes of one already (read next).
  bool request_waiting() {
    std::lock_guard lock(sessions_mutex_);
    for (const auto& weak : sessions_)
      if (auto session = weak.lock(); session && session->request_waiting()) return true;
    return false;
  }

  bool reserve_body(std::size_t bytes) {
    std::size_t now = gauges_->body_bytes;
    do {
      if (bytes > 0 && now + bytes > options_.max_body_bytes_in_flight) return false;
    } while (!gauges_->body_bytes.compare_exchange_weak(now, now + bytes));
    return true;
  }

  /// One connection: reads a request (header first, so that `Expect: 100-continue` is answered and
  /// the body's size is checked against the caps before it is read), answers it, and reads the next.
  class Session : public std::enable_shared_from_this<Session> {
   public:
    Session(boost::asio::ip::tcp::socket socket, RetrievalHttpServer& server)
        : stream_(std::move(socket)), server_(server), gauges_(server.gauges_) {
      ++gauges_->connections;
    }
    ~Session() {
      end_request();
      --gauges_->connections;
    }
    void read() {
      awaiting_header_ = true;
      parser_.emplace();
      parser_->body_limit(server_.options_.max_body_bytes);
      stream_.expires_after(server_.options_.io_timeout);  // for the whole request, header and body
      boost::beast::http::async_read_header(stream_, buffer_, *parser_,
                                            [self = shared_from_this()](boost::beast::error_code ec, std::size_t) {
                                              self->on_header(ec);
                                            });
    }
    /// Answers 503 without reading (over the connection cap) and closes.
    void refuse(std::string_view message) {
      begin_request();
      respond({boost::beast::http::status::service_unavailable, error_body(message)}, false);
    }

    /// Waiting for a request whose bytes have arrived (FIONREAD on the socket, from any thread:
    /// asked only during a drain).
    bool request_waiting() {
      boost::system::error_code ec;
      return awaiting_header_ && stream_.socket().available(ec) > 0 && !ec;
    }

   private:
    static std::string error_body(std::string_view message) {
      return "{\"error\":" + kevo::detail::json_quote(message) + "}";
    }
    void on_header(boost::beast::error_code ec) {
      namespace http = boost::beast::http;
      using http::status;
      if (ec) return awaiting_header_ = false, on_read_error(ec);
      begin_request();  // (before it stops waiting: a drain sees it as one or the other)
      awaiting_header_ = false;
      target_ = std::string(parser_->get().target());
      head_ = parser_->get().method() == http::verb::head;
      using Metrics = serving_detail::ServingMetrics;
      const std::size_t limit = server_.options_.max_body_bytes;
      const std::size_t declared = parser_->content_length() ? static_cast<std::size_t>(*parser_->content_length())
                                                             : parser_->chunked() ? limit : 0;
      if (server_.draining_) {
        // A small body is read first: closing with bytes unread would reset the connection, and
        // the reset could reach the client before the answer does.
        server_.metrics_.rejected(Metrics::draining);
        refused_ = error(status::service_unavailable, "the server is draining");
        if (declared == 0 || declared > (64u << 10)) return respond(std::move(*refused_), false);
        return read_body();
      }
      if (declared > limit) return respond(error(status::payload_too_large, "body limit exceeded"), false);
      if (!server_.reserve_body(declared)) {
        server_.metrics_.rejected(Metrics::body_bytes);
        return respond(error(status::service_unavailable, "too many body bytes in flight; retry later"), false);
      }
      reserved_ = declared;
      if (!boost::beast::iequals(parser_->get()[http::field::expect], "100-continue")) return read_body();
      interim_.emplace(status::continue_, 11);
      http::async_write(stream_, *interim_, [self = shared_from_this()](boost::beast::error_code ec, std::size_t) {
        if (ec) return self->close();
        self->stream_.expires_after(self->server_.options_.io_timeout);  // the body's read starts now
        self->read_body();
      });
    }
    void read_body() {
      boost::beast::http::async_read(stream_, buffer_, *parser_,
                                     [self = shared_from_this()](boost::beast::error_code ec, std::size_t) {
                                       self->on_read(ec);
                                     });
    }
    void on_read_error(boost::beast::error_code ec) {
      namespace http = boost::beast::http;
      if (ec == http::error::end_of_stream || ec == boost::beast::error::timeout || ec == boost::asio::error::operation_aborted)
        return close();
      if (ec == http::error::body_limit)
        return respond(error(http::status::payload_too_large, "body limit exceeded"), false);
      begin_request();  // an unparsable request: answer 400 and close
      respond(error(http::status::bad_request, "bad HTTP request: " + ec.message()), false);
    }
    void on_read(boost::beast::error_code ec) {
      if (ec) return on_read_error(ec);
      if (refused_) {
        HttpAnswer a = std::move(*refused_);
        refused_.reset();
        return respond(std::move(a), false);
      }
      Prepared prepared;
      bool keep_alive = false;
      {
        auto request = parser_->release();  // the body goes at the end of this scope
        parser_.reset();
        keep_alive = request.keep_alive();
        prepared = server_.prepare(request.method(), request.target(), request.body(), *json_);
      }
      release_buffers();
      if (prepared.answer) return respond(std::move(*prepared.answer), keep_alive);
      server_.submit(std::move(prepared), [self = shared_from_this(), keep_alive](HttpAnswer a) {
        boost::asio::post(self->stream_.get_executor(), [self, keep_alive, a = std::move(a)]() mutable {
          self->respond(std::move(a), keep_alive);
        });
      });
    }
    /// A large body leaves no memory behind on a keep-alive connection.
    void release_buffers() {
      buffer_.shrink_to_fit();
      if (json_->capacity() > (std::size_t{1} << 20)) json_.emplace();
    }
    void respond(HttpAnswer a, bool keep_alive) {
      namespace http = boost::beast::http;
      keep_alive = keep_alive && !server_.draining_;
      response_ = http::response<http::string_body>(a.first, 11);
      const bool exposition = target_ == "/metrics" && a.first == http::status::ok;
      response_.set(http::field::content_type, exposition ? "text/plain; version=0.0.4" : "application/json");
      if (a.first == http::status::method_not_allowed) response_.set(http::field::allow, allowed_methods(target_));
      if (a.first == http::status::service_unavailable) response_.set(http::field::retry_after, "1");
      response_.keep_alive(keep_alive);
      if (!head_) response_.body() = std::move(a.second);  // a HEAD answer has no body
      response_.prepare_payload();
      stream_.expires_after(server_.options_.io_timeout);
      http::async_write(stream_, response_, [self = shared_from_this(), keep_alive](boost::beast::error_code ec, std::size_t) {
        self->server_.metrics_.answered(self->target_, static_cast<unsigned>(self->response_.result_int()),
                                        std::chrono::duration<double>(std::chrono::steady_clock::now() - self->started_).count());
        self->response_ = {};
        self->end_request();
        if (!ec && keep_alive) self->read();
        else if (!ec) self->linger();
        else self->close();
      });
    }
    /// After the last answer: stops sending and reads what the client still sends (a body not
    /// read) until it closes or the timeout, so that the answer is not lost to a reset.
    void linger() {
      boost::beast::error_code ignored;
      stream_.socket().shutdown(boost::asio::ip::tcp::socket::shutdown_send, ignored);
      stream_.expires_after(std::min<std::chrono::milliseconds>(server_.options_.io_timeout, std::chrono::seconds(2)));
      discard();
    }
    void discard() {
      scratch_.resize(16384);
      stream_.async_read_some(boost::asio::buffer(scratch_), [self = shared_from_this()](boost::beast::error_code ec, std::size_t) {
        if (!ec) self->discard();
      });
    }
    void close() {
      boost::beast::error_code ignored;
      stream_.socket().shutdown(boost::asio::ip::tcp::socket::shutdown_send, ignored);
    }
    void begin_request() {
      if (!active_) active_ = true, ++gauges_->active_requests, started_ = std::chrono::steady_clock::now();
    }
    void end_request() {
      gauges_->body_bytes -= reserved_;
      reserved_ = 0;
      if (active_) active_ = false, --gauges_->active_requests;
    }

    boost::beast::tcp_stream stream_;
    boost::beast::flat_buffer buffer_;
    std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
    std::optional<boost::beast::http::response<boost::beast::http::empty_body>> interim_;  // 100 Continue
    boost::beast::http::response<boost::beast::http::string_body> response_;
    std::optional<simdjson::ondemand::parser> json_{std::in_place};  // reused for every request of this connection
    std::vector<char> scratch_;
    std::string target_;
    bool head_ = false, active_ = false;
    std::optional<HttpAnswer> refused_;  // the answer to a request, once its body is read (during a drain)
    std::atomic<bool> awaiting_header_{false};
    std::size_t reserved_ = 0;  // of gauges_->body_bytes
    std::chrono::steady_clock::time_point started_{};  // this request's header read
    RetrievalHttpServer& server_;  // not used once the server is gone (in the destructor)
    std::shared_ptr<Gauges> gauges_;
  };

  void accept() {
    acceptor_.async_accept(boost::asio::make_strand(io_), [this](boost::beast::error_code ec,
                                                                  boost::asio::ip::tcp::socket socket) {
      if (!ec) serve(std::move(socket));  // (even once stopped: taken before that, its client waits)
      if (ec == boost::asio::error::operation_aborted || !acceptor_.is_open()) return;  // stopped
      accept();
    });
  }
  void serve(boost::asio::ip::tcp::socket socket) {
    auto session = std::make_shared<Session>(std::move(socket), *this);
    {
      std::lock_guard lock(sessions_mutex_);
      if (sessions_.size() > 2 * gauges_->connections + 64) std::erase_if(sessions_, [](const auto& w) { return w.expired(); });
      sessions_.push_back(session);
    }
    if (gauges_->connections > options_.max_connections) {
      metrics_.rejected(serving_detail::ServingMetrics::connections);
      session->refuse("too many connections (" + std::to_string(options_.max_connections) + "); retry later");
    } else {
      session->read();
    }
  }
  /// Takes the connections the kernel has already accepted (a client of one has sent its request
  /// and waits), so that each is answered (503) rather than reset when the acceptor closes.
  void take_backlog() {
    boost::system::error_code ec;
    acceptor_.non_blocking(true, ec);
    for (int n = 0; !ec && n < 4096; ++n) {
      boost::asio::ip::tcp::socket socket(boost::asio::make_strand(io_));
      acceptor_.accept(socket, ec);
      if (!ec) serve(std::move(socket));
    }
  }

  boost::asio::io_context& io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  RetrievalBackend& backend_;
  ServingOptions options_;
  std::shared_ptr<Gauges> gauges_ = std::make_shared<Gauges>();
  std::atomic<std::size_t> queued_{0};
  std::atomic<bool> draining_{false};
  serving_detail::ServingMetrics metrics_;
  // Written before draining_ is set.
  std::chrono::steady_clock::time_point drain_deadline_{}, drain_cutoff_{}, drain_cut_running_{};
  boost::asio::steady_timer drain_timer_;
  std::mutex jobs_mutex_, sessions_mutex_;
  std::vector<std::weak_ptr<Session>> sessions_;  // for a drain: connections with a request not yet read
  std::vector<std::shared_ptr<Job>> jobs_;  // queued or running
  // Last, so that they stop (and their threads join) before anything their jobs use goes.
  boost::asio::thread_pool searches_;
  boost::asio::thread_pool updates_;
};

}  // namespace kevo::retrieval
