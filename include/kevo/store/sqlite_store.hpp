// kevo/store/sqlite_store.hpp: the default SearchStore: one SQLite file in WAL mode. Each record
// is its own transaction, so a search killed at any moment (SIGKILL included) loses nothing that
// had finished.
//
//   auto store = kevo::store::SqliteStore::open("runs/scoring.db");
//   if (!store) return fail(store.error().message);
//   auto run = store->latest_run();      // to resume
#pragma once

#include <kevo/detail/json_writer.hpp>
#include <kevo/detail/sqlite.hpp>
#include <kevo/store.hpp>

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string_view>

namespace kevo::store {

class SqliteStore {
 public:
  /// Opens (creating if needed) the store at `path`; ":memory:" gives a private in-memory store.
  static expected<SqliteStore, Error> open(const std::filesystem::path& path) {
    auto db = detail::SqliteHandle::open(path.string());
    if (!db) return make_error(fmt::format("{}: cannot open the store: {}", path.string(), db.error().message));
    if (auto ok = db->exec(schema); !ok) return make_error(fmt::format("{}: {}", path.string(), ok.error().message));
    SqliteStore store(std::move(*db), path.string());
    if (auto ok = store.add_missing_columns(); !ok) return unexpected(ok.error());
    return store;
  }

  expected<std::int64_t, Error> begin_run(const RunInfo& info) {
    auto st = prepare(
        "INSERT INTO runs(problem, problem_dir, settings, started_at, problem_identity, reference_seconds, target_identity)"
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
    if (!st) return unexpected(st.error());
    st->bind(1, info.problem);
    st->bind(2, info.problem_dir);
    st->bind(3, info.settings_json);
    st->bind(4, now());
    st->bind(5, info.problem_identity);
    st->bind(6, info.reference_seconds);
    st->bind(7, info.target_identity);
    if (auto ok = step_done(*st); !ok) return unexpected(ok.error());
    return static_cast<std::int64_t>(sqlite3_last_insert_rowid(db_.get()));
  }

  /// Keeps the reference time that the run's speedups are over (a resume reuses it).
  expected<void, Error> set_reference_seconds(std::int64_t run, double seconds) {
    auto st = prepare("UPDATE runs SET reference_seconds = ?2 WHERE id = ?1");
    if (!st) return unexpected(st.error());
    st->bind(1, static_cast<long long>(run));
    st->bind(2, seconds);
    return step_done(*st);
  }

  expected<NodeKey, Error> add_node(std::int64_t run, NodeKey parent, NodeKey mate, const Candidate& c, MemoryMode mode) {
    auto st = prepare(
        "INSERT INTO nodes(run_id, parent_id, mate_id, source_hash, source, knobs, origin, memory_mode, created_at)"
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)");
    if (!st) return unexpected(st.error());
    st->bind(1, static_cast<long long>(run));
    bind_key(*st, 2, parent);
    bind_key(*st, 3, mate);
    st->bind(4, fmt::format("{:016x}", c.hash()));
    st->bind(5, c.source);
    st->bind(6, detail::knobs_to_json(c.knobs));
    st->bind(7, c.origin);
    st->bind(8, to_string(mode));
    st->bind(9, now());
    if (auto ok = step_done(*st); !ok) return unexpected(ok.error());
    return static_cast<NodeKey>(sqlite3_last_insert_rowid(db_.get()));
  }

  /// `settled` is false for a new best's first figure, stored before its race settles it.
  expected<void, Error> add_evaluation(std::int64_t run, NodeKey node, const Evaluation& e, bool settled = true) {
    auto st = prepare(
        "INSERT INTO evaluations(run_id, node_id, failure, speedup, seconds, reference_seconds, bottleneck,"
        " gbytes_per_s, gflops, roofline_fraction, message, detail, finished_at, settled)"
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"
        // A node's second evaluation (a new best's re-timed figure) replaces its first, in place:
        // the row keeps its place in the order evaluations finished.
        " ON CONFLICT(node_id) DO UPDATE SET failure = excluded.failure, speedup = excluded.speedup,"
        " seconds = excluded.seconds, reference_seconds = excluded.reference_seconds, bottleneck = excluded.bottleneck,"
        " gbytes_per_s = excluded.gbytes_per_s, gflops = excluded.gflops, roofline_fraction = excluded.roofline_fraction,"
        " message = excluded.message, detail = excluded.detail, settled = excluded.settled");
    if (!st) return unexpected(st.error());
    st->bind(1, static_cast<long long>(run));
    st->bind(2, static_cast<long long>(node));
    st->bind(3, to_string(e.failure));
    st->bind(4, e.speedup);
    st->bind(5, e.seconds);
    st->bind(6, e.reference_seconds);
    st->bind(7, to_string(e.diagnostics.bottleneck));
    st->bind(8, e.diagnostics.achieved_gbytes_per_s);
    st->bind(9, e.diagnostics.achieved_gflops);
    st->bind(10, e.diagnostics.roofline_fraction);
    st->bind(11, e.diagnostics.message);
    st->bind(12, e.diagnostics.detail);
    st->bind(13, now());
    st->bind(14, static_cast<long long>(settled ? 1 : 0));
    return step_done(*st);
  }

  expected<void, Error> finish_run(std::int64_t run, const std::string& stopped_because, NodeKey best, double verified_speedup) {
    auto st = prepare("UPDATE runs SET stopped_because = ?2, best_node = ?3, verified_speedup = ?4, finished_at = ?5 WHERE id = ?1");
    if (!st) return unexpected(st.error());
    st->bind(1, static_cast<long long>(run));
    st->bind(2, stopped_because);
    bind_key(*st, 3, best);
    st->bind(4, verified_speedup);
    st->bind(5, now());
    return step_done(*st);
  }

  expected<RunInfo, Error> find_run(std::int64_t run) {
    return query_run(fmt::format("SELECT {} FROM runs WHERE id = ?1", run_columns), run);
  }

  expected<RunInfo, Error> latest_run() {
    return query_run(fmt::format("SELECT {} FROM runs ORDER BY id DESC LIMIT 1", run_columns), -1);
  }

  /// The latest run of one problem, where a store holds many problems' runs (kevo-suite's); none: not begun.
  expected<std::optional<RunInfo>, Error> latest_run_of(std::string_view problem) {
    auto st = prepare(fmt::format("SELECT {} FROM runs WHERE problem = ?1 ORDER BY id DESC LIMIT 1", run_columns));
    if (!st) return unexpected(st.error());
    st->bind(1, problem);
    if (st->step() != SQLITE_ROW) return std::optional<RunInfo>();
    return std::optional<RunInfo>(run_from(*st));
  }

  /// Every node of a run in creation order, each with its evaluation if it finished.
  expected<std::vector<StoredNode>, Error> load_nodes(std::int64_t run) {
    auto st = prepare(
        "SELECT n.id, coalesce(n.parent_id, 0), coalesce(n.mate_id, 0), n.source, n.knobs, n.origin, n.memory_mode,"
        " e.id, e.failure, e.speedup, e.seconds, e.reference_seconds, e.bottleneck, e.gbytes_per_s, e.gflops,"
        " e.roofline_fraction, e.message, e.detail, coalesce(e.settled, 1)"
        " FROM nodes n LEFT JOIN evaluations e ON e.node_id = n.id WHERE n.run_id = ?1 ORDER BY n.id");
    if (!st) return unexpected(st.error());
    st->bind(1, static_cast<long long>(run));
    std::vector<StoredNode> out;
    int rc;
    while ((rc = st->step()) == SQLITE_ROW) {
      StoredNode n;
      n.key = st->integer(0);
      n.parent = st->integer(1);
      n.mate = st->integer(2);
      n.candidate.source = st->text(3);
      n.candidate.knobs = detail::knobs_from_json(st->text(4));
      n.candidate.origin = st->text(5);
      n.memory_mode = memory_mode_from(st->text(6));
      if (!st->is_null(7)) {
        Evaluation e;
        n.finish_order = st->integer(7);
        e.failure = failure_kind_from_string(st->text(8));
        e.speedup = st->real(9);
        e.seconds = st->real(10);
        e.reference_seconds = st->real(11);
        e.diagnostics.bottleneck = bottleneck_from_string(st->text(12));
        e.diagnostics.achieved_gbytes_per_s = st->real(13);
        e.diagnostics.achieved_gflops = st->real(14);
        e.diagnostics.roofline_fraction = st->real(15);
        e.diagnostics.message = st->text(16);
        e.diagnostics.detail = st->text(17);
        n.evaluation = std::move(e);
        n.settled = st->integer(18) != 0;
      }
      out.push_back(std::move(n));
    }
    if (rc != SQLITE_DONE) return failure("load_nodes");
    return out;
  }

  /// The fastest correct candidates that earlier runs of `problem` found (by settled figures), on
  /// whatever target they were measured: a later run starts from them.
  expected<std::vector<Candidate>, Error> best_of_earlier_runs(const std::string& problem, std::int64_t except_run,
                                                              std::size_t limit) {
    return best_of_earlier_runs(problem, /*any target:*/ std::string(), except_run, limit);
  }

  /// The same, from runs measured on `target_identity` only (another GPU's figures do not rank
  /// candidates for this one); an empty identity takes every target's.
  expected<std::vector<Candidate>, Error> best_of_earlier_runs(const std::string& problem, const std::string& target_identity,
                                                              std::int64_t except_run, std::size_t limit) {
    auto st = prepare(
        "SELECT n.source, n.knobs, n.origin, max(e.speedup) FROM nodes n JOIN evaluations e ON e.node_id = n.id"
        " JOIN runs r ON r.id = n.run_id WHERE r.problem = ?1 AND r.id <> ?2 AND e.failure = 'ok' AND e.settled = 1"
        " AND (?4 = '' OR r.target_identity = ?4)"
        " GROUP BY n.source_hash ORDER BY max(e.speedup) DESC LIMIT ?3");
    if (!st) return unexpected(st.error());
    st->bind(1, problem);
    st->bind(2, static_cast<long long>(except_run));
    st->bind(3, static_cast<long long>(limit));
    st->bind(4, target_identity);
    std::vector<Candidate> out;
    int rc;
    while ((rc = st->step()) == SQLITE_ROW)
      out.push_back(Candidate{std::string(st->text(0)), detail::knobs_from_json(st->text(1)),
                              fmt::format("best of an earlier run ({:.2f}x then)", st->real(3))});
    if (rc != SQLITE_DONE) return failure("best_of_earlier_runs");
    return out;
  }

  const std::string& path() const { return path_; }

 private:
  static constexpr const char* schema = R"sql(
    PRAGMA journal_mode = WAL;
    PRAGMA synchronous = NORMAL;
    PRAGMA foreign_keys = ON;
    CREATE TABLE IF NOT EXISTS runs(
      id INTEGER PRIMARY KEY, problem TEXT NOT NULL, problem_dir TEXT, settings TEXT,
      started_at REAL, finished_at REAL, stopped_because TEXT, best_node INTEGER, verified_speedup REAL);
    CREATE TABLE IF NOT EXISTS nodes(
      id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id),
      parent_id INTEGER REFERENCES nodes(id), mate_id INTEGER REFERENCES nodes(id),
      source_hash TEXT NOT NULL, source TEXT NOT NULL, knobs TEXT, origin TEXT, memory_mode TEXT, created_at REAL);
    CREATE INDEX IF NOT EXISTS nodes_by_run ON nodes(run_id);
    CREATE TABLE IF NOT EXISTS evaluations(
      id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id),
      node_id INTEGER NOT NULL UNIQUE REFERENCES nodes(id), failure TEXT NOT NULL, speedup REAL,
      seconds REAL, reference_seconds REAL, bottleneck TEXT, gbytes_per_s REAL, gflops REAL,
      roofline_fraction REAL, message TEXT, detail TEXT, finished_at REAL);
  )sql";

  /// Columns added since the first schema, each with the value an older store's rows mean.
  expected<void, Error> add_missing_columns() {
    struct Column {
      const char* table;
      const char* name;
      const char* declaration;
    };
    for (const Column& c : {Column{"runs", "problem_identity", "TEXT NOT NULL DEFAULT ''"},
                            Column{"runs", "reference_seconds", "REAL NOT NULL DEFAULT 0"},
                            Column{"runs", "target_identity", "TEXT NOT NULL DEFAULT ''"},
                            Column{"evaluations", "settled", "INTEGER NOT NULL DEFAULT 1"}}) {
      auto st = prepare(fmt::format("SELECT count(*) FROM pragma_table_info('{}') WHERE name = '{}'", c.table, c.name));
      if (!st) return unexpected(st.error());
      if (st->step() != SQLITE_ROW) return failure("schema");
      if (st->integer(0) > 0) continue;
      if (auto ok = db_.exec(fmt::format("ALTER TABLE {} ADD COLUMN {} {}", c.table, c.name, c.declaration)); !ok)
        return make_error(fmt::format("{}: {}", path_, ok.error().message));
    }
    return {};
  }

  static constexpr const char* run_columns =
      "id, problem, problem_dir, settings, coalesce(stopped_because, ''), coalesce(problem_identity, ''),"
      " coalesce(reference_seconds, 0), coalesce(best_node, 0), coalesce(verified_speedup, 0), coalesce(target_identity, '')";

  SqliteStore(detail::SqliteHandle db, std::string path) : db_(std::move(db)), path_(std::move(path)) {}

  static double now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
  static MemoryMode memory_mode_from(std::string_view s) {
    for (auto m : {MemoryMode::trajectory, MemoryMode::siblings, MemoryMode::combined, MemoryMode::fresh})
      if (to_string(m) == s) return m;
    return MemoryMode::fresh;
  }
  static void bind_key(detail::SqliteStatement& st, int index, NodeKey key) {
    if (key == no_key) st.bind_null(index);
    else st.bind(index, static_cast<long long>(key));
  }

  unexpected<Error> failure(std::string_view what) const {
    return make_error(fmt::format("{}: {}: {}", path_, what, db_.last_error()));
  }
  expected<detail::SqliteStatement, Error> prepare(std::string_view sql) {
    auto st = db_.prepare(sql);
    if (!st) return make_error(fmt::format("{}: {}", path_, st.error().message));
    return st;
  }
  expected<void, Error> step_done(detail::SqliteStatement& st) {
    if (st.step() != SQLITE_DONE) return failure("write");
    return {};
  }
  expected<RunInfo, Error> query_run(const std::string& sql, std::int64_t run) {
    auto st = prepare(sql);
    if (!st) return unexpected(st.error());
    if (run >= 0) st->bind(1, static_cast<long long>(run));
    if (st->step() != SQLITE_ROW)
      return make_error(run >= 0 ? fmt::format("{}: no run {}", path_, run) : fmt::format("{}: holds no run to resume", path_));
    return run_from(*st);
  }
  static RunInfo run_from(detail::SqliteStatement& st) {
    return RunInfo{.id = st.integer(0),
                   .problem = std::string(st.text(1)),
                   .problem_dir = std::string(st.text(2)),
                   .settings_json = std::string(st.text(3)),
                   .stopped_because = std::string(st.text(4)),
                   .problem_identity = std::string(st.text(5)),
                   .reference_seconds = st.real(6),
                   .best_node = st.integer(7),
                   .verified_speedup = st.real(8),
                   .target_identity = std::string(st.text(9))};
  }

  detail::SqliteHandle db_;
  std::string path_;
};

static_assert(SearchStore<SqliteStore>);

}  // namespace kevo::store
