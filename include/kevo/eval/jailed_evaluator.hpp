// kevo/eval/jailed_evaluator.hpp: what every evaluator of kevo's shares, whatever it runs on.
// It compiles each candidate inside a jail (builds cached by content hash; refused by the screen
// first), runs it jailed beside the problem's trusted checker (checked_run.hpp), which checks it
// against the reference on fresh random inputs (poisoned outputs, every check shape, every timed
// call) and times it, names its bottleneck against the machine's roofline, refuses a figure
// beyond that roofline as implausible, and re-times two candidates side by side. A `Toolchain`
// says what differs between targets: the compiler and its flags, the generated checker and
// runner, the jail's devices, the roofline. Models: CpuEvaluator (cpu_evaluator.hpp),
// CudaEvaluator (cuda_evaluator.hpp). An `Executor` says where each checked run happens: here
// (LocalExecutor, the default) or on a Slurm node (SlurmExecutor, slurm_executor.hpp).
//
//   kevo::eval::JailedEvaluator<kevo::eval::CpuToolchain> evaluator(problem);   // = CpuEvaluator
//   if (auto ready = evaluator.prepare(); !ready) return fail(ready.error().message);
//   kevo::Evaluation e = evaluator.evaluate(candidate, /*seed=*/7);   // e.speedup over the reference
//
// Why one file of about 1020 lines: the build cache, the timing gate and the reference's figures are
// one object's state, which compile, evaluate, race and profile all use.
#pragma once

#include <kevo/candidate.hpp>
#include <kevo/eval/checked_run.hpp>
#include <kevo/eval/executor.hpp>
#include <kevo/gpu_presence.hpp>
#include <kevo/eval/harness.hpp>
#include <kevo/eval/jail.hpp>
#include <kevo/eval/library_headers.hpp>
#include <kevo/eval/ncu_profile.hpp>
#include <kevo/eval/roofline.hpp>
#include <kevo/eval/sandbox.hpp>
#include <kevo/eval/screening.hpp>
#include <kevo/eval/timing_gate.hpp>
#include <kevo/eval/torch_helper.hpp>
#include <kevo/evaluator.hpp>
#include <kevo/expected.hpp>
#include <kevo/problem.hpp>

#include <fmt/format.h>
#include <simdjson.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

namespace kevo::eval {

/// $XDG_CACHE_HOME/kevo, else ~/.cache/kevo, else /tmp/kevo-cache.
inline std::filesystem::path default_cache_dir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::filesystem::path(xdg) / "kevo";
  if (const char* home = std::getenv("HOME"); home && *home) return std::filesystem::path(home) / ".cache" / "kevo";
  return "/tmp/kevo-cache";
}

struct EvaluatorOptions {
  std::filesystem::path cache_dir = default_cache_dir();
  std::string compiler = {};                      ///< empty: the toolchain's own ($CXX or g++; nvcc)
  std::chrono::seconds compile_timeout{60};
  std::chrono::seconds run_timeout{20};           ///< wall clock, per call of a candidate's kernel()
  std::chrono::seconds cpu_time_limit{0};         ///< per run; 0: twice run_timeout (threads use both cores)
  std::size_t memory_limit_bytes = std::size_t{2} << 30;
  std::size_t output_limit_bytes = 1u << 20;
  int max_processes = 64;                         ///< threads count too
  int warmup = 2;
  int repetitions = 7;
  int reference_repetitions = 15;                 ///< the reference is timed once, more carefully
  /// Interleaved runs per side in compare(), in ABBA order: two rounds cancel a linear drift, and a
  /// race holds the machine alone (compiles wait), so a third round cost a sixth of a CPU search.
  int compare_rounds = 2;
  bool flush_caches = true;                       ///< before each timed call, so the roofline bounds it
  bool screen = true;                             ///< parse each candidate with clang-15 first (screening.hpp)
  std::size_t tmpfs_bytes = std::size_t{64} << 20;  ///< each of the candidate's /tmp, /var/tmp, /dev/shm, scratch
  bool machine_wide_gate = true;                  ///< also keep other kevo processes' compiles off timed runs
  bool profile_new_bests = true;                  ///< GPU: run each new best once more under Nsight Compute (where ncu is found)
  std::filesystem::path library_include_dir = {}; ///< where a problem's library_headers are read (the dir holding kevo/); empty: library_include_root()
};

/// Removes the temporaries (`NAME.tmp-PID[-TID]`) that killed runs left in `directory`: those of a
/// process not alive here, untouched for `grace`, and any untouched for a day (a reused PID). The
/// grace spares a build in flight on another machine that shares the cache (an NFS home), whose
/// PIDs mean nothing here: it touches its directory at least once per compile timeout. Returns how
/// many went.
inline std::size_t sweep_stale_temporaries(const std::filesystem::path& directory, std::chrono::seconds grace) {
  namespace fs = std::filesystem;
  std::size_t swept = 0;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (const auto& entry : fs::directory_iterator(directory, ec)) {
    const std::string name = entry.path().filename().string();
    const auto at = name.rfind(".tmp-");
    if (at == std::string::npos) continue;
    const std::string_view rest = std::string_view(name).substr(at + 5);
    const std::string_view digits = rest.substr(0, rest.find('-'));
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string_view::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(std::string(digits)));
    std::error_code time_ec;
    const auto touched = fs::last_write_time(entry.path(), time_ec);
    if (time_ec) continue;
    const auto idle = now - touched;
    const bool alive = pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM);
    if ((!alive && idle > grace) || idle > std::chrono::hours(24)) {
      std::error_code remove_ec;
      if (fs::remove_all(entry.path(), remove_ec) > 0 && !remove_ec) ++swept;
    }
  }
  return swept;
}

/// What an evaluator has done so far; the cache's effect is visible here.
struct EvaluatorStats {
  std::size_t compiles = 0;     ///< candidate builds actually compiled
  std::size_t cache_hits = 0;   ///< candidate builds found in the cache
  std::size_t runs = 0;         ///< checked runs (a checker beside a jailed runner)
  std::size_t torch_helper_starts = 0;  ///< a KernelBench-format problem's kept PyTorch helper, started (again where one died)
};

/// A Toolchain provides, as static members: `target`; `source_extension` (".cpp", ".cu");
/// `default_compiler()`; `compile_flags(problem)`; `link_flags()`; `identity()` (what makes a build
/// this machine's: the CPU, the GPU); `uses_gpu`; `checker_sources(problem)`, `runner_source(problem)`;
/// `check_problem(problem)`; `roofline(cache_dir, compiler)` (empty where the checker measures it in
/// each run); `compile_notes(compiler_stderr)` (registers and spills, for diagnostics);
/// `compiler_roots(compiler)` (what the jailed compiler must see beyond /usr); optionally
/// `checker_problem_compiler(compiler)` (the command, flags included, that builds the checker's problem
/// unit, checker.cpp, where not the toolchain's compiler: CUDA's is the host's). The Executor runs
/// each checked run (compiles stay here, in the build cache).
template <class Toolchain, Executor RunExecutor = LocalExecutor>
class JailedEvaluator {
 public:
  explicit JailedEvaluator(Problem problem, EvaluatorOptions options = {}, RunExecutor executor = {})
      : problem_(std::move(problem)), options_(with_compiler(std::move(options))), gate_(timing_lock_file(options_)),
        executor_(std::move(executor)) {}

