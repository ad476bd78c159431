// kevo/report/html.hpp: what every kevo HTML page needs: text made safe to place in HTML, and the
// page written to its file.
#pragma once

#include <kevo/expected.hpp>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
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

/// Writes a rendered page to `path`; an error where it could not be rendered or written.
inline expected<void, Error> write_page(const expected<std::string, Error>& html, const std::filesystem::path& path) {
  if (!html) return unexpected(html.error());
  std::ofstream out(path);
  out << *html;
  if (!out) return make_error(fmt::format("{}: cannot be written", path.string()));
  return {};
}

}  // namespace kevo::report
