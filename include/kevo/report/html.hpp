// kevo/report/html.hpp: what every kevo HTML page needs: text made safe to place in HTML, and the
// page written to its file.
#pragma once

#include <kevo/expected.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
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

/// The frame both reports draw speedups in: evaluations across (0 to n - 1), speedup up (0 to
/// y_max), a grid line and a label at each whole step, the caption under the axis.
struct SpeedupFrame {
  static constexpr double width = 760, height = 300, left = 50, bottom = 30, top = 10;
  double y_max = 1.5;
  std::size_t n = 2;

  /// A frame that holds speedups up to `best` (with room above) over `evaluations`.
  static SpeedupFrame fitting(double best, std::size_t evaluations) {
    return SpeedupFrame{.y_max = std::max(best * 1.1, 1.5), .n = std::max<std::size_t>(evaluations, 2)};
  }
  double x(std::size_t i) const { return left + (width - left - 10) * double(i) / double(n - 1); }
  double y(double speedup) const { return top + (height - top - bottom) * (1 - speedup / y_max); }
  /// The opening <svg> tag, the grid and the caption; the caller adds its marks and "</svg>".
  std::string open(std::string_view caption, double caption_x) const {
    std::string svg = fmt::format(R"(<svg viewBox="0 0 {} {}" width="{}" height="{}" font-size="11">)", width, height, width, height);
    for (double tick = 0; tick <= y_max; tick += std::max(1.0, std::round(y_max / 6)))
      svg += fmt::format(R"(<line x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}" stroke="#eee"/><text x="5" y="{:.1f}">{:.0f}x</text>)",
                         left, width - 10, y(tick), y(tick), y(tick) + 4, tick);
    return svg + fmt::format(R"(<text x="{}" y="{}">{}</text>)", left + caption_x, height - 5, escape_html(caption));
  }
};

/// Writes a rendered page to `path`; an error where it could not be rendered or written.
inline expected<void, Error> write_page(const expected<std::string, Error>& html, const std::filesystem::path& path) {
  if (!html) return unexpected(html.error());
  std::ofstream out(path);
  out << *html;
  if (!out) return make_error(fmt::format("{}: cannot be written", path.string()));
  return {};
}

}  // namespace kevo::report
