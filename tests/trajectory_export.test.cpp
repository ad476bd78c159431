// Trajectory export (issue 22): a store the real search loop wrote, exported as JSONL, every line
// parsed back and checked against what the store holds; bad input refused in one line; and, where
// the build has it, the kevo-export command line end to end.
#include <kevo/search/greedy.hpp>
#include <kevo/default_search_loop.hpp>
#include <kevo/store/sqlite_store.hpp>
#include <kevo/store/trajectory_export.hpp>

#include "support/process_temp_dir.hpp"
#include "support/synthetic_evaluator.hpp"

#include <catch2/catch.hpp>
#include <simdjson.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

namespace kevo_tests::trajectory_export_test {

using namespace kevo;
using kevo::testing::SyntheticEvaluator;

namespace {
// The stores and exports go with the process.
const kevo::testing::ProcessTempDir temp_dir("kevo-export-test");

std::filesystem::path temp_path(const std::string& name) {
  auto path = temp_dir.path() / name;
  for (auto suffix : {"", "-wal", "-shm", ".part"}) std::filesystem::remove(path.string() + suffix);
  return path;
}

auto make_loop(const Problem& problem, SyntheticEvaluator& evaluator, store::SqliteStore& store, SearchArguments args) {
  return SearchLoop<synth::TemplateSynthesizer, search::Greedy, memory::Combined, SyntheticEvaluator, knowledge::NullRetriever,
                    store::SqliteStore>(problem, synth::TemplateSynthesizer(problem), search::Greedy{}, memory::Combined{},
                                        evaluator, knowledge::NullRetriever{}, store, std::move(args));
}

/// Two finished runs of the synthetic problem (its knob c = 3 fails to compile), as the loop
/// stores them.
std::filesystem::path searched_store(const std::string& name) {
  const auto path = temp_path(name);
  const Problem problem = kevo::testing::synthetic_problem();
  SyntheticEvaluator evaluator;
  auto store = store::SqliteStore::open(path).value();
  for (std::uint64_t seed : {3, 4}) {
    auto loop = make_loop(problem, evaluator, store, {.jobs = 1, .max_evaluations = 40, .seed = seed, .warm_start = 0});
    REQUIRE(loop.run(loop.synthesizer().seed()));
  }
  return path;
}

std::vector<std::string> export_lines(const std::filesystem::path& path, store::ExportOptions options = {}) {
  auto exporter = store::TrajectoryExporter::open(path);
  REQUIRE(exporter);
  std::vector<std::string> lines;
  auto summary = exporter->write(
      [&](std::string_view line) {
        lines.emplace_back(line);
        return true;
      },
      options);
  REQUIRE(summary);
  CHECK(summary->records == lines.size());
  return lines;
}

std::string text(simdjson::dom::element e) { return std::string(std::string_view(e)); }

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
}  // namespace

TEST_CASE("every node of a searched store exports as one record that matches the store", "[export][store]") {
  const auto path = searched_store("searched.db");
  auto store = store::SqliteStore::open(path).value();
  std::map<NodeKey, std::pair<RunInfo, StoredNode>> expected_nodes;
  for (std::int64_t run : {1, 2}) {
    const RunInfo info = store.find_run(run).value();
    auto nodes = store.load_nodes(run).value();
    for (auto& node : nodes) expected_nodes[node.key] = {info, std::move(node)};
  }
  REQUIRE(expected_nodes.size() == 82);  // each run: the seed and 40 children

  const auto lines = export_lines(path);
  REQUIRE(lines.size() == expected_nodes.size());
  simdjson::dom::parser parser;
  NodeKey previous = 0;
  std::size_t failures = 0, bests = 0;
  for (const auto& line : lines) {
    INFO(line.substr(0, 300));
    simdjson::dom::element record;
    REQUIRE_FALSE(parser.parse(line).get(record));  // every line is one whole JSON object
    CHECK(std::int64_t(record["schema_version"]) == 1);
    const NodeKey key = std::int64_t(record["node"]);
    CHECK(key > previous);  // in node order
    previous = key;
    REQUIRE(expected_nodes.count(key));
    const auto& [run, node] = expected_nodes.at(key);
    CHECK(std::int64_t(record["run"]) == run.id);
    CHECK(text(record["problem"]) == "synthetic");
    if (node.parent == no_key) CHECK(record["parent"].is_null());
    else CHECK(std::int64_t(record["parent"]) == node.parent);
    CHECK(text(record["origin"]) == node.candidate.origin);
    CHECK(text(record["memory_mode"]) == to_string(node.memory_mode));
    CHECK(record["prompt"].is_null());
    CHECK(record["answer"].is_null());
    CHECK(text(record["candidate"]["source"]) == node.candidate.source);
    CHECK(text(record["candidate"]["source_hash"]) == fmt::format("{:016x}", node.candidate.hash()));
    Knobs knobs;
    for (auto [name, value] : record["candidate"]["knobs"].get_object()) knobs[std::string(name)] = text(value);
    CHECK(knobs == node.candidate.knobs);

    REQUIRE(node.evaluation);  // a finished run evaluated every node
    const Evaluation& e = *node.evaluation;
    CHECK(bool(record["evaluated"]));
    auto d = record["diagnostics"];
    CHECK(text(d["failure"]) == to_string(e.failure));
    CHECK(text(d["message"]) == e.diagnostics.message);
    CHECK(text(d["bottleneck"]) == to_string(e.diagnostics.bottleneck));
    CHECK(double(d["seconds"]) == e.seconds);
    CHECK(double(d["reference_seconds"]) == e.reference_seconds);
    CHECK(double(record["reward"]) == (e.ok() ? e.speedup : 0.0));
    CHECK(bool(record["settled"]) == node.settled);
    CHECK(bool(record["best"]) == (key == run.best_node));
    failures += !e.ok();
    bests += key == run.best_node;
  }
  CHECK(failures > 0);  // the landscape's compile errors are there, with reward 0
  CHECK(bests == 2);    // one verified best per run

  SECTION("--run keeps one run's nodes, and only_ok its correct candidates") {
    const auto second = export_lines(path, {.run = 2});
    CHECK(second.size() == 41);
    for (const auto& line : second) CHECK(std::int64_t(parser.parse(line)["run"]) == 2);
    const auto correct = export_lines(path, {.only_ok = true});
    CHECK(correct.size() == lines.size() - failures);
    for (const auto& line : correct) CHECK(double(parser.parse(line)["reward"]) > 0);
  }
}

TEST_CASE("a node without its evaluation, odd figures and odd bytes still make valid records", "[export][store]") {
  const auto path = temp_path("odd.db");
  {
    auto store = store::SqliteStore::open(path).value();
    const auto run = store.begin_run({.problem = "odd \"name\"", .settings_json = "{}"}).value();
    const auto root = store.add_node(run, no_key, no_key, {"int main() {}\n", {{"tile", "8"}}, "seed"}, MemoryMode::fresh).value();
    Evaluation nan_figures;
    nan_figures.speedup = std::numeric_limits<double>::quiet_NaN();
    nan_figures.seconds = std::numeric_limits<double>::infinity();
    nan_figures.diagnostics.message = "bad byte \xff and a tab\t";
    REQUIRE(store.add_evaluation(run, root, nan_figures));
    // Killed before its evaluation finished: the generation is there, its outcome is not.
    REQUIRE(store.add_node(run, root, no_key, {"int main() { return 1; }", {}, "mutate"}, MemoryMode::trajectory));
  }
  const auto lines = export_lines(path);
  REQUIRE(lines.size() == 2);
  simdjson::dom::parser parser, second_parser;  // an element lives only as long as its parser's last parse
  simdjson::dom::element first, second;
  REQUIRE_FALSE(parser.parse(lines[0]).get(first));
  CHECK(text(first["problem"]) == "odd \"name\"");
  CHECK(first["reward"].is_null());  // NaN has no JSON form
  CHECK(first["diagnostics"]["seconds"].is_null());
  CHECK(text(first["diagnostics"]["message"]) == "bad byte \xef\xbf\xbd and a tab\t");
  CHECK(text(first["candidate"]["knobs"]["tile"]) == "8");
  REQUIRE_FALSE(second_parser.parse(lines[1]).get(second));
  CHECK(std::int64_t(second["parent"]) == std::int64_t(first["node"]));
  CHECK_FALSE(bool(second["evaluated"]));
  CHECK(second["diagnostics"].is_null());
  CHECK(second["reward"].is_null());
  CHECK(second["settled"].is_null());
  CHECK(simdjson::dom::object(second["candidate"]["knobs"]).size() == 0);
}

TEST_CASE("bad input is one line naming the problem, and no store is created", "[export][errors]") {
  const auto missing = temp_path("missing.db");
  auto none = store::TrajectoryExporter::open(missing);
  REQUIRE_FALSE(none);
  CHECK(none.error().kind == store::ExportErrorKind::bad_input);
  CHECK(none.error().message == missing.string() + ": no such store");
  CHECK_FALSE(std::filesystem::exists(missing));

  const auto text_file = temp_path("notes.txt");
  std::ofstream(text_file) << "not a database, only some words that go on for a while\n";
  auto not_sqlite = store::TrajectoryExporter::open(text_file);
  REQUIRE_FALSE(not_sqlite);
  CHECK(not_sqlite.error().kind == store::ExportErrorKind::bad_input);
  CHECK_THAT(not_sqlite.error().message, Catch::Contains("not a kevo store"));

  const auto other_db = temp_path("other.db");
  REQUIRE(detail::SqliteHandle::open(other_db.string())->exec("CREATE TABLE things(id INTEGER PRIMARY KEY)"));
  auto not_kevo = store::TrajectoryExporter::open(other_db);
  REQUIRE_FALSE(not_kevo);
  CHECK(not_kevo.error().message == other_db.string() + ": not a kevo store (no runs, nodes and evaluations tables)");

  const auto empty = temp_path("empty.db");
  store::SqliteStore::open(empty).value();
  auto exporter = store::TrajectoryExporter::open(empty);
  REQUIRE(exporter);
  std::ostringstream out;
  auto unknown = exporter->write(out, {.run = 7});
  REQUIRE_FALSE(unknown);
  CHECK(unknown.error().kind == store::ExportErrorKind::bad_input);
  CHECK(unknown.error().message == empty.string() + ": no run 7 (it holds no run)");
  for (const auto& e : {none.error().message, not_sqlite.error().message, unknown.error().message})
    CHECK(e.find('\n') == std::string::npos);
}

#ifdef KEVO_EXPORT_BIN
TEST_CASE("kevo-export writes the same records through its command line, and exits 2 on bad input", "[export][cli]") {
  const auto path = searched_store("cli.db");
  const auto out = temp_path("cli.jsonl");
  const auto log = temp_path("cli.log");
  auto run = [&](const std::string& arguments) {
    const int status = std::system(fmt::format("'{}' {} 2>'{}'", KEVO_EXPORT_BIN, arguments, log.string()).c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  REQUIRE(run(fmt::format("'{}' --run 1 --out '{}'", path.string(), out.string())) == 0);
  CHECK(read_file(log) == fmt::format("kevo-export: 41 records from 1 run to {}\n", out.string()));
  std::string expected;
  for (const auto& line : export_lines(path, {.run = 1})) expected += line + '\n';
  CHECK(read_file(out) == expected);
  CHECK_FALSE(std::filesystem::exists(out.string() + ".part"));

  CHECK(run(fmt::format("'{}' --run 9 --out '{}'", path.string(), temp_path("none.jsonl").string())) == 2);
  CHECK(read_file(log) == fmt::format("kevo-export: {}: no run 9 (it holds 2 runs, 1 to 2)\n", path.string()));
  CHECK_FALSE(std::filesystem::exists(temp_path("none.jsonl")));
  CHECK(run(fmt::format("'{}'", temp_path("absent.db").string())) == 2);
  CHECK(read_file(log) == fmt::format("kevo-export: {}: no such store\n", temp_path("absent.db").string()));
  CHECK(run("--run") == 2);
  CHECK(read_file(log) == "kevo-export: --run needs a value (--help for usage)\n");
}
#endif

}  // namespace kevo_tests::trajectory_export_test
