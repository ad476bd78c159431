// kevo-loopback-llm: a stand-in LLM server on 127.0.0.1 for trying kevo-llm-search offline. It
// speaks both wire formats (POST /v1/chat/completions and POST /v1/messages) and answers each
// prompt with a plausible candidate for a template problem: it reads the current implementation
// and its diagnosis from the prompt, then proposes a knob change on the diagnosed side (or the
// change a faster sibling made), as a whole-file rewrite or a SEARCH/REPLACE edit; now and then it
// answers with code that does not compile, so the search's diagnostics loop shows itself.
//
//   kevo-loopback-llm problems/cpu_scoring --port 8765 &
//   KEVO_LLM_BASE_URL=http://127.0.0.1:8765/v1 KEVO_LLM_MODEL=loopback kevo-llm-search problems/cpu_scoring --log-prompts
#include <kevo/detail/json_writer.hpp>
#include <kevo/problem_loader.hpp>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <simdjson.h>

#include <charconv>
#include <mutex>
#include <random>
#include <string>
#include <thread>

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;

namespace {


/// The text between `open` and the next `close` after it, or empty.
std::string_view between(std::string_view text, std::string_view open, std::string_view close) {
  const std::size_t a = text.find(open);
  if (a == std::string_view::npos) return {};
  const std::size_t b = text.find(close, a + open.size());
  return b == std::string_view::npos ? std::string_view() : text.substr(a + open.size(), b - a - open.size());
}

class CandidateWriter {
 public:
  CandidateWriter(kevo::Problem problem, std::uint64_t seed) : problem_(std::move(problem)), rng_(seed) {}

  /// An answer to `prompt`, as the model's text.
  std::string answer(std::string_view system, std::string_view prompt, int retries) {
    std::lock_guard lock(mutex_);
    if (system.find("distil") != std::string_view::npos) {  // asked to summarize a learned skill
      const std::string_view change = between(prompt, "improvement:\n", "\n");
      return fmt::format("{} The gain came from the knob change listed, applied on the side the profile named; try the same "
                         "move first on kernels with the same bottleneck.", change);
    }
    const std::string_view current = between(between(prompt, "## Current implementation", "\n```\n"), "```cpp\n", "\n```");
    kevo::Knobs knobs = read_knobs(current);
    std::uniform_real_distribution<double> coin(0, 1);

    const std::string_view task = between(prompt, "# Task\n", "\n");  // the diagnosis, not the docs or siblings
    if (task.find("does not compile") != std::string_view::npos) {
      mutate(knobs, kevo::KnobSide::any);
      return fmt::format("The previous version referenced an undeclared name; this one restores a clean build with {}.\n\n```cpp\n{}```\n",
                         kevo::to_string(knobs), problem_.render(knobs));
    }
    std::string why;
    for (int i = 0; i < retries; ++i) mutate(knobs, kevo::KnobSide::any);
    if (auto adopted = sibling_change(prompt, knobs); !adopted.empty()) {
      why = fmt::format("A faster sibling changed {}; I take that change.", adopted);
    } else {
      const kevo::KnobSide side = task.find("memory-bound") != std::string_view::npos    ? kevo::KnobSide::memory
                                  : task.find("compute-bound") != std::string_view::npos ? kevo::KnobSide::compute
                                  : task.find("latency-bound") != std::string_view::npos ? kevo::KnobSide::parallel
                                                                                         : kevo::KnobSide::any;
      why = fmt::format("The diagnosis points at the {} side; I change {}.", kevo::to_string(side), mutate(knobs, side));
    }
    const double roll = coin(rng_);
    if (roll < 0.12) {  // a slip a real model makes: a name that was never declared
      std::string source = problem_.render(knobs);
      const std::size_t at = source.find("void kernel(");
      if (at != std::string::npos) source.insert(source.find('{', at) + 1, "\n  scratch_total += 1;");
      return fmt::format("{} I also keep a running total for debugging.\n\n```cpp\n{}```\n", why, source);
    }
    if (roll < 0.4 && !current.empty()) {
      if (auto edit = as_edit(current, knobs); !edit.empty()) return fmt::format("{}\n\n{}", why, edit);
    }
    return fmt::format("{}\n\n```cpp\n{}```\n", why, problem_.render(knobs));
  }

