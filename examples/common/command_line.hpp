// examples/common/command_line.hpp: how kevo's programs take their command lines, with CLI11:
// --help prints and exits 0; a bad flag or value is one line that names it, and exit code 2.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>

namespace kevo_examples {

/// Parses argv into what `app` describes; returns the exit code where the program should stop now.
inline std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "%s: %s (--help lists the options)\n", app.get_name().c_str(), e.what());
    return 2;
  }
  return std::nullopt;
}

}  // namespace kevo_examples
