// kevo-bench-policies: the shipped search policies compared at equal evaluation budgets.
//
//   kevo-bench-policies [--budget 40] [--seeds 5] [--problems problems/cpu_scoring,problems/softmax] [--cache FILE]
//
// Part 1 runs every policy over several seeds on each shipped CPU problem with the real,
// sandboxed evaluator and reports the median best speedup against evaluations spent. Every
// distinct candidate is measured once and the measurement is shared by all policies and seeds,
// so they search one landscape and its noise cannot favour one of them.
// Part 2 measures the loop itself: its overhead per evaluation, the cost of a policy decision,
// and the memory a tree of 100,000 nodes takes, since searches run for days at scale.
#include <kevo/problem_loader.hpp>
#include <kevo/detail/sqlite.hpp>
#include <kevo/eval/cpu_evaluator.hpp>
#include <kevo/kevo.hpp>

#include "support/synthetic_evaluator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

/// Measures each distinct candidate once; later requests for it get the same measurement. With a
/// cache file, measurements also carry over between runs of the benchmark (same machine only).
class SharedMeasurements {
 public:
  SharedMeasurements(kevo::eval::CpuEvaluator& inner, const std::string& cache_path, const std::string& problem)
      : inner_(&inner), problem_(problem) {
    if (cache_path.empty()) return;
    auto db = kevo::detail::SqliteHandle::open(cache_path);
    if (!db || !db->exec("CREATE TABLE IF NOT EXISTS measured(problem TEXT, hash TEXT, failure TEXT, speedup REAL,"
                         " seconds REAL, PRIMARY KEY(problem, hash))")) {
      fmt::print(stderr, "measurement cache {} unusable; measuring everything\n", cache_path);
      return;
    }
    auto st = db->prepare("SELECT hash, failure, speedup, seconds FROM measured WHERE problem = ?1");
    if (!st) return;
    st->bind(1, problem_);
    while (st->step() == SQLITE_ROW) {
      kevo::Evaluation e;
      e.failure = kevo::failure_kind_from_string(st->text(1));
      e.speedup = st->real(2);
      e.seconds = st->real(3);
      cache_[std::stoull(std::string(st->text(0)), nullptr, 16)] = e;
    }
    cache_db_ = std::move(*db);
  }

  kevo::Evaluation evaluate(const kevo::Candidate& c, std::uint64_t seed) {
    {
      std::lock_guard lock(mutex_);
      if (auto it = cache_.find(c.hash()); it != cache_.end()) return it->second;
    }
    kevo::Evaluation e = inner_->evaluate(c, seed);
    std::lock_guard lock(mutex_);
    ++measured_;
    if (cache_db_) {
      if (auto st = cache_db_->prepare("INSERT OR REPLACE INTO measured VALUES (?1, ?2, ?3, ?4, ?5)")) {
        st->bind(1, problem_);
        st->bind(2, fmt::format("{:016x}", c.hash()));
        st->bind(3, kevo::to_string(e.failure));
        st->bind(4, e.speedup);
        st->bind(5, e.seconds);
        st->step();
      }
    }
    return cache_.emplace(c.hash(), e).first->second;
  }
  kevo::expected<kevo::Comparison, kevo::Error> compare(const kevo::Candidate& a, const kevo::Candidate& b, std::uint64_t seed) {
    return kevo::Comparison{evaluate(a, seed).seconds, evaluate(b, seed).seconds};
  }
  std::size_t measured() const { return measured_; }
  std::size_t known() const { return cache_.size(); }

