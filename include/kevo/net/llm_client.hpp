// kevo/net/llm_client.hpp: an asynchronous LLM client over Boost.Beast (HTTPS through OpenSSL,
// certificates and host names verified) for OpenAI-compatible Chat Completions and Anthropic
// Messages. Every operation and every request has a deadline; 429/5xx/529 and connection resets
// are retried with bounded, jittered exponential backoff that honours Retry-After, for the whole
// endpoint (RateGate); a cap bounds the requests in flight; tokens and cost are metered against a
// budget; cancel() ends the requests in flight at once (Ctrl-C, through CancelOnInterrupt). The API
// key comes from an environment variable that the caller names; it is sent only as a header, and
// redacted from logs, errors, request bodies and answers.
//
//   boost::asio::io_context io;
//   auto client = kevo::net::LlmClient::create(io.get_executor(), {.base_url = "http://127.0.0.1:8000/v1", .model = "m"});
//   client->async_complete({.messages = {{"user", "Hi"}}}, [](auto result) { /* expected<ChatResponse, LlmError> */ });
//   io.run();
//
// Code that cannot wait asynchronously (Synthesizer::generate) uses BlockingLlmClient, which runs
// an LlmClient on its own io_context thread:
//
//   auto llm = kevo::net::BlockingLlmClient::create({.base_url = url, .model = "m", .api_key_env = "OPENAI_API_KEY"});
//   auto answer = llm->complete({.system = "...", .messages = {{"user", prompt}}});
//
// Why one file of about 670 lines: one client object holds the connection, the retries, the rate
// gate and the meter; the two wire formats differ only inside it.
#pragma once

#include <kevo/net/chat.hpp>
#include <kevo/net/endpoint.hpp>
#include <kevo/net/usage_meter.hpp>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <csignal>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <exception>
#include <functional>
#include <iomanip>
#include <locale>
#include <map>
#include <mutex>
#include <sstream>
#include <future>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>

namespace kevo::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using std::chrono::milliseconds;

