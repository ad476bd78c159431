// A user's program on the installed kevo::postgres: a search whose history goes to a shared PostgreSQL
// server (KEVO_TEST_POSTGRES, the test fixture's), in a schema of its own that it drops when done.
#include <kevo/default_search_loop.hpp>
#include <kevo/store/postgres_store.hpp>

#include "user_components.hpp"

#include <libpq-fe.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

bool run_sql(const char* server, const std::string& sql) {
  PGconn* conn = PQconnectdb(server);
  const bool connected = PQstatus(conn) == CONNECTION_OK;
  PGresult* r = connected ? PQexec(conn, sql.c_str()) : nullptr;
  const bool ok = r && PQresultStatus(r) == PGRES_COMMAND_OK;
  if (!ok) std::fprintf(stderr, "postgres consumer: %s: %s", sql.c_str(), PQerrorMessage(conn));
  PQclear(r);
  PQfinish(conn);
  return ok;
}

// How many rows `table` holds, or -1.
long count_rows(const char* server, const std::string& table) {
  PGconn* conn = PQconnectdb(server);
  PGresult* r = PQstatus(conn) == CONNECTION_OK ? PQexec(conn, ("SELECT count(*) FROM " + table).c_str()) : nullptr;
  const long n = r && PQresultStatus(r) == PGRES_TUPLES_OK ? std::atol(PQgetvalue(r, 0, 0)) : -1;
  PQclear(r);
  PQfinish(conn);
  return n;
}

}  // namespace

int main() {
  const char* server = std::getenv("KEVO_TEST_POSTGRES");
  if (!server || !*server) {
    std::puts("postgres consumer: KEVO_TEST_POSTGRES is unset (ctest's postgres fixture sets it)");
    return 1;
  }
  const std::string schema = "kevo_consumer_" + std::to_string(::getpid());
  if (!run_sql(server, "CREATE SCHEMA " + schema)) return 1;
  int status = 1;
  {
    auto store = kevo::store::PostgresStore::open(std::string(server) + " options='-csearch_path=" + schema + "'");
    if (!store) {
      std::printf("postgres consumer: %s\n", store.error().message.c_str());
    } else {
      kevo::Problem problem;
      problem.name = "consumer";
      problem.template_source = "x = ${x};";
      problem.knobs.push_back({"x", {"0", "1", "2", "3", "4", "5", "6", "7"}, "0", kevo::KnobSide::compute});
      LandscapeEvaluator evaluator;
      auto loop = kevo::make_search_loop(problem, evaluator, *store, {.max_evaluations = 20});
      auto result = loop.run(loop.synthesizer().seed());
      const long stored = count_rows(server, schema + ".evaluations");
      if (result && result->best_speedup >= 6.0 && stored == static_cast<long>(result->evaluations)) {
        std::printf("postgres consumer: found %.1fx, its %ld evaluations in PostgreSQL\n", result->best_speedup, stored);
        status = 0;
      } else {
        std::printf("postgres consumer: the search on a PostgresStore did not find x = 5 with its evaluations stored (%ld rows)\n", stored);
      }
    }
  }
  return run_sql(server, "SET client_min_messages TO warning; DROP SCHEMA " + schema + " CASCADE") ? status : 1;
}
