// kevo/store/postgres_store.hpp: a SearchStore on a PostgreSQL server, for histories shared by
// several searches (and machines) at once. Same semantics as SqliteStore: every call is its own
// committed statement, so it is durable when it returns; ids come from identity columns, so
// concurrent searches on one database never collide. Link kevo::postgres (libpq).
//
//   auto store = kevo::store::PostgresStore::open("host=db.lan dbname=kevo user=kevo");
//   if (!store) return fail(store.error().message);
//   auto loop = kevo::make_search_loop(problem, evaluator, *store);
#pragma once

#include <kevo/detail/json_writer.hpp>
#include <kevo/store.hpp>

#include <fmt/format.h>
#include <libpq-fe.h>

#include <charconv>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kevo::detail {

/// A query's result, owned. Values are text (libpq's default format).
class PgResult {
 public:
  explicit PgResult(PGresult* r) : result_(r, &PQclear) {}

  bool ok() const {
    const auto status = PQresultStatus(result_.get());
    return status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK;
  }
  int rows() const { return PQntuples(result_.get()); }
  bool is_null(int row, int column) const { return PQgetisnull(result_.get(), row, column) != 0; }
  std::string_view text(int row, int column) const {
    return {PQgetvalue(result_.get(), row, column), static_cast<std::size_t>(PQgetlength(result_.get(), row, column))};
  }
  std::int64_t integer(int row, int column) const {
    std::int64_t value = 0;
    const auto t = text(row, column);
    std::from_chars(t.data(), t.data() + t.size(), value);
    return value;
  }
  double real(int row, int column) const {
    // float8's text form round-trips (PostgreSQL 12+ prints the shortest exact digits).
    return is_null(row, column) ? 0.0 : std::strtod(PQgetvalue(result_.get(), row, column), nullptr);
  }
  bool boolean(int row, int column) const { return text(row, column) == "t"; }
  /// The server's message, on one line.
  std::string error() const { return one_line(PQresultErrorMessage(result_.get())); }

  static std::string one_line(const char* message) {
    std::string out;
    for (const char* p = message ? message : ""; *p; ++p) {
      if (*p == '\n') {
        if (p[1] != '\0') out += "; ";
      } else if (*p != '\t') {
        out += *p;
      }
    }
    return out;
  }

 private:
  std::unique_ptr<PGresult, decltype(&PQclear)> result_;
};

/// One query parameter: text, or SQL NULL.
using PgParam = std::optional<std::string>;

/// A connection, owned. Queries take their values as parameters, never spliced into the SQL.
class PgConnection {
 public:
  /// Connects; the error names the server (never the whole conninfo, which may hold a password).
  static expected<PgConnection, Error> connect(const std::string& conninfo) {
    char* parse_error = nullptr;
    PQconninfoOption* options = PQconninfoParse(conninfo.c_str(), &parse_error);
    if (options == nullptr) {
      std::string why = parse_error ? PgResult::one_line(parse_error) : std::string("out of memory");
      PQfreemem(parse_error);
      return make_error(fmt::format("PostgreSQL: invalid connection string: {}", why));
    }
    PQconninfoFree(options);
    PgConnection c(PQconnectdb(conninfo.c_str()));
    if (!c.conn_) return make_error("PostgreSQL: cannot allocate a connection");
    if (PQstatus(c.conn_.get()) != CONNECTION_OK)
      return make_error(fmt::format("{}: cannot connect: {}", c.server(), PgResult::one_line(PQerrorMessage(c.conn_.get()))));
    // The server's notices ("already exists, skipping") are not the caller's output: libpq would print them to stderr.
    PQsetNoticeProcessor(c.conn_.get(), [](void*, const char*) {}, nullptr);
    return c;
  }

  /// Runs `sql` with `params` as $1, $2, ...
  PgResult query(const char* sql, const std::vector<PgParam>& params = {}) {
    reconnect_if_lost();
    std::vector<const char*> values;
    values.reserve(params.size());
    for (const auto& p : params) values.push_back(p ? p->c_str() : nullptr);
    return PgResult(PQexecParams(conn_.get(), sql, static_cast<int>(values.size()), nullptr, values.data(), nullptr,
                                 nullptr, 0));
  }
  /// Runs constant SQL, several statements allowed (schema changes); no parameters.
  PgResult exec(const char* sql) {
    reconnect_if_lost();
    return PgResult(PQexec(conn_.get(), sql));
  }
  /// libpq's last message on this connection, on one line (for a result that did not come back).
  std::string last_error() const { return PgResult::one_line(PQerrorMessage(conn_.get())); }