  JailedEvaluator(const JailedEvaluator&) = delete;
  JailedEvaluator& operator=(const JailedEvaluator&) = delete;

  /// Generates and compiles the checker, the runner and the reference (cached), refuses a loose
  /// tolerance, times the reference on the timing shape and loads (or measures) the roofline. evaluate() calls it when needed;
  /// call it first to see its errors, which name the file at fault.
  expected<void, Error> prepare() {
    std::lock_guard lock(prepare_mutex_);
    if (prepared_) return {};
    auto result = prepare_locked();  // a failure is not kept: a compile that timed out may succeed later
    prepared_ = result.has_value();
    return result;
  }

  /// Compiles one candidate without running it (a machine without the target's device can still
  /// check that candidates build): the Evaluation says compile_error, screened_out, or none, with
  /// the compiler's notes (registers, spills) in its detail.
  Evaluation compile(const Candidate& candidate) {
    {
      std::lock_guard lock(prepare_mutex_);
      if (auto built = prepare_builds_locked(); !built) return failed(FailureKind::sandbox_error, built.error().message);
    }
    const Build b = build(candidate.source);
    Evaluation e;
    e.failure = b.failure;
    e.diagnostics.message = b.ok() ? "compiled" : b.message;
    e.diagnostics.detail = b.ok() ? b.notes : b.detail;
    return e;
  }

  /// Compiles, checks and times one candidate. Thread-safe; timed runs are serialized inside.
  Evaluation evaluate(const Candidate& candidate, std::uint64_t seed) {
    Evaluation e;
    if (auto ready = prepare(); !ready) return failed(FailureKind::sandbox_error, "the problem is not ready: " + ready.error().message);
    e.reference_seconds = reference_seconds_;
    auto built = build(candidate.source);
    if (!built.ok()) {
      e.failure = built.failure;
      e.diagnostics.message = built.message;
      e.diagnostics.detail = built.detail;
      return e;
    }
    const RunReport report = run_harness(built.executable, seed, options_.warmup, options_.repetitions);
    if (report.failure != FailureKind::none) {
      e.failure = report.failure;
      e.diagnostics.message = report.message;
      e.diagnostics.detail = report.detail;
      return e;
    }
    e.seconds = report.seconds;
    e.speedup = report.seconds > 0 ? reference_seconds_ / report.seconds : 0;
    const Roofline roof = roofline_of(report);
    e.diagnostics = classify(report.bytes, report.flops, report.seconds, roof);
    if (e.diagnostics.roofline_fraction > 1.0) return implausible(std::move(e), report, roof);
    e.diagnostics.detail = fmt::format("median {:.4g} ms, fastest {:.4g} ms of {} timed calls{}{}; reference {:.4g} ms{}{}", report.seconds * 1e3,
                                       report.min_seconds * 1e3, report.samples,
                                       report.samples == 1 && options_.repetitions > 1 ? " (over 10x slower than the reference: not timed further)" : "",
                                       report.round_trip_seconds > 0 ? fmt::format(" (kevo's round trip of {:.0f} us taken off each batch)", report.round_trip_seconds * 1e6) : "",
                                       reference_seconds_ * 1e3, built.notes.empty() ? "" : "; ", built.notes);
    if constexpr (Toolchain::uses_gpu) profile_if_new_best(e, built.executable, seed);
    return e;
  }

  /// Re-times both candidates in interleaved runs (ABBA order), so that drift and noise cannot
  /// pick the winner. Both are checked for correctness in the first round.
  expected<Comparison, Error> compare(const Candidate& challenger, const Candidate& incumbent, std::uint64_t seed) {
    if (auto ready = prepare(); !ready) return make_error(ready.error().message);
    auto a = build(challenger.source);
    if (!a.ok()) return make_error("challenger: " + a.message);
    auto b = build(incumbent.source);
    if (!b.ok()) return make_error("incumbent: " + b.message);
    return race(a.executable, b.executable, seed);
  }

  /// compare() against the reference itself: `incumbent_seconds` is the reference's time in the
  /// same runs, so challenger vs incumbent is the verified speedup.
  expected<Comparison, Error> compare_with_reference(const Candidate& challenger, std::uint64_t seed) {
    if (auto ready = prepare(); !ready) return make_error(ready.error().message);
    auto a = build(challenger.source);
    if (!a.ok()) return make_error("challenger: " + a.message);
    if (problem_.torch) return race(a.executable, {}, seed);
    return race(a.executable, reference_build_, seed);
  }

  /// A KernelBench-format problem's peers, timed beside PyTorch eager (the reference) by prepare():
  /// torch.compile where the installed PyTorch has it, else why not.
  struct TorchPeers {
    double compile_seconds = 0;  ///< 0: not timed (see compile_note)
    std::string compile_note;
  };
  const TorchPeers& torch_peers() const { return torch_peers_; }

  /// Median time of the reference on the timing shape, measured by prepare().
  double reference_seconds() const { return reference_seconds_; }
  /// What its figures are measured on: the target, this machine's device and the compiler with its
  /// version, e.g. "cuda; gpu: NVIDIA H200, 9.0; /usr/local/cuda/bin/nvcc nvcc: NVIDIA (R) Cuda compiler
  /// driver; Cuda compilation tools, release 13.0, V13.0.88". A search warm-starts only from runs with
  /// the same identity. Known once prepare() has run (compile() too); empty before: unknown.
  std::string target_identity() const {
    if (compiler_identity_.empty()) return {};
    return fmt::format("{}; {}; {}", to_string(Toolchain::target), Toolchain::identity(), compiler_identity_);
  }
  /// How the reference's checked figure came about, where the clock has parts worth naming (the
  /// GPU checker's round trip and its own CUDA-event timing of the reference); empty otherwise.
  const std::string& reference_clock_note() const { return reference_clock_note_; }
  const Roofline& roofline() const { return roofline_; }
  const Problem& problem() const { return problem_; }
  const EvaluatorOptions& options() const { return options_; }

  /// The template rendered with its default knobs: the search's natural root.
  Candidate default_candidate() const {
    return Candidate{.source = problem_.render(problem_.default_knobs()), .knobs = problem_.default_knobs(), .origin = "template defaults"};
  }
  /// A kernel that calls the reference: its speedup is 1 up to noise.
  Candidate reference_candidate() const { return Candidate{.source = reference_kernel_source(problem_), .knobs = {}, .origin = "reference"}; }

  EvaluatorStats stats() const {
    const TorchHelperServer* helper = kept_torch_helper_.load();
    return EvaluatorStats{compiles_.load(), cache_hits_.load(), runs_.load(), helper ? helper->starts() : 0};
  }
  /// Where this problem's generated sources and builds live.
  const std::filesystem::path& build_directory() const { return problem_dir_; }

