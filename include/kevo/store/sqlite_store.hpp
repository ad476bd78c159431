// kevo/store/sqlite_store.hpp: the default SearchStore: one SQLite file in WAL mode. Each record
// is its own transaction, so a search killed at any moment (SIGKILL included) loses nothing that
// had finished.
//
//   auto store = kevo::store::SqliteStore::open("runs/scoring.db");
//   if (!store) return fail(store.error().message);
//   auto run = store->latest_run();      // to resume
#pragma once

#include <kevo/detail/json_writer.hpp>
#include <kevo/store.hpp>

#include <fmt/format.h>
#include <sqlite3.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>

namespace kevo::store {

class SqliteStore {
 public:
  /// Opens (creating if needed) the store at `path`; ":memory:" gives a private in-memory store.
  static expected<SqliteStore, Error> open(const std::filesystem::path& path) {
    sqlite3* raw = nullptr;
    const int rc = sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
    Database db(raw);
    if (rc != SQLITE_OK)
      return make_error(fmt::format("{}: cannot open the store: {}", path.string(), raw ? sqlite3_errmsg(raw) : "out of memory"));
    sqlite3_busy_timeout(raw, 5000);
    SqliteStore store(std::move(db), path.string());
    if (auto ok = store.exec(schema); !ok) return unexpected(ok.error());
    return store;
  }

  expected<std::int64_t, Error> begin_run(const RunInfo& info) {
    auto st = prepare("INSERT INTO runs(problem, problem_dir, settings, started_at) VALUES (?1, ?2, ?3, ?4)");
    if (!st) return unexpected(st.error());
    bind(*st, 1, info.problem);
    bind(*st, 2, info.problem_dir);
    bind(*st, 3, info.settings_json);
    sqlite3_bind_double(st->get(), 4, now());
    if (auto ok = step_done(*st); !ok) return unexpected(ok.error());
    return static_cast<std::int64_t>(sqlite3_last_insert_rowid(db_.get()));
  }

  expected<NodeKey, Error> add_node(std::int64_t run, NodeKey parent, NodeKey mate, const Candidate& c, MemoryMode mode) {
    auto st = prepare(
        "INSERT INTO nodes(run_id, parent_id, mate_id, source_hash, source, knobs, origin, memory_mode, created_at)"
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)");
    if (!st) return unexpected(st.error());
    sqlite3_bind_int64(st->get(), 1, run);
    bind_key(*st, 2, parent);
    bind_key(*st, 3, mate);
    bind(*st, 4, fmt::format("{:016x}", c.hash()));
    bind(*st, 5, c.source);
    bind(*st, 6, detail::knobs_to_json(c.knobs));
    bind(*st, 7, c.origin);
    bind(*st, 8, to_string(mode));
    sqlite3_bind_double(st->get(), 9, now());
    if (auto ok = step_done(*st); !ok) return unexpected(ok.error());
    return static_cast<NodeKey>(sqlite3_last_insert_rowid(db_.get()));
  }

  expected<void, Error> add_evaluation(std::int64_t run, NodeKey node, const Evaluation& e) {
    auto st = prepare(
        "INSERT INTO evaluations(run_id, node_id, failure, speedup, seconds, reference_seconds, bottleneck,"
        " gbytes_per_s, gflops, roofline_fraction, message, detail, finished_at)"
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)");
    if (!st) return unexpected(st.error());
    sqlite3_bind_int64(st->get(), 1, run);
    sqlite3_bind_int64(st->get(), 2, node);
    bind(*st, 3, to_string(e.failure));
    sqlite3_bind_double(st->get(), 4, e.speedup);
    sqlite3_bind_double(st->get(), 5, e.seconds);
    sqlite3_bind_double(st->get(), 6, e.reference_seconds);
    bind(*st, 7, to_string(e.diagnostics.bottleneck));
    sqlite3_bind_double(st->get(), 8, e.diagnostics.achieved_gbytes_per_s);
    sqlite3_bind_double(st->get(), 9, e.diagnostics.achieved_gflops);
    sqlite3_bind_double(st->get(), 10, e.diagnostics.roofline_fraction);
    bind(*st, 11, e.diagnostics.message);
    bind(*st, 12, e.diagnostics.detail);
    sqlite3_bind_double(st->get(), 13, now());
    return step_done(*st);
  }

