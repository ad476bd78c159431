// The retrieval server's tests' side of the wire: a server on loopback for the length of a scope,
// a keep-alive client with a timeout on every step, and a request's JSON body; and the backend they
// serve from, the CPU's unless asked otherwise:
//
//   KEVO_SERVER_TEST_BACKEND=gpu   the in-process servers serve from the GPU backend (make_test_backend),
//                                  and the retrieval_server binary is started with --backend gpu
//   KEVO_RETRIEVAL_SERVER=PATH     the retrieval_server binary the tests start (default: the one built
//                                  beside the test, build/<dir>/examples/retrieval_server/retrieval_server)
//
// The GPU backend is linked into the tests where the build has CUDA (retrieval_server_cuda_backend);
// asked for where there is none, or no GPU, each test that makes a backend fails and says why.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "serving.hpp"  // examples/retrieval_server: the HTTP server

#if defined(KEVO_RETRIEVAL_SERVER_CUDA)
#include "cuda_backend.hpp"  // examples/retrieval_server: make_cuda_backend
#endif

namespace kevo::test {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

/// The backend the server's tests serve from: KEVO_SERVER_TEST_BACKEND ("cpu" or "gpu"), "cpu" where unset.
inline std::string server_test_backend() {
  const char* chosen = std::getenv("KEVO_SERVER_TEST_BACKEND");
  const std::string backend = chosen && *chosen ? chosen : "cpu";
  if (backend != "cpu" && backend != "gpu")
    throw std::invalid_argument("KEVO_SERVER_TEST_BACKEND is '" + backend + "': cpu or gpu");
  return backend;
}

/// Whether the tests run on the GPU backend (where a check holds only on the CPU's, it is skipped with a WARN).
inline bool testing_gpu_backend() { return server_test_backend() == "gpu"; }

/// A backend for `schema` and `model`, empty: the CPU's on `cpu_threads` threads, or with
/// KEVO_SERVER_TEST_BACKEND=gpu the GPU's (room for `capacity` ads). Throws, saying why, where the
/// GPU backend was asked for and cannot be had: the tests never fall back to the CPU unasked.
inline std::unique_ptr<retrieval::RetrievalBackend> make_test_backend(const retrieval::Schema& schema,
                                                                      const retrieval::Model& model,
                                                                      unsigned cpu_threads,
                                                                      std::size_t capacity = std::size_t{1} << 20) {
  if (!testing_gpu_backend()) return std::make_unique<retrieval::CpuRetrievalBackend>(schema, model, cpu_threads);
#if defined(KEVO_RETRIEVAL_SERVER_CUDA)
  std::string why;
  if (auto gpu = retrieval::make_cuda_backend(schema, model, capacity, {}, why)) return gpu;
  throw std::runtime_error("KEVO_SERVER_TEST_BACKEND=gpu: no GPU backend (" + why + ")");
#else
  (void)capacity;
  throw std::runtime_error("KEVO_SERVER_TEST_BACKEND=gpu: this test was built without CUDA, so it has no GPU backend");
#endif
}

/// The retrieval_server binary the tests start: $KEVO_RETRIEVAL_SERVER where set (it must exist), else
/// the one beside this test's build (build/<dir>/tests/<this> -> build/<dir>/examples/retrieval_server/
/// retrieval_server). Empty where neither is there.
inline std::string server_binary() {
  if (const char* given = std::getenv("KEVO_RETRIEVAL_SERVER"); given && *given) {
    if (!std::filesystem::is_regular_file(given))
      throw std::invalid_argument(std::string("KEVO_RETRIEVAL_SERVER names no file: ") + given);
    return std::filesystem::absolute(given).string();
  }
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  const auto binary = self.parent_path().parent_path() / "examples" / "retrieval_server" / "retrieval_server";
  return std::filesystem::exists(binary) ? binary.string() : std::string();
}

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