 private:
  // The target's screen, with asm statements and the named kevo headers let through where the problem
  // allows them (the headers those include need no allowing: the screen reads only #include lines of the candidate).
  ScreeningRules screening_rules() const {
    ScreeningRules rules = ScreeningRules::for_target(problem_.target);
    rules.allow_asm = problem_.allow_asm;
    rules.allowed_includes.insert(rules.allowed_includes.end(), problem_.library_headers.begin(), problem_.library_headers.end());
    // The screen parses each pass that nvcc makes with the flags that the build passes it: this GPU's
    // architecture and the problem's own -D.
    if constexpr (Toolchain::target == Target::cuda) rules.nvcc_flags = Toolchain::compile_flags(problem_);
    return rules;
  }

  struct Build {
    FailureKind failure = FailureKind::none;
    std::filesystem::path executable;
    std::string message;
    std::string detail;
    std::string notes;  // the compiler's word on resources: registers, spills, shared memory
    bool ok() const { return failure == FailureKind::none; }
  };

  static EvaluatorOptions with_compiler(EvaluatorOptions options) {
    if (options.compiler.empty()) options.compiler = Toolchain::default_compiler();
    return options;
  }

  /// The roofline the checker measured in this very run where it does (the GPU), else the machine's.
  Roofline roofline_of(const RunReport& report) const {
    if (report.roofline_gbytes_per_s <= 0) return roofline_;
    Roofline r = roofline_;
    r.read_gbytes_per_s = report.roofline_gbytes_per_s;
    r.peak_gflops = report.roofline_gflops;
    return r;
  }

  static std::filesystem::path timing_lock_file(const EvaluatorOptions& options) {
    if (!options.machine_wide_gate) return {};
    std::error_code ec;
    std::filesystem::create_directories(options.cache_dir, ec);
    return options.cache_dir / "timing.lock";
  }

  /// Faster than the machine can go: not a record but a trick or a broken bytes/FLOPs model.
  static std::string implausible_message(const Diagnostics& d, const Roofline& roof) {
    return fmt::format("implausible: {:.0f}% of this machine's measured roofline ({:.1f} GB/s of {:.1f}, {:.1f} GFLOP/s of {:.1f}); not credited",
                       100 * d.roofline_fraction, d.achieved_gbytes_per_s, roof.read_gbytes_per_s, d.achieved_gflops, roof.peak_gflops);
  }
  static Evaluation implausible(Evaluation e, const RunReport& report, const Roofline& roof) {
    e.failure = FailureKind::implausible;
    e.diagnostics.message = implausible_message(e.diagnostics, roof);
    e.diagnostics.detail = fmt::format("median {:.4g} ms (wall {:.4g} ms, CPU {:.4g} ms) of {} timed calls", report.seconds * 1e3,
                                       report.wall_seconds * 1e3, report.cpu_seconds * 1e3, report.samples);
    e.seconds = 0;
    e.speedup = 0;
    return e;
  }

  static Evaluation failed(FailureKind kind, std::string message) {
    Evaluation e;
    e.failure = kind;
    e.diagnostics.message = std::move(message);
    return e;
  }

  SandboxLimits trusted_limits() const {
    SandboxLimits l;
    l.wall_time = options_.compile_timeout;
    l.drop_privileges = false;
    l.isolate = false;
    l.file_size_bytes = std::size_t{1} << 30;
    l.memory_bytes = std::size_t{8} << 30;  // a template that explodes the compiler stops here
    l.output_bytes = 256 << 10;
    const char* path = std::getenv("PATH");
    l.environment = {std::string("PATH=") + (path ? path : "/usr/local/bin:/usr/bin:/bin"), "LANG=C", "LC_ALL=C", "TMPDIR=/tmp"};
    return l;
  }

  SandboxLimits candidate_limits() const {
    SandboxLimits l;
    l.wall_time = options_.run_timeout;
    l.cpu_time = options_.cpu_time_limit.count() > 0 ? options_.cpu_time_limit : 2 * options_.run_timeout;
    l.memory_bytes = Toolchain::uses_gpu ? 0 : options_.memory_limit_bytes;  // RLIMIT_AS breaks CUDA (ops-notes)
    l.file_size_bytes = 16u << 20;
    l.output_bytes = options_.output_limit_bytes;
    l.max_processes = options_.max_processes;
    l.max_open_files = Toolchain::uses_gpu ? 512 : 64;  // the CUDA driver opens its device files and more
    // Every call may take run_timeout; the whole run is bounded too.
    l.wall_time = 3 * options_.run_timeout + std::chrono::seconds(30);
    return l;
  }

  SandboxLimits checker_limits() const {
    SandboxLimits l = trusted_limits();
    if (Toolchain::uses_gpu) l.memory_bytes = 0;  // device allocations count against RLIMIT_AS
    l.wall_time = 3 * options_.run_timeout + std::chrono::seconds(30);
    l.output_bytes = 64 << 10;
    return l;
  }

  JailOptions candidate_jail() const { return JailOptions{.tmpfs_bytes = options_.tmpfs_bytes, .seccomp = true, .gpu = Toolchain::uses_gpu}; }

  std::vector<std::string> compile_flags() const { return Toolchain::compile_flags(problem_); }

  std::vector<std::string> link_command(std::vector<std::string> inputs, const std::string& output) const {
    std::vector<std::string> args = compile_flags();
    args.insert(args.end(), inputs.begin(), inputs.end());
    for (const auto& flag : Toolchain::link_flags()) args.push_back(flag);
    args.insert(args.end(), {"-o", output});
    return args;
  }

  static std::string join(const std::vector<std::string>& parts) {
    std::string out;
    for (const auto& p : parts) out += (out.empty() ? "" : " ") + p;
    return out;
  }

  static bool write_file_atomically(const std::filesystem::path& path, std::string_view text) {
    const auto temporary = path.string() + fmt::format(".tmp-{}-{}", ::getpid(), std::hash<std::thread::id>{}(std::this_thread::get_id()));
    {
      std::ofstream out(temporary, std::ios::binary);
      out << text;
      if (!out) return false;
    }
    std::error_code ec;
    std::filesystem::rename(temporary, path, ec);
    return !ec;
  }

