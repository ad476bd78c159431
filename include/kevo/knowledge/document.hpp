// kevo/knowledge/document.hpp: knowledge documents: markdown files with front matter, split into
// sections that are retrieved one at a time.
//
//   auto docs = kevo::knowledge::load_documents("knowledge");      // every **/*.md with front matter
//   for (const auto& d : *docs) for (const auto& s : d.sections) index(d, s);
//   auto one = kevo::knowledge::parse_document(text, "hardware/x86-64/simd.md");
#pragma once

#include <kevo/expected.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace kevo::knowledge {

/// One retrievable piece of a document: a `## ` section, or the text before the first one.
struct Section {
  std::string heading;  ///< empty for the text before the first heading
  std::string text;
  /// Narrower than the document's, from a `<!-- targets: cuda, hip -->` line right under the
  /// heading: GPU-only advice in a document for every target. Empty: the document's.
  std::vector<std::string> targets = {};
};

struct Document {
  std::string path;                        ///< relative to the folder it was loaded from
  std::string title;
  std::string category;                    ///< "hardware/nvidia-hopper": top level first
  std::vector<std::string> targets;        ///< "cpu", "cuda", "hip"; empty or "any": all
  std::vector<std::string> architectures;  ///< empty: every architecture of the targets
  std::vector<std::string> tags;
  std::vector<Section> sections;

  /// The first component of the category: "correctness", "optimization", "hardware" or "skill".
  std::string top_category() const { return category.substr(0, category.find('/')); }
};

