// kevo/report/html.hpp: what every kevo HTML page needs: text made safe to place in HTML.
#pragma once

#include <string>
#include <string_view>

namespace kevo::report {

/// `text` with the characters HTML gives meaning to replaced by their entities.
inline std::string escape_html(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace kevo::report
