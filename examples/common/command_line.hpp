// examples/common/command_line.hpp: how kevo's programs take their command lines, with CLI11:
// --help prints and exits 0; a bad flag or value is one line that names it, and exit code 2.
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include <kevo/retrieval/types.hpp>

namespace kevo_examples {

/// For a flag that counts or sizes something: decimal digits only (no sign, so "-1" is not 2^64 - 1
/// and "+5" is refused too; no "0x"; a leading 0 not octal: CLI11 itself takes all of these), within
/// 64 bits. It hands CLI11 the number written plainly, for the flag's range check and its conversion.
inline const CLI::Validator whole_number(
    [](std::string& text) -> std::string {
      std::uint64_t value = 0;
      const char* end = text.data() + text.size();
      const auto [at, ec] = std::from_chars(text.data(), end, value);
      if (text.empty() || ec != std::errc() || at != end) return "takes a whole number, not '" + text + "'";
      text = std::to_string(value);
      return {};
    },
    "", "");

/// For --dtype: one of the embedding types kevo::retrieval names (embedding_type_named then converts it).
inline const CLI::Validator embedding_type(
    [](std::string& text) -> std::string {
      if (kevo::retrieval::embedding_type_named(text)) return {};
      return "takes " + std::string(kevo::retrieval::kEmbeddingTypeNames) + ", not '" + text + "'";
    },
    "", "embedding type");

/// Says why the command line is refused, in one line that names the program, and gives exit code 2:
/// for what a flag's own check cannot see (two flags that disagree) as for what CLI11 refuses.
inline int refuse_command_line(const CLI::App& app, const std::string& why) {
  std::fprintf(stderr, "%s: %s (--help lists the options)\n", app.get_name().c_str(), why.c_str());
  return 2;
}

/// Parses argv into what `app` describes; returns the exit code where the program should stop now.
inline std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    return refuse_command_line(app, e.what());
  }
  return std::nullopt;
}

}  // namespace kevo_examples
