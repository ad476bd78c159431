// kevo-suite: a set of KernelBench-format problems, searched one by one into one store, and scored as the field
// scores KernelBench (fast_p over PyTorch eager and over torch.compile, and the geometric mean):
//
//   kevo-suite problems/kernelbench --budget 20 --size-scale 0.05
//   ...
//   over PyTorch eager:   fast_0 89%  fast_1.0 58%  fast_1.5 32%  geomean 1.21x (17 of 19 correct)
//
// Each problem's search is kevo-search (or, with --llm, kevo-llm-search) run beside this program, so a
// problem's failure stays its own. Killed at any moment, it resumes when run again with the same arguments:
// problems whose search finished are read back, and an unfinished search continues from the store.
#include <kevo/gpu_presence.hpp>
#include <kevo/eval/torch_problem.hpp>
#include <kevo/report/suite_report.hpp>
#include <kevo/store/sqlite_store.hpp>

#include "../common/command_line.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <simdjson.h>

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct Options {
  std::vector<fs::path> inputs;
  std::size_t budget = 20, jobs = 2;
  double size_scale = 1.0;
  std::string python, device = "cpu";
  bool llm = false;
  fs::path out = "kevo-runs/suite";
};

int fail(std::string_view message, int code = 1) {
  fmt::print(stderr, "kevo-suite: {}\n", message);
  return code;
}

/// The .py files named, or found (not recursively) in the directories named, in name order.
std::vector<fs::path> problem_files(const std::vector<fs::path>& inputs) {
  std::vector<fs::path> files;
  for (const auto& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<fs::path> found;
      for (const auto& entry : fs::directory_iterator(in, ec))
        if (entry.is_regular_file() && entry.path().extension() == ".py" && entry.path().filename().string().front() != '_') found.push_back(entry.path());
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.push_back(in);
    }
  }
  return files;
}

/// Runs `argv` with this program's stdout and stderr; it dies with this program (a kill leaves no search behind).
int run_child(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) return -1;
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

/// A finished search's row, from the --json summary it wrote; none where it is missing or of another problem.
std::optional<kevo::report::SuiteRow> read_summary(const fs::path& path, const std::string& identity, const std::string& problem) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.load(path.string()).get(doc)) return std::nullopt;
  std::string_view id, stopped, family;
  if (doc["problem_identity"].get(id) || id != identity) return std::nullopt;
  kevo::report::SuiteRow row;
  row.problem = problem;
  bool verified = false;
  double over_eager = 0, seconds = 0;
  std::uint64_t evaluations = 0;
  if (doc["verified"].get(verified) || doc["speedup_over_eager"].get(over_eager) || doc["evaluations"].get(evaluations) ||
      doc["stopped_because"].get(stopped))
    return std::nullopt;
  if (!doc["family"].get(family)) row.family = std::string(family);
  if (!doc["elapsed_seconds"].get(seconds)) row.seconds = seconds;
  row.correct = verified && over_eager > 0;
  row.over_eager = over_eager;
  if (double c = 0; !doc["speedup_over_compile"].get(c)) row.over_compile = c;
  row.evaluations = evaluations;
  row.stopped_because = std::string(stopped);
  return row;
}