  /// "PostgreSQL at HOST:PORT/DB", as errors name the server.
  std::string server() const {
    const char* host = PQhost(conn_.get());
    const char* port = PQport(conn_.get());
    const char* db = PQdb(conn_.get());
    return fmt::format("PostgreSQL at {}:{}/{}", host && *host ? host : "localhost", port && *port ? port : "5432",
                       db ? db : "");
  }
  PGconn* get() const { return conn_.get(); }

 private:
  explicit PgConnection(PGconn* c) : conn_(c, &PQfinish) {}
  // A connection lost earlier (a server restart) is remade before the next statement is sent, so
  // a long search outlives it; a statement in flight when it broke is reported, never re-sent.
  void reconnect_if_lost() {
    if (PQstatus(conn_.get()) == CONNECTION_BAD) PQreset(conn_.get());
  }
  std::unique_ptr<PGconn, decltype(&PQfinish)> conn_;
};

}  // namespace kevo::detail

namespace kevo::store {

class PostgresStore {
 public:
  /// The schema version this code writes; open() migrates an older store up to it.
  static constexpr int schema_version = 2;

  /// Connects with libpq's `conninfo` ("host=... port=... dbname=... user=...", or a postgresql://
  /// URI) and creates or migrates the schema in the connection's current schema (search_path).
  static expected<PostgresStore, Error> open(std::string conninfo) {
    auto conn = detail::PgConnection::connect(conninfo);
    if (!conn) return unexpected(conn.error());
    PostgresStore store(std::move(*conn));
    if (auto ok = store.migrate(); !ok) return unexpected(ok.error());
    return store;
  }

  expected<std::int64_t, Error> begin_run(const RunInfo& info) {
    auto r = query("INSERT INTO runs(problem, problem_dir, settings, problem_identity, reference_seconds, target_identity)"
                   " VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
                   {info.problem, info.problem_dir, info.settings_json, info.problem_identity, real(info.reference_seconds),
                    info.target_identity});
    if (!r) return unexpected(r.error());
    return r->integer(0, 0);
  }

  /// Keeps the reference time that the run's speedups are over (a resume reuses it).
  expected<void, Error> set_reference_seconds(std::int64_t run, double seconds) {
    return command("UPDATE runs SET reference_seconds = $2 WHERE id = $1", {integer(run), real(seconds)});
  }

  expected<NodeKey, Error> add_node(std::int64_t run, NodeKey parent, NodeKey mate, const Candidate& c, MemoryMode mode) {
    auto r = query("INSERT INTO nodes(run_id, parent_id, mate_id, source_hash, source, knobs, origin, memory_mode)"
                   " VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
                   {integer(run), key(parent), key(mate), fmt::format("{:016x}", c.hash()), c.source,
                    detail::knobs_to_json(c.knobs), c.origin, std::string(to_string(mode))});
    if (!r) return unexpected(r.error());
    return r->integer(0, 0);
  }

  /// `settled` is false for a new best's first figure, stored before its race settles it.
  expected<void, Error> add_evaluation(std::int64_t run, NodeKey node, const Evaluation& e, bool settled = true) {
    return command(
        "INSERT INTO evaluations(run_id, node_id, failure, speedup, seconds, reference_seconds, bottleneck,"
        " gbytes_per_s, gflops, roofline_fraction, message, detail, settled)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
        // A node's second evaluation (a new best's re-timed figure) replaces its first, in place:
        // the row keeps its id, which is its place in the order evaluations finished.
        " ON CONFLICT (node_id) DO UPDATE SET failure = excluded.failure, speedup = excluded.speedup,"
        " seconds = excluded.seconds, reference_seconds = excluded.reference_seconds, bottleneck = excluded.bottleneck,"
        " gbytes_per_s = excluded.gbytes_per_s, gflops = excluded.gflops, roofline_fraction = excluded.roofline_fraction,"
        " message = excluded.message, detail = excluded.detail, settled = excluded.settled, finished_at = now()",
        {integer(run), integer(node), std::string(to_string(e.failure)), real(e.speedup), real(e.seconds),
         real(e.reference_seconds), std::string(to_string(e.diagnostics.bottleneck)), real(e.diagnostics.achieved_gbytes_per_s),
         real(e.diagnostics.achieved_gflops), real(e.diagnostics.roofline_fraction), e.diagnostics.message,
         e.diagnostics.detail, std::string(settled ? "true" : "false")});
  }