  /// The errors that matter from a compiler's output: the first few errors with their source
  /// lines, our build paths stripped, capped in size.
  std::string trim_compiler_output(std::string_view text, std::string_view strip_prefix = {}) const {
    std::vector<std::string> lines;
    std::istringstream in{std::string(text)};
    for (std::string line; std::getline(in, line);) {
      if (!strip_prefix.empty())
        for (std::size_t at; (at = line.find(strip_prefix)) != std::string::npos;) line.erase(at, strip_prefix.size());
      if (!problem_dir_.empty())
        for (std::string dir = problem_dir_.string() + "/"; line.find(dir) != std::string::npos;) line.erase(line.find(dir), dir.size());
      lines.push_back(std::move(line));
    }
    std::string out;
    int errors = 0;
    for (std::size_t i = 0; i < lines.size() && errors < 3; ++i) {
      const std::string& line = lines[i];
      const bool is_error = line.find("error:") != std::string::npos || line.find("undefined reference") != std::string::npos ||
                            line.find("multiple definition") != std::string::npos;
      if (!is_error) continue;
      ++errors;
      out += line + "\n";
      // the source line and caret that gcc prints beneath
      for (std::size_t k = i + 1; k < lines.size() && k <= i + 2 && lines[k].find(": ") == std::string::npos; ++k) out += lines[k] + "\n";
    }
    if (out.empty())
      for (std::size_t i = 0; i < lines.size() && i < 10; ++i) out += lines[i] + "\n";
    if (out.size() > 1500) out = out.substr(0, 1500) + "...\n";
    while (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
  }

  static std::string first_line(std::string_view text) { return std::string(text.substr(0, text.find('\n'))); }
  /// A compiler's `--version` text in one line: its first line, and the line naming its release
  /// where that is another (nvcc's first line names no version: "Cuda compilation tools, release 13.0, V13.0.88").
  static std::string version_of(std::string_view text) {
    std::string out = first_line(text);
    if (const auto at = text.find(", release "); at != std::string_view::npos && at > out.size()) {
      const auto start = text.rfind('\n', at) + 1;
      out += "; " + first_line(text.substr(start));
    }
    return out;
  }

  /// Runs the compiler with `args` in `directory`, as a compile: shared with other compiles, never
  /// beside a timed run. The compiler runs jailed: it sees the system's headers, the problem's
  /// generated files and `directory` (writable), nothing else (no `.incbin "/etc/shadow"`).
  SandboxResult run_compiler(std::vector<std::string> args, const std::filesystem::path& directory,
                             std::vector<std::filesystem::path> also_read = {}) {
    args.insert(args.begin(), options_.compiler);
    return run_compiler_command(std::move(args), directory, std::move(also_read));
  }

  /// The same with `command` whole: its first word the compiler to run.
  SandboxResult run_compiler_command(std::vector<std::string> command, const std::filesystem::path& directory,
                                     std::vector<std::filesystem::path> also_read = {}) {
    // Its /tmp holds the compiler's intermediate files, which for nvcc and CUB can pass a candidate's 64 MiB.
    also_read.push_back(problem_dir_);
    JailOptions options{.read_only = std::move(also_read), .writable = {directory}, .working_directory = directory,
                        .tmpfs_bytes = std::size_t{1} << 30, .seccomp = false};
    for (const auto& root : Toolchain::compiler_roots(options_.compiler)) options.read_only.push_back(root);
    // A C++ reference is compiled from the problem's directory; a PyTorch problem's directory (the user's, beside the
    // .py) holds nothing a compile needs, so the jailed compiler does not see it.
    if (!problem_.directory.empty() && !problem_.torch) options.read_only.push_back(std::filesystem::absolute(problem_.directory));
    auto jail = make_jail(options);
    if (!jail) {
      SandboxResult r;
      r.setup_error = jail.error().message;
      return r;
    }
    SandboxLimits limits = trusted_limits();
    limits.isolate = false;  // the jail's namespaces
    // A compile's load on the host's cores would skew a CPU timing, so they take turns; a GPU's
    // timing is the device's own clock, so its runs overlap the next candidates' compiles.
    std::shared_lock compiling(gate_, std::defer_lock);
    if constexpr (!Toolchain::uses_gpu) compiling.lock();
    return run_sandboxed(jail->command(command), limits);
  }

  /// The generated sources, the reference, the runner and the checker, compiled (cached).
  expected<void, Error> prepare_builds_locked() {
    namespace fs = std::filesystem;
    if (builds_ready_) return {};
    if (auto fit = Toolchain::check_problem(problem_); !fit) return unexpected(fit.error());
    const SandboxResult version = run_sandboxed({options_.compiler, "--version"}, trusted_limits());
    if (!version.ok())
      return make_error(fmt::format("the compiler '{}' does not run: {}", options_.compiler,
                                    version.setup_error.empty() ? first_line(version.stderr_text) : version.setup_error));
    compiler_identity_ = options_.compiler + " " + version_of(version.stdout_text);

    const std::string header = problem_header(problem_);
    const CheckerSources checker = Toolchain::checker_sources(problem_);
    const std::string runner = Toolchain::runner_source(problem_);
    const std::string ext(Toolchain::source_extension);
    const std::string flags = join(compile_flags());
    // The kevo headers its candidates may include, read now: their text is part of the key, so an
    // edited kevo header gets a build directory of its own.
    auto library = library_header_closure(library_include_root(options_.library_include_dir), problem_.library_headers);
    if (!library) return make_error(fmt::format("{}: 'library_headers': {}", (problem_.directory / "problem.json").string(), library.error().message));
    std::string library_text;
    for (const auto& h : *library) library_text += fmt::format("\n{} {}\n{}", h.path, h.content.size(), h.content);
    // The machine too (the CPU, the GPU): flags such as -march=native make a build this machine's, and
    // a cache directory may be shared (an NFS home) by machines of other kinds. And the screen's rules:
    // a build cached while asm was allowed is not taken once it is refused.
    const std::uint64_t key = content_hash(header + checker.problem + checker.body + runner + problem_.reference_source + flags + compiler_identity_ +
                                           Toolchain::identity() + (problem_.allow_asm ? "; asm allowed" : "") + library_text);
    std::string safe_name = problem_.name;  // the name becomes a directory name
    for (char& c : safe_name)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') c = '_';
    problem_dir_ = options_.cache_dir / "problems" / fmt::format("{}-{:016x}", safe_name, key);
    std::error_code ec;
    fs::create_directories(problem_dir_ / "builds", ec);
    if (ec) return make_error(fmt::format("{}: cannot be created: {}", problem_dir_.string(), ec.message()));
    // What killed runs left half-built. Each step of a build touches its directory within a compile timeout.
    const auto grace = 2 * options_.compile_timeout + std::chrono::seconds(60);
    sweep_stale_temporaries(problem_dir_, grace);
    sweep_stale_temporaries(problem_dir_ / "builds", grace);
    // The checker's problem unit: built by the toolchain's compiler, or by the command the toolchain names for it.
    constexpr bool own_problem_compiler = requires(const std::string& compiler) { Toolchain::checker_problem_compiler(compiler); };
    const std::string problem_unit = own_problem_compiler ? "checker.cpp" : "checker" + ext;
    if (!write_file_atomically(problem_dir_ / "kevo_problem.hpp", header) || !write_file_atomically(problem_dir_ / problem_unit, checker.problem) ||
        !write_file_atomically(problem_dir_ / ("runner" + ext), runner))
      return make_error(fmt::format("{}: cannot write the generated sources", problem_dir_.string()));
    for (const auto& h : *library) {
      const fs::path copy = problem_dir_ / h.path;
      fs::create_directories(copy.parent_path(), ec);
      if (ec || !write_file_atomically(copy, h.content))
        return make_error(fmt::format("{}: cannot write the library header {}", problem_dir_.string(), h.path));
    }

    const std::string manifest = problem_.torch ? problem_.torch->file.string() : (problem_.directory / "problem.json").string();
    std::string reference_path = (problem_.directory / problem_.reference_file).string();
    if (problem_.torch) {
      // PyTorch is the reference, run by the checker through kevo's helper beside it; a copy of the module is
      // what it runs, so an edit to the file mid-search cannot change a problem whose key says otherwise.
      reference_path = (problem_dir_ / "reference.cpp").string();
      if (!write_file_atomically(problem_dir_ / "kevo_torch.py", detail::harness_files::kevo_torch_py) ||
          !write_file_atomically(problem_dir_ / "reference_module.py", problem_.reference_source) ||
          !write_file_atomically(reference_path, detail::torch_reference_stub(problem_)))
        return make_error(fmt::format("{}: cannot write the PyTorch reference's files", problem_dir_.string()));
    }
    std::vector<std::string> base = compile_flags();
    base.insert(base.end(), {"-I", problem_dir_.string()});
    // Each output is first written under a name of this process's and thread's own, then renamed: the
    // cache is shared (ctest -j runs two test processes on one problem; a search may run two evaluators),
    // and under one shared name a second linker recreated the file while the first's was renamed into
    // place and started, still open for writing in that linker: ETXTBSY ("Text file busy"), or a torn file.
    const std::string own = fmt::format(".tmp-{}-{}", ::getpid(), std::hash<std::thread::id>{}(std::this_thread::get_id()));
    std::vector<std::string> toolchain_command = base;
    toolchain_command.insert(toolchain_command.begin(), options_.compiler);
    auto compile_object = [&](const std::string& source, const std::string& object, const std::vector<std::string>& command) {
      return compile_object_in(problem_dir_, command, source, object, own);
    };
    if (auto error = compile_object(fs::absolute(reference_path).string(), "reference.o", toolchain_command))
      return make_error(fmt::format("{} does not compile: {}", reference_path, *error));
    if (auto error = compile_object("runner" + ext, "runner.o", toolchain_command))
      return make_error(fmt::format("{}: kevo's runner does not compile for this problem: {}", manifest, *error));
    std::vector<std::string> problem_command = toolchain_command;
    if constexpr (own_problem_compiler) {
      problem_command = Toolchain::checker_problem_compiler(options_.compiler);
      problem_command.insert(problem_command.end(), {"-I", problem_dir_.string()});
    }
    if (auto error = compile_object(problem_unit, "checker.o", problem_command))
      return make_error(fmt::format("{}: the tensor sizes or the bytes/FLOPs model do not compile as C++: {}", manifest, *error));
    if (!fs::exists(problem_dir_ / "checker")) {
      auto body = checker_body_object(checker.body, own);
      if (!body) return make_error(fmt::format("{}: {}", manifest, body.error().message));
      const std::string temporary = "checker" + own;
      const SandboxResult r = run_compiler(link_command({"checker.o", body->string(), "reference.o"}, temporary), problem_dir_, {body->parent_path()});
      if (!r.ok()) {
        fs::remove(problem_dir_ / temporary, ec);
        return make_error(fmt::format("{}: the checker does not link with the reference: {}", manifest, trim_compiler_output(r.stderr_text + r.setup_error)));
      }
      fs::rename(problem_dir_ / temporary, problem_dir_ / "checker", ec);
    }
    builds_ready_ = true;
    return {};
  }

  /// The checker's body, compiled: the same text for every problem of this target and kind of reference, so
  /// compiled once per cache (in a directory named by its text, the flags and the compiler) and linked with each
  /// problem's own small unit. Most of a checker's compile is this (about 4 s of g++ at -O2, more with nvcc).
  expected<std::filesystem::path, Error> checker_body_object(const std::string& body, const std::string& own) {
    namespace fs = std::filesystem;
    const std::string ext(Toolchain::source_extension);
    const std::string flags = join(compile_flags());
    const fs::path dir = options_.cache_dir / "checker-bodies" /
                         fmt::format("{}-{:016x}", to_string(Toolchain::target), content_hash(body + flags + compiler_identity_ + Toolchain::identity()));
    const fs::path object = dir / "checker_body.o";
    if (fs::exists(object)) return object;
    std::error_code ec;
    fs::create_directories(dir, ec);
    sweep_stale_temporaries(dir, 2 * options_.compile_timeout + std::chrono::seconds(60));  // what killed compiles left
    if (ec || !write_file_atomically(dir / ("checker_body" + ext), body)) return make_error(fmt::format("{}: cannot be written", dir.string()));
    std::vector<std::string> command = compile_flags();
    command.insert(command.begin(), options_.compiler);
    if (auto error = compile_object_in(dir, command, "checker_body" + ext, "checker_body.o", own))
      return make_error(fmt::format("kevo's checker does not compile with the problem's flags ({}): {}", flags, *error));
    return object;
  }

  /// Compiles `source` in `dir` into `object` there with `command` (the compiler and its flags): empty, or why
  /// not. The object is written under a name of this process's and thread's own (`own`), then renamed: the cache
  /// is shared, and a second process compiling the same object replaces it whole.
  std::optional<std::string> compile_object_in(const std::filesystem::path& dir, std::vector<std::string> command, const std::string& source,
                                               const std::string& object, const std::string& own) {
    namespace fs = std::filesystem;
    if (fs::exists(dir / object)) return std::nullopt;
    const std::string temporary = object + own;
    command.insert(command.end(), {"-c", source, "-o", temporary});
    const SandboxResult r = run_compiler_command(std::move(command), dir);
    std::error_code ec;
    if (!r.ok()) {
      fs::remove(dir / temporary, ec);
      if (r.timed_out) return fmt::format("timed out after {} s", options_.compile_timeout.count());
      return trim_compiler_output(r.stderr_text + r.setup_error, dir == problem_dir_ ? std::string() : dir.string() + "/");
    }
    fs::rename(dir / temporary, dir / object, ec);
    return std::nullopt;
  }

  expected<void, Error> prepare_locked() {
    namespace fs = std::filesystem;
    // No GPU here, where the runs would be: said before any compile (compile() alone still builds).
    if constexpr (Toolchain::uses_gpu && std::is_same_v<RunExecutor, LocalExecutor>)
      if (auto here = nvidia_device_present(); !here) return make_error(fmt::format("{}: {}", problem_.name, here.error().message), here.error().kind);
    if (auto built = prepare_builds_locked(); !built) return built;
    const std::string manifest = problem_.torch ? problem_.torch->file.string() : (problem_.directory / "problem.json").string();
    const std::string reference_path = (problem_.directory / problem_.reference_file).string();
    {
      // The reference's runs here are runs like any other: not beside a candidate's (whose static
      // initializers may take the device's memory) nor beside a timed one.
      std::unique_lock validating(gate_);
      if (auto loose = validate_tolerance(); !loose) return make_error(fmt::format("{}: {}", manifest, loose.error().message));
    }
    if (problem_.torch) return prepare_torch_reference();

    // The reference run as the kernel: checks the whole pipeline and times the reference.
    auto reference_build = build(reference_kernel_source(problem_));
    if (!reference_build.ok())
      return make_error(fmt::format("{}: the reference does not link with kevo's runner: {}", reference_path, reference_build.detail));
    reference_build_ = reference_build.executable;
    const RunReport timing = run_harness(reference_build_, 1, options_.warmup, options_.reference_repetitions);
    if (timing.failure != FailureKind::none)
      return make_error(fmt::format("{}: the reference failed its own run ({}): {} {}", reference_path, to_string(timing.failure),
                                    timing.message, timing.detail));
    reference_seconds_ = timing.seconds;
    round_trip_seconds_ = timing.round_trip_seconds;  // measured by the reference's run, trusted for every later one
    if (timing.reference_in_process_seconds > 0)
      reference_clock_note_ = fmt::format("checked in batches of calls, kevo's round trip of {:.0f} us taken off each batch; "
                                          "the checker's own CUDA events time one call at {:.4g} ms",
                                          timing.round_trip_seconds * 1e6, timing.reference_in_process_seconds * 1e3);

    std::unique_lock timing_lock(gate_);  // a probe is a timed run too
    auto roofline = Toolchain::roofline(options_.cache_dir, options_.compiler);
    if (!roofline) return make_error(roofline.error().message);
    roofline_ = roofline_of(timing).read_gbytes_per_s > 0 ? roofline_of(timing) : *roofline;
    return {};
  }

  /// The checker refuses a tolerance under which a constant output would pass every check.
  expected<void, Error> validate_tolerance() {
    const SandboxResult r = run_sandboxed({(problem_dir_ / "checker").string(), "--validate-tolerance", "1"}, checker_limits());
    simdjson::dom::parser parser;
    simdjson::dom::element verdict;
    std::string_view status, detail;
    if (!parser.parse(detail::last_json_line(r.stdout_text)).get(verdict) && !verdict["status"].get_string().get(status)) {
      if (status == "ok") return {};
      if (status == "loose_tolerance" && !verdict["detail"].get_string().get(detail))
        return make_error("the tolerance is too loose: " + std::string(detail));
      if (!verdict["detail"].get_string().get(detail))
        return make_error("the reference failed while the tolerance was checked: " + std::string(detail));
    }
    return make_error("the reference failed while the tolerance was checked: " + detail::tail(r.stderr_text + r.stdout_text + r.setup_error, 400));
  }

  /// Compiles `source` into an executable linked with the cached reference and runner objects.
  /// Builds (and compile errors) are cached by content hash of source, flags and compiler.
  Build build(const std::string& source) {
    namespace fs = std::filesystem;
    Build b;
    const std::uint64_t key = content_hash(source + "\n" + join(compile_flags()) + "\n" + compiler_identity_ + "\n" + problem_dir_.string());
    const fs::path dir = problem_dir_ / "builds" / fmt::format("{:016x}", key);
    auto from_cache = [&]() -> bool {
      if (fs::exists(dir / "candidate")) {
        b.executable = dir / "candidate";
        b.notes = read_notes(dir);
        return true;
      }
      if (fs::exists(dir / "compile_error.txt")) {
        std::ifstream in(dir / "compile_error.txt");
        std::stringstream text;
        text << in.rdbuf();
        b.failure = FailureKind::compile_error;
        b.detail = text.str();
        b.message = "does not compile: " + first_line(b.detail);
        return true;
      }
      if (options_.screen && fs::exists(dir / "screened_out.txt")) {
        std::ifstream in(dir / "screened_out.txt");
        std::getline(in, b.detail);
        b.failure = FailureKind::screened_out;
        b.message = "refused before compiling: " + b.detail;
        return true;
      }
      return false;
    };
    if (from_cache()) {
      ++cache_hits_;
      return b;
    }
    std::error_code ec;
    // Defence in depth before the compiler sees it; a refusal is kept like a compile error.
    if (options_.screen) {
      const ScreeningVerdict verdict = screen_candidate(source, problem_.target, problem_dir_, screening_rules());
      if (verdict.refused) {
        b.failure = FailureKind::screened_out;
        b.message = "refused before compiling: " + verdict.reason;
        b.detail = verdict.reason;
        fs::create_directories(dir, ec);
        write_file_atomically(dir / "screened_out.txt", verdict.reason);
        return b;
      }
    }
    ++compiles_;
    const fs::path work = dir.string() + fmt::format(".tmp-{}-{}", ::getpid(), std::hash<std::thread::id>{}(std::this_thread::get_id()));
    fs::remove_all(work, ec);
    fs::create_directories(work, ec);
    const std::string source_name = std::string("candidate") + std::string(Toolchain::source_extension);
    if (ec || !write_file_atomically(work / source_name, source)) {
      b.failure = FailureKind::sandbox_error;
      b.message = fmt::format("{}: cannot write the candidate: {}", work.string(), ec.message());
      return b;
    }
    std::vector<std::string> args = compile_flags();
    args.insert(args.end(), {"-I", problem_dir_.string(), "-c", source_name, "-o", "candidate.o"});
    SandboxResult r = run_compiler(args, work);
    const std::string notes = r.ok() ? Toolchain::compile_notes(r.stderr_text) : std::string();
    if (r.ok()) r = run_compiler(link_command({"candidate.o", (problem_dir_ / "runner.o").string(), (problem_dir_ / "reference.o").string()}, "candidate"), work);
    if (!r.ok()) {
      if (!r.setup_error.empty()) {
        b.failure = FailureKind::sandbox_error;
        b.message = "the compiler could not be started: " + r.setup_error;
        fs::remove_all(work, ec);
        return b;
      }
      b.failure = FailureKind::compile_error;
      b.detail = r.timed_out ? fmt::format("the compile ran past {} s and was killed", options_.compile_timeout.count())
                             : trim_compiler_output(r.stderr_text, (work.string() + "/"));
      b.message = "does not compile: " + first_line(b.detail);
      // Keep the failure so the same source is not compiled again (timeouts may be load: not kept).
      if (!r.timed_out) {
        write_file_atomically(work / "compile_error.txt", b.detail);
        fs::remove(work / "candidate.o", ec);
        fs::rename(work, dir, ec);
      }
      fs::remove_all(work, ec);
      return b;
    }
    fs::remove(work / "candidate.o", ec);
    if (!notes.empty()) write_file_atomically(work / "notes.txt", notes);
    fs::rename(work, dir, ec);  // atomic publish; if another thread won the race, use its build
    fs::remove_all(work, ec);
    if (!fs::exists(dir / "candidate")) {
      b.failure = FailureKind::sandbox_error;
      b.message = fmt::format("{}: the build vanished", dir.string());
      return b;
    }
    b.executable = dir / "candidate";
    b.notes = read_notes(dir);
    return b;
  }

  static std::string read_notes(const std::filesystem::path& dir) {
    std::ifstream in(dir / "notes.txt");
    std::string line;
    std::getline(in, line);
    return line;
  }

  RunReport run_harness(const std::filesystem::path& executable, std::uint64_t seed, int warmup, int repetitions) {
    // Runs on other machines compete with neither this one's compiles nor each other: `jobs` in flight.
    if (executor_.remote()) return run_harness_locked(executable, seed, warmup, repetitions);
    std::unique_lock timing(gate_);
    return run_harness_locked(executable, seed, warmup, repetitions);
  }

  // kevo_torch.py in `mode`, on this problem's copy of the module.
  std::vector<std::string> torch_helper_argv(const char* mode) const {
    return {problem_.torch->python, (problem_dir_ / "kevo_torch.py").string(), mode, (problem_dir_ / "reference_module.py").string(),
            "--scale", fmt::format("{:.9g}", problem_.torch->size_scale), "--device", problem_.torch->device};
  }

  // A KernelBench-format problem's PyTorch helper, kept running for this evaluator's runs (on this machine:
  // a remote run's checker starts its own). Null where there is none to keep.
  TorchHelperServer* torch_helper() {
    if (!problem_.torch || executor_.remote()) return nullptr;
    std::call_once(torch_helper_made_, [&] {
      SandboxLimits limits = checker_limits();
      limits.memory_bytes = 0;                           // PyTorch maps far more address space than it uses
      limits.wall_time = std::chrono::hours(12);         // its whole life: one past that is started again
      limits.environment.insert(limits.environment.end(), {"OMP_WAIT_POLICY=PASSIVE", "PYTHONDONTWRITEBYTECODE=1", "HOME=/tmp"});
      torch_helper_ = std::make_unique<TorchHelperServer>(TorchHelperServer::Launch{.argv = torch_helper_argv("serve-runs"), .limits = std::move(limits)});
      kept_torch_helper_.store(torch_helper_.get());
    });
    return torch_helper_.get();
  }

  // The checker's end of a connection to the kept helper, or -1: the checker then starts a helper of its own
  // (where the kept one cannot start, that one's failure is the run's, with its words).
  int torch_helper_connection() {
    TorchHelperServer* helper = torch_helper();
    if (!helper) return -1;
    auto connection = helper->connect();
    return connection ? connection->release() : -1;
  }

  RunReport run_harness_locked(const std::filesystem::path& executable, std::uint64_t seed, int warmup, int repetitions) {
    ++runs_;
    return executor_.run(CheckedRunRequest{.checker = problem_dir_ / "checker",
                                         .runner = executable,
                                         .seed = seed,
                                         .warmup = warmup,
                                         .repetitions = repetitions,
                                         .flush_caches = options_.flush_caches,
                                         .call_timeout = options_.run_timeout,
                                         .round_trip_seconds = round_trip_seconds_,
                                         .runner_limits = candidate_limits(),
                                         .checker_limits = checker_limits(),
                                         .jail = candidate_jail(),
                                         .torch_helper_fd = torch_helper_connection()});
  }

  static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  }

