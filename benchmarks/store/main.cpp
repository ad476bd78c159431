// kevo-bench-store: evaluations recorded per second, with concurrent writers (one connection each,
// as separate searches have), into SQLite and PostgreSQL. An evaluation recorded is what the loop
// does per candidate: add_node, then add_evaluation, each durable when it returns. The stores can
// first be filled with a large tree from an earlier run, so that the writers meet full indexes.
//
//   tests/support/postgres_server.sh start /tmp/kevo-pg 55432
//   kevo-bench-store --writers 16 --evaluations 2000 --prefill 1000000 \
//     --postgres "host=127.0.0.1 port=55432 dbname=kevo_test user=postgres" --sqlite /tmp/kevo-bench-store.db
//   sqlite:   16 writers, 32000 evaluations in 4.1 s: 7800 evaluations/s (store held 1000000 nodes before)
#include <kevo/detail/sqlite.hpp>
#include <kevo/store/sqlite_store.hpp>
#if KEVO_BENCH_HAVE_POSTGRES
#include <kevo/store/postgres_store.hpp>
#endif

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Options {
  int writers = 16;
  int evaluations = 2000;  // per writer
  long long prefill = 0;   // nodes of an earlier run, each evaluated, before the writers start
  std::string postgres;    // conninfo; empty: PostgreSQL is not measured
  std::string sqlite = "/tmp/kevo-bench-store.db";
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

kevo::Candidate candidate(int writer, int i) {
  // About a template kernel's size, distinct per writer and step.
  std::string source = fmt::format("// writer {} step {}\n", writer, i);
  source.append(1500, 'x');
  return kevo::Candidate{std::move(source), {{"tile", std::to_string(i % 64)}, {"unroll", std::to_string(i % 8)}}, "bench"};
}

kevo::Evaluation evaluation(int i) {
  kevo::Evaluation e;
  e.speedup = 1.0 + (i % 97) / 10.0;
  e.seconds = 1e-3 / e.speedup;
  e.reference_seconds = 1e-3;
  e.diagnostics.bottleneck = kevo::Bottleneck::memory;
  e.diagnostics.message = "ok";
  return e;
}

/// Runs `writers` threads, each with its own store from `open`, each recording `evaluations`
/// evaluations in a run of its own; prints the rate.
template <class Open>
void measure(const char* name, Open open, const Options& o, long long prefilled) {
  std::atomic<long long> recorded{0};
  std::atomic<int> failed{0};
  std::string first_error;
  std::mutex error_mutex;
  auto fail = [&](const std::string& message) {
    std::lock_guard lock(error_mutex);
    if (failed++ == 0) first_error = message;
  };
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int w = 0; w < o.writers; ++w)
    threads.emplace_back([&, w] {
      auto store = open();
      if (!store) return fail(store.error().message);
      auto run = store->begin_run({.problem = "bench", .settings_json = "{}"});
      if (!run) return fail(run.error().message);
      kevo::NodeKey parent = kevo::no_key;
      for (int i = 0; i < o.evaluations; ++i) {
        auto key = store->add_node(*run, parent, kevo::no_key, candidate(w, i), kevo::MemoryMode::combined);
        if (!key) return fail(key.error().message);
        if (auto ok = store->add_evaluation(*run, *key, evaluation(i)); !ok) return fail(ok.error().message);
        if (parent == kevo::no_key || i % 8 == 0) parent = *key;  // a tree, not a list
        ++recorded;
      }
      if (auto ok = store->finish_run(*run, "evaluation_budget", parent, 1.0); !ok) fail(ok.error().message);
    });
  for (auto& t : threads) t.join();
  const double seconds = seconds_since(start);
  fmt::print("{:9} {} writers, {} evaluations in {:.2f} s: {:.0f} evaluations/s (store held {} nodes before)\n",
             fmt::format("{}:", name), o.writers, recorded.load(), seconds, recorded.load() / seconds, prefilled);
  if (failed > 0) fmt::print("{:9} {} writers failed; the first: {}\n", "", failed.load(), first_error);
}

