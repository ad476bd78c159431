// kevo/retrieval/serving.hpp: a Boost.Beast HTTP front end for any RetrievalBackend. JSON in
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
//   GET  /health  -> {"backend":"cpu"}
//
// Status: 400 for a request the caller got wrong (with its reason), 500 where the backend failed
// a valid search, 503 where it could not apply a valid update (such as a full index).
//
//   RetrievalHttpServer server(io, backend, {asio::ip::make_address("127.0.0.1"), 0});
//   server.start();   // then io.run(); server.port() is the bound port
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <simdjson.h>

#include <charconv>
#include <chrono>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

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

inline std::vector<float> float_array(json::value v) {
  std::vector<float> out;
  for (auto x : v.get_array()) out.push_back(static_cast<float>(x.get_double()));
  return out;
}

inline Request parse_search(json::object object) {
  Request r;
  for (auto field : object) {
    const std::string_view key = field.unescaped_key();
    if (key == "features") {
      r.features = float_array(field.value());
    } else if (key == "query") {
      for (auto entry : field.value().get_array()) {
        CategoryQuery q;
        bool has_category = false;
        for (auto f : entry.get_object()) {
          const std::string_view k = f.unescaped_key();
          if (k == "category") q.category = to_u32(f.value().get_uint64(), "category"), has_category = true;
          else if (k == "values")
            for (auto v : f.value().get_array()) q.values.push_back(to_u32(v.get_uint64(), "value"));
          else throw BadRequest{"unknown field in query: " + std::string(k)};
        }
        if (!has_category) throw BadRequest{"a query entry needs \"category\""};
        r.query.push_back(std::move(q));
      }
    } else if (key == "k") {
      r.k = to_int(field.value().get_int64(), "k");
    } else if (key == "routing") {
      r.routing = to_int(field.value().get_int64(), "routing");
    } else {
      throw BadRequest{"unknown field: " + std::string(key)};
    }
  }
  return r;
}

inline Request parse_search(json::document& doc) { return parse_search(doc.get_object()); }

inline std::vector<Request> parse_search_batch(json::document& doc, std::size_t most) {
  std::vector<Request> requests;
  for (auto field : doc.get_object()) {
    if (std::string_view(field.unescaped_key()) != "requests") throw BadRequest{"expected {\"requests\": [...]}"};
    for (auto entry : field.value().get_array()) {
      if (requests.size() == most) throw BadRequest{"a batch holds at most " + std::to_string(most) + " requests"};
      try {
        requests.push_back(parse_search(entry.get_object()));
      } catch (const BadRequest& e) {
        throw BadRequest{batch_error(requests.size(), Error{e.message}).error().message};
      }
    }
  }
  if (requests.empty()) throw BadRequest{"a batch needs at least one request"};
  return requests;
}

inline std::vector<AdRecord> parse_ads(json::document& doc) {
  std::vector<AdRecord> ads;
  for (auto field : doc.get_object()) {
    if (std::string_view(field.unescaped_key()) != "ads") throw BadRequest{"expected {\"ads\": [...]}"};
    for (auto entry : field.value().get_array()) {
      AdRecord ad;
      bool has_id = false;
      for (auto f : entry.get_object()) {
        const std::string_view k = f.unescaped_key();
        if (k == "id") ad.id = to_u32(f.value().get_uint64(), "id"), has_id = true;
        else if (k == "embedding") ad.embedding = float_array(f.value());
        else if (k == "bias") ad.bias = static_cast<float>(f.value().get_double());
        else if (k == "live") ad.live = f.value().get_bool();
        else if (k == "clauses")
          for (auto c : f.value().get_array()) {
            Clause clause;
            bool has_category = false, has_value = false;
            for (auto cf : c.get_object()) {
              const std::string_view ck = cf.unescaped_key();
              if (ck == "category") clause.category = to_u32(cf.value().get_uint64(), "category"), has_category = true;
              else if (ck == "value") clause.value = to_u32(cf.value().get_uint64(), "value"), has_value = true;
              else if (ck == "exclude") clause.exclude = cf.value().get_bool();
              else throw BadRequest{"unknown field in clause: " + std::string(ck)};
            }
            if (!has_category || !has_value) throw BadRequest{"a clause needs \"category\" and \"value\""};
            ad.clauses.push_back(clause);
          }
        else throw BadRequest{"unknown field in ad: " + std::string(k)};
      }
      if (!has_id) throw BadRequest{"an ad needs \"id\" (an upsert without one would replace ad 0)"};
      ads.push_back(std::move(ad));
    }
  }
  return ads;
}