  expected<void, Error> finish_run(std::int64_t run, const std::string& stopped_because, NodeKey best, double verified_speedup) {
    return command("UPDATE runs SET stopped_because = $2, best_node = $3, verified_speedup = $4, finished_at = now()"
                   " WHERE id = $1",
                   {integer(run), stopped_because, key(best), real(verified_speedup)});
  }

  expected<RunInfo, Error> find_run(std::int64_t run) {
    auto r = query(fmt::format("SELECT {} FROM runs WHERE id = $1", run_columns), {integer(run)});
    if (!r) return unexpected(r.error());
    if (r->rows() == 0) return make_error(fmt::format("{}: no run {}", conn_.server(), run));
    return run_from(*r);
  }

  expected<RunInfo, Error> latest_run() {
    auto r = query(fmt::format("SELECT {} FROM runs ORDER BY id DESC LIMIT 1", run_columns), {});
    if (!r) return unexpected(r.error());
    if (r->rows() == 0) return make_error(fmt::format("{}: holds no run to resume", conn_.server()));
    return run_from(*r);
  }

  /// Every node of a run in creation order, each with its evaluation if it finished.
  expected<std::vector<StoredNode>, Error> load_nodes(std::int64_t run) {
    auto r = query("SELECT n.id, coalesce(n.parent_id, 0), coalesce(n.mate_id, 0), n.source, n.knobs, n.origin, n.memory_mode,"
                   " e.id, e.failure, e.speedup, e.seconds, e.reference_seconds, e.bottleneck, e.gbytes_per_s, e.gflops,"
                   " e.roofline_fraction, e.message, e.detail, coalesce(e.settled, true)"
                   " FROM nodes n LEFT JOIN evaluations e ON e.node_id = n.id WHERE n.run_id = $1 ORDER BY n.id",
                   {integer(run)});
    if (!r) return unexpected(r.error());
    std::vector<StoredNode> out;
    out.reserve(static_cast<std::size_t>(r->rows()));
    for (int i = 0; i < r->rows(); ++i) {
      StoredNode n;
      n.key = r->integer(i, 0);
      n.parent = r->integer(i, 1);
      n.mate = r->integer(i, 2);
      n.candidate.source = r->text(i, 3);
      n.candidate.knobs = detail::knobs_from_json(r->text(i, 4));
      n.candidate.origin = r->text(i, 5);
      n.memory_mode = memory_mode_from(r->text(i, 6));
      if (!r->is_null(i, 7)) {
        Evaluation e;
        n.finish_order = r->integer(i, 7);
        e.failure = failure_kind_from_string(r->text(i, 8));
        e.speedup = r->real(i, 9);
        e.seconds = r->real(i, 10);
        e.reference_seconds = r->real(i, 11);
        e.diagnostics.bottleneck = bottleneck_from_string(r->text(i, 12));
        e.diagnostics.achieved_gbytes_per_s = r->real(i, 13);
        e.diagnostics.achieved_gflops = r->real(i, 14);
        e.diagnostics.roofline_fraction = r->real(i, 15);
        e.diagnostics.message = r->text(i, 16);
        e.diagnostics.detail = r->text(i, 17);
        n.evaluation = std::move(e);
        n.settled = r->boolean(i, 18);
      }
      out.push_back(std::move(n));
    }
    return out;
  }

  /// The fastest correct candidates that earlier runs of `problem` found (by settled figures),
  /// other searches' runs on this database included, on whatever target they were measured: a
  /// later run starts from them.
  expected<std::vector<Candidate>, Error> best_of_earlier_runs(const std::string& problem, std::int64_t except_run,
                                                              std::size_t limit) {
    return best_of_earlier_runs(problem, /*any target:*/ std::string(), except_run, limit);
  }