/// An earlier run of `nodes` nodes, each evaluated, written in bulk (the writers' own path is what
/// is measured, not this).
bool prefill_sqlite(const std::string& path, long long nodes) {
  auto db = kevo::detail::SqliteHandle::open(path);
  if (!db) return false;
  const char* statements[] = {
      "BEGIN",
      "INSERT INTO runs(problem, settings) VALUES ('bench-prefill', '{}')",
      "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ?1)"
      " INSERT INTO nodes(run_id, source_hash, source, knobs, origin, memory_mode)"
      " SELECT (SELECT max(id) FROM runs), printf('%016x', i), printf('%d', i), '{}', 'prefill', 'fresh' FROM s",
      "INSERT INTO evaluations(run_id, node_id, failure, speedup, seconds, reference_seconds, bottleneck, gbytes_per_s,"
      " gflops, roofline_fraction, message, detail, settled)"
      " SELECT run_id, id, 'ok', 1.0 + (id % 50) / 10.0, 1e-3, 1e-3, 'memory', 0, 0, 0, '', '', 1 FROM nodes"
      " WHERE run_id = (SELECT max(id) FROM runs)",
      "COMMIT"};
  for (const char* sql : statements) {
    auto st = db->prepare(sql);
    if (!st) return false;
    if (std::string_view(sql).find("?1") != std::string_view::npos) st->bind(1, nodes);
    if (st->step() != SQLITE_DONE) return false;
  }
  return true;
}

#if KEVO_BENCH_HAVE_POSTGRES
bool prefill_postgres(kevo::detail::PgConnection& db, long long nodes) {
  auto run = db.query("INSERT INTO runs(problem, settings) VALUES ('bench-prefill', '{}') RETURNING id");
  if (!run.ok()) return false;
  const std::string id(run.text(0, 0));
  auto filled = db.query(
      "INSERT INTO nodes(run_id, source_hash, source, knobs, origin, memory_mode)"
      " SELECT $1, lpad(to_hex(i), 16, '0'), i::text, '{}', 'prefill', 'fresh' FROM generate_series(1, $2::bigint) i",
      {id, std::to_string(nodes)});
  if (!filled.ok()) return false;
  auto evaluated = db.query(
      "INSERT INTO evaluations(run_id, node_id, failure, speedup, seconds, reference_seconds, bottleneck, gbytes_per_s,"
      " gflops, roofline_fraction, message, detail) SELECT run_id, id, 'ok', 1.0 + (id % 50) / 10.0, 1e-3, 1e-3,"
      " 'memory', 0, 0, 0, '', '' FROM nodes WHERE run_id = $1",
      {id});
  return evaluated.ok() && db.exec("ANALYZE").ok();
}
#endif

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--writers") o.writers = std::stoi(value);
    else if (flag == "--evaluations") o.evaluations = std::stoi(value);
    else if (flag == "--prefill") o.prefill = std::stoll(value);
    else if (flag == "--postgres") o.postgres = value;
    else if (flag == "--sqlite") o.sqlite = value;
    else {
      fmt::print(stderr, "usage: kevo-bench-store [--writers 16] [--evaluations 2000 (per writer)] [--prefill NODES]"
                         " [--postgres CONNINFO] [--sqlite PATH]\n");
      return 2;
    }
  }

  for (auto suffix : {"", "-wal", "-shm"}) std::filesystem::remove(o.sqlite + suffix);
  if (!kevo::store::SqliteStore::open(o.sqlite)) return 1;  // creates the schema before the writers race to it
  if (o.prefill > 0 && !prefill_sqlite(o.sqlite, o.prefill)) {
    fmt::print(stderr, "{}: cannot prefill\n", o.sqlite);
    return 1;
  }
  measure("sqlite", [&] { return kevo::store::SqliteStore::open(o.sqlite); }, o, o.prefill);

#if KEVO_BENCH_HAVE_POSTGRES
  if (!o.postgres.empty()) {
    // A schema of its own, dropped first: the numbers are for a store of known size.
    auto admin = kevo::detail::PgConnection::connect(o.postgres);
    if (!admin) {
      fmt::print(stderr, "{}\n", admin.error().message);
      return 1;
    }
    if (auto r = admin->exec("DROP SCHEMA IF EXISTS kevo_bench CASCADE; CREATE SCHEMA kevo_bench"); !r.ok()) {
      fmt::print(stderr, "{}: {}\n", admin->server(), r.error());
      return 1;
    }
    const std::string conninfo = o.postgres + " options='-csearch_path=kevo_bench'";
    auto setup = kevo::store::PostgresStore::open(conninfo);
    if (!setup) {
      fmt::print(stderr, "{}\n", setup.error().message);
      return 1;
    }
    auto bench_db = kevo::detail::PgConnection::connect(conninfo);
    if (o.prefill > 0 && (!bench_db || !prefill_postgres(*bench_db, o.prefill))) {
      fmt::print(stderr, "PostgreSQL: cannot prefill\n");
      return 1;
    }
    measure("postgres", [&] { return kevo::store::PostgresStore::open(conninfo); }, o, o.prefill);
    admin->exec("DROP SCHEMA kevo_bench CASCADE");
  }
#else
  if (!o.postgres.empty()) fmt::print(stderr, "built without libpq: PostgreSQL is not measured\n");
#endif
  return 0;
}