  /// Nsight Compute's view of a new best (5% past the last profiled): the runner started under ncu in its jail (the filter lets
  /// ncu fork, exec and talk to its child), one checked call on the timing shape, and ncu's class
  /// and line in place of the roofline's. Only new bests, since ncu replays each kernel once per
  /// metric pass. Advisory: a verdict or a figure never comes from it, and where ncu is missing or
  /// fails the roofline's class stands, with the reason in the detail.
  void profile_if_new_best(Evaluation& e, const std::filesystem::path& executable, std::uint64_t seed) {
    if (!options_.profile_new_bests || executor_.remote()) return;
    {
      std::lock_guard lock(profile_mutex_);
      if (e.speedup <= 1.05 * best_profiled_speedup_) return;  // a new best by 5% at least: a few profiles a search
      best_profiled_speedup_ = e.speedup;
    }
    static const std::optional<std::filesystem::path> ncu = find_ncu();
    if (!ncu) {
      e.diagnostics.detail += "; not profiled: ncu not found";
      return;
    }
    const char* home = std::getenv("HOME");
    auto ncu_tree = ncu_install_tree(*ncu, {home ? std::filesystem::path(home) : std::filesystem::path(), options_.cache_dir, problem_dir_});
    if (!ncu_tree) {
      e.diagnostics.detail += "; not profiled: " + ncu_tree.error().message;
      return;
    }
    JailOptions jail = candidate_jail();
    jail.launcher = ncu_launcher({.ncu = ncu->string()});
    jail.seccomp_exempt = ncu_seccomp_exempt();
    if (*ncu_tree) jail.read_only.push_back(**ncu_tree);
    // The toolkit's ncu is a script that finds Nsight Compute beside the toolkit or under /opt/nvidia.
    if (std::error_code ec; std::filesystem::is_directory("/opt/nvidia", ec)) jail.read_only.push_back("/opt/nvidia");
    SandboxLimits runner = candidate_limits(), checker = checker_limits();
    runner.environment.insert(runner.environment.end(), {"HOME=/scratch", "TMPDIR=/tmp"});  // where ncu keeps its files
    runner.wall_time = checker.wall_time = std::chrono::seconds(180);  // ncu starts slowly and replays each kernel
    runner.output_bytes = std::size_t{4} << 20;
    RunReport r;
    {
      std::unique_lock timing(gate_);
      r = run_checked(CheckedRunRequest{.checker = problem_dir_ / "checker", .runner = executable, .seed = seed ^ 0x9e3779b9u,
                                        .flush_caches = false, .call_timeout = std::chrono::seconds(120), .round_trip_seconds = round_trip_seconds_,
                                        .runner_limits = runner, .checker_limits = checker, .jail = std::move(jail), .profile = true});
    }
    if (r.failure != FailureKind::none) {
      e.diagnostics.detail += "; not profiled: its run under ncu failed: " + r.message + " [" + detail::tail(r.detail + "\n" + r.runner_output, 400) + "]";
      return;
    }
    auto launches = parse_ncu_csv(r.runner_output);
    if (!launches || launches->empty()) {
      e.diagnostics.detail += "; not profiled: " + (launches ? std::string("ncu profiled no kernel") : launches.error().message) + " [" +
                              detail::tail(r.runner_output, 400) + "]";
      return;
    }
    e.diagnostics = prefer_profile(e.diagnostics, *launches);  // the class and line; the figures and detail stay
    e.diagnostics.detail += "; profiled by ncu";
  }