inline std::vector<std::uint32_t> parse_ids(json::document& doc) {
  std::vector<std::uint32_t> ids;
  for (auto field : doc.get_object()) {
    if (std::string_view(field.unescaped_key()) != "ids") throw BadRequest{"expected {\"ids\": [...]}"};
    for (auto v : field.value().get_array()) ids.push_back(to_u32(v.get_uint64(), "id"));
  }
  return ids;
}

/// The shortest text that reads back as the same number (std::to_chars).
template <class T>
std::string number(T value) {
  char buffer[64];
  const auto end = std::to_chars(buffer, buffer + sizeof buffer, value).ptr;
  return std::string(buffer, end);
}

inline std::string json_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\u00";
      out += hex[(c >> 4) & 0xf];
      out += hex[c & 0xf];
    } else {
      out += c;
    }
  }
  return out;
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

}  // namespace serving_detail

struct ServingOptions {
  std::chrono::milliseconds io_timeout{10000};  // each read and each write
  std::size_t max_body_bytes = 64u << 20;
  std::size_t max_batch_requests = 64;  // per POST /search_batch
};

/// One HTTP server over one backend; runs on the io_context it is given (any number of threads).
class RetrievalHttpServer {
 public:
  RetrievalHttpServer(boost::asio::io_context& io, RetrievalBackend& backend, boost::asio::ip::tcp::endpoint endpoint,
                      ServingOptions options = {})
      : io_(io), acceptor_(io, endpoint), backend_(backend), options_(options) {}

  unsigned short port() const { return acceptor_.local_endpoint().port(); }
  void start() { accept(); }
  void stop() {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
  }

  /// The answer to one request: status and JSON body. Public so that it can be tested without sockets.
  std::pair<boost::beast::http::status, std::string> handle(boost::beast::http::verb method, std::string_view target,
                                                            const std::string& body,
                                                            simdjson::ondemand::parser& parser) {
    using boost::beast::http::status;
    using boost::beast::http::verb;
    namespace sd = serving_detail;
    auto error = [](status s, std::string_view message) {
      return std::pair{s, "{\"error\":\"" + sd::json_escape(message) + "\"}"};
    };
    if (method == verb::get && target == "/health")
      return {status::ok, "{\"backend\":\"" + sd::json_escape(backend_.name()) + "\"}"};
    if (method != verb::post) return error(status::method_not_allowed, "use POST (or GET /health)");
    if (target != "/search" && target != "/search_batch" && target != "/ads" && target != "/expire")
      return error(status::not_found, "no such path");
    try {
      // The padded copy and the document live together in this scope; no view outlives them.
      const simdjson::padded_string input(body);
      simdjson::ondemand::document doc = parser.iterate(input);
      // The request is checked here, so that what the backend refuses after these checks is its own
      // failure (500, 503), not the caller's (400); a request too large for the model's fp16
      // vectors is found only by running its towers, and is the caller's.
      auto search_failed = [&](const Error& e) {
        return error(e.message.find(kVectorsOverflowMessage) != std::string::npos ? status::bad_request
                                                                                  : status::internal_server_error,
                     e.message);
      };
      if (target == "/search") {
        const Request request = sd::parse_search(doc);
        if (auto ok = validate_request(backend_.schema(), backend_.model(), request); !ok)
          return error(status::bad_request, ok.error().message);
        auto top = backend_.search(request);
        if (!top) return search_failed(top.error());
        return {status::ok, sd::results_json(*top)};
      }
      if (target == "/search_batch") {
        const std::vector<Request> requests = sd::parse_search_batch(doc, options_.max_batch_requests);
        for (std::size_t r = 0; r < requests.size(); ++r)
          if (auto ok = validate_request(backend_.schema(), backend_.model(), requests[r]); !ok)
            return error(status::bad_request, batch_error(r, ok.error()).error().message);
        auto answers = backend_.search_batch(std::span<const Request>(requests.data(), requests.size()));
        if (!answers) return search_failed(answers.error());
        std::string out = "{\"answers\":[";
        for (std::size_t r = 0; r < answers->size(); ++r) out += (r ? "," : "") + sd::results_json((*answers)[r]);
        return {status::ok, out + "]}"};
      }
      if (target == "/ads") {
        const std::vector<AdRecord> ads = sd::parse_ads(doc);
        for (const AdRecord& ad : ads)
          if (auto ok = validate_ad(backend_.schema(), ad); !ok) return error(status::bad_request, ok.error().message);
        if (auto ok = backend_.upsert(std::span<const AdRecord>(ads.data(), ads.size())); !ok)
          return error(status::service_unavailable, ok.error().message);  // such as a full index
        return {status::ok, "{\"upserted\":" + sd::number(ads.size()) + "}"};
      }
      const std::vector<std::uint32_t> ids = sd::parse_ids(doc);
      auto expired = backend_.expire(std::span<const std::uint32_t>(ids.data(), ids.size()));
      if (!expired) return error(status::service_unavailable, expired.error().message);
      return {status::ok, "{\"expired\":" + sd::number(*expired) + "}"};
    } catch (const sd::BadRequest& e) {
      return error(status::bad_request, e.message);
    } catch (const simdjson::simdjson_error& e) {
      return error(status::bad_request, std::string("malformed JSON: ") + e.what());
    } catch (const std::exception& e) {  // (out of memory, no thread to start): this request fails, the server goes on
      return error(status::internal_server_error, std::string("internal error: ") + e.what());
    }
  }

