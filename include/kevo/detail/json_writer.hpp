// kevo/detail/json_writer.hpp: writing JSON text (simdjson reads it; it does not write it): knobs as
// JSON and back; strings through json_text.hpp.
#pragma once

#include <kevo/candidate.hpp>
#include <kevo/detail/json_text.hpp>

#include <fmt/format.h>
#include <simdjson.h>

#include <string>
#include <string_view>

namespace kevo::detail {

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
