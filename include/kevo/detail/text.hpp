// kevo/detail/text.hpp: small text helpers shared by the headers that quote text into prompts,
// logs and error messages.
//
//   kevo::detail::one_line("error: x\n  at line 3", 80);   // "error: x   at line 3"
//   kevo::detail::one_line(long_message, 160);              // cut at a word, "..." where it was cut
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kevo::detail {

/// `text` on one line, at most about `max_chars`: cut at a word boundary (never inside a number
/// or a UTF-8 character), with "..." where it was cut.
inline std::string one_line(std::string_view text, std::size_t max_chars = 200) {
  std::string out;
  for (char c : text) out += (c == '\n' || c == '\r' || c == '\t') ? ' ' : c;
  if (out.size() <= max_chars) return out;
  std::size_t cut = out.rfind(' ', max_chars);
  if (cut == std::string::npos || cut < max_chars / 2) {  // one long word: cut it, but not inside a character
    cut = max_chars;
    while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;
  }
  out.resize(cut);
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out + "...";
}

}  // namespace kevo::detail
