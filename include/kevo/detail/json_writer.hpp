// kevo/detail/json_writer.hpp: writing JSON text (simdjson reads it; it does not write it).
#pragma once

#include <kevo/candidate.hpp>

#include <fmt/format.h>
#include <simdjson.h>

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

inline std::string knobs_to_json(const Knobs& knobs) {
  std::string out = "{";
  for (const auto& [name, value] : knobs) {
    if (out.size() > 1) out += ',';
    out += json_quote(name) + ':' + json_quote(value);
  }
  return out + '}';
}

inline Knobs knobs_from_json(std::string_view text) {
  Knobs knobs;
  thread_local simdjson::dom::parser parser;  // one per thread, not per row: a store reads thousands
  simdjson::dom::object object;
  if (parser.parse(text.data(), text.size()).get(object)) return knobs;
  for (auto [key, value] : object) {
    std::string_view v;
    if (!value.get_string().get(v)) knobs[std::string(key)] = std::string(v);
  }
  return knobs;
}

}  // namespace kevo::detail