 private:
  /// The template line that holds `${name}`, split around the placeholder.
  std::pair<std::string, std::string> template_line(const std::string& name) const {
    const std::string placeholder = "${" + name + "}";
    const std::string& t = problem_.template_source;
    const std::size_t at = t.find(placeholder);
    if (at == std::string::npos) return {};
    const std::size_t line_start = t.rfind('\n', at) + 1;
    std::string prefix = t.substr(line_start, at - line_start);
    prefix.erase(0, prefix.find_first_not_of(' '));
    return {prefix, t.substr(at + placeholder.size(), 1)};
  }

  /// The knob values a rendered source was made from (defaults where it does not say).
  kevo::Knobs read_knobs(std::string_view source) const {
    kevo::Knobs knobs = problem_.default_knobs();
    for (const auto& spec : problem_.knobs) {
      const auto [prefix, suffix] = template_line(spec.name);
      const std::size_t at = prefix.empty() ? std::string_view::npos : source.find(prefix);
      if (at == std::string_view::npos) continue;
      const std::size_t begin = at + prefix.size();
      const std::size_t end = source.find(suffix, begin);
      if (end == std::string_view::npos) continue;
      const std::string value(source.substr(begin, end - begin));
      if (spec.index_of(value)) knobs[spec.name] = value;
    }
    return knobs;
  }

  /// Moves one knob on `side` (any knob when none is on that side) to a neighbouring value.
  std::string mutate(kevo::Knobs& knobs, kevo::KnobSide side) {
    std::vector<const kevo::KnobSpec*> choices;
    for (const auto& k : problem_.knobs)
      if (k.domain.size() > 1 && (side == kevo::KnobSide::any || k.side == side)) choices.push_back(&k);
    if (choices.empty())
      for (const auto& k : problem_.knobs)
        if (k.domain.size() > 1) choices.push_back(&k);
    if (choices.empty()) return "nothing";
    const kevo::KnobSpec& k = *choices[std::uniform_int_distribution<std::size_t>(0, choices.size() - 1)(rng_)];
    const std::size_t i = k.index_of(knobs[k.name]).value_or(0);
    const std::size_t j = i + 1 < k.domain.size() && (i == 0 || rng_() % 2) ? i + 1 : i - 1;
    const std::string before = knobs[k.name];
    knobs[k.name] = k.domain[j];
    return fmt::format("{} from {} to {}", k.name, before, k.domain[j]);
  }

  /// Takes the knob change of the first faster sibling the prompt lists ("knobs: a 1->4, b 2->8").
  std::string sibling_change(std::string_view prompt, kevo::Knobs& knobs) {
    const std::string_view faster = between(prompt, "Faster than the current implementation", "\n\n");
    const std::string_view change = between(faster, "knobs: ", "\n");
    if (change.empty() || rng_() % 3 == 0) return {};  // sometimes explore instead
    std::string applied;
    for (std::size_t pos = 0; pos < change.size();) {
      const std::size_t comma = change.find(", ", pos);
      const std::string_view item = change.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
      const std::size_t space = item.find(' '), arrow = item.find("->");
      if (space != std::string_view::npos && arrow != std::string_view::npos && problem_.knob(item.substr(0, space))) {
        knobs[std::string(item.substr(0, space))] = std::string(item.substr(arrow + 2));
        applied += (applied.empty() ? "" : ", ") + std::string(item);
      }
      if (comma == std::string_view::npos) break;
      pos = comma + 2;
    }
    return applied;
  }

  /// SEARCH/REPLACE edits turning `current` into the rendering of `knobs`, one per changed line.
  std::string as_edit(std::string_view current, const kevo::Knobs& knobs) const {
    std::string edits;
    for (const auto& spec : problem_.knobs) {
      const auto [prefix, suffix] = template_line(spec.name);
      const std::size_t at = prefix.empty() ? std::string_view::npos : current.find(prefix);
      if (at == std::string_view::npos) continue;
      const std::size_t line_start = current.rfind('\n', at) + 1;
      const std::size_t line_end = current.find('\n', at);
      const std::string line(current.substr(line_start, line_end - line_start));
      const std::size_t value_begin = at - line_start + prefix.size();
      const std::size_t value_end = line.find(suffix, value_begin);
      if (value_end == std::string::npos || line.substr(value_begin, value_end - value_begin) == knobs.at(spec.name)) continue;
      const std::string replaced = line.substr(0, value_begin) + knobs.at(spec.name) + line.substr(value_end);
      edits += fmt::format("<<<<<<< SEARCH\n{}\n=======\n{}\n>>>>>>> REPLACE\n", line, replaced);
    }
    return edits;
  }