  /// The same, from runs measured on `target_identity` only (another GPU's figures do not rank
  /// candidates for this one); an empty identity takes every target's.
  expected<std::vector<Candidate>, Error> best_of_earlier_runs(const std::string& problem, const std::string& target_identity,
                                                              std::int64_t except_run, std::size_t limit) {
    auto r = query("SELECT source, knobs, speedup FROM ("
                   "  SELECT DISTINCT ON (n.source_hash) n.source, n.knobs, e.speedup"
                   "  FROM nodes n JOIN evaluations e ON e.node_id = n.id JOIN runs r ON r.id = n.run_id"
                   "  WHERE r.problem = $1 AND r.id <> $2 AND e.failure = 'ok' AND e.settled"
                   "  AND ($4 = '' OR r.target_identity = $4)"
                   "  ORDER BY n.source_hash, e.speedup DESC) best"
                   " ORDER BY speedup DESC LIMIT $3",
                   {problem, integer(except_run), integer(static_cast<std::int64_t>(limit)), target_identity});
    if (!r) return unexpected(r.error());
    std::vector<Candidate> out;
    for (int i = 0; i < r->rows(); ++i)
      out.push_back(Candidate{std::string(r->text(i, 0)), detail::knobs_from_json(r->text(i, 1)),
                              fmt::format("best of an earlier run ({:.2f}x then)", r->real(i, 2))});
    return out;
  }

  /// The server, as errors name it ("PostgreSQL at HOST:PORT/DB").
  std::string server() const { return conn_.server(); }

 private:
  /// Each entry takes the schema from the version before it to its own; entry 0 creates version 1.
  /// A new version appends an entry, never edits one (stores in the field went through it).
  static constexpr const char* migrations[] = {
      R"sql(
    CREATE TABLE runs(
      id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, problem text NOT NULL, problem_dir text NOT NULL DEFAULT '',
      settings text NOT NULL DEFAULT '', problem_identity text NOT NULL DEFAULT '',
      reference_seconds double precision NOT NULL DEFAULT 0, started_at timestamptz NOT NULL DEFAULT now(),
      finished_at timestamptz, stopped_because text, best_node bigint, verified_speedup double precision);
    CREATE INDEX runs_by_problem ON runs(problem);
    CREATE TABLE nodes(
      id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, run_id bigint NOT NULL REFERENCES runs(id),
      parent_id bigint REFERENCES nodes(id), mate_id bigint REFERENCES nodes(id), source_hash text NOT NULL,
      source text NOT NULL, knobs text NOT NULL, origin text NOT NULL, memory_mode text NOT NULL,
      created_at timestamptz NOT NULL DEFAULT now());
    CREATE INDEX nodes_by_run ON nodes(run_id, id);
    CREATE TABLE evaluations(
      id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, run_id bigint NOT NULL REFERENCES runs(id),
      node_id bigint NOT NULL UNIQUE REFERENCES nodes(id), failure text NOT NULL, speedup double precision NOT NULL,
      seconds double precision NOT NULL, reference_seconds double precision NOT NULL, bottleneck text NOT NULL,
      gbytes_per_s double precision NOT NULL, gflops double precision NOT NULL,
      roofline_fraction double precision NOT NULL, message text NOT NULL, detail text NOT NULL,
      settled boolean NOT NULL DEFAULT true, finished_at timestamptz NOT NULL DEFAULT now());
    CREATE INDEX evaluations_by_run ON evaluations(run_id);
  )sql",
      // 2: what a run's figures were measured on (RunInfo::target_identity); '' for earlier runs: unknown.
      R"sql(
    ALTER TABLE runs ADD COLUMN target_identity text NOT NULL DEFAULT '';
  )sql"};
  static_assert(std::size(migrations) == schema_version);

