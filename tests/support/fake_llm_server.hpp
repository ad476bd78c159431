// A fake LLM server for tests: a blocking Beast HTTP/1.1 server on an ephemeral 127.0.0.1 port, in
// threads of the test process. It replays scripted replies, computes replies from the request, and
// injects faults (resets, slow bodies); "${API_KEY}" in a reply becomes the caller's key, as a server
// that quotes it would. Modes for search tests: echo_parent() answers with the current
// implementation from the prompt, as a model that repeats the parent does; BreakMode breaks code
// and repairs it when the prompt asks for a repair.
#pragma once

#include <kevo/detail/json_writer.hpp>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <simdjson.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace kevo::testing {

namespace fake_llm {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;
}  // namespace fake_llm
using namespace fake_llm;

/// One scripted reply: a status and body, or a fault.
struct Reply {
  enum class Fault { none, reset, slow_body };
  unsigned status = 200;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  Fault fault = Fault::none;
  std::chrono::milliseconds delay{0};  ///< before the response (none) or between headers and body (slow_body)
};

struct Received {
  std::string target;
  std::map<std::string, std::string> headers;  // lowercase names
  std::string body;
  std::chrono::steady_clock::time_point at;    ///< when the request arrived
};

/// A blocking HTTP/1.1 server: one thread accepts, one thread per connection answers.
/// Accepts loopback connections until `stopping` is set (the owner then connects once to wake
/// it), handing each socket to `on_accept`.
template <class OnAccept>
void accept_until_stopped(asio::io_context& io, tcp::acceptor& acceptor, const std::atomic<bool>& stopping,
                          OnAccept on_accept) {
  while (true) {
    tcp::socket socket(io);
    beast::error_code ec;
    acceptor.accept(socket, ec);
    if (stopping) return;
    if (!ec) on_accept(std::move(socket));
  }
}

class LoopbackServer {
 public:
  LoopbackServer() : acceptor_(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
    port_ = acceptor_.local_endpoint().port();
    accept_thread_ = std::thread([this] { accept_loop(); });
  }
  ~LoopbackServer() {
    stopping_ = true;
    beast::error_code ignored;
    tcp::socket poke(io_);  // wakes the blocking accept
    poke.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port_), ignored);
    accept_thread_.join();
    std::lock_guard lock(mutex_);
    for (auto& t : connections_) t.join();
  }

  void script(std::vector<Reply> replies) {
    std::lock_guard lock(mutex_);
    for (auto& r : replies) replies_.push_back(std::move(r));
  }
  /// Computes the reply for each request once the script runs out (it sees the request).
  void respond_with(std::function<Reply(const Received&)> f) {
    std::lock_guard lock(mutex_);
    responder_ = std::move(f);
  }
  /// Every later request gets this reply, once the script runs out.
  void always(Reply r) {
    std::lock_guard lock(mutex_);
    fallback_ = std::move(r);
  }
  std::vector<Received> received() {
    std::lock_guard lock(mutex_);
    return received_;
  }
  int max_concurrent() const { return max_concurrent_; }
  std::string url() const { return fmt::format("http://127.0.0.1:{}", port_); }

 private:
  void accept_loop() {
    accept_until_stopped(io_, acceptor_, stopping_, [this](tcp::socket socket) {
      std::lock_guard lock(mutex_);
      connections_.emplace_back([this, s = std::move(socket)]() mutable { serve(std::move(s)); });
    });
  }

  void serve(tcp::socket socket) {
    beast::flat_buffer buffer;
    http::request<http::string_body> req;
    beast::error_code ec;
    http::read(socket, buffer, req, ec);
    if (ec) return;
    const int now = ++concurrent_;
    for (int seen = max_concurrent_; now > seen && !max_concurrent_.compare_exchange_weak(seen, now);) {
    }
    Reply reply;
    {
      std::lock_guard lock(mutex_);
      Received r{std::string(req.target()), {}, req.body(), std::chrono::steady_clock::now()};
      for (const auto& field : req) {
        std::string name(field.name_string());
        for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        r.headers[name] = std::string(field.value());
      }
      received_.push_back(std::move(r));
      if (!replies_.empty()) {
        reply = std::move(replies_.front());
        replies_.pop_front();
      } else if (responder_) {
        reply = responder_(received_.back());
      } else if (fallback_) {
        reply = *fallback_;
      } else {
        reply = Reply{.status = 500, .body = R"({"error":{"message":"the test script ran out of replies"}})"};
      }
    }
    // A server that echoes the caller's key (as some error bodies do) must not leak it further.
    const std::string key = req.count(http::field::authorization)
                                ? std::string(req[http::field::authorization]).substr(7)
                                : std::string(req["x-api-key"]);
    for (std::size_t at; (at = reply.body.find("${API_KEY}")) != std::string::npos;) reply.body.replace(at, 10, key);

    if (reply.fault == Reply::Fault::reset) {
      socket.set_option(asio::socket_base::linger(true, 0), ec);  // close with RST
      socket.close(ec);
      --concurrent_;
      return;
    }
    if (reply.fault == Reply::Fault::none) std::this_thread::sleep_for(reply.delay);
    http::response<http::string_body> res{static_cast<http::status>(reply.status), 11};
    res.set(http::field::content_type, "application/json");
    for (const auto& [name, value] : reply.headers) res.set(name, value);
    res.body() = reply.body;
    res.prepare_payload();
    if (reply.fault == Reply::Fault::slow_body) {
      http::response_serializer<http::string_body> sr{res};
      http::write_header(socket, sr, ec);
      std::this_thread::sleep_for(reply.delay);
      http::write(socket, sr, ec);
    } else {
      http::write(socket, res, ec);
    }
    --concurrent_;
    socket.shutdown(tcp::socket::shutdown_send, ec);
    // Drain until the client closes, so our close does not turn into a reset.
    char sink[256];
    while (!ec) socket.read_some(asio::buffer(sink), ec);
  }

  asio::io_context io_;
  tcp::acceptor acceptor_;
  unsigned short port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  std::mutex mutex_;
  std::vector<std::thread> connections_;
  std::deque<Reply> replies_;
  std::optional<Reply> fallback_;
  std::function<Reply(const Received&)> responder_;
  std::vector<Received> received_;
  std::atomic<int> concurrent_{0}, max_concurrent_{0};
};


