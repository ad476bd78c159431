// kevo/detail/sqlite.hpp: the few SQLite calls the store and the knowledge base need, owned RAII-style,
// with failures as kevo::expected values.
//
//   auto db = kevo::detail::SqliteHandle::open("kevo.db");
//   auto st = db->prepare("SELECT title FROM kevo_knowledge WHERE kevo_knowledge MATCH ?1");
//   st->bind(1, "memory"); while (st->step() == SQLITE_ROW) use(st->text(0));
#pragma once

#include <kevo/expected.hpp>

#include <fmt/format.h>
#include <sqlite3.h>

#include <memory>
#include <string>
#include <string_view>

namespace kevo::detail {

/// A prepared statement. Column text views are valid until the next step() or reset().
class SqliteStatement {
 public:
  explicit SqliteStatement(sqlite3_stmt* s) : stmt_(s, &sqlite3_finalize) {}

  void bind(int index, std::string_view text) {
    sqlite3_bind_text(stmt_.get(), index, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
  }
  void bind(int index, long long value) { sqlite3_bind_int64(stmt_.get(), index, value); }
  void bind(int index, double value) { sqlite3_bind_double(stmt_.get(), index, value); }
  void bind_null(int index) { sqlite3_bind_null(stmt_.get(), index); }
  bool is_null(int column) const { return sqlite3_column_type(stmt_.get(), column) == SQLITE_NULL; }

  int step() { return sqlite3_step(stmt_.get()); }
  void reset() {
    sqlite3_reset(stmt_.get());
    sqlite3_clear_bindings(stmt_.get());
  }

  std::string_view text(int column) const {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_.get(), column));
    return p ? std::string_view(p, static_cast<std::size_t>(sqlite3_column_bytes(stmt_.get(), column)))
             : std::string_view();
  }
  long long integer(int column) const { return sqlite3_column_int64(stmt_.get(), column); }
  double real(int column) const { return sqlite3_column_double(stmt_.get(), column); }

 private:
  std::unique_ptr<sqlite3_stmt, int (*)(sqlite3_stmt*)> stmt_;
};

/// An open database connection.
class SqliteHandle {
 public:
  static expected<SqliteHandle, Error> open(const std::string& path) {
    sqlite3* raw = nullptr;
    const int rc = sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                                   nullptr);
    SqliteHandle handle(raw);
    if (rc != SQLITE_OK)
      return make_error(fmt::format("{}: cannot open SQLite database ({})", path, raw ? sqlite3_errmsg(raw) : "out of memory"));
    // Several runs (and the store) may share one file: wait for a lock rather than fail at once.
    sqlite3_busy_timeout(raw, 5000);
    return handle;
  }

  expected<void, Error> exec(const std::string& sql) {
    char* message = nullptr;
    if (sqlite3_exec(db_.get(), sql.c_str(), nullptr, nullptr, &message) != SQLITE_OK) {
      std::string text = message ? message : "unknown error";
      sqlite3_free(message);
      return make_error(fmt::format("SQLite: {} (in: {:.60})", text, sql));
    }
    return {};
  }

  expected<SqliteStatement, Error> prepare(std::string_view sql) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db_.get(), sql.data(), static_cast<int>(sql.size()), &stmt, nullptr) != SQLITE_OK)
      return make_error(fmt::format("SQLite: {} (in: {:.60})", sqlite3_errmsg(db_.get()), sql));
    return SqliteStatement(stmt);
  }

  std::string last_error() const { return sqlite3_errmsg(db_.get()); }
  sqlite3* get() const { return db_.get(); }

 private:
  explicit SqliteHandle(sqlite3* raw) : db_(raw, &sqlite3_close_v2) {}
  std::unique_ptr<sqlite3, int (*)(sqlite3*)> db_;
};

}  // namespace kevo::detail
