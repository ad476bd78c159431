// kevo/detail/json_writer.hpp: writing JSON text (simdjson reads it; it does not write it).
#pragma once

#include <kevo/candidate.hpp>

#include <fmt/format.h>
#include <simdjson.h>

#include <string>
#include <string_view>

namespace kevo::detail {

/// `text` as a quoted JSON string.
inline std::string json_quote(std::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
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
  }
  return out + '"';
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
  simdjson::dom::parser parser;
  simdjson::dom::object object;
  if (parser.parse(text.data(), text.size()).get(object)) return knobs;
  for (auto [key, value] : object) {
    std::string_view v;
    if (!value.get_string().get(v)) knobs[std::string(key)] = std::string(v);
  }
  return knobs;
}

}  // namespace kevo::detail