/// The text of an OpenAI-format chat completion whose answer is `text`.
inline std::string openai_answer(std::string_view text) {
  return fmt::format(R"({{"choices":[{{"index":0,"message":{{"role":"assistant","content":{}}},"finish_reason":"stop"}}],)"
                     R"("usage":{{"prompt_tokens":100,"completion_tokens":50,"total_tokens":150}}}})",
                     kevo::detail::json_quote(text));
}

/// The user turn of an OpenAI-format request body (its first message), or empty.
inline std::string first_user_message(std::string_view body) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(body.data(), body.size()).get(doc)) return {};
  simdjson::dom::array messages;
  if (doc["messages"].get_array().get(messages)) return {};
  for (auto m : messages) {
    std::string_view role, content;
    if (!m["role"].get_string().get(role) && role == "user" && !m["content"].get_string().get(content)) return std::string(content);
  }
  return {};
}

/// The current implementation in a kevo prompt: the code block after "## Current implementation".
inline std::string current_implementation(std::string_view prompt) {
  const std::size_t section = prompt.find("## Current implementation");
  if (section == std::string_view::npos) return {};
  const std::size_t open = prompt.find("```", section);
  const std::size_t line = prompt.find('\n', open);
  const std::size_t close = prompt.find("\n```", line);
  if (open == std::string_view::npos || line == std::string_view::npos || close == std::string_view::npos) return {};
  return std::string(prompt.substr(line + 1, close - line - 1));
}

/// Echo mode: a model that answers every prompt with the parent's code, unchanged.
inline Reply echo_parent(const Received& r) {
  return Reply{.body = openai_answer("Here is the optimized kernel.\n\n```cpp\n" + current_implementation(first_user_message(r.body)) + "\n```\n")};
}

/// Break mode: a model that breaks code now and then and fixes it when asked to repair. A prompt
/// with kevo's repair section ("## Repair") is answered with the current implementation minus its
/// broken lines (a correct candidate), except every `repair_fails_every`-th repair (0: none), which
/// stays broken; every `break_every`-th other prompt (1: all) is answered with the current
/// implementation plus a line that does not compile (it uses the undeclared `scratch_total`, as
/// tests/support/variant_evaluator.hpp judges it); the rest get a numbered variant ("// Variant N").
/// Thread-safe: the server answers connections on their own threads.
class BreakMode {
 public:
  explicit BreakMode(int break_every = 1, int repair_fails_every = 0)
      : break_every_(break_every), repair_fails_every_(repair_fails_every) {}

  Reply operator()(const Received& r) {
    const std::string prompt = first_user_message(r.body);
    const std::string parent = current_implementation(prompt);
    const int n = ++answers_;
    if (prompt.find("## Repair") != std::string::npos) {
      const int k = ++repair_prompts_;
      if (repair_fails_every_ > 0 && k % repair_fails_every_ == 0) return broken(parent, n);
      std::string fixed;
      for (std::size_t at = 0; at < parent.size();) {
        std::size_t end = parent.find('\n', at);
        if (end == std::string::npos) end = parent.size();
        const std::string_view line(parent.data() + at, end - at);
        if (line.find("scratch_total") == std::string_view::npos) fixed.append(line).push_back('\n');
        at = end + 1;
      }
      ++repairs_;
      return Reply{.body = openai_answer(fmt::format("Removed the undeclared name.\n\n```cpp\n{}// repaired ({})\n```\n", fixed, n))};
    }
    if (break_every_ > 0 && ++plain_prompts_ % break_every_ == 0) return broken(parent, n);
    return Reply{.body = openai_answer(fmt::format("A new variant.\n\n```cpp\n{}\n// Variant {}\n```\n", parent, ++variants_))};
  }

  int repair_prompts() const { return repair_prompts_; }
  int breaks() const { return breaks_; }
  int repairs() const { return repairs_; }

 private:
  Reply broken(const std::string& parent, int n) {
    ++breaks_;
    return Reply{.body = openai_answer(fmt::format(
                     "Keep a running total.\n\n```cpp\n{}\nvoid kevo_running_total_{}() {{ scratch_total += 1; }}\n```\n", parent, n))};
  }

  int break_every_, repair_fails_every_;
  std::atomic<int> answers_{0}, plain_prompts_{0}, repair_prompts_{0}, variants_{0}, breaks_{0}, repairs_{0};
};

}  // namespace kevo::testing
