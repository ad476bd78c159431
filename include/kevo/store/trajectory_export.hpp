// kevo/store/trajectory_export.hpp: a SQLite store's generations as JSONL for post-training, one
// record a line (the schema: docs/trajectory-export.md). It streams: one cursor over the nodes, each
// record written as its row is read, so a store of a million nodes exports in the memory of one.
//
//   auto exporter = kevo::store::TrajectoryExporter::open("kevo-runs/cpu_scoring.db");
//   if (!exporter) return fail(exporter.error().message);
//   auto summary = exporter->write(std::cout, {.run = 3});
#pragma once

#include <kevo/detail/json_writer.hpp>
#include <kevo/detail/sqlite.hpp>
#include <kevo/expected.hpp>

#include <fmt/format.h>
#include <simdjson.h>

#include <cmath>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <ostream>
#include <set>
#include <string>
#include <string_view>
#include <system_error>

namespace kevo::store {

/// Bumped whenever a field changes meaning or goes away; added fields keep the version.
inline constexpr int trajectory_schema_version = 1;

struct ExportOptions {
  std::int64_t run = 0;  ///< 0: every run in the store
  bool only_ok = false;  ///< only candidates that compiled, ran and were correct
};

struct ExportSummary {
  std::size_t records = 0;
  std::size_t runs = 0;  ///< runs that contributed at least one record
};

/// Bad input (no store, not a kevo store, no such run) is the caller's to fix; a failure midway
/// (a read or a write that failed) is not.
enum class ExportErrorKind { bad_input, failed };

struct ExportError {
  ExportErrorKind kind = ExportErrorKind::failed;
  std::string message;
};

class TrajectoryExporter {
 public:
  /// Opens an existing kevo store; unlike SqliteStore::open it creates nothing, and refuses a file
  /// that is not one.
  static expected<TrajectoryExporter, ExportError> open(const std::filesystem::path& path) {
    const std::string name = path.string();
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return bad_input(fmt::format("{}: no such store", name));
    if (!std::filesystem::is_regular_file(path, ec)) return bad_input(fmt::format("{}: not a file, so not a kevo store", name));
    auto db = detail::SqliteHandle::open(name);
    if (!db) return bad_input(db.error().message);
    // SQLite opens any file lazily: the first read says whether it is a database at all.
    auto tables = db->prepare(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('runs', 'nodes', 'evaluations')");
    if (!tables || tables->step() != SQLITE_ROW)
      return bad_input(fmt::format("{}: not a kevo store (not an SQLite database: {})", name, db->last_error()));
    if (tables->integer(0) != 3) return bad_input(fmt::format("{}: not a kevo store (no runs, nodes and evaluations tables)", name));
    TrajectoryExporter exporter(std::move(*db), name);
    // Stores older than the race's `settled` flag hold only settled figures.
    auto settled = exporter.db_.prepare("SELECT count(*) FROM pragma_table_info('evaluations') WHERE name = 'settled'");
    exporter.has_settled_ = settled && settled->step() == SQLITE_ROW && settled->integer(0) > 0;
    return exporter;
  }

  /// Calls `sink(line)` with each record (one JSON object, no newline), in node order; a sink that
  /// returns false stops the export as a failure (a full disk, a closed pipe).
  template <class Sink>
    requires std::predicate<Sink&, std::string_view>
  expected<ExportSummary, ExportError> write(Sink&& sink, const ExportOptions& options = {}) {
    if (options.run != 0) {
      auto run = db_.prepare("SELECT count(*) FROM runs WHERE id = ?1");
      if (!run) return failed(run.error().message);
      run->bind(1, static_cast<long long>(options.run));
      if (run->step() != SQLITE_ROW) return failed(fmt::format("{}: {}", path_, db_.last_error()));
      if (run->integer(0) == 0) return bad_input(fmt::format("{}: no run {} ({})", path_, options.run, describe_runs()));
    }
    // CROSS JOIN keeps the nodes the outer loop, walked in id order: rows come as the cursor
    // reaches them, never gathered into a sorter.
    const std::string sql = fmt::format(
        "SELECT n.run_id, r.problem, n.id, coalesce(n.parent_id, 0), coalesce(n.mate_id, 0), n.source_hash, n.source,"
        " n.knobs, n.origin, n.memory_mode, n.created_at, e.id, e.failure, e.speedup, e.seconds, e.reference_seconds,"
        " e.bottleneck, e.gbytes_per_s, e.gflops, e.roofline_fraction, e.message, e.detail, e.finished_at, {},"
        " coalesce(r.best_node, 0) = n.id"
        " FROM nodes n CROSS JOIN runs r ON r.id = n.run_id LEFT JOIN evaluations e ON e.node_id = n.id"
        " WHERE {}{} ORDER BY n.id",
        has_settled_ ? "coalesce(e.settled, 1)" : "1", options.run != 0 ? "n.run_id = ?1" : "1",
        options.only_ok ? " AND e.failure = 'ok'" : "");
    auto rows = db_.prepare(sql);
    if (!rows) return failed(fmt::format("{}: {}", path_, rows.error().message));
    if (options.run != 0) rows->bind(1, static_cast<long long>(options.run));

    ExportSummary summary;
    std::set<std::int64_t> runs;  // bounded by the runs, not the nodes
    std::string line;             // reused: one record's text at a time
    int rc;
    while ((rc = rows->step()) == SQLITE_ROW) {
      line.clear();
      append_record(line, *rows);
      if (!sink(std::string_view(line))) return failed(fmt::format("{}: writing record {} failed", path_, summary.records + 1));
      ++summary.records;
      runs.insert(rows->integer(0));
    }
    if (rc != SQLITE_DONE) return failed(fmt::format("{}: reading the nodes failed: {}", path_, db_.last_error()));
    summary.runs = runs.size();
    return summary;
  }

  /// Writes the records to `out`, one a line.
  expected<ExportSummary, ExportError> write(std::ostream& out, const ExportOptions& options = {}) {
    auto summary = write(
        [&out](std::string_view record) {
          out.write(record.data(), static_cast<std::streamsize>(record.size()));
          out.put('\n');
          return static_cast<bool>(out);
        },
        options);
    if (summary && !out.flush()) return failed(fmt::format("{}: writing the export failed", path_));
    return summary;
  }

  const std::string& path() const { return path_; }

 private:
  TrajectoryExporter(detail::SqliteHandle db, std::string path) : db_(std::move(db)), path_(std::move(path)) {}

  static unexpected<ExportError> bad_input(std::string message) {
    return unexpected(ExportError{ExportErrorKind::bad_input, std::move(message)});
  }
  static unexpected<ExportError> failed(std::string message) {
    return unexpected(ExportError{ExportErrorKind::failed, std::move(message)});
  }

  /// "runs 1-4", so an unknown run's error says which exist.
  std::string describe_runs() {
    auto st = db_.prepare("SELECT count(*), min(id), max(id) FROM runs");
    if (!st || st->step() != SQLITE_ROW || st->integer(0) == 0) return "it holds no run";
    if (st->integer(0) == 1) return fmt::format("it holds run {}", st->integer(1));
    return fmt::format("it holds {} runs, {} to {}", st->integer(0), st->integer(1), st->integer(2));
  }

  // JSON has no NaN or infinity: a figure that is not finite is null.
  static void append_number(std::string& out, double value) {
    if (std::isfinite(value)) fmt::format_to(std::back_inserter(out), "{}", value);
    else out += "null";
  }
  static void append_real_or_null(std::string& out, const detail::SqliteStatement& row, int column) {
    if (row.is_null(column)) out += "null";
    else append_number(out, row.real(column));
  }
  static void append_key_or_null(std::string& out, long long key) {
    if (key == 0) out += "null";
    else fmt::format_to(std::back_inserter(out), "{}", key);
  }

  /// The stored knobs re-written through the parser, so a damaged row cannot break the line.
  void append_knobs(std::string& out, std::string_view stored) {
    simdjson::dom::object object;
    out += '{';
    if (!stored.empty() && !parser_.parse(stored.data(), stored.size()).get(object)) {
      bool first = true;
      for (auto [key, value] : object) {
        std::string_view text;
        if (value.get_string().get(text)) continue;
        if (!first) out += ',';
        first = false;
        detail::append_json_string(out, key);
        out += ':';
        detail::append_json_string(out, text);
      }
    }
    out += '}';
  }

  void append_record(std::string& out, const detail::SqliteStatement& row) {
    const bool evaluated = !row.is_null(11);
    const bool ok = evaluated && row.text(12) == "ok";
    fmt::format_to(std::back_inserter(out), R"({{"schema_version":{},"run":{},"problem":)", trajectory_schema_version,
                   row.integer(0));
    detail::append_json_string(out, row.text(1));
    fmt::format_to(std::back_inserter(out), R"(,"node":{},"parent":)", row.integer(2));
    append_key_or_null(out, row.integer(3));
    out += R"(,"mate":)";
    append_key_or_null(out, row.integer(4));
    out += R"(,"origin":)";
    detail::append_json_string(out, row.text(8));
    out += R"(,"memory_mode":)";
    detail::append_json_string(out, row.text(9));
    // kevo's store does not keep the LLM's exchange yet: the fields are there, and null, so a
    // reader's code needs no change once it does.
    out += R"(,"prompt":null,"answer":null,"candidate":{"source":)";
    detail::append_json_string(out, row.text(6));
    out += R"(,"source_hash":)";
    detail::append_json_string(out, row.text(5));
    out += R"(,"knobs":)";
    append_knobs(out, row.text(7));
    out += R"(},"evaluated":)";
    out += evaluated ? "true" : "false";
    out += R"(,"diagnostics":)";
    if (!evaluated) {
      out += "null";
    } else {
      out += R"({"failure":)";
      detail::append_json_string(out, row.text(12));
      out += R"(,"message":)";
      detail::append_json_string(out, row.text(20));
      out += R"(,"detail":)";
      detail::append_json_string(out, row.text(21));
      out += R"(,"bottleneck":)";
      detail::append_json_string(out, row.is_null(16) ? std::string_view("unknown") : row.text(16));
      out += R"(,"seconds":)";
      append_real_or_null(out, row, 14);
      out += R"(,"reference_seconds":)";
      append_real_or_null(out, row, 15);
      out += R"(,"gbytes_per_s":)";
      append_real_or_null(out, row, 17);
      out += R"(,"gflops":)";
      append_real_or_null(out, row, 18);
      out += R"(,"roofline_fraction":)";
      append_real_or_null(out, row, 19);
      out += '}';
    }
    out += R"(,"reward":)";
    if (!evaluated) out += "null";
    else if (!ok) out += "0";
    else append_real_or_null(out, row, 13);
    out += R"(,"settled":)";
    out += !evaluated ? "null" : row.integer(23) != 0 ? "true" : "false";
    out += R"(,"best":)";
    out += row.integer(24) != 0 ? "true" : "false";
    out += R"(,"created_at":)";
    append_real_or_null(out, row, 10);
    out += R"(,"finished_at":)";
    append_real_or_null(out, row, 22);
    out += '}';
  }

  detail::SqliteHandle db_;
  std::string path_;
  bool has_settled_ = true;
  simdjson::dom::parser parser_;  // reused for every row's knobs
};

}  // namespace kevo::store