  /// What kevo's PyTorch helper timed: PyTorch eager (the report's seconds) and torch.compile where asked.
  struct TorchTiming {
    RunReport report;
    TorchPeers peers;
  };

  /// PyTorch eager on the problem, timed by kevo's helper on fresh inputs with the caches flushed before each
  /// call (CUDA events on a GPU; on the CPU the larger of wall time and CPU time over the CPUs, the checker's
  /// clock), and torch.compile beside it where `peers`. The caller holds the timing gate.
  TorchTiming time_torch_locked(std::uint64_t seed, int repetitions, bool peers) {
    const std::uint64_t timing_seed = seed % (1ull << 40);
    const int timed_calls = std::max(3, repetitions);
    // The kept helper, where there is one: its answer is "ready", then the JSON line.
    if (TorchHelperServer* helper = torch_helper()) {
      const std::string request = fmt::format("{}\ntime {} {} {}\nquit\n", detail::torch_tensor_spec(problem_), timing_seed, timed_calls, peers ? 1 : 0);
      if (auto answer = helper->converse(request, std::chrono::seconds(600)); answer && answer->starts_with("ready\n"))
        return torch_timing_of(detail::last_json_line(*answer), *answer, repetitions);
    }
    SandboxLimits limits = checker_limits();
    limits.memory_bytes = 0;  // PyTorch maps far more address space than it uses
    limits.wall_time = std::chrono::seconds(600);
    std::vector<std::string> argv = torch_helper_argv("time");
    argv.insert(argv.end(), {"--repetitions", std::to_string(timed_calls), "--seed", std::to_string(timing_seed)});
    if (peers) argv.push_back("--peers");
    const SandboxResult r = run_sandboxed(argv, limits);
    return torch_timing_of(detail::last_json_line(r.stdout_text), r.stderr_text + r.stdout_text + r.setup_error, repetitions);
  }