  expected<void, Error> finish_run(std::int64_t run, const std::string& stopped_because, NodeKey best, double verified_speedup) {
    auto st = prepare("UPDATE runs SET stopped_because = ?2, best_node = ?3, verified_speedup = ?4, finished_at = ?5 WHERE id = ?1");
    if (!st) return unexpected(st.error());
    sqlite3_bind_int64(st->get(), 1, run);
    bind(*st, 2, stopped_because);
    bind_key(*st, 3, best);
    sqlite3_bind_double(st->get(), 4, verified_speedup);
    sqlite3_bind_double(st->get(), 5, now());
    return step_done(*st);
  }

  expected<RunInfo, Error> find_run(std::int64_t run) {
    return query_run("SELECT id, problem, problem_dir, settings, coalesce(stopped_because, '') FROM runs WHERE id = ?1", run);
  }

  expected<RunInfo, Error> latest_run() {
    return query_run("SELECT id, problem, problem_dir, settings, coalesce(stopped_because, '') FROM runs ORDER BY id DESC LIMIT 1", -1);
  }

  /// Every node of a run in creation order, each with its evaluation if it finished.
  expected<std::vector<StoredNode>, Error> load_nodes(std::int64_t run) {
    auto st = prepare(
        "SELECT n.id, coalesce(n.parent_id, 0), coalesce(n.mate_id, 0), n.source, n.knobs, n.origin, n.memory_mode,"
        " e.id, e.failure, e.speedup, e.seconds, e.reference_seconds, e.bottleneck, e.gbytes_per_s, e.gflops,"
        " e.roofline_fraction, e.message, e.detail"
        " FROM nodes n LEFT JOIN evaluations e ON e.node_id = n.id WHERE n.run_id = ?1 ORDER BY n.id");
    if (!st) return unexpected(st.error());
    sqlite3_bind_int64(st->get(), 1, run);
    std::vector<StoredNode> out;
    int rc;
    while ((rc = sqlite3_step(st->get())) == SQLITE_ROW) {
      sqlite3_stmt* s = st->get();
      StoredNode n;
      n.key = sqlite3_column_int64(s, 0);
      n.parent = sqlite3_column_int64(s, 1);
      n.mate = sqlite3_column_int64(s, 2);
      n.candidate.source = text(s, 3);
      n.candidate.knobs = detail::knobs_from_json(text(s, 4));
      n.candidate.origin = text(s, 5);
      n.memory_mode = memory_mode_from(text(s, 6));
      if (sqlite3_column_type(s, 7) != SQLITE_NULL) {
        Evaluation e;
        n.finish_order = sqlite3_column_int64(s, 7);
        e.failure = failure_kind_from_string(text(s, 8));
        e.speedup = sqlite3_column_double(s, 9);
        e.seconds = sqlite3_column_double(s, 10);
        e.reference_seconds = sqlite3_column_double(s, 11);
        e.diagnostics.bottleneck = bottleneck_from_string(text(s, 12));
        e.diagnostics.achieved_gbytes_per_s = sqlite3_column_double(s, 13);
        e.diagnostics.achieved_gflops = sqlite3_column_double(s, 14);
        e.diagnostics.roofline_fraction = sqlite3_column_double(s, 15);
        e.diagnostics.message = text(s, 16);
        e.diagnostics.detail = text(s, 17);
        n.evaluation = std::move(e);
      }
      out.push_back(std::move(n));
    }
    if (rc != SQLITE_DONE) return failure("load_nodes");
    return out;
  }