int suite_main(int argc, char** argv) {
  Options o;
  CLI::App app{"Searches each KernelBench-format problem of a set and scores the set as KernelBench is scored (fast_p).", "kevo-suite"};
  app.add_option("problems", o.inputs, "KernelBench-format files, or directories of them")->required();
  using kevo_examples::whole_number;
  app.add_option("--budget", o.budget, "candidates to evaluate per problem")->capture_default_str()->transform(whole_number);
  app.add_option("--jobs", o.jobs, "generations and evaluations in flight per search")->capture_default_str()->transform(whole_number);
  app.add_option("--size-scale", o.size_scale, "shrink every module's size constants (integers of 64 or more) by this factor")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 1.0));
  app.add_option("--python", o.python, "the Python whose PyTorch runs the references (default $KEVO_PYTHON, else /usr/bin/python3)");
  app.add_option("--device", o.device, "where the kernels run")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("--llm", o.llm, "search with kevo-llm-search (its LLM from KEVO_LLM_BASE_URL and KEVO_LLM_MODEL); without it, problems no template family matches are skipped");
  app.add_option("--out", o.out, "where the store, each search's files and the table go")->capture_default_str();
  if (auto stop = kevo_examples::parse_command_line(app, argc, argv)) return *stop;

  const std::vector<fs::path> files = problem_files(o.inputs);
  if (files.empty()) return fail("no .py problem files found in what was given", 2);
  // --device cuda where no GPU is: a named stop, exit 2, before any search.
  if (o.device == "cuda")
    if (auto here = kevo::nvidia_device_present(); !here) return fail(here.error().message, 2);
  std::error_code ec;
  fs::create_directories(o.out / "searches", ec);
  if (ec) return fail(fmt::format("{}: cannot be created: {}", o.out.string(), ec.message()), 2);
  const fs::path store_path = o.out / "suite.db";
  const fs::path self_dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  const fs::path search_program = self_dir / (o.llm ? "../llm_search/kevo-llm-search" : "../search/kevo-search");
  const fs::path beside = self_dir / (o.llm ? "kevo-llm-search" : "kevo-search");  // installed: in the same bin/
  const fs::path program = fs::exists(beside, ec) ? beside : search_program;
  if (!fs::exists(program, ec)) return fail(fmt::format("{} not found beside kevo-suite", program.filename().string()), 2);

  std::vector<kevo::report::SuiteRow> rows;
  for (std::size_t i = 0; i < files.size(); ++i) {
    const fs::path& file = files[i];
    fmt::print("kevo-suite: [{}/{}] {}\n", i + 1, files.size(), file.string());
    std::fflush(stdout);
    kevo::report::SuiteRow row;
    row.problem = file.filename().string();
    auto problem = kevo::eval::load_torch_problem(file, {.python = o.python, .size_scale = o.size_scale,
                                                         .target = o.device == "cuda" ? kevo::Target::cuda : kevo::Target::cpu});
    if (!problem) {
      const std::string& message = problem.error().message;
      const auto reason = message.find(": cannot be used as a problem: ");
      row.stopped_because = "unusable: " + (reason == std::string::npos ? message : message.substr(reason + 31));
      fmt::print("kevo-suite: {}\n", problem.error().message);
      rows.push_back(row);
      continue;
    }
    row.family = problem->torch->family;
    if (row.family.empty() && !o.llm) {
      row.stopped_because = "needs --llm";
      fmt::print("kevo-suite: {}: no template family matches it; it needs --llm\n", file.string());
      rows.push_back(row);
      continue;
    }
    const fs::path summary = o.out / "searches" / (problem->name + ".json");
    if (auto done = read_summary(summary, problem->identity(), row.problem)) {
      fmt::print("kevo-suite: finished earlier: {} (read back from {})\n", done->stopped_because, summary.string());
      rows.push_back(*done);
      continue;
    }
    // An unfinished search of this problem in the store continues; else one begins.
    bool resume = false;
    if (!o.llm) {
      auto store = kevo::store::SqliteStore::open(store_path);
      if (!store) return fail(store.error().message, 2);
      auto run = store->latest_run_of(problem->name);
      resume = run && *run && (*run)->stopped_because.empty() && (*run)->problem_identity == problem->identity();
    }
    std::vector<std::string> args = {program.string(), file.string(), "--size-scale", fmt::format("{:.9g}", o.size_scale), "--device", o.device,
                                     "--budget", std::to_string(o.budget), "--jobs", std::to_string(o.jobs), "--store",
                                     o.llm ? (o.out / "searches" / (problem->name + ".llm.db")).string() : store_path.string()};
    if (!o.python.empty()) args.insert(args.end(), {"--python", o.python});
    if (o.llm) {
      args.insert(args.end(), {"--json", summary.string()});
    } else {
      args.insert(args.end(), {"--json", summary.string(), "--out", (o.out / "searches" / (problem->name + ".best.cpp")).string(), "--report",
                               (o.out / "searches" / (problem->name + ".html")).string()});
      if (resume) args.push_back("--resume");
    }
    if (resume) fmt::print("kevo-suite: continuing its unfinished search in {}\n", store_path.string());
    const auto started = std::chrono::steady_clock::now();
    const int code = run_child(args);
    if (code == 130) return fail("interrupted; run the same command again to continue", 130);
    if (auto done = read_summary(summary, problem->identity(), row.problem)) {
      rows.push_back(*done);
      continue;
    }
    row.stopped_because = fmt::format("the search failed (exit {})", code);
    row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    rows.push_back(row);
  }

  const kevo::report::SuiteScore s = kevo::report::score(rows);
  const std::string table = kevo::report::suite_table(rows, s);
  fmt::print("\n{}", table);
  const std::string settings = fmt::format(R"({{"budget":{},"jobs":{},"size_scale":{:.9g},"device":"{}","llm":{}}})", o.budget, o.jobs, o.size_scale,
                                           o.device, o.llm);
  std::ofstream(o.out / "suite.txt") << fmt::format("kevo-suite, settings {}\n{}", settings, table);
  std::ofstream(o.out / "suite.json") << kevo::report::suite_json(rows, s, settings);
  const std::string title = fmt::format("kevo-suite: {} problems{}", rows.size(), o.size_scale != 1.0 ? fmt::format(", sizes scaled by {:g}", o.size_scale) : "");
  if (auto ok = kevo::report::write_page(kevo::report::suite_html(rows, s, title), o.out / "suite.html"); !ok) return fail(ok.error().message);
  fmt::print("table: {}, {}, {}\n", (o.out / "suite.txt").string(), (o.out / "suite.json").string(), (o.out / "suite.html").string());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return suite_main(argc, argv);
  } catch (const fs::filesystem_error& e) {
    return fail(e.what(), 2);
  }
}