  // PyTorch's timing from the helper's JSON line (`words`: all it said, for the failure).
  static TorchTiming torch_timing_of(const std::string& line, const std::string& words, int repetitions) {
    TorchTiming t;
    simdjson::dom::parser parser;
    simdjson::dom::element verdict;
    bool ok = false;
    if (parser.parse(line).get(verdict) || verdict["ok"].get(ok) || !ok) {
      std::string_view why;
      t.report.failure = FailureKind::sandbox_error;
      t.report.message = !verdict["error"].get(why) ? "PyTorch eager failed while timed: " + std::string(why)
                                                      : "PyTorch eager failed while timed: " + detail::tail(words, 400);
      return t;
    }
    if (verdict["eager_seconds"].get(t.report.seconds) || !(t.report.seconds > 0)) {
      t.report.failure = FailureKind::sandbox_error;
      t.report.message = "PyTorch eager's timing gave no time";
      return t;
    }
    t.report.samples = repetitions;
    if (verdict["compile_seconds"].get(t.peers.compile_seconds)) t.peers.compile_seconds = 0;
    if (std::string_view note; !verdict["compile_note"].get(note)) t.peers.compile_note = std::string(note);
    return t;
  }

  /// prepare() for a KernelBench-format problem: PyTorch eager's time is the reference's; torch.compile is timed beside it.
  expected<void, Error> prepare_torch_reference() {
    std::unique_lock timing_lock(gate_);
    TorchTiming t = time_torch_locked(1, options_.reference_repetitions, true);
    if (t.report.failure != FailureKind::none) return make_error(fmt::format("{}: {}", problem_.torch->file.string(), t.report.message));
    reference_seconds_ = t.report.seconds;
    torch_peers_ = t.peers;
    reference_clock_note_ = fmt::format("PyTorch {} eager on the {}, timed by kevo's helper: fresh inputs, caches flushed before each call, {}",
                                        problem_.torch->torch_version, problem_.torch->device,
                                        problem_.torch->device == "cpu" ? "the larger of wall time and CPU time over the CPUs"
                                                                        : "CUDA events");
    auto roofline = Toolchain::roofline(options_.cache_dir, options_.compiler);
    if (!roofline) return make_error(roofline.error().message);
    roofline_ = *roofline;
    return {};
  }

