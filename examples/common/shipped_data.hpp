// examples/common/shipped_data.hpp: where kevo's programs find the problems and knowledge kevo ships,
// installed or not: `kevo-search cuda_softmax` works from any directory.
#pragma once

#include <filesystem>
#include <system_error>

namespace kevo_examples {

/// The folder that holds problems/ and knowledge/: <prefix>/share/kevo beside an installed program
/// (<prefix>/bin), else the source tree this program was built from (KEVO_SOURCE_DATA_DIR).
inline std::filesystem::path shipped_data_dir() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed = self.parent_path().parent_path() / "share" / "kevo";
    if (fs::is_directory(installed / "problems", ec)) return installed;
  }
  return KEVO_SOURCE_DATA_DIR;
}

/// A problem as named on the command line: a directory where one is at that path, else the shipped
/// problem of that name ("cuda_softmax"), else the path as given (so that loading it names it).
inline std::filesystem::path resolve_problem(const std::filesystem::path& given) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(given, ec) || given.has_parent_path()) return given;
  const fs::path shipped = shipped_data_dir() / "problems" / given;
  return fs::is_regular_file(shipped / "problem.json", ec) ? shipped : given;
}

}  // namespace kevo_examples
