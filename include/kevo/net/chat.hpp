// kevo/net/chat.hpp: the LLM wire formats: a chat request encoded as OpenAI Chat Completions or
// Anthropic Messages JSON, and responses and error bodies decoded with simdjson. No I/O here.
//
//   kevo::net::ChatRequest req{.system = "You write C++.", .messages = {{"user", "Hello"}}};
//   std::string body = kevo::net::encode_request(kevo::net::WireFormat::anthropic, "claude-x", req);
//   auto reply = kevo::net::ResponseDecoder{}.decode(kevo::net::WireFormat::anthropic, body);
#pragma once

#include <kevo/detail/json_writer.hpp>
#include <kevo/expected.hpp>

#include <fmt/format.h>
#include <simdjson.h>

#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kevo::net {

/// Which API dialect a server speaks.
enum class WireFormat : std::uint8_t {
  openai,     ///< POST {base}/v1/chat/completions, Authorization: Bearer (OpenAI, vLLM, llama.cpp, Ollama)
  anthropic,  ///< POST {base}/v1/messages, x-api-key, anthropic-version: 2023-06-01
};

inline constexpr std::string_view to_string(WireFormat w) { return w == WireFormat::openai ? "openai" : "anthropic"; }

inline std::optional<WireFormat> wire_format_from_string(std::string_view s) {
  if (s == "openai" || s == "openai-compatible" || s == "chat-completions") return WireFormat::openai;
  if (s == "anthropic" || s == "messages") return WireFormat::anthropic;
  return std::nullopt;
}

struct ChatMessage {
  std::string role;  ///< "user" or "assistant"
  std::string content;
};

struct ChatRequest {
  std::string system;
  std::vector<ChatMessage> messages;
  std::size_t max_tokens = 4096;       ///< required by Anthropic; a cap on the answer's cost everywhere
  std::optional<double> temperature;
  std::string model;                   ///< empty: the client's configured model
};

struct TokenUsage {
  std::uint64_t input_tokens = 0;
  std::uint64_t output_tokens = 0;
};

struct ChatResponse {
  std::string text;            ///< the answer's text, all text parts joined
  std::string finish_reason;   ///< "stop"/"length" (OpenAI) or "end_turn"/"max_tokens" (Anthropic)
  std::string model;
  TokenUsage usage;
  int http_status = 0;
  int attempts = 0;            ///< HTTP attempts it took, retries included

  /// The model stopped because it hit max_tokens, so the answer is cut off.
  bool truncated() const { return finish_reason == "length" || finish_reason == "max_tokens"; }
};

/// Why a request failed, for a caller that reacts differently to each.
enum class LlmErrorKind : std::uint8_t {
  configuration,       ///< bad URL, API key variable unset: fix the setup, retrying is pointless
  budget_exhausted,    ///< the run's token or cost budget is spent: stop the search cleanly
  timeout,             ///< an operation or the whole request ran past its limit
  transport,           ///< connection failed (refused, reset, TLS or certificate error)
  http_status,         ///< the server answered with a status that retrying will not fix (400, 401, 404)
  retries_exhausted,   ///< 429/5xx or resets on every allowed attempt
  malformed_response,  ///< the body is not the JSON the wire format promises
  empty_response,      ///< a valid body with no answer in it (no choices, no text)
  response_too_large,  ///< the body passed the configured size limit
  cancelled,           ///< the client was cancelled (Ctrl-C): the search is stopping
};

inline constexpr std::string_view to_string(LlmErrorKind k) {
  switch (k) {
    case LlmErrorKind::configuration: return "configuration";
    case LlmErrorKind::budget_exhausted: return "budget_exhausted";
    case LlmErrorKind::timeout: return "timeout";
    case LlmErrorKind::transport: return "transport";
    case LlmErrorKind::http_status: return "http_status";
    case LlmErrorKind::retries_exhausted: return "retries_exhausted";
    case LlmErrorKind::malformed_response: return "malformed_response";
    case LlmErrorKind::empty_response: return "empty_response";
    case LlmErrorKind::response_too_large: return "response_too_large";
    case LlmErrorKind::cancelled: return "cancelled";
  }
  return "?";
}

/// A kevo::Error with the failure's kind and HTTP status; it slices to kevo::Error where a caller
/// needs only the message.
struct LlmError : Error {
  LlmErrorKind kind = LlmErrorKind::transport;
  int http_status = 0;
  int attempts = 0;
};