  /// Both re-timed in interleaved runs (ABBA...), each run checked on its own fresh inputs. An empty
  /// incumbent is PyTorch eager (a KernelBench-format problem's reference).
  expected<Comparison, Error> race(const std::filesystem::path& challenger, const std::filesystem::path& incumbent, std::uint64_t seed) {
    std::unique_lock timing(gate_);  // the whole race, so no compile interleaves with it
    std::vector<double> a_times, b_times;
    const int rounds = std::max(1, options_.compare_rounds);
    for (int round = 0; round < rounds; ++round) {
      for (int turn = 0; turn < 2; ++turn) {
        const bool challenger_turn = (turn == 0) == (round % 2 == 0);  // ABBA...
        const RunReport r = !challenger_turn && incumbent.empty()
                                ? time_torch_locked(seed + static_cast<std::uint64_t>(round), options_.repetitions, false).report
                                : run_harness_locked(challenger_turn ? challenger : incumbent, seed + static_cast<std::uint64_t>(round),
                                                     options_.warmup, options_.repetitions);
        const bool candidate_fault = r.failure != FailureKind::none && r.failure != FailureKind::sandbox_error;
        if (challenger_turn && candidate_fault)
          return Comparison{.challenger_failure = r.failure, .challenger_message = "on the race's fresh inputs: " + r.message};
        if (r.failure != FailureKind::none)
          return make_error(fmt::format("{} failed while re-timed: {}: {}", challenger_turn ? "challenger" : "incumbent", to_string(r.failure),
                                        r.message));
        // A race's figure is credited as a search's is: none past the roofline (the final
        // verification is a race too).
        if (challenger_turn) {
          const Roofline roof = roofline_of(r);
          const Diagnostics d = classify(r.bytes, r.flops, r.seconds, roof);
          if (d.roofline_fraction > 1.0)
            return Comparison{.challenger_failure = FailureKind::implausible, .challenger_message = "re-timed: " + implausible_message(d, roof)};
        }
        (challenger_turn ? a_times : b_times).push_back(r.seconds);
      }
    }
    return Comparison{.challenger_seconds = median(a_times), .incumbent_seconds = median(b_times)};
  }

  Problem problem_;
  EvaluatorOptions options_;
  std::mutex prepare_mutex_;
  bool prepared_ = false;
  bool builds_ready_ = false;
  std::string compiler_identity_;
  std::filesystem::path problem_dir_;
  double reference_seconds_ = 0;
  std::string reference_clock_note_;
  double round_trip_seconds_ = -1;  ///< the GPU checker's own round trip, from the reference's run (< 0: not yet measured)
  std::filesystem::path reference_build_;   // the reference as a candidate: the yardstick of compare_with_reference
  TorchPeers torch_peers_;                  // a KernelBench-format problem's torch.compile, timed by prepare()
  Roofline roofline_;
  TimingGate gate_;
  std::mutex profile_mutex_;
  double best_profiled_speedup_ = 0;  ///< the fastest candidate profiled so far: only a faster one is profiled
  std::atomic<std::size_t> compiles_{0}, cache_hits_{0}, runs_{0};
  RunExecutor executor_;
  std::once_flag torch_helper_made_;
  std::unique_ptr<TorchHelperServer> torch_helper_;  // last: gone first, while what its runs used still stands
  std::atomic<const TorchHelperServer*> kept_torch_helper_{nullptr};  // the same, for stats() from any thread
};

}  // namespace kevo::eval