  kevo::Problem problem_;
  std::mt19937_64 rng_;
  std::mutex mutex_;
};

void serve(tcp::socket socket, CandidateWriter& writer) {
  beast::flat_buffer buffer;
  http::request<http::string_body> req;
  beast::error_code ec;
  http::read(socket, buffer, req, ec);
  if (ec) return;
  const bool anthropic = req.target().ends_with("/messages");
  http::response<http::string_body> res{http::status::ok, 11};
  res.set(http::field::content_type, "application/json");

  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  std::string prompt;
  if (req.method() != http::verb::post || parser.parse(req.body()).get(doc)) {
    res.result(http::status::bad_request);
    res.body() = R"({"error":{"type":"invalid_request_error","message":"POST a JSON chat request"}})";
  } else {
    std::string system;
    int retries = 0;
    simdjson::dom::array messages;
    if (!doc["messages"].get_array().get(messages))
      for (auto m : messages) {
        std::string_view role, content;
        if (m["content"].get_string().get(content)) continue;
        if (!m["role"].get_string().get(role) && role == "system") system = std::string(content);
        else if (role == "user" && prompt.empty()) prompt = std::string(content);
        else if (role == "user") ++retries;  // "that was tried before": move further this time
      }
    if (std::string_view s; !doc["system"].get_string().get(s)) system = std::string(s);  // Anthropic's place for it
    const std::string text = writer.answer(system, prompt, retries);
    const std::size_t in = (req.body().size() + 3) / 4, out = (text.size() + 3) / 4;
    res.body() = anthropic
                     ? fmt::format(R"({{"id":"msg_loopback","type":"message","role":"assistant","model":"loopback","content":[{{"type":"text","text":{}}}],"stop_reason":"end_turn","usage":{{"input_tokens":{},"output_tokens":{}}}}})",
                                   kevo::detail::json_quote(text), in, out)
                     : fmt::format(R"({{"id":"chatcmpl-loopback","object":"chat.completion","model":"loopback","choices":[{{"index":0,"message":{{"role":"assistant","content":{}}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":{},"completion_tokens":{},"total_tokens":{}}}}})",
                                   kevo::detail::json_quote(text), in, out, in + out);
  }
  res.prepare_payload();
  http::write(socket, res, ec);
  socket.shutdown(tcp::socket::shutdown_send, ec);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string_view(argv[1]).starts_with("-")) {
    fmt::print(stderr, "usage: kevo-loopback-llm PROBLEM_DIR [--port N] [--seed S]\n"
                       "Serves plausible candidates for PROBLEM_DIR's template on 127.0.0.1 (OpenAI and Anthropic wire formats).\n");
    return 2;
  }
  unsigned short port = 8765;
  std::uint64_t seed = 1;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i], value = argv[i + 1];
    bool ok = false;
    if (flag == "--port") ok = std::from_chars(value.data(), value.data() + value.size(), port).ec == std::errc();
    else if (flag == "--seed") ok = std::from_chars(value.data(), value.data() + value.size(), seed).ec == std::errc();
    if (!ok) {
      fmt::print(stderr, "kevo-loopback-llm: bad option {} {}\n", flag, value);
      return 2;
    }
  }
  auto problem = kevo::load_problem(argv[1]);
  if (!problem) {
    fmt::print(stderr, "kevo-loopback-llm: {}\n", problem.error().message);
    return 1;
  }
  CandidateWriter writer(std::move(*problem), seed);
  asio::io_context io;
  beast::error_code ec;
  tcp::acceptor acceptor(io);
  const tcp::endpoint where(asio::ip::make_address("127.0.0.1"), port);
  acceptor.open(where.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(where, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    fmt::print(stderr, "kevo-loopback-llm: cannot listen on 127.0.0.1:{}: {}\n", port, ec.message());
    return 1;
  }
  fmt::print("kevo-loopback-llm: serving on http://127.0.0.1:{}/v1\n", acceptor.local_endpoint().port());
  std::fflush(stdout);
  while (true) {
    tcp::socket socket(io);
    acceptor.accept(socket, ec);
    if (ec) continue;
    std::thread([s = std::move(socket), &writer]() mutable { serve(std::move(s), writer); }).detach();
  }
}
