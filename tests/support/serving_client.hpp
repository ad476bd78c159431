// The retrieval server's tests' side of the wire: a server on loopback for the length of a scope,
// a keep-alive client with a timeout on every step, and a request's JSON body.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include <chrono>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "kevo/retrieval/serving.hpp"

namespace kevo::test {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

/// A server on 127.0.0.1 with an ephemeral port, its I/O on `io_threads` threads, stopped at scope exit.
struct RunningServer {
  asio::io_context io;
  retrieval::RetrievalHttpServer server;
  std::vector<std::thread> threads;
  explicit RunningServer(retrieval::RetrievalBackend& backend,
                         retrieval::ServingOptions options = {.io_timeout = std::chrono::milliseconds(3000)}, unsigned io_threads = 1)
      : server(io, backend, {asio::ip::make_address("127.0.0.1"), 0}, options) {
    server.start();
    for (unsigned t = 0; t < io_threads; ++t) threads.emplace_back([this] { io.run(); });
  }
  ~RunningServer() {
    asio::post(io, [this] { server.stop(); io.stop(); });
    for (auto& t : threads) t.join();
  }
};

/// One keep-alive connection; each exchange has a timeout.
struct Client {
  asio::io_context io;
  beast::tcp_stream stream{io};
  beast::flat_buffer buffer;
  explicit Client(unsigned short port) {
    stream.expires_after(std::chrono::seconds(5));
    stream.connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  }
  http::response<http::string_body> send(http::verb method, const std::string& target, const std::string& body,
                                         std::chrono::seconds read_timeout = std::chrono::seconds(30)) {
    http::request<http::string_body> request(method, target, 11);
    request.set(http::field::host, "127.0.0.1");
    request.body() = body;
    if (!body.empty() || method == http::verb::post) request.prepare_payload();
    stream.expires_after(std::chrono::seconds(5));
    http::write(stream, request);
    return receive(method == http::verb::head, read_timeout);
  }
  http::response<http::string_body> receive(bool head = false, std::chrono::seconds timeout = std::chrono::seconds(30)) {
    http::response_parser<http::string_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    parser.skip(head);  // an answer to HEAD has no body, whatever its Content-Length says
    stream.expires_after(timeout);
    http::read(stream, buffer, parser);
    return parser.release();
  }
};

struct Reply {
  unsigned status = 0;
  std::string body;
  std::string retry_after;
};

/// One request on a fresh connection.
inline Reply call(unsigned short port, http::verb method, const std::string& target, const std::string& body) {
  Client c(port);
  auto r = c.send(method, target, body);
  return {static_cast<unsigned>(r.result_int()), r.body(), std::string(r[http::field::retry_after])};
}

/// A search request as the server's JSON takes it.
inline std::string search_body(const retrieval::Request& r) {
  std::string features, query;
  for (float x : r.features) features += fmt::format("{}{}", features.empty() ? "" : ",", x);
  for (const retrieval::CategoryQuery& q : r.query) {
    std::string values;
    for (auto v : q.values) values += fmt::format("{}{}", values.empty() ? "" : ",", v);
    query += fmt::format("{}{{\"category\":{},\"values\":[{}]}}", query.empty() ? "" : ",", q.category, values);
  }
  return fmt::format("{{\"features\":[{}],\"query\":[{}],\"k\":{},\"routing\":{}}}", features, query, r.k, r.routing);
}

}  // namespace kevo::test