inline unexpected<LlmError> make_llm_error(LlmErrorKind kind, std::string message, int http_status = 0, int attempts = 0) {
  LlmError e;
  e.message = std::move(message);
  e.kind = kind;
  e.http_status = http_status;
  e.attempts = attempts;
  return unexpected<LlmError>(std::move(e));
}

/// Anything that answers a chat request synchronously: net::BlockingLlmClient, or a test double.
template <class C>
concept ChatCompleter = requires(C& c, const ChatRequest& r) {
  { c.complete(r) } -> std::same_as<expected<ChatResponse, LlmError>>;
};

/// The request body for `format`. OpenAI's newer models take the answer cap as
/// "max_completion_tokens"; `max_tokens_field` names it (Anthropic always uses "max_tokens").
inline std::string encode_request(WireFormat format, std::string_view model, const ChatRequest& request,
                                  std::string_view max_tokens_field = "max_tokens") {
  std::string out = "{\"model\":";
  kevo::detail::append_json_string(out, request.model.empty() ? model : std::string_view(request.model));
  out += fmt::format(",\"{}\":{}", format == WireFormat::anthropic ? "max_tokens" : max_tokens_field, request.max_tokens);
  if (request.temperature) out += fmt::format(",\"temperature\":{}", *request.temperature);
  if (format == WireFormat::anthropic && !request.system.empty()) {
    out += ",\"system\":";  // Anthropic takes the system prompt at the top level
    kevo::detail::append_json_string(out, request.system);
  }
  out += ",\"messages\":[";
  bool first = true;
  auto message = [&](std::string_view role, std::string_view content) {
    if (!first) out += ',';
    first = false;
    out += "{\"role\":";
    kevo::detail::append_json_string(out, role);
    out += ",\"content\":";
    kevo::detail::append_json_string(out, content);
    out += '}';
  };
  if (format == WireFormat::openai && !request.system.empty()) message("system", request.system);
  for (const auto& m : request.messages) message(m.role, m.content);
  out += "]}";
  return out;
}

/// Decodes response and error bodies. Reuses one simdjson parser, so one decoder must not be used
/// from two threads at once; every string it returns is a copy.
class ResponseDecoder {
 public:
  expected<ChatResponse, LlmError> decode(WireFormat format, std::string_view body) {
    const simdjson::padded_string input(body);  // the document lives only inside this call
    simdjson::ondemand::document doc;
    if (auto err = parser_.iterate(input).get(doc))
      return make_llm_error(LlmErrorKind::malformed_response, fmt::format("response is not JSON ({})", simdjson::error_message(err)));
    simdjson::ondemand::object root;
    if (doc.get_object().get(root)) return make_llm_error(LlmErrorKind::malformed_response, "response is not a JSON object");

    ChatResponse r;
    bool saw_answer_field = false;
    std::string error_message;
    for (auto field : root) {
      std::string_view key;
      if (field.unescaped_key().get(key)) return malformed("a key");
      auto value = field.value();
      if (key == "model") {
        std::string_view s;
        if (!value.get_string().get(s)) r.model = std::string(s);
      } else if (key == "usage") {
        simdjson::ondemand::object usage;
        if (value.get_object().get(usage)) return malformed("usage");
        for (auto u : usage) {
          std::string_view k;
          if (u.unescaped_key().get(k)) return malformed("usage");
          std::uint64_t n = 0;
          if (u.value().get_uint64().get(n)) continue;  // null or nested detail objects
          if (k == "prompt_tokens" || k == "input_tokens") r.usage.input_tokens = n;
          else if (k == "completion_tokens" || k == "output_tokens") r.usage.output_tokens = n;
        }
      } else if (key == "error") {
        error_message = message_of(value);
      } else if (format == WireFormat::openai && key == "choices") {
        saw_answer_field = true;
        simdjson::ondemand::array choices;
        if (value.get_array().get(choices)) return malformed("choices");
        for (auto choice : choices) {
          simdjson::ondemand::object c;
          if (choice.get_object().get(c)) return malformed("a choice");
          for (auto cf : c) {
            std::string_view ck;
            if (cf.unescaped_key().get(ck)) return malformed("a choice");
            if (ck == "finish_reason") {
              std::string_view s;
              if (!cf.value().get_string().get(s)) r.finish_reason = std::string(s);
            } else if (ck == "message") {
              simdjson::ondemand::object m;
              if (cf.value().get_object().get(m)) return malformed("choices[0].message");
              for (auto mf : m) {
                std::string_view mk;
                if (mf.unescaped_key().get(mk)) return malformed("choices[0].message");
                if (mk == "content" && !append_text(mf.value(), r.text)) return malformed("choices[0].message.content");
              }
            }
          }
          break;  // only the first choice is used (n = 1)
        }
      } else if (format == WireFormat::anthropic && key == "content") {
        saw_answer_field = true;
        if (!append_text(value, r.text)) return malformed("content");
      } else if (format == WireFormat::anthropic && key == "stop_reason") {
        std::string_view s;
        if (!value.get_string().get(s)) r.finish_reason = std::string(s);
      }
    }
    if (!error_message.empty()) return make_llm_error(LlmErrorKind::malformed_response, "error in a success response: " + error_message);
    if (!saw_answer_field)
      return make_llm_error(LlmErrorKind::malformed_response,
                            format == WireFormat::openai ? "response has no 'choices'" : "response has no 'content'");
    if (r.text.empty())
      return make_llm_error(LlmErrorKind::empty_response,
                            r.finish_reason.empty() ? "the response carries no answer text (empty choices or content)"
                                                    : fmt::format("the answer is empty (finish reason '{}')", r.finish_reason));
    return r;
  }

