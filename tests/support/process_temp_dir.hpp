// tests/support/process_temp_dir.hpp: a directory that this test process owns under the system's
// temp directory, named for the process ("<prefix>-<pid>"), made when first asked for and removed,
// with what it holds, when the object goes (at the process's end, for a static one), so that test
// runs leave nothing in /tmp.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <string_view>
#include <system_error>

namespace kevo::testing {

class ProcessTempDir {
 public:
  explicit ProcessTempDir(std::string_view prefix)
      : path_(std::filesystem::temp_directory_path() / fmt::format("{}-{}", prefix, ::getpid())) {}
  ~ProcessTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ProcessTempDir(const ProcessTempDir&) = delete;
  ProcessTempDir& operator=(const ProcessTempDir&) = delete;

  /// The directory, made if it is not there.
  const std::filesystem::path& path() const {
    std::filesystem::create_directories(path_);
    return path_;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace kevo::testing