  /// The fastest correct candidates that earlier runs of `problem` found: a later run starts from them.
  expected<std::vector<Candidate>, Error> best_of_earlier_runs(const std::string& problem, std::int64_t except_run,
                                                              std::size_t limit) {
    auto st = prepare(
        "SELECT n.source, n.knobs, n.origin, max(e.speedup) FROM nodes n JOIN evaluations e ON e.node_id = n.id"
        " JOIN runs r ON r.id = n.run_id WHERE r.problem = ?1 AND r.id <> ?2 AND e.failure = 'ok'"
        " GROUP BY n.source_hash ORDER BY max(e.speedup) DESC LIMIT ?3");
    if (!st) return unexpected(st.error());
    bind(*st, 1, problem);
    sqlite3_bind_int64(st->get(), 2, except_run);
    sqlite3_bind_int64(st->get(), 3, static_cast<std::int64_t>(limit));
    std::vector<Candidate> out;
    int rc;
    while ((rc = sqlite3_step(st->get())) == SQLITE_ROW)
      out.push_back(Candidate{text(st->get(), 0), detail::knobs_from_json(text(st->get(), 1)),
                              fmt::format("best of an earlier run ({:.2f}x then)", sqlite3_column_double(st->get(), 3))});
    if (rc != SQLITE_DONE) return failure("best_of_earlier_runs");
    return out;
  }

  const std::string& path() const { return path_; }

 private:
  struct CloseDatabase {
    void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
  };
  struct FinalizeStatement {
    void operator()(sqlite3_stmt* st) const { sqlite3_finalize(st); }
  };
  using Database = std::unique_ptr<sqlite3, CloseDatabase>;
  using Statement = std::unique_ptr<sqlite3_stmt, FinalizeStatement>;

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

  SqliteStore(Database db, std::string path) : db_(std::move(db)), path_(std::move(path)) {}

  static double now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
  static std::string text(sqlite3_stmt* s, int column) {
    const auto* p = sqlite3_column_text(s, column);
    return p ? std::string(reinterpret_cast<const char*>(p), static_cast<std::size_t>(sqlite3_column_bytes(s, column))) : std::string();
  }
  static MemoryMode memory_mode_from(std::string_view s) {
    for (auto m : {MemoryMode::trajectory, MemoryMode::siblings, MemoryMode::combined, MemoryMode::fresh})
      if (to_string(m) == s) return m;
    return MemoryMode::fresh;
  }
  static void bind(Statement& st, int index, std::string_view value) {
    sqlite3_bind_text(st.get(), index, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
  }
  static void bind_key(Statement& st, int index, NodeKey key) {
    if (key == no_key) sqlite3_bind_null(st.get(), index);
    else sqlite3_bind_int64(st.get(), index, key);
  }

  unexpected<Error> failure(std::string_view what) const {
    return make_error(fmt::format("{}: {}: {}", path_, what, sqlite3_errmsg(db_.get())));
  }
  expected<void, Error> exec(const char* sql) {
    char* message = nullptr;
    if (sqlite3_exec(db_.get(), sql, nullptr, nullptr, &message) != SQLITE_OK) {
      std::string text = message ? message : "unknown error";
      sqlite3_free(message);
      return make_error(fmt::format("{}: {}", path_, text));
    }
    return {};
  }
  expected<Statement, Error> prepare(const char* sql) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db_.get(), sql, -1, &st, nullptr) != SQLITE_OK) return failure("prepare");
    return Statement(st);
  }
  expected<void, Error> step_done(Statement& st) {
    if (sqlite3_step(st.get()) != SQLITE_DONE) return failure("write");
    return {};
  }
  expected<RunInfo, Error> query_run(const char* sql, std::int64_t run) {
    auto st = prepare(sql);
    if (!st) return unexpected(st.error());
    if (run >= 0) sqlite3_bind_int64(st->get(), 1, run);
    if (sqlite3_step(st->get()) != SQLITE_ROW)
      return make_error(run >= 0 ? fmt::format("{}: no run {}", path_, run) : fmt::format("{}: holds no run to resume", path_));
    sqlite3_stmt* s = st->get();
    return RunInfo{sqlite3_column_int64(s, 0), text(s, 1), text(s, 2), text(s, 3), text(s, 4)};
  }

  Database db_;
  std::string path_;
};

static_assert(SearchStore<SqliteStore>);

}  // namespace kevo::store