namespace detail {

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

inline std::string lowercase(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

/// "[a, b, c]" or "a, b, c" -> {"a", "b", "c"}; quotes around items are dropped.
inline std::vector<std::string> parse_list(std::string_view value) {
  value = trim(value);
  if (!value.empty() && value.front() == '[') value.remove_prefix(1);
  if (!value.empty() && value.back() == ']') value.remove_suffix(1);
  std::vector<std::string> items;
  while (!value.empty()) {
    const std::size_t comma = value.find(',');
    std::string_view item = trim(value.substr(0, comma));
    if (item.size() >= 2 && (item.front() == '"' || item.front() == '\'') && item.back() == item.front())
      item = item.substr(1, item.size() - 2);
    if (!item.empty()) items.emplace_back(item);
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return items;
}

inline std::string strip_comment(std::string_view value) {
  // A '#' after whitespace starts a comment, as in YAML; '#' inside a word (C#) stays.
  for (std::size_t i = 1; i < value.size(); ++i)
    if (value[i] == '#' && std::isspace(static_cast<unsigned char>(value[i - 1]))) return std::string(trim(value.substr(0, i)));
  return std::string(trim(value));
}

}  // namespace detail

/// Parses one markdown file. `relative_path` names it in errors and supplies the category when
/// the front matter has none (its folder). Returns nullopt for a file without front matter.
inline expected<std::optional<Document>, Error> parse_document(std::string_view text, std::string_view relative_path) {
  using detail::trim;
  if (text.substr(0, 3) != "---") return std::optional<Document>{};
  const std::size_t header_end = text.find("\n---", 3);
  if (header_end == std::string_view::npos)
    return make_error(fmt::format("{}: front matter opened with '---' but never closed", relative_path));

  Document doc;
  doc.path = std::string(relative_path);
  std::string_view header = text.substr(3, header_end - 3);
  std::size_t line_number = 1;
  while (!header.empty()) {
    const std::size_t eol = header.find('\n');
    std::string_view line = header.substr(0, eol);
    header = eol == std::string_view::npos ? std::string_view() : header.substr(eol + 1);
    ++line_number;
    if (trim(line).empty() || trim(line).front() == '#') continue;
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos)
      return make_error(fmt::format("{}:{}: front matter lines are 'key: value'", relative_path, line_number));
    const std::string key = detail::lowercase(trim(line.substr(0, colon)));
    const std::string value = detail::strip_comment(line.substr(colon + 1));
    if (key == "title") doc.title = std::string(trim(std::string_view(value)));
    else if (key == "category") doc.category = detail::lowercase(value);
    else if (key == "targets" || key == "target") doc.targets = detail::parse_list(detail::lowercase(value));
    else if (key == "architectures" || key == "architecture") doc.architectures = detail::parse_list(detail::lowercase(value));
    else if (key == "tags") doc.tags = detail::parse_list(detail::lowercase(value));
    // Unknown keys are allowed, so documents can carry metadata for other tools.
  }
  if (doc.title.size() >= 2 && doc.title.front() == '"' && doc.title.back() == '"') doc.title = doc.title.substr(1, doc.title.size() - 2);
  if (doc.title.empty()) return make_error(fmt::format("{}: front matter needs a 'title'", relative_path));
  if (doc.category.empty()) {
    const std::string folder = std::filesystem::path(relative_path).parent_path().generic_string();
    if (folder.empty()) return make_error(fmt::format("{}: no 'category' and no folder to take it from", relative_path));
    doc.category = detail::lowercase(folder);
  }
  const std::string top = doc.top_category();
  if (top != "correctness" && top != "optimization" && top != "hardware" && top != "skill")
    return make_error(fmt::format("{}: category '{}' must start with correctness, optimization or hardware", relative_path,
                                  doc.category));

  // Split the body at "## " headings; deeper headings stay inside their section.
  std::string_view body = text.substr(header_end + 4);
  if (const std::size_t eol = body.find('\n'); eol != std::string_view::npos) body.remove_prefix(eol + 1);
  else body = {};
  Section current;
  auto flush = [&] {
    if (!trim(current.text).empty()) {
      current.text = std::string(trim(current.text));
      doc.sections.push_back(std::move(current));
    }
    current = Section{};
  };
  while (!body.empty()) {
    const std::size_t eol = body.find('\n');
    std::string_view line = body.substr(0, eol);
    body = eol == std::string_view::npos ? std::string_view() : body.substr(eol + 1);
    if (line.substr(0, 3) == "## ") {
      flush();
      current.heading = std::string(trim(line.substr(3)));
    } else if (const std::string_view t = trim(line); t.starts_with("<!-- targets:") && t.ends_with("-->") && trim(current.text).empty()) {
      current.targets = detail::parse_list(detail::lowercase(t.substr(13, t.size() - 16)));
      for (const std::string& target : current.targets) {
        const bool known = target == "cpu" || target == "cuda" || target == "hip";
        const auto has = [&](std::string_view t) { return std::find(doc.targets.begin(), doc.targets.end(), t) != doc.targets.end(); };
        const bool within = doc.targets.empty() || has("any") || has(target);
        if (!known || !within)
          return make_error(fmt::format("{}: section '{}' names target '{}', which is not cpu, cuda or hip, or not one of the document's",
                                        relative_path, current.heading, target));
      }
    } else if (line.substr(0, 2) == "# " && doc.sections.empty() && trim(current.text).empty()) {
      continue;  // a top-level title repeats the front matter's
    } else {
      current.text.append(line);
      current.text += '\n';
    }
  }
  flush();
  return std::optional<Document>(std::move(doc));
}

/// Loads every `*.md` under `folder` (recursively, in a stable order) that has front matter.
inline expected<std::vector<Document>, Error> load_documents(const std::filesystem::path& folder) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return make_error(fmt::format("{}: not a knowledge folder", folder.string()));
  std::vector<fs::path> files;
  for (fs::recursive_directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file() && it->path().extension() == ".md") files.push_back(it->path());
  if (ec) return make_error(fmt::format("{}: {}", folder.string(), ec.message()));
  std::sort(files.begin(), files.end());

  std::vector<Document> docs;
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return make_error(fmt::format("{}: cannot be read", file.string()));
    std::ostringstream text;
    text << in.rdbuf();
    auto doc = parse_document(text.str(), fs::relative(file, folder).generic_string());
    if (!doc) return unexpected(doc.error());
    if (*doc) docs.push_back(std::move(**doc));
  }
  return docs;
}

}  // namespace kevo::knowledge