/// Limits on each operation (connect includes name resolution and the TLS handshake; read is the
/// whole response) and on the request as a whole, retries and backoff included.
struct Timeouts {
  milliseconds connect{10'000};
  milliseconds write{30'000};
  milliseconds read{120'000};      ///< a whole chat completion is generated before the first byte: a long answer takes a minute or two
  milliseconds request{180'000};   ///< the read and room for one retry
};

/// When an endpoint may next be asked. One per endpoint in the process: a 429 with Retry-After
/// holds back every request to that endpoint, from any generation and any client, not only the
/// retry of the request that got it.
class RateGate {
 public:
  using Clock = std::chrono::steady_clock;

  static std::shared_ptr<RateGate> for_endpoint(const std::string& key) {
    static std::mutex mutex;
    static std::map<std::string, std::weak_ptr<RateGate>> gates;  // weak: a gate lives as long as a client uses it
    std::lock_guard lock(mutex);
    auto& slot = gates[key];
    if (auto gate = slot.lock()) return gate;
    auto gate = std::make_shared<RateGate>();
    slot = gate;
    return gate;
  }
  void hold_until(Clock::time_point t) {
    std::lock_guard lock(mutex_);
    not_before_ = std::max(not_before_, t);
  }
  Clock::time_point open_at() const {
    std::lock_guard lock(mutex_);
    return not_before_;
  }

 private:
  mutable std::mutex mutex_;
  Clock::time_point not_before_{};
};

/// Which failures are retried and how long to wait between attempts.
struct RetryPolicy {
  int max_attempts = 4;                  ///< attempts in all, the first included
  milliseconds initial_backoff{500};     ///< doubled after each attempt, jittered down by up to half
  milliseconds max_backoff{20'000};
  milliseconds max_retry_after{60'000};  ///< a server's Retry-After is honoured up to this
};

struct LlmClientOptions {
  std::string base_url = "https://api.openai.com/v1";
  WireFormat wire_format = WireFormat::openai;
  std::string model;
  std::string api_key_env;               ///< name of the variable holding the key; empty: send none
  Timeouts timeouts;
  RetryPolicy retry;
  std::size_t max_in_flight = 4;
  std::size_t max_response_bytes = 8u << 20;
  Budget budget;
  Pricing pricing;
  std::string ca_file;                   ///< extra PEM trust anchors (self-hosted servers); system store always
  std::uint64_t jitter_seed = 0;         ///< 0: seeded from std::random_device
  std::string user_agent = "kevo/0.1";
  std::string max_tokens_field = "max_tokens";  ///< OpenAI format: "max_completion_tokens" for newer OpenAI models
  std::function<void(std::string_view)> log;  ///< one line per retry or failure; the key is redacted
};

class LlmClient {
 public:
  using Result = expected<ChatResponse, LlmError>;

  /// Validates the options and reads the API key. Fails when the URL is malformed or the named
  /// key variable is unset or empty.
  static expected<LlmClient, LlmError> create(asio::any_io_executor executor, LlmClientOptions options) {
    auto endpoint = parse_endpoint(options.base_url);
    if (!endpoint) return make_llm_error(LlmErrorKind::configuration, endpoint.error().message);
    if (options.model.empty()) return make_llm_error(LlmErrorKind::configuration, "no model named");
    std::string key;
    if (!options.api_key_env.empty()) {
      const char* value = std::getenv(options.api_key_env.c_str());
      if (!value || !*value)
        return make_llm_error(LlmErrorKind::configuration,
                              fmt::format("environment variable {} (named as holding the API key) is not set", options.api_key_env));
      key = value;
    }
    if (options.retry.max_attempts < 1) options.retry.max_attempts = 1;
    if (options.max_in_flight < 1) options.max_in_flight = 1;
    auto state = std::make_shared<State>(std::move(executor), std::move(options), std::move(*endpoint), std::move(key));
    if (state->endpoint.tls) {
      state->tls.emplace(asio::ssl::context::tls_client);
      beast::error_code ec;
      state->tls->set_default_verify_paths(ec);
      if (ec) return make_llm_error(LlmErrorKind::configuration, fmt::format("cannot load the system certificates: {}", ec.message()));
      if (!state->options.ca_file.empty()) {
        state->tls->load_verify_file(state->options.ca_file, ec);
        if (ec)
          return make_llm_error(LlmErrorKind::configuration, fmt::format("{}: cannot load certificates: {}", state->options.ca_file, ec.message()));
      }
      state->tls->set_verify_mode(asio::ssl::verify_peer);
    }
    return LlmClient(std::move(state));
  }

  /// Sends `request`; calls `handler(Result)` once, on the client's strand.
  template <class Handler>
  void async_complete(ChatRequest request, Handler handler) {
    auto state = state_;
    auto cancel = std::make_shared<asio::cancellation_signal>();
    asio::dispatch(state->strand, [state, cancel, request = std::move(request), handler = std::move(handler)]() mutable {
      state->cancel_signals.insert(cancel);
      asio::co_spawn(state->strand, run(state, std::move(request)),
                     asio::bind_cancellation_slot(cancel->slot(), [state, cancel, handler = std::move(handler)](
                                                                       std::exception_ptr failure, Result result) mutable {
                       state->cancel_signals.erase(cancel);
                       if (state->cancelled) {
                         state->meter.record_failure();
                         handler(Result(make_llm_error(LlmErrorKind::cancelled, "the LLM request was cancelled")));
                         return;
                       }
                       finish(std::move(handler), std::move(failure), std::move(result));
                     }));
    });
  }

  /// Cancels every request in flight within moments, and refuses later ones (Ctrl-C: the search is
  /// stopping and should not wait out a hung request). Thread-safe; the client stays cancelled.
  void cancel() {
    state_->cancelled = true;
    auto state = state_;
    asio::dispatch(state->strand, [state] {
      for (const auto& signal : state->cancel_signals) signal->emit(asio::cancellation_type::terminal);
      for (const auto& waiter : state->waiters) waiter->timer.cancel();
    });
  }
  bool cancelled() const { return state_->cancelled; }

  /// `text` without the API key: for any text that may have passed through a model or a candidate
  /// (an answer that quotes the key, a log line) before it is stored, printed or sent.
  std::string redact(std::string text) const { return state_->redact(std::move(text)); }

 private:
  template <class Handler>
  static void finish(Handler handler, std::exception_ptr failure, Result result) {
    if (failure) {
      std::string what = "unknown exception";
      try {
        std::rethrow_exception(failure);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      handler(Result(make_llm_error(LlmErrorKind::transport, "LLM request failed: " + what)));
      return;
    }
    handler(std::move(result));
  }

 public:
  /// The same, for callers that are coroutines themselves.
  asio::awaitable<Result> complete(ChatRequest request) {
    co_return co_await asio::co_spawn(state_->strand, run(state_, std::move(request)), asio::use_awaitable);
  }

  UsageReport usage() const { return state_->meter.report(); }
  std::optional<std::string> budget_exhaustion() const { return state_->meter.exhaustion(); }
  bool budget_exhausted() const { return state_->meter.exhausted(); }
  const LlmClientOptions& options() const { return state_->options; }

  /// The delay a response asks for: retry-after-ms, or Retry-After as seconds (fractions allowed) or
  /// as an HTTP date (IMF-fixdate, "Sun, 06 Nov 1994 08:49:37 GMT"; a date already past means now).
  /// Anything else is no delay, and the client falls back to its own backoff.
  static std::optional<milliseconds> parse_retry_after(std::string_view seconds, std::string_view millis,
                                                       std::chrono::system_clock::time_point now =
                                                           std::chrono::system_clock::now()) {
    double value = 0;
    if (!millis.empty() && std::from_chars(millis.data(), millis.data() + millis.size(), value).ec == std::errc() && value >= 0)
      return milliseconds(static_cast<long long>(value));
    if (seconds.empty()) return std::nullopt;
    if (const auto [end, ec] = std::from_chars(seconds.data(), seconds.data() + seconds.size(), value);
        ec == std::errc() && end == seconds.data() + seconds.size() && value >= 0)
      return milliseconds(static_cast<long long>(value * 1000));
    std::tm date{};
    std::istringstream in{std::string(seconds)};
    in.imbue(std::locale::classic());
    in >> std::get_time(&date, "%a, %d %b %Y %H:%M:%S GMT");
    if (in.fail()) return std::nullopt;
    const auto at = std::chrono::system_clock::from_time_t(timegm(&date));
    return std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(at - now));
  }

 private:
  using Clock = std::chrono::steady_clock;

  struct Waiter {
    explicit Waiter(asio::any_io_executor ex) : timer(std::move(ex)) {}
    asio::steady_timer timer;
    bool granted = false;
  };

  // Everything but `meter` is touched only on `strand`.
  struct State {
    State(asio::any_io_executor ex, LlmClientOptions o, Endpoint e, std::string k)
        : strand(asio::make_strand(ex)), options(std::move(o)), endpoint(std::move(e)), api_key(std::move(k)),
          meter(options.budget, options.pricing), rng(options.jitter_seed ? options.jitter_seed : std::random_device{}()) {}
    asio::strand<asio::any_io_executor> strand;
    LlmClientOptions options;
    Endpoint endpoint;
    std::string api_key;
    std::optional<asio::ssl::context> tls;
    UsageMeter meter;
    ResponseDecoder decoder;
    std::mt19937_64 rng;
    std::size_t in_flight = 0;
    std::deque<std::shared_ptr<Waiter>> waiters;
    std::shared_ptr<RateGate> gate = RateGate::for_endpoint(fmt::format("{}://{}:{}", endpoint.tls ? "https" : "http", endpoint.host, endpoint.port));
    std::set<std::shared_ptr<asio::cancellation_signal>> cancel_signals;  // one per request in flight
    std::atomic<bool> cancelled{false};

    /// Removes the key from text that came back from the server (some echo it in error bodies).
    std::string redact(std::string text) const {
      if (!api_key.empty())
        for (std::size_t at; (at = text.find(api_key)) != std::string::npos;) text.replace(at, api_key.size(), "[redacted]");
      return text;
    }
    void log(const std::string& line) const {
      if (options.log) options.log(redact(line));
    }
  };

  /// What one HTTP attempt produced: a transport error (and where), or a status and body.
  struct Exchange {
    beast::error_code error;
    std::string stage;
    unsigned status = 0;
    std::string body;
    std::optional<milliseconds> retry_after;
  };

  explicit LlmClient(std::shared_ptr<State> state) : state_(std::move(state)) {}

  static constexpr auto with_error = asio::as_tuple(asio::use_awaitable);

  static Result fail(State& s, LlmErrorKind kind, std::string message, int status, int attempts) {
    s.meter.record_failure();
    message = s.redact(std::move(message));  // error texts get logged and stored by callers
    s.log(fmt::format("LLM request failed ({}): {}", to_string(kind), message));
    return Result(make_llm_error(kind, std::move(message), status, attempts));
  }

  static bool retryable_status(unsigned status) { return status == 408 || status == 429 || status >= 500; }

  static bool retryable_transport(const beast::error_code& ec) {
    return ec == asio::error::connection_reset || ec == asio::error::connection_aborted || ec == asio::error::broken_pipe ||
           ec == asio::error::eof || ec == asio::error::connection_refused || ec == http::error::end_of_stream ||
           ec == http::error::partial_message || ec == asio::ssl::error::stream_truncated;
  }

  static milliseconds backoff(State& s, int attempt) {
    const auto& r = s.options.retry;
    const double base = std::min<double>(static_cast<double>(r.max_backoff.count()),
                                         static_cast<double>(r.initial_backoff.count()) * std::ldexp(1.0, attempt - 1));
    // Jitter keeps many clients that failed together from retrying together.
    std::uniform_real_distribution<double> jitter(0.5, 1.0);
    return milliseconds(static_cast<long long>(base * jitter(s.rng)));
  }

  static asio::awaitable<bool> acquire_slot(std::shared_ptr<State> state, Clock::time_point deadline) {
    State& s = *state;
    if (s.in_flight < s.options.max_in_flight) {
      ++s.in_flight;
      co_return true;
    }
    auto waiter = std::make_shared<Waiter>(s.strand);
    waiter->timer.expires_at(deadline);
    s.waiters.push_back(waiter);
    co_await waiter->timer.async_wait(with_error);
    if (waiter->granted) co_return true;  // release() handed its slot over
    std::erase(s.waiters, waiter);
    co_return false;
  }

  static void release_slot(State& s) {
    if (!s.waiters.empty()) {
      auto next = std::move(s.waiters.front());
      s.waiters.pop_front();
      next->granted = true;
      next->timer.cancel();
      return;
    }
    --s.in_flight;
  }

  static asio::awaitable<Result> run(std::shared_ptr<State> state, ChatRequest request) {
    State& s = *state;
    const auto& o = s.options;
    const auto started = Clock::now();
    const auto deadline = started + o.timeouts.request;
    if (s.cancelled) co_return Result(make_llm_error(LlmErrorKind::cancelled, "the LLM request was cancelled"));
    if (auto why = s.meter.exhaustion()) co_return fail(s, LlmErrorKind::budget_exhausted, *why, 0, 0);

    if (!co_await acquire_slot(state, deadline)) {
      if (s.cancelled) co_return Result(make_llm_error(LlmErrorKind::cancelled, "the LLM request was cancelled"));
      co_return fail(s, LlmErrorKind::timeout,
                     fmt::format("no request slot became free within the request timeout ({} in flight at most)", o.max_in_flight), 0, 0);
    }
    struct SlotGuard {
      State* s;
      ~SlotGuard() { release_slot(*s); }
    } guard{&s};

    // The key never travels in a body: a prompt may quote it (a candidate that read it, an answer that echoed it).
    const std::string body = s.redact(encode_request(o.wire_format, o.model, request, o.max_tokens_field));
    const std::string path = s.endpoint.request_path(o.wire_format);
    std::string last_problem;
    for (int attempt = 1;; ++attempt) {
      // The endpoint's gate: a Retry-After that another request got holds this one back too.
      if (const auto open_at = s.gate->open_at(); open_at > Clock::now()) {
        const auto wait = std::chrono::duration_cast<milliseconds>(open_at - Clock::now());
        if (open_at >= deadline)
          co_return fail(s, LlmErrorKind::retries_exhausted,
                         fmt::format("the endpoint asked to wait {} ms (Retry-After), past the request timeout{}{}", wait.count(),
                                     last_problem.empty() ? "" : "; last: ", last_problem),
                         0, attempt - 1);
        asio::steady_timer hold(s.strand, open_at);
        co_await hold.async_wait(with_error);
        if (s.cancelled) co_return Result(make_llm_error(LlmErrorKind::cancelled, "the LLM request was cancelled"));
      }
      Exchange x = co_await exchange(state, body, path, deadline);
      if (s.cancelled) co_return Result(make_llm_error(LlmErrorKind::cancelled, "the LLM request was cancelled"));
      std::optional<milliseconds> delay;
      if (x.error) {
        const std::string what = fmt::format("{} to {}:{} failed: {}", x.stage, s.endpoint.host, s.endpoint.port, x.error.message());
        if (x.error == beast::error::timeout) {
          const auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - started).count();
          co_return fail(s, LlmErrorKind::timeout, fmt::format("request timed out during {} after {} ms", x.stage, waited), 0, attempt);
        }
        if (x.error == http::error::body_limit)
          co_return fail(s, LlmErrorKind::response_too_large,
                         fmt::format("response body exceeds the {}-byte limit", o.max_response_bytes), 0, attempt);
        if (!retryable_transport(x.error)) co_return fail(s, LlmErrorKind::transport, what, 0, attempt);
        last_problem = what;
      } else if (x.status >= 200 && x.status < 300) {
        auto decoded = s.decoder.decode(o.wire_format, x.body);
        if (!decoded) co_return fail(s, decoded.error().kind, decoded.error().message, static_cast<int>(x.status), attempt);
        decoded->http_status = static_cast<int>(x.status);
        decoded->attempts = attempt;
        decoded->text = s.redact(std::move(decoded->text));  // an answer that quotes the key must not carry it into the search
        s.meter.record(decoded->usage);
        co_return std::move(decoded);
      } else if (retryable_status(x.status)) {
        last_problem = fmt::format("HTTP {}: {}", x.status, s.decoder.error_message(x.body));
        if (x.retry_after) delay = std::min(*x.retry_after, o.retry.max_retry_after);
        // Rate limited: the whole endpoint waits, so the next generation does not hit it again at once.
        if (x.status == 429 || (x.retry_after && x.status == 503)) s.gate->hold_until(Clock::now() + delay.value_or(backoff(s, attempt)));
      } else {
        co_return fail(s, LlmErrorKind::http_status, fmt::format("HTTP {}: {}", x.status, s.decoder.error_message(x.body)),
                       static_cast<int>(x.status), attempt);
      }

      if (attempt >= o.retry.max_attempts)
        co_return fail(s, LlmErrorKind::retries_exhausted, fmt::format("gave up after {} attempts; last: {}", attempt, last_problem),
                       static_cast<int>(x.status), attempt);
      if (!delay) delay = backoff(s, attempt);
      if (Clock::now() + *delay >= deadline)
        co_return fail(s, LlmErrorKind::retries_exhausted,
                       fmt::format("the next retry (in {} ms) would pass the request timeout; last: {}", delay->count(), last_problem),
                       static_cast<int>(x.status), attempt);
      s.log(fmt::format("LLM request attempt {}/{} failed ({}); retrying in {} ms", attempt, o.retry.max_attempts, last_problem,
                        delay->count()));
      s.meter.record_retry();
      asio::steady_timer pause(s.strand, *delay);
      co_await pause.async_wait(with_error);
      if (s.cancelled) co_return Result(make_llm_error(LlmErrorKind::cancelled, "the LLM request was cancelled"));
    }
  }

  /// One connection, one request, one response.
  static asio::awaitable<Exchange> exchange(std::shared_ptr<State> state, const std::string& body, const std::string& path,
                                            Clock::time_point deadline) {
    State& s = *state;
    const Timeouts& t = s.options.timeouts;
    Exchange x;
    // Each operation gets its own limit, cut short by the request's deadline.
    auto limit = [&](milliseconds per_operation) -> std::optional<Clock::duration> {
      const auto left = deadline - Clock::now();
      if (left <= Clock::duration::zero()) return std::nullopt;
      return std::min<Clock::duration>(per_operation, left);
    };
    auto expired = [&](std::string stage) {
      x.error = beast::error::timeout;
      x.stage = std::move(stage);
      return x;
    };

    // The resolver has no expiry of its own; a timer cancels it.
    auto resolver = std::make_shared<asio::ip::tcp::resolver>(s.strand);
    const auto resolve_limit = limit(t.connect);
    if (!resolve_limit) co_return expired("name resolution");
    asio::steady_timer resolve_timer(s.strand, *resolve_limit);
    auto resolve_timed_out = std::make_shared<bool>(false);  // the handler may outlive this frame
    resolve_timer.async_wait([resolver, resolve_timed_out](beast::error_code ec) {
      if (!ec) {
        *resolve_timed_out = true;
        resolver->cancel();
      }
    });
    auto [resolve_error, results] = co_await resolver->async_resolve(s.endpoint.host, s.endpoint.port, with_error);
    resolve_timer.cancel();
    if (*resolve_timed_out) co_return expired("name resolution");
    if (resolve_error) {
      x.error = resolve_error;
      x.stage = "name resolution";
      co_return x;
    }

    beast::tcp_stream stream(s.strand);
    const auto connect_limit = limit(t.connect);
    if (!connect_limit) co_return expired("connect");
    stream.expires_after(*connect_limit);
    if (auto [ec, ep] = co_await stream.async_connect(results, with_error); ec) {
      x.error = ec;
      x.stage = "connect";
      co_return x;
    }

    if (!s.endpoint.tls) {
      co_await transact(stream, s, body, path, limit, x);
      beast::error_code ignored;
      stream.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
      co_return x;
    }

    beast::ssl_stream<beast::tcp_stream> tls(std::move(stream), *s.tls);
    // SNI, so virtual hosts present the right certificate (not sent for IP literals, which SNI
    // does not allow), and the certificate must name the host.
    beast::error_code not_an_address;
    asio::ip::make_address(s.endpoint.host, not_an_address);
    if (not_an_address && !SSL_set_tlsext_host_name(tls.native_handle(), s.endpoint.host.c_str())) {
      x.error = beast::error_code(static_cast<int>(::ERR_get_error()), asio::error::get_ssl_category());
      x.stage = "TLS setup";
      co_return x;
    }
    tls.set_verify_callback(asio::ssl::host_name_verification(s.endpoint.host));
    const auto handshake_limit = limit(t.connect);
    if (!handshake_limit) co_return expired("TLS handshake");
    beast::get_lowest_layer(tls).expires_after(*handshake_limit);
    if (auto [ec] = co_await tls.async_handshake(asio::ssl::stream_base::client, with_error); ec) {
      x.error = ec;
      x.stage = "TLS handshake";
      co_return x;
    }
    co_await transact(tls, s, body, path, limit, x);
    // A polite close; servers often drop the connection first, so errors here mean nothing.
    beast::get_lowest_layer(tls).expires_after(std::chrono::seconds(1));
    co_await tls.async_shutdown(with_error);
    co_return x;
  }

  template <class Stream, class Limit>
  static asio::awaitable<void> transact(Stream& stream, State& s, const std::string& body, const std::string& path, Limit& limit,
                                        Exchange& x) {
    const Timeouts& t = s.options.timeouts;
    http::request<http::string_body> req{http::verb::post, path, 11};
    req.set(http::field::host, s.endpoint.host_header());
    req.set(http::field::user_agent, s.options.user_agent);
    req.set(http::field::content_type, "application/json");
    req.set(http::field::accept, "application/json");
    req.set(http::field::connection, "close");
    if (s.options.wire_format == WireFormat::openai) {
      if (!s.api_key.empty()) req.set(http::field::authorization, "Bearer " + s.api_key);
    } else {
      if (!s.api_key.empty()) req.set("x-api-key", s.api_key);
      req.set("anthropic-version", "2023-06-01");
    }
    req.body() = body;
    req.prepare_payload();

    const auto write_limit = limit(t.write);
    if (!write_limit) {
      x.error = beast::error::timeout;
      x.stage = "write";
      co_return;
    }
    beast::get_lowest_layer(stream).expires_after(*write_limit);
    if (auto [ec, n] = co_await http::async_write(stream, req, with_error); ec) {
      x.error = ec;
      x.stage = "write";
      co_return;
    }

    const auto read_limit = limit(t.read);
    if (!read_limit) {
      x.error = beast::error::timeout;
      x.stage = "read";
      co_return;
    }
    beast::get_lowest_layer(stream).expires_after(*read_limit);
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(s.options.max_response_bytes);
    if (auto [ec, n] = co_await http::async_read(stream, buffer, parser, with_error); ec) {
      x.error = ec;
      x.stage = "read";
      co_return;
    }
    auto& res = parser.get();
    x.status = res.result_int();
    x.retry_after = parse_retry_after(res["retry-after"], res["retry-after-ms"]);
    x.body = std::move(res.body());
  }

  std::shared_ptr<State> state_;
};

/// LlmClient behind a blocking call, on an io_context and thread of its own. Thread-safe: several
/// threads may call complete() at once (up to max_in_flight run concurrently). Copies share one
/// client: its thread, its in-flight cap, its usage meter and budget.
class BlockingLlmClient {
 public:
  static constexpr bool thread_safe = true;

  static expected<BlockingLlmClient, LlmError> create(LlmClientOptions options) {
    auto runner = std::make_shared<Runner>();
    auto client = LlmClient::create(runner->io.get_executor(), std::move(options));
    if (!client) return unexpected(client.error());
    return BlockingLlmClient(std::move(runner), std::move(*client));
  }

  expected<ChatResponse, LlmError> complete(const ChatRequest& request) {
    std::promise<LlmClient::Result> done;
    auto result = done.get_future();
    client_->async_complete(request, [&done](LlmClient::Result r) { done.set_value(std::move(r)); });
    return result.get();
  }

  /// Cancels the requests in flight (their complete() returns LlmErrorKind::cancelled within
  /// moments) and every later one. Thread-safe, and safe from any thread but a signal handler.
  void cancel() { client_->cancel(); }
  bool cancelled() const { return client_->cancelled(); }
  std::string redact(std::string text) const { return client_->redact(std::move(text)); }

  UsageReport usage() const { return client_->usage(); }
  std::optional<std::string> budget_exhaustion() const { return client_->budget_exhaustion(); }
  bool budget_exhausted() const { return client_->budget_exhausted(); }
  const LlmClientOptions& options() const { return client_->options(); }

 private:
  struct Runner {
    asio::io_context io;
    asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
    std::thread thread{[this] { io.run(); }};
    ~Runner() {
      work.reset();
      io.stop();  // abandon requests still in flight: their callers are gone
      thread.join();
    }
  };

  BlockingLlmClient(std::shared_ptr<Runner> runner, LlmClient client) : runner_(std::move(runner)), client_(std::move(client)) {}

  std::shared_ptr<Runner> runner_;  // declared first: destroyed after the client
  std::optional<LlmClient> client_;
};

static_assert(ChatCompleter<BlockingLlmClient>);

/// Calls `cancel` on the first SIGINT or SIGTERM, from a thread of its own, so that Ctrl-C does not
/// wait out a hung request (give it BlockingLlmClient::cancel). It listens beside the search loop's
/// own handler (Asio hands a signal to every set that waits for it), and lets go of the signals
/// after the first, so that a second one ends the process.
class CancelOnInterrupt {
 public:
  explicit CancelOnInterrupt(std::function<void()> cancel) : cancel_(std::move(cancel)) {
    signals_.async_wait([this](const beast::error_code& ec, int) {
      if (ec) return;
      cancel_();
      beast::error_code ignored;
      signals_.clear(ignored);
    });
    thread_ = std::thread([this] { io_.run(); });
  }
  ~CancelOnInterrupt() {
    io_.stop();
    thread_.join();
  }
  CancelOnInterrupt(const CancelOnInterrupt&) = delete;
  CancelOnInterrupt& operator=(const CancelOnInterrupt&) = delete;

 private:
  asio::io_context io_;
  asio::signal_set signals_{io_, SIGINT, SIGTERM};
  std::function<void()> cancel_;
  std::thread thread_;
};

}  // namespace kevo::net