  /// The human-readable message in an error body ({"error": {"message": ...}} in both formats),
  /// or the start of the body when it has none.
  std::string error_message(std::string_view body) {
    const simdjson::padded_string input(body);
    simdjson::ondemand::document doc;
    simdjson::ondemand::object root;
    if (!parser_.iterate(input).get(doc) && !doc.get_object().get(root)) {
      for (auto field : root) {
        std::string_view key;
        if (field.unescaped_key().get(key)) break;
        if (key == "error") return message_of(field.value());
      }
    }
    return fmt::format("{:.200}", body);
  }

 private:
  static unexpected<LlmError> malformed(std::string_view what) {
    return make_llm_error(LlmErrorKind::malformed_response, fmt::format("response has a malformed {}", what));
  }

  /// A string, null, or an array of parts ({"type": "text", "text": ...}) appended to `out`.
  static bool append_text(simdjson::simdjson_result<simdjson::ondemand::value> result, std::string& out) {
    simdjson::ondemand::value value;
    if (result.get(value)) return false;
    simdjson::ondemand::json_type type;
    if (value.type().get(type)) return false;
    if (type == simdjson::ondemand::json_type::null) return true;
    if (type == simdjson::ondemand::json_type::string) {
      std::string_view s;
      if (value.get_string().get(s)) return false;
      out.append(s);
      return true;
    }
    if (type != simdjson::ondemand::json_type::array) return false;
    simdjson::ondemand::array parts;
    if (value.get_array().get(parts)) return false;
    for (auto part : parts) {
      simdjson::ondemand::object p;
      if (part.get_object().get(p)) return false;
      std::string type_name, text;
      for (auto f : p) {
        std::string_view k, s;
        if (f.unescaped_key().get(k)) return false;
        if ((k == "type" || k == "text") && f.value().get_string().get(s)) return false;
        if (k == "type") type_name = std::string(s);
        else if (k == "text") text = std::string(s);
      }
      if (type_name == "text" || type_name.empty()) out += text;  // skip thinking and tool blocks
    }
    return true;
  }

  static std::string message_of(simdjson::simdjson_result<simdjson::ondemand::value> result) {
    simdjson::ondemand::value value;
    if (result.get(value)) return "unreadable error";
    simdjson::ondemand::json_type type;
    if (value.type().get(type)) return "unreadable error";
    std::string_view s;
    if (type == simdjson::ondemand::json_type::string) return value.get_string().get(s) ? "unreadable error" : std::string(s);
    simdjson::ondemand::object e;
    if (type != simdjson::ondemand::json_type::object || value.get_object().get(e)) return "unreadable error";
    std::string kind, message;
    for (auto f : e) {
      std::string_view k;
      if (f.unescaped_key().get(k)) break;
      if (k == "message" && !f.value().get_string().get(s)) message = std::string(s);
      else if (k == "type" && !f.value().get_string().get(s)) kind = std::string(s);
    }
    if (!kind.empty() && !message.empty()) return fmt::format("{}: {}", kind, message);
    return message.empty() ? kind : message;
  }

  simdjson::ondemand::parser parser_;
};

}  // namespace kevo::net
