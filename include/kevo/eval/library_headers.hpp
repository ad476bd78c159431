// kevo/eval/library_headers.hpp: the kevo headers a problem lets its candidates include (its
// manifest's "library_headers"), found under kevo's include root with every "kevo/..." header they
// include in turn, so that the evaluator can copy them into the problem's build directory: the only
// tree, beside the toolchain, that the jailed compiler sees.
//
//   const auto root = kevo::eval::library_include_root(options.library_include_dir);
//   auto headers = kevo::eval::library_header_closure(root, problem.library_headers);
//   if (!headers) return fail(headers.error().message);   // names the header and where it looked
#pragma once

#include <kevo/expected.hpp>
#include <kevo/problem.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <source_location>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace kevo::eval {

/// One header to copy: its path under the include root ("kevo/retrieval/half.hpp") and its text.
struct LibraryHeader {
  std::string path;
  std::string content;
};

/// kevo's include root (the directory that holds kevo/): `configured` where given, else
/// $KEVO_INCLUDE_DIR, else the root of the headers this program was compiled from; empty if none.
inline std::filesystem::path library_include_root(const std::filesystem::path& configured = {}) {
  namespace fs = std::filesystem;
  if (!configured.empty()) return configured;
  if (const char* env = std::getenv("KEVO_INCLUDE_DIR"); env && *env) return env;
  // A header-only library: the headers this program was built against (the variable above serves a
  // program run on another machine than it was built on).
  const fs::path self = std::source_location::current().file_name();  // <root>/kevo/eval/library_headers.hpp
  const fs::path root = self.parent_path().parent_path().parent_path();
  std::error_code ec;
  if (!root.empty() && fs::is_regular_file(root / "kevo" / "eval" / "library_headers.hpp", ec)) return root;
  return {};
}

namespace detail {

/// The `#include "kevo/..."` names in a header's text, in order (quoted includes only: the standard
/// library's and the toolkit's headers are the compiler's own).
inline std::vector<std::string> quoted_kevo_includes(std::string_view text) {
  std::vector<std::string> out;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t nl = std::min(text.find('\n', at), text.size());
    std::string_view line = text.substr(at, nl - at);
    at = nl + 1;
    auto skip_space = [&] {
      while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    };
    skip_space();
    if (!line.starts_with('#')) continue;
    line.remove_prefix(1);
    skip_space();
    if (!line.starts_with("include")) continue;
    line.remove_prefix(7);
    skip_space();
    if (!line.starts_with('"')) continue;
    const std::size_t close = line.find('"', 1);
    if (close == std::string_view::npos) continue;
    const std::string_view name = line.substr(1, close - 1);
    if (name.starts_with("kevo/")) out.emplace_back(name);
  }
  return out;
}

}  // namespace detail

/// The headers `names` and, transitively, every `#include "kevo/..."` in them, read from `root`,
/// sorted by path. A header that is missing is an error naming it, what included it, and the root.
inline expected<std::vector<LibraryHeader>, Error> library_header_closure(const std::filesystem::path& root,
                                                                          const std::vector<std::string>& names) {
  namespace fs = std::filesystem;
  constexpr std::string_view how = "set KEVO_INCLUDE_DIR (or EvaluatorOptions::library_include_dir) to the directory that holds kevo/";
  std::vector<LibraryHeader> out;
  if (names.empty()) return out;
  if (root.empty())
    return make_error(fmt::format("the problem's library header {} needs kevo's include root, which was not found: {}", names.front(), how));
  std::set<std::string> seen;
  std::vector<std::pair<std::string, std::string>> pending;  // {header, the header that included it}
  for (auto it = names.rbegin(); it != names.rend(); ++it) pending.emplace_back(*it, std::string());
  while (!pending.empty()) {
    auto [name, included_by] = std::move(pending.back());
    pending.pop_back();
    if (!seen.insert(name).second) continue;
    const std::string by = included_by.empty() ? std::string() : fmt::format(" (included by {})", included_by);
    if (auto fault = kevo::detail::library_header_fault(name))
      return make_error(fmt::format("library header \"{}\"{} {}: it must be a relative path under kevo/", name, by, *fault));
    const fs::path file = root / name;
    std::error_code ec;
    if (!fs::is_regular_file(file, ec))
      return make_error(fmt::format("library header {}{} is not in kevo's include root {}: {}", name, by, root.string(), how));
    auto text = kevo::detail::read_text_file(file);
    if (!text) return make_error(fmt::format("library header {}{}: {}", name, by, text.error().message));
    for (auto& include : detail::quoted_kevo_includes(*text)) pending.emplace_back(std::move(include), name);
    out.push_back(LibraryHeader{name, std::move(*text)});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.path < b.path; });
  return out;
}

}  // namespace kevo::eval