  /// Brings the schema to `schema_version` in one transaction, under an advisory lock, so that
  /// searches opening a fresh database at once create it once; a newer schema is refused.
  expected<void, Error> migrate() {
    if (auto r = conn_.exec("BEGIN"); !r.ok()) return failure("schema", r);
    auto rollback_on_error = [this](expected<void, Error> outcome) {
      if (!outcome) conn_.exec("ROLLBACK");
      return outcome;
    };
    return rollback_on_error([&]() -> expected<void, Error> {
      // Any fixed key: it only has to be the same for every kevo that opens this database.
      if (auto r = conn_.exec("SELECT pg_advisory_xact_lock(7301431593580917065)"); !r.ok()) return failure("schema", r);
      if (auto r = conn_.exec("CREATE TABLE IF NOT EXISTS kevo_schema(version integer NOT NULL)"); !r.ok())
        return failure("schema", r);
      auto current = conn_.exec("SELECT coalesce(max(version), 0) FROM kevo_schema");
      if (!current.ok()) return failure("schema", current);
      const auto version = current.integer(0, 0);
      if (version > schema_version)
        return make_error(fmt::format("{}: the store's schema is version {}, newer than this kevo knows ({}): upgrade kevo",
                                      conn_.server(), version, schema_version));
      for (auto v = version; v < schema_version; ++v)
        if (auto r = conn_.exec(migrations[v]); !r.ok()) return failure(fmt::format("migration to schema {}", v + 1), r);
      if (version < schema_version) {
        if (auto r = conn_.exec("DELETE FROM kevo_schema"); !r.ok()) return failure("schema", r);
        if (auto r = conn_.query("INSERT INTO kevo_schema(version) VALUES ($1)", {std::to_string(schema_version)}); !r.ok())
          return failure("schema", r);
      }
      if (auto r = conn_.exec("COMMIT"); !r.ok()) return failure("schema", r);
      return {};
    }());
  }

  static constexpr const char* run_columns =
      "id, problem, problem_dir, settings, coalesce(stopped_because, ''), problem_identity,"
      " reference_seconds, coalesce(best_node, 0), coalesce(verified_speedup, 0), target_identity";

  explicit PostgresStore(detail::PgConnection conn) : conn_(std::move(conn)), mutex_(std::make_unique<std::mutex>()) {}

  static detail::PgParam integer(std::int64_t v) { return std::to_string(v); }
  static detail::PgParam key(NodeKey k) { return k == no_key ? detail::PgParam{} : integer(k); }
  // fmt's shortest round-trip form; PostgreSQL reads "nan" and "inf" too.
  static detail::PgParam real(double v) { return fmt::format("{}", v); }

  static MemoryMode memory_mode_from(std::string_view s) {
    for (auto m : {MemoryMode::trajectory, MemoryMode::siblings, MemoryMode::combined, MemoryMode::fresh})
      if (to_string(m) == s) return m;
    return MemoryMode::fresh;
  }
  static RunInfo run_from(const detail::PgResult& r) {
    return RunInfo{.id = r.integer(0, 0),
                   .problem = std::string(r.text(0, 1)),
                   .problem_dir = std::string(r.text(0, 2)),
                   .settings_json = std::string(r.text(0, 3)),
                   .stopped_because = std::string(r.text(0, 4)),
                   .problem_identity = std::string(r.text(0, 5)),
                   .reference_seconds = r.real(0, 6),
                   .best_node = r.integer(0, 7),
                   .verified_speedup = r.real(0, 8),
                   .target_identity = std::string(r.text(0, 9))};
  }

  unexpected<Error> failure(std::string_view what, const detail::PgResult& r) const {
    const std::string why = r.error();
    return make_error(fmt::format("{}: {}: {}", conn_.server(), what, why.empty() ? conn_.last_error() : why));
  }
  /// One statement, committed on return (autocommit). The lock keeps a store shared by threads
  /// from interleaving on its one connection.
  expected<detail::PgResult, Error> query(const std::string& sql, const std::vector<detail::PgParam>& params) {
    std::lock_guard lock(*mutex_);
    auto r = conn_.query(sql.c_str(), params);
    if (!r.ok()) return failure("query", r);
    return r;
  }
  expected<void, Error> command(const std::string& sql, const std::vector<detail::PgParam>& params) {
    auto r = query(sql, params);
    if (!r) return unexpected(r.error());
    return {};
  }

  detail::PgConnection conn_;
  std::unique_ptr<std::mutex> mutex_;
};

static_assert(SearchStore<PostgresStore>);

}  // namespace kevo::store
