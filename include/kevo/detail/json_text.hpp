// kevo/detail/json_text.hpp: text as a JSON string, written once for every part of kevo (the
// store's knobs, the LLM's requests, the checkers' verdicts, the retrieval server's answers).
//
//   std::string body = "{\"error\":" + kevo::detail::json_quote(message) + "}";
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace kevo::detail {

/// Appends `text` as a JSON string. Invalid UTF-8 (compiler output can carry any byte) becomes
/// U+FFFD, since servers reject bodies that are not UTF-8.
inline void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
          if (c < 0x20) out += fmt::format("\\u{:04x}", c);
          else out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    const std::size_t len = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 0;
    bool valid = len != 0 && i + len <= text.size();
    for (std::size_t k = 1; valid && k < len; ++k) valid = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
    if (valid) {
      out.append(text.substr(i, len));
      i += len;
    } else {
      out += "\\ufffd";
      ++i;
    }
  }
  out += '"';
}

/// `text` as a quoted JSON string.
inline std::string json_quote(std::string_view text) {
  std::string out;
  append_json_string(out, text);
  return out;
}

}  // namespace kevo::detail
