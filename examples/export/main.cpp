// kevo-export: a kevo store's generations as JSONL for post-training, one record a line: the
// candidate, its knobs, its diagnostics and its reward (the schema: docs/trajectory-export.md).
//
//   kevo-export kevo-runs/cpu_scoring.db --out cpu_scoring.jsonl
//   kevo-export: 61 records from 1 run to cpu_scoring.jsonl
//
// It streams, so a store of a million nodes exports in bounded memory. Bad input (no store, not a
// kevo store, an unknown run, a bad option) is one line on stderr and exit 2.
#include <kevo/store/trajectory_export.hpp>

#include <fmt/format.h>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

namespace fs = std::filesystem;

namespace {

constexpr const char* usage = R"(usage: kevo-export STORE [options]

Writes every generation (node) of a kevo SQLite store as one JSON record a line (JSONL): the
candidate's source and knobs, its diagnostics and its reward (the speedup; 0 for a failure).

options:
  --run ID      only this run (default: every run in the store)
  --out PATH    write to PATH (default: stdout); PATH appears only once the export is complete
  --only-ok     only candidates that compiled, ran and were correct
)";

struct Options {
  fs::path store;
  fs::path out;
  kevo::store::ExportOptions export_options;
};

int fail(std::string_view message, int code) {
  fmt::print(stderr, "kevo-export: {}\n", message);
  return code;
}

kevo::expected<Options, kevo::Error> parse_arguments(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--run" || arg == "--out") {
      if (i + 1 >= argc) return kevo::make_error(fmt::format("{} needs a value", arg));
      const std::string_view value = argv[++i];
      if (arg == "--out") {
        o.out = value;
        continue;
      }
      auto& run = o.export_options.run;
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), run);
      if (ec != std::errc() || end != value.data() + value.size() || run <= 0)
        return kevo::make_error(fmt::format("--run needs a run id (a positive number), not '{}'", value));
    } else if (arg == "--only-ok") o.export_options.only_ok = true;
    else if (arg == "--help" || arg == "-h") return kevo::make_error("");
    else if (arg.starts_with("--")) return kevo::make_error(fmt::format("unknown option {}", arg));
    else if (o.store.empty()) o.store = arg;
    else return kevo::make_error(fmt::format("unexpected argument '{}'", arg));
  }
  if (o.store.empty()) return kevo::make_error("no store given");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  auto options = parse_arguments(argc, argv);
  if (!options) {
    if (options.error().message.empty()) {
      fmt::print("{}", usage);
      return 0;
    }
    return fail(fmt::format("{} (--help for usage)", options.error().message), 2);
  }
  auto exporter = kevo::store::TrajectoryExporter::open(options->store);
  if (!exporter) return fail(exporter.error().message, 2);

  using Summary = kevo::expected<kevo::store::ExportSummary, kevo::store::ExportError>;
  auto failed = [](const Summary& summary) {
    return fail(summary.error().message, summary.error().kind == kevo::store::ExportErrorKind::bad_input ? 2 : 1);
  };
  auto done = [](const kevo::store::ExportSummary& summary, std::string_view where) {
    fmt::print(stderr, "kevo-export: {} record{} from {} run{} to {}\n", summary.records, summary.records == 1 ? "" : "s",
               summary.runs, summary.runs == 1 ? "" : "s", where);
    return 0;
  };

  if (options->out.empty()) {
    std::ios::sync_with_stdio(false);
    auto summary = exporter->write(std::cout, options->export_options);
    return summary ? done(*summary, "stdout") : failed(summary);
  }

  // Written beside PATH and renamed once complete: a failed export leaves no half a file behind.
  const fs::path& out = options->out;
  const fs::path partial = out.string() + ".part";
  std::error_code ec;
  if (out.has_parent_path() && !fs::is_directory(out.parent_path(), ec))
    return fail(fmt::format("--out {}: no directory {}", out.string(), out.parent_path().string()), 2);
  Summary summary = kevo::store::ExportSummary{};
  {
    std::ofstream file(partial, std::ios::binary | std::ios::trunc);
    if (!file) return fail(fmt::format("--out {}: cannot create {}", out.string(), partial.string()), 2);
    summary = exporter->write(file, options->export_options);
  }
  if (!summary) {
    fs::remove(partial, ec);
    return failed(summary);
  }
  fs::rename(partial, out, ec);
  if (ec) return fail(fmt::format("--out {}: cannot rename {} to it: {}", out.string(), partial.string(), ec.message()), 1);
  return done(*summary, out.string());
}