 private:
  kevo::eval::CpuEvaluator* inner_;
  std::string problem_;
  std::optional<kevo::detail::SqliteHandle> cache_db_;
  std::mutex mutex_;
  std::unordered_map<std::uint64_t, kevo::Evaluation> cache_;
  std::size_t measured_ = 0;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string> out;
  while (!text.empty()) {
    auto comma = text.find(',');
    out.emplace_back(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
  }
  return out;
}

/// The best speedup found after each number of evaluations, for one run.
std::vector<double> best_curve(kevo::Problem& problem, SharedMeasurements& measurements, std::string_view policy_name,
                               std::uint64_t seed, std::size_t budget) {
  auto store = kevo::store::SqliteStore::open(":memory:").value();
  std::vector<double> curve;
  kevo::SearchArguments args{.jobs = 2, .max_evaluations = budget, .seed = seed, .warm_start = 0, .retime_new_best = false};
  args.on_progress = [&](const kevo::Progress& p) { curve.push_back(p.best_speedup); };
  kevo::synth::TemplateSynthesizer synth(problem);
  kevo::SearchLoop<kevo::synth::TemplateSynthesizer, kevo::search::AnyPolicy, kevo::memory::Adaptive, SharedMeasurements,
                   kevo::knowledge::NullRetriever, kevo::store::SqliteStore>
      loop(problem, synth, *kevo::search::make_policy(policy_name), kevo::memory::Adaptive{}, measurements,
           kevo::knowledge::NullRetriever{}, store, args);
  auto result = loop.run(synth.seed());
  if (!result) fmt::print(stderr, "  {} seed {}: {}\n", policy_name, seed, result.error().message);
  while (!curve.empty() && curve.size() < budget + 1) curve.push_back(curve.back());
  return curve;
}

void compare_policies(const std::vector<std::string>& problem_dirs, std::size_t budget, std::size_t seeds,
                      const std::vector<std::string>& policies, const std::string& cache) {
  std::vector<std::size_t> checkpoints;
  for (std::size_t c = 10; c < budget; c *= 2) checkpoints.push_back(c);
  checkpoints.push_back(budget);

  fmt::print("## Best speedup against evaluations spent (median over {} seeds)\n\n", seeds);
  std::string header = "| problem | policy |";
  std::string rule = "|---|---|";
  for (auto c : checkpoints) header += fmt::format(" @{} |", c), rule += "---:|";
  fmt::print("{} min..max @{} | wall s |\n{}---:|---:|\n", header, budget, rule);

  for (const auto& dir : problem_dirs) {
    auto problem = kevo::load_problem(dir);
    if (!problem) { fmt::print(stderr, "{}\n", problem.error().message); continue; }
    kevo::eval::CpuEvaluator evaluator(*problem);
    if (auto ok = evaluator.prepare(); !ok) { fmt::print(stderr, "{}\n", ok.error().message); continue; }
    SharedMeasurements measurements(evaluator, cache, problem->name);
    for (const auto& policy : policies) {
      const auto start = Clock::now();
      std::vector<std::vector<double>> curves;
      for (std::uint64_t seed = 1; seed <= seeds; ++seed) curves.push_back(best_curve(*problem, measurements, policy, seed, budget));
      std::string row = fmt::format("| {} | {} |", problem->name, policy);
      std::vector<double> finals;
      for (auto c : checkpoints) {
        std::vector<double> at;
        for (const auto& curve : curves)
          if (curve.size() > c) at.push_back(curve[c]);
        row += fmt::format(" {:.2f}x |", median(at));
        if (c == budget) finals = at;
      }
      fmt::print("{} {:.2f}..{:.2f} | {:.0f} |\n", row, *std::min_element(finals.begin(), finals.end()),
                 *std::max_element(finals.begin(), finals.end()), seconds_since(start));
      std::fflush(stdout);
    }
    fmt::print("| {} | (distinct candidates: {}, measured in this run: {}) | | | | | |\n", problem->name, measurements.known(),
               measurements.measured());
  }
}

void loop_overhead() {
  const kevo::Problem problem = kevo::testing::synthetic_problem();
  kevo::testing::SyntheticEvaluator evaluator;  // costs nothing: what remains is the loop
  for (bool on_disk : {false, true}) {
    const std::string path = on_disk ? "/tmp/kevo-bench-overhead.db" : ":memory:";
    for (auto suffix : {"", "-wal", "-shm"}) std::remove((path + suffix).c_str());
    auto store = kevo::store::SqliteStore::open(path).value();
    const std::size_t n = 2000;
    auto loop = kevo::make_search_loop(problem, evaluator, store, {.jobs = 2, .max_evaluations = n, .warm_start = 0});
    const auto start = Clock::now();
    auto result = loop.run(loop.synthesizer().seed());
    const double s = seconds_since(start);
    fmt::print("| loop overhead per evaluation, store {} | {:.1f} us | {} evaluations (synthetic landscape; the space holds 4096) |\n",
               on_disk ? "on disk (WAL)" : "in memory", 1e6 * s / result->evaluations, result->evaluations);
  }
}

template <class Policy>
void decision_cost(std::string_view name, Policy policy) {
  kevo::SearchTree tree;
  kevo::Rng rng(1);
  std::uniform_real_distribution<float> speed(0.5f, 10.0f);
  tree.record(tree.root(), kevo::FailureKind::none, 1.0, kevo::Bottleneck::memory);
  policy.on_result(tree, tree.root());
  const std::size_t nodes = 100000;
  double last_seconds = 0;
  for (std::size_t i = 1; i < nodes; ++i) {
    const bool timed = i >= nodes - 1000;
    const auto start = Clock::now();
    const kevo::Expansion e = policy.select(tree, rng);
    const kevo::NodeId child = tree.add_child(e.parent);
    policy.on_expand(tree, child);
    const bool fails = i % 5 == 0;
    tree.record(child, fails ? kevo::FailureKind::compile_error : kevo::FailureKind::none, fails ? 0 : speed(rng), kevo::Bottleneck::memory);
    policy.on_result(tree, child);
    if (timed) last_seconds += seconds_since(start);
  }
  const std::size_t bytes = tree.memory_bytes() + policy.memory_bytes();
  fmt::print("| {} at 100,000 nodes | {:.2f} us per decision | tree + policy {:.1f} MB ({:.0f} B/node) |\n", name,
             1e6 * last_seconds / 1000, bytes / 1e6, double(bytes) / nodes);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t budget = 40, seeds = 5;
  std::string problems = "problems/cpu_scoring,problems/softmax,problems/gemm";
  bool loop_only = false;
  std::string cache;
  std::string policies = "mcts,evolutionary,greedy,random";
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--budget" && i + 1 < argc) budget = std::stoul(argv[++i]);
    else if (arg == "--seeds" && i + 1 < argc) seeds = std::stoul(argv[++i]);
    else if (arg == "--problems" && i + 1 < argc) problems = argv[++i];
    else if (arg == "--loop-only") loop_only = true;
    else if (arg == "--cache" && i + 1 < argc) cache = argv[++i];
    else if (arg == "--policies" && i + 1 < argc) policies = argv[++i];
    else {
      fmt::print(stderr, "usage: kevo-bench-policies [--budget N] [--seeds N] [--problems DIR,DIR] [--policies A,B] [--cache FILE] [--loop-only]\n");
      return 2;
    }
  }
  fmt::print("## The loop itself\n\n| what | figure | note |\n|---|---:|---|\n");
  loop_overhead();
  decision_cost("MCTS", kevo::search::Mcts{});
  decision_cost("evolutionary", kevo::search::Evolutionary{});
  decision_cost("greedy", kevo::search::Greedy{});
  decision_cost("random", kevo::search::Random{});
  fmt::print("\n");
  if (!loop_only) compare_policies(split(problems), budget, seeds, split(policies), cache);
}