 private:
  class Session : public std::enable_shared_from_this<Session> {
   public:
    Session(boost::asio::ip::tcp::socket socket, RetrievalHttpServer& server)
        : stream_(std::move(socket)), server_(server) {}
    void read() {
      request_ = {};
      parser_.emplace();
      parser_->body_limit(server_.options_.max_body_bytes);
      stream_.expires_after(server_.options_.io_timeout);
      boost::beast::http::async_read(stream_, buffer_, *parser_,
                                     [self = shared_from_this()](boost::beast::error_code ec, std::size_t) {
                                       self->on_read(ec);
                                     });
    }

   private:
    void on_read(boost::beast::error_code ec) {
      namespace http = boost::beast::http;
      if (ec == http::error::end_of_stream || ec == boost::beast::error::timeout) return close();
      if (ec) {  // an unparsable request: answer 400 and close
        respond(http::status::bad_request,
                "{\"error\":\"bad HTTP request: " + serving_detail::json_escape(ec.message()) + "\"}", false);
        return;
      }
      request_ = parser_->release();
      auto [status, body] = server_.handle(request_.method(), request_.target(), request_.body(), json_);
      respond(status, std::move(body), request_.keep_alive());
    }
    void respond(boost::beast::http::status status, std::string body, bool keep_alive) {
      namespace http = boost::beast::http;
      response_ = http::response<http::string_body>(status, 11);
      response_.set(http::field::content_type, "application/json");
      response_.keep_alive(keep_alive);
      response_.body() = std::move(body);
      response_.prepare_payload();
      stream_.expires_after(server_.options_.io_timeout);
      http::async_write(stream_, response_, [self = shared_from_this(), keep_alive](boost::beast::error_code ec, std::size_t) {
        if (!ec && keep_alive) self->read();
        else self->close();
      });
    }
    void close() {
      boost::beast::error_code ignored;
      stream_.socket().shutdown(boost::asio::ip::tcp::socket::shutdown_send, ignored);
    }

    boost::beast::tcp_stream stream_;
    boost::beast::flat_buffer buffer_;
    std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
    boost::beast::http::request<boost::beast::http::string_body> request_;
    boost::beast::http::response<boost::beast::http::string_body> response_;
    simdjson::ondemand::parser json_;  // reused for every request of this connection
    RetrievalHttpServer& server_;
  };

  void accept() {
    acceptor_.async_accept(boost::asio::make_strand(io_), [this](boost::beast::error_code ec,
                                                                  boost::asio::ip::tcp::socket socket) {
      if (ec == boost::asio::error::operation_aborted || !acceptor_.is_open()) return;  // stopped
      if (!ec) std::make_shared<Session>(std::move(socket), *this)->read();
      accept();
    });
  }

  boost::asio::io_context& io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  RetrievalBackend& backend_;
  ServingOptions options_;
};

}  // namespace kevo::retrieval
