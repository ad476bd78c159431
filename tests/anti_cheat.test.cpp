// Hostile candidates for problems/softmax against CpuEvaluator: each one is contained, named (its
// FailureKind and a distinctive part of its message) and costs exactly one evaluation, and the
// evaluator keeps working afterwards. Where an attack only needs a system call to fail, the
// candidate proves the jail held by exiting with a code that names the errno (101 EPERM, 102
// ENOENT, 113 EACCES, 128 ENOSPC, 230 EROFS: see prove()), and where the call succeeds it answers
// correctly through reference(): a jail that lets the attack through turns the test red.
#include <kevo/problem_loader.hpp>
#include <kevo/eval/cpu_evaluator.hpp>

#include <catch2/catch.hpp>

#include "support/require_prepared.hpp"

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <string_view>

namespace Catch {
template <>
struct StringMaker<kevo::FailureKind> {
  static std::string convert(kevo::FailureKind kind) { return std::string(kevo::to_string(kind)); }
};
}  // namespace Catch

namespace kevo_tests::anti_cheat_test {

namespace {

namespace fs = std::filesystem;
using kevo::FailureKind;

const fs::path shipped = fs::path(KEVO_SOURCE_DIR) / "problems";

kevo::eval::CpuEvaluatorOptions hostile_options() {
  kevo::eval::CpuEvaluatorOptions o;
  o.cache_dir = fs::temp_directory_path() / "kevo-anti-cheat-cache";
  o.run_timeout = std::chrono::seconds(3);  // the hangs cost 3 s each
  // Each test is a process of its own, so each prepares the evaluator again, and the reference's 15
  // timed calls (each on fresh inputs, checked: about 0.33 s here) were most of a test's time. These
  // tests judge verdicts, not the reference's figure: 3 timed calls (issue 50).
  o.reference_repetitions = 3;
  // These candidates test the jail and the checker, the wall behind the screen (screening.hpp would
  // refuse most of them unrun).
  o.screen = false;
  return o;
}

kevo::Problem load(const fs::path& directory) {
  auto problem = kevo::load_problem(directory);
  if (!problem) FAIL(problem.error().message);
  return *problem;
}

// problems/softmax copied to a directory named `name`, the text `from` of its manifest replaced by
// `to`: one manifest rule under test, the rest exactly the shipped problem (no copy to drift).
fs::path softmax_variant(const std::string& name, const std::string& from, const std::string& to) {
  const fs::path directory = fs::temp_directory_path() / "kevo-anti-cheat-problems" / name;
  fs::remove_all(directory);
  fs::create_directories(directory);
  for (const char* file : {"reference.cpp", "kernel.cpp.tmpl"}) fs::copy_file(shipped / "softmax" / file, directory / file);
  std::ifstream in(shipped / "softmax" / "problem.json");
  std::string manifest((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = manifest.find(from);
  REQUIRE(at != std::string::npos);
  manifest.replace(at, from.size(), to);
  std::ofstream(directory / "problem.json") << manifest;
  return directory;
}

// One evaluator for every softmax case: prepared once, and still working after all of them.
kevo::eval::CpuEvaluator& softmax_evaluator() {
  static kevo::eval::CpuEvaluator evaluator(load(shipped / "softmax"), hostile_options());
  return evaluator;
}

// A name no other run uses, for files the candidates leave and the host must not see.
std::string random_name(std::string_view prefix) {
  std::random_device entropy;
  return fmt::format("{}{:08x}{:08x}", prefix, entropy(), entropy());
}

// What every hostile candidate includes: the problem's declarations and prove(). An exit code from
// 129 to 192 reads as 128 + a signal (bwrap's way of passing one on), so an errno of 29 or more is
// proved as 200 + errno: EROFS (30) exits with 230, not with 130, which would read as SIGINT.
constexpr std::string_view prelude = R"(#include "kevo_problem.hpp"

#include <cerrno>
#include <unistd.h>

// The jail held where a call failed: the exit code names the errno (EPERM 1 -> 101, ENOENT 2 -> 102,
// ENOSPC 28 -> 128, EROFS 30 -> 230).
[[noreturn]] inline void prove(int error) { _exit(error < 29 ? 100 + error : 200 + error); }
)";

// Evaluates `source` (after the prelude) on `evaluator` and checks that it cost exactly one run.
kevo::Evaluation evaluate_hostile(kevo::eval::CpuEvaluator& evaluator, std::string_view source, std::uint64_t seed = 11) {
  REQUIRE_PREPARED(evaluator);
  const std::size_t runs = evaluator.stats().runs;
  const kevo::Evaluation e = evaluator.evaluate(kevo::Candidate{.source = std::string(prelude) + std::string(source), .origin = "hostile"}, seed);
  INFO(to_string(e.failure) << ": " << e.diagnostics.message << "\n" << e.diagnostics.detail);
  CHECK(evaluator.stats().runs == runs + 1);  // one evaluation, no more (and it compiled)
  return e;
}

kevo::Evaluation evaluate_hostile(std::string_view source, std::uint64_t seed = 11) { return evaluate_hostile(softmax_evaluator(), source, seed); }

// The candidate failed as `kind`, with `part` in its message.
void require_named(const kevo::Evaluation& e, FailureKind kind, std::string_view part) {
  INFO(to_string(e.failure) << ": " << e.diagnostics.message << "\n" << e.diagnostics.detail);
  CHECK(e.failure == kind);
  CHECK_THAT(e.diagnostics.message, Catch::Contains(std::string(part)));
}

// "$NAME" in a candidate's source, replaced by a per-test value.
std::string with(std::string_view source, std::string_view placeholder, std::string_view value) {
  std::string out(source);
  for (std::size_t at; (at = out.find(placeholder)) != std::string::npos;) out.replace(at, placeholder.size(), value);
  return out;
}

// ---- the hostile candidates ----

// Writes through a null pointer (one the compiler cannot see is null).
constexpr std::string_view null_write = R"(
void kernel(const Shape&, const float*, float*) {
  volatile float* volatile target = nullptr;
  *target = 1.0f;
}
)";

// Spins forever.
constexpr std::string_view infinite_loop = R"(
void kernel(const Shape&, const float*, float*) {
  for (volatile unsigned long spin = 0;; spin = spin + 1) {
  }
}
)";

// The classic fork bomb: every process forks forever.
constexpr std::string_view fork_bomb = R"(
void kernel(const Shape&, const float*, float*) {
  for (;;) fork();
}
)";

// Forks once; a child would be a process outside the checker's freeze and CPU clock.
constexpr std::string_view fork_once = R"(
void kernel(const Shape& shape, const float* x, float* y) {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  if (child < 0) prove(errno);
  reference(shape, x, y);  // the jail let a process out
}
)";

// Starts a program (posix_spawn, which is how system() and popen() start theirs).
constexpr std::string_view spawn_program = R"(
#include <spawn.h>
void kernel(const Shape& shape, const float* x, float* y) {
  pid_t child;
  char* const argv[] = {const_cast<char*>("true"), nullptr};
  char* const envp[] = {nullptr};
  if (const int error = posix_spawn(&child, "/usr/bin/true", nullptr, nullptr, argv, envp); error != 0) prove(error);
  reference(shape, x, y);
}
)";

// Starts 10000 threads that sleep forever (detached, so that a failure throws rather than aborts).
constexpr std::string_view thread_bomb = R"(
#include <thread>
void kernel(const Shape& shape, const float* x, float* y) {
  for (int i = 0; i < 10000; ++i) std::thread([] { for (;;) pause(); }).detach();
  reference(shape, x, y);
}
)";

// Allocates 8 GiB and touches every page. (Touching 2 GiB a page at a time takes longer than the
// 3 s these tests allow a call on this machine, so the bomb asks for all of it at once.)
constexpr std::string_view memory_bomb = R"(
#include <memory>
void kernel(const Shape& shape, const float* x, float* y) {
  constexpr std::size_t bytes = std::size_t{8} << 30;
  std::unique_ptr<char[]> block(new char[bytes]);
  volatile char* p = block.get();
  for (std::size_t k = 0; k < bytes; k += 4096) p[k] = 1;
  reference(shape, x, y);
}
)";

// Prints 100 MB to stdout.
constexpr std::string_view output_flood = R"(
#include <cstring>
void kernel(const Shape& shape, const float* x, float* y) {
  static char block[1 << 20];
  std::memset(block, 'k', sizeof block);
  for (int i = 0; i < 100; ++i)
    if (write(1, block, sizeof block) < 0) prove(errno);
  reference(shape, x, y);
}
)";

// Opens sockets of every family that reaches beyond the process: the network, the host's Unix
// sockets, the kernel's netlink.
constexpr std::string_view open_socket = R"(
#include <sys/socket.h>
#include <initializer_list>
void kernel(const Shape& shape, const float* x, float* y) {
  for (int family : {AF_INET, AF_INET6, AF_UNIX, AF_NETLINK}) {
    if (socket(family, SOCK_STREAM, 0) >= 0) {
      reference(shape, x, y);  // a socket: the network (or the host) is one connect() away
      return;
    }
    if (errno != EPERM) prove(errno);
  }
  prove(EPERM);
}
)";

// Reads a secret the host left in its /tmp, the host's accounts, root's home, kevo's sources and
// the problem's generated checker. ($SECRET, $CHECKER: set by the test.)
constexpr std::string_view read_secrets = R"(
#include <cstdio>
#include <initializer_list>
void kernel(const Shape& shape, const float* x, float* y) {
  for (const char* path : {"$SECRET", "/etc/passwd", "/etc/shadow", "/root", "/root/.bashrc", "$SOURCE/README.md", "$CHECKER"}) {
    if (FILE* f = std::fopen(path, "r")) {
      std::fclose(f);
      reference(shape, x, y);  // it could read the file
      return;
    }
    if (errno != ENOENT) prove(errno);
  }
  prove(ENOENT);
}
)";

// Leaves files in /tmp, /var/tmp and /dev/shm (the jail's own, gone with it), then answers correctly.
constexpr std::string_view write_own_room = R"(
#include <fcntl.h>
#include <initializer_list>
#include <string>
void kernel(const Shape& shape, const float* x, float* y) {
  for (const char* dir : {"/tmp", "/var/tmp", "/dev/shm", "/scratch"}) {
    const std::string path = std::string(dir) + "/$NAME";
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) prove(errno);
    if (write(fd, "left behind\n", 12) != 12) prove(errno);
    close(fd);
  }
  reference(shape, x, y);
}
)";

// Creates a file among the system's programs.
constexpr std::string_view write_system = R"(
#include <fcntl.h>
void kernel(const Shape& shape, const float* x, float* y) {
  const int fd = open("/usr/$NAME", O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) prove(errno);
  close(fd);
  reference(shape, x, y);
}
)";

// Overwrites its own cached build (bound at /run/kevo/candidate), so a later run of the same
// source would run something else.
constexpr std::string_view write_own_build = R"(
#include <fcntl.h>
void kernel(const Shape& shape, const float* x, float* y) {
  const int fd = open("/run/kevo/candidate", O_WRONLY | O_APPEND);
  if (fd < 0) prove(errno);
  close(fd);
  reference(shape, x, y);
}
)";

// Fills /dev/shm with 512 MiB, in 4 MiB files (each under the 16 MiB file-size limit).
constexpr std::string_view fill_shm = R"(
#include <fcntl.h>
#include <string>
void kernel(const Shape& shape, const float* x, float* y) {
  static char block[1 << 20];
  for (int f = 0; f < 128; ++f) {
    const std::string path = "/dev/shm/fill-" + std::to_string(f);
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) prove(errno);
    for (int m = 0; m < 4; ++m) {
      block[0] = static_cast<char>(f + m);
      if (write(fd, block, sizeof block) < 0) prove(errno);  // a short write is followed by a failing one
    }
    close(fd);
  }
  reference(shape, x, y);  // 512 MiB fit: the cap did not hold
}
)";

// Writes nothing.
constexpr std::string_view writes_nothing = R"(
void kernel(const Shape&, const float*, float*) {}
)";

// Computes y, then scribbles on its input.
constexpr std::string_view mutate_input = R"(
void kernel(const Shape& shape, const float* x, float* y) {
  reference(shape, x, y);
  const_cast<float*>(x)[0] += 1.0f;
}
)";

// Writes one element past the end of y (into the checker's guard).
constexpr std::string_view write_past_end = R"(
void kernel(const Shape& shape, const float* x, float* y) {
  reference(shape, x, y);
  y[shape.R * shape.C] = 0.0f;
}
)";

// Remembers the outputs for each input address and shape, and replays them when both repeat.
constexpr std::string_view replay_by_address = R"(
#include <algorithm>
#include <map>
#include <tuple>
#include <vector>
void kernel(const Shape& shape, const float* x, float* y) {
  static std::map<std::tuple<const float*, long, long>, std::vector<float>> seen;
  const auto key = std::make_tuple(x, shape.R, shape.C);
  if (auto at = seen.find(key); at != seen.end()) {
    std::copy(at->second.begin(), at->second.end(), y);
    return;
  }
  reference(shape, x, y);
  seen[key].assign(y, y + shape.R * shape.C);
}
)";

// Fingerprints x by 16 sampled elements (and R and C), and replays the outputs of an earlier call
// with the same fingerprint.
constexpr std::string_view replay_by_samples = R"(
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <vector>
void kernel(const Shape& shape, const float* x, float* y) {
  static std::map<std::vector<std::uint32_t>, std::vector<float>> seen;
  const long n = shape.R * shape.C;
  std::vector<std::uint32_t> key = {static_cast<std::uint32_t>(shape.R), static_cast<std::uint32_t>(shape.C)};
  for (long k = 0; k < 16; ++k) {
    std::uint32_t word;
    std::memcpy(&word, x + k * (n - 1) / 15, 4);
    key.push_back(word);
  }
  if (auto at = seen.find(key); at != seen.end()) {
    std::copy(at->second.begin(), at->second.end(), y);
    return;
  }
  reference(shape, x, y);
  seen[key].assign(y, y + n);
}
)";

// Prints an ok verdict from a static constructor, then leaves before kevo's runner starts.
constexpr std::string_view forge_from_static_constructor = R"(
#include <cstdio>
namespace {
struct Forge {
  Forge() {
    std::fputs("{\"status\":\"ok\",\"seconds\":1e-9,\"bytes\":1,\"flops\":1,\"samples\":7}\n", stdout);
    std::fflush(stdout);
    _exit(0);
  }
} forge;
}  // namespace
void kernel(const Shape& shape, const float* x, float* y) { reference(shape, x, y); }
)";

// Writes an ok verdict to every descriptor it has (stdout, stderr, the control socket, ...), then
// leaves. (The descriptors handed over keep the numbers they had in the evaluating process, which
// depend on what else that process has open: all of 1..1023 are tried.)
constexpr std::string_view forge_on_every_descriptor = R"(
#include <cstring>
void kernel(const Shape&, const float*, float*) {
  const char* verdict = "{\"status\":\"ok\",\"seconds\":1e-9,\"bytes\":1,\"flops\":1,\"samples\":7}\n";
  for (int fd = 1; fd < 1024; ++fd) (void)!write(fd, verdict, std::strlen(verdict));
  _exit(0);
}
)";

// Sends the checker a well-formed "done" for the current call on the control socket (found by
// trying descriptors 3..1023), without computing anything, and then waits.
constexpr std::string_view forge_done = R"(
#include <sys/socket.h>
#include <cstdint>
struct Reply {
  std::uint64_t kind, seq;
  char text[240];
};
void kernel(const Shape&, const float*, float*) {
  static std::uint64_t seq = 0;
  Reply forged{};
  forged.kind = 2;  // reply_done
  forged.seq = ++seq;
  int sent_on = -1;
  for (int fd = 3; fd < 1024 && sent_on < 0; ++fd)
    if (send(fd, &forged, sizeof forged, MSG_NOSIGNAL) == static_cast<long>(sizeof forged)) sent_on = fd;
  if (sent_on < 0) prove(errno);
  for (;;) pause();  // the only answer the checker gets is the forged one
}
)";

// Computes the right outputs, then exits with success.
constexpr std::string_view exit_after_computing = R"(
#include <cstdlib>
void kernel(const Shape& shape, const float* x, float* y) {
  reference(shape, x, y);
  std::exit(0);
}
)";

// Returns at once and computes on a detached thread, out of the timer's sight.
constexpr std::string_view work_after_return = R"(
#include <thread>
void kernel(const Shape& shape, const float* x, float* y) {
  std::thread([shape, x, y] { reference(shape, x, y); }).detach();
}
)";

// Correct on every shape but the timing shape, where it does only the first half of the rows.
constexpr std::string_view half_on_timing_shape = R"(
void kernel(const Shape& shape, const float* x, float* y) {
  if (shape.R == 4096 && shape.C == 1024) {
    const Shape half{shape.R / 2, shape.C};
    reference(half, x, y);
    return;
  }
  reference(shape, x, y);
}
)";

// Attaches to its parent with ptrace, then signals every process it can see.
constexpr std::string_view ptrace_and_kill = R"(
#include <signal.h>
#include <sys/ptrace.h>
void kernel(const Shape& shape, const float* x, float* y) {
  if (ptrace(PTRACE_ATTACH, getppid(), nullptr, nullptr) == 0) {
    reference(shape, x, y);
    return;
  }
  if (errno != EPERM) prove(errno);
  if (kill(-1, SIGKILL) == 0) {
    reference(shape, x, y);
    return;
  }
  prove(errno);
}
)";

// Shrinks the shared arena under the checker: ftruncate on every descriptor that is a plain file
// (the arena is a memfd the runner keeps), then returns, so the checker reads memory that is gone.
constexpr std::string_view truncate_arena = R"(
#include <sys/stat.h>
void kernel(const Shape&, const float*, float*) {
  int truncated = 0, refused = 0;
  for (int fd = 3; fd < 64; ++fd) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (ftruncate(fd, 0) == 0) ++truncated;
    else refused = errno;
  }
  if (truncated == 0) prove(refused);
}
)";

// Reserves the whole address space the jail allows (PROT_NONE: no memory is used) from a static
// initializer, before kevo's runner maps the checker's arena in the same process.
constexpr std::string_view take_address_space = R"(
#include <sys/mman.h>
namespace {
struct TakeAll {
  TakeAll() {
    for (std::size_t size = std::size_t{1} << 46; size >= 4096; size /= 2)
      while (mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) != MAP_FAILED) {
      }
  }
} take_all;
}  // namespace
void kernel(const Shape& shape, const float* x, float* y) { reference(shape, x, y); }
)";

// Computes the timing shape's rows on a helper thread in the moments after the checker has placed
// the next call's inputs and before it starts the clock (it flushes the caches then), so kernel()
// has fewer rows left: the reference's work, part of it where the timer does not look. The helper
// watches the arena, and knows when it saw inputs arrive while it ran: between the start of its
// last scan that found none and finding them, it was off its CPU for under 10 ms (a runner stopped
// between calls is off far longer: the checker verifies, draws and places inputs meanwhile). On the
// last call on the timing shape (the near-replay check, after 1 + 2 + 7 others) it exits with the
// percentage of the timed calls' rows done that way before kernel() was called: 0 where the runner
// is kept stopped from one call's check until the next call's clock starts.
constexpr std::string_view head_start = R"(
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <thread>
namespace {
constexpr std::uint32_t poison = 0x7fc0deadu;  // what the checker fills unwritten outputs with
std::mutex working;
std::atomic<bool> stop{false};
// Guarded by `working`: the output the helper is filling, how far it got, and whether it saw the
// inputs arrive.
float* target = nullptr;
long rows_done = 0;
bool seen_arriving = false;

std::uint32_t word(const float* p) {
  std::uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}

long clock_ns(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

// The mapping that holds `inside`: the checker's arena.
bool mapping_of(const void* inside, unsigned char** base, std::size_t* bytes) {
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (!maps) return false;
  char line[512];
  bool found = false;
  const unsigned long at = reinterpret_cast<unsigned long>(inside);
  while (!found && std::fgets(line, sizeof line, maps)) {
    unsigned long start = 0, end = 0;
    if (std::sscanf(line, "%lx-%lx", &start, &end) == 2 && start <= at && at < end) {
      *base = reinterpret_cast<unsigned char*>(start);
      *bytes = end - start;
      found = true;
    }
  }
  std::fclose(maps);
  return found;
}

// A freshly placed output: every row poisoned, after a word that is not.
bool placed(const float* y, long R, long C) {
  if (word(y - 1) == poison) return false;
  for (long r = 0; r < R; ++r)
    if (word(y + r * C) != poison || word(y + r * C + C - 1) != poison) return false;
  return true;
}

// Each slot of the arena holds x then y, `span` bytes each, shifted by 64 bytes times 0..6.
void helper(unsigned char* arena, std::size_t bytes, long R, long C) {
  const std::size_t slot = bytes / 2, span = slot / 2;
  long empty_wall = 0, empty_cpu = 0;  // when the last scan that found nothing began
  for (;;) {
    if (stop.load()) {
      std::this_thread::yield();
      continue;
    }
    std::lock_guard<std::mutex> lock(working);
    if (stop.load()) continue;
    if (target && rows_done < R) {  // one row a turn, so kernel() can take over at once
      const float* x = reinterpret_cast<const float*>(reinterpret_cast<unsigned char*>(target) - span);
      const Shape row{1, C};
      reference(row, x + rows_done * C, target + rows_done * C);
      ++rows_done;
      continue;
    }
    const long wall = clock_ns(CLOCK_MONOTONIC), cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    bool found = false;
    for (std::size_t s = 0; s < 2; ++s)
      for (std::size_t h = 0; h < 7; ++h) {
        float* y = reinterpret_cast<float*>(arena + s * slot + span + 64 * h);
        if (y != target && placed(y, R, C)) {
          target = y;
          rows_done = 0;
          const long off_cpu = (clock_ns(CLOCK_MONOTONIC) - empty_wall) - (clock_ns(CLOCK_THREAD_CPUTIME_ID) - empty_cpu);
          seen_arriving = off_cpu < 10000000;
          found = true;
        }
      }
    if (!found) {
      empty_wall = wall;
      empty_cpu = cpu;
    }
  }
}
}  // namespace

void kernel(const Shape& shape, const float* x, float* y) {
  static int timing_calls = 0;
  static long ahead = 0, total = 0;
  if (shape.R != 4096 || shape.C != 1024) {
    reference(shape, x, y);
    return;
  }
  if (++timing_calls == 1) {
    unsigned char* base = nullptr;
    std::size_t bytes = 0;
    if (mapping_of(x, &base, &bytes)) std::thread(helper, base, bytes, shape.R, shape.C).detach();
  }
  if (timing_calls == 11) _exit(static_cast<int>(100 * ahead / total));
  stop = true;
  std::lock_guard<std::mutex> lock(working);
  const long done = target == y ? rows_done : 0;
  if (timing_calls > 1) {
    ahead += seen_arriving ? done : 0;
    total += shape.R;
  }
  target = nullptr;
  rows_done = 0;
  const Shape rest{shape.R - done, shape.C};
  if (rest.R > 0) reference(rest, x + done * shape.C, y + done * shape.C);
  stop = false;
}
)";

}  // namespace

// ---- escapes: processes, threads, memory, output, the network, the file system ----

TEST_CASE("anti-cheat: a null-pointer write is a crash named SIGSEGV") {
  require_named(evaluate_hostile(null_write), FailureKind::crash, "SIGSEGV");
}

TEST_CASE("anti-cheat: an infinite loop times out") {
  require_named(evaluate_hostile(infinite_loop), FailureKind::timeout, "no answer within 3 s in kernel() on shape R=1 C=1");
}

TEST_CASE("anti-cheat: a fork bomb spins on EPERM until it times out, and one fork proves EPERM") {
  require_named(evaluate_hostile(fork_bomb), FailureKind::timeout, "no answer within 3 s");
  require_named(evaluate_hostile(fork_once), FailureKind::crash, "exited with code 101 in kernel()");
  require_named(evaluate_hostile(spawn_program), FailureKind::crash, "exited with code 101 in kernel()");
}

TEST_CASE("anti-cheat: a thread bomb stops at the process limit, and kernel() throws") {
  // The process limit (RLIMIT_NPROC, 64 tasks under the run's own uid; the stacks' address space
  // would stop it a little later) refuses a thread: std::thread throws std::system_error (EAGAIN),
  // which the runner catches and reports.
  require_named(evaluate_hostile(thread_bomb), FailureKind::crash, "kernel() threw Resource temporarily unavailable");
}

TEST_CASE("anti-cheat: an 8 GiB memory bomb stops at the address-space limit") {
  require_named(evaluate_hostile(memory_bomb), FailureKind::memory_limit, "ran out of memory (limit 2048 MiB): std::bad_alloc");
}

TEST_CASE("anti-cheat: 100 MB on stdout is cut at the output cap") {
  require_named(evaluate_hostile(output_flood), FailureKind::output_limit, "printed more than 1048576 bytes");
}

TEST_CASE("anti-cheat: sockets are refused (EPERM)") {
  require_named(evaluate_hostile(open_socket), FailureKind::crash, "exited with code 101 in kernel()");
}

TEST_CASE("anti-cheat: the host's secrets, accounts, sources and checker are not there (ENOENT)") {
  const fs::path secret = "/tmp/" + random_name("kevo-secret-");
  struct Removed {
    fs::path path;
    ~Removed() { fs::remove(path); }
  } removed{secret};
  std::ofstream(secret) << "the host's secret\n";
  REQUIRE(fs::exists(secret));
  auto& evaluator = softmax_evaluator();
  REQUIRE_PREPARED(evaluator);
  const std::string source = with(with(with(read_secrets, "$SECRET", secret.string()), "$SOURCE", KEVO_SOURCE_DIR),
                                  "$CHECKER", (evaluator.build_directory() / "checker.cpp").string());
  require_named(evaluate_hostile(source), FailureKind::crash, "exited with code 102 in kernel()");
}

TEST_CASE("anti-cheat: files written in the jail's /tmp, /var/tmp and /dev/shm never reach the host") {
  const std::string name = random_name("kevo-left-behind-");
  const kevo::Evaluation e = evaluate_hostile(with(write_own_room, "$NAME", name));
  INFO(e.diagnostics.message << "\n" << e.diagnostics.detail);
  CHECK(e.ok());  // the writes succeed, in the jail's own tmpfs
  for (const char* dir : {"/tmp", "/var/tmp", "/dev/shm", "/scratch"}) {
    INFO(dir);
    CHECK_FALSE(fs::exists(fs::path(dir) / name));
  }
}

TEST_CASE("anti-cheat: the system and the candidate's own build are read-only") {
  const std::string name = random_name("kevo-escape-");
  require_named(evaluate_hostile(with(write_system, "$NAME", name)), FailureKind::crash, "exited with code 230 in kernel()");  // EROFS
  CHECK_FALSE(fs::exists(fs::path("/usr") / name));
  // The build travels in as a read-only copy of mode 0555 (bwrap --ro-bind-data): the permission
  // check comes before the read-only mount's (EACCES 13).
  require_named(evaluate_hostile(write_own_build), FailureKind::crash, "exited with code 113 in kernel()");
}

TEST_CASE("anti-cheat: filling /dev/shm stops at the tmpfs cap (ENOSPC)") {
  require_named(evaluate_hostile(fill_shm), FailureKind::crash, "exited with code 128 in kernel()");
}

TEST_CASE("anti-cheat: ptrace and kill(-1) are refused (EPERM)") {
  require_named(evaluate_hostile(ptrace_and_kill), FailureKind::crash, "exited with code 101 in kernel()");
}

// ---- cheats on the results ----

TEST_CASE("anti-cheat: a kernel that writes nothing leaves its outputs unwritten") {
  require_named(evaluate_hostile(writes_nothing), FailureKind::unwritten_output, "y: 1 of 1 elements left unwritten");
}

TEST_CASE("anti-cheat: writing into the input is caught") {
  require_named(evaluate_hostile(mutate_input), FailureKind::mutated_input, "changed its input x (element 0");
}

TEST_CASE("anti-cheat: writing past the output's end is caught") {
  require_named(evaluate_hostile(write_past_end), FailureKind::wrong_answer, "wrote past its end");
}

TEST_CASE("anti-cheat: replaying outputs by input address is caught") {
  const kevo::Evaluation e = evaluate_hostile(replay_by_address);
  INFO(to_string(e.failure) << ": " << e.diagnostics.message);
  CHECK((e.failure == FailureKind::wrong_answer || e.failure == FailureKind::replayed_output));
  CHECK_THAT(e.diagnostics.message, Catch::Contains("on the timing shape R=4096 C=1024"));
}

TEST_CASE("anti-cheat: replaying outputs by a sampled fingerprint of the inputs is caught") {
  // The last check changes 1 input element in 256: with seed 11 none of the 16 samples is among
  // them (so for about 94% of seeds), and the cache replays the last timed call's outputs.
  require_named(evaluate_hostile(replay_by_samples), FailureKind::replayed_output, "elements are an earlier call's outputs");
}

TEST_CASE("anti-cheat: a kernel correct on every shape but the timing shape is caught there") {
  require_named(evaluate_hostile(half_on_timing_shape), FailureKind::unwritten_output,
                "y: 2097152 of 4194304 elements left unwritten (first at index 2097152) on the timing shape");
}

TEST_CASE("anti-cheat: work left to a detached thread is not credited") {
  const kevo::Evaluation e = evaluate_hostile(work_after_return);
  INFO(to_string(e.failure) << ": " << e.diagnostics.message);
  CHECK((e.failure == FailureKind::unwritten_output || e.failure == FailureKind::wrong_answer));
}

// ---- forged verdicts ----

TEST_CASE("anti-cheat: a verdict printed by a static constructor is a crash while starting") {
  require_named(evaluate_hostile(forge_from_static_constructor), FailureKind::crash,
                "exited with code 0 while starting, before kevo's runner reached main() (a static initializer?)");
}

TEST_CASE("anti-cheat: a verdict written to every descriptor is not taken") {
  // Descriptors 1 and 2 are the runner's own pipes (never read as a verdict); one of the others is
  // the control socket, where the JSON line arrives as one message of the wrong size.
  require_named(evaluate_hostile(forge_on_every_descriptor), FailureKind::bad_report, "bytes that are not a message of kevo's runner in kernel()");
}

TEST_CASE("anti-cheat: a forged \"done\" without computing leaves the outputs unwritten") {
  require_named(evaluate_hostile(forge_done), FailureKind::unwritten_output, "y: 1 of 1 elements left unwritten");
}

TEST_CASE("anti-cheat: exiting with success after computing is a crash") {
  require_named(evaluate_hostile(exit_after_computing), FailureKind::crash, "exited with code 0 in kernel() on shape R=1 C=1");
}

TEST_CASE("anti-cheat: the shared arena cannot be shrunk under the checker") {
  // Given the arena's memfd, ftruncate() would shrink it, and the checker's next read of the arena
  // would be a SIGBUS in the checker, which reads as kevo's fault (sandbox_error). The runner closes
  // the descriptor once it has mapped the arena, so the candidate finds no file to shrink (exit 100:
  // no descriptor refused it); were one left, the seals against resizing (F_SEAL_SHRINK |
  // F_SEAL_GROW | F_SEAL_SEAL) would refuse it with EPERM (exit 101).
  require_named(evaluate_hostile(truncate_arena), FailureKind::crash, "exited with code 100 in kernel() on shape R=1 C=1");
}

TEST_CASE("anti-cheat: a static initializer that takes the address space is the candidate's crash, named") {
  // The runner cannot map the checker's arena beside it: that is the candidate's doing (the same
  // runner started beside the reference), so a crash named by the runner, not kevo's sandbox_error.
  require_named(evaluate_hostile(take_address_space), FailureKind::crash,
                "kevo's runner could not start in the candidate's process (its static initializers ran first): kevo's runner could "
                "not map the checker's arena: Cannot allocate memory");
}

TEST_CASE("anti-cheat: no work is done between placing a call's inputs and starting its clock") {
  // head_start exits with the percentage of the timed calls' rows its helper thread computed
  // after the inputs arrived and before kernel() was called, while the runner was free to run:
  // work no clock saw, which would pass for a speedup of up to 2x.
  require_named(evaluate_hostile(head_start), FailureKind::crash,
                "exited with code 0 in kernel() on the timing shape R=4096 C=1024 (inputs of the last timed call");
}

// ---- the problem's own numbers ----

TEST_CASE("anti-cheat: a tolerance under which constants pass is refused by prepare()") {
  // Under abs 1.0, writing 0 everywhere passes.
  kevo::eval::CpuEvaluator loose(load(softmax_variant("loose_softmax", "\"abs\": 1e-7", "\"abs\": 1.0")), hostile_options());
  auto ready = loose.prepare();
  REQUIRE_FALSE(ready);
  CHECK_THAT(ready.error().message, Catch::Contains("the tolerance is too loose"));
  CHECK_THAT(ready.error().message, Catch::Contains("loose_softmax/problem.json"));
}

TEST_CASE("anti-cheat: a negative tolerance is refused by load_problem()") {
  auto problem = kevo::load_problem(softmax_variant("negative_tolerance", "\"abs\": 1e-7", "\"abs\": -1e-7"));
  REQUIRE_FALSE(problem);
  CHECK_THAT(problem.error().message, Catch::Contains("negative_tolerance/problem.json"));
  CHECK_THAT(problem.error().message, Catch::Contains("tolerance.abs"));
}

TEST_CASE("anti-cheat: a figure past the roofline is refused as implausible, in a run and in a race") {
  // 10000 times the real traffic: an honest kernel measures past the roofline.
  kevo::eval::CpuEvaluator overstated(load(softmax_variant("overstated_bytes", "\"bytes_model\": \"8.0 * R * C\"",
                                                           "\"bytes_model\": \"80000.0 * R * C\"")), hostile_options());
  REQUIRE_PREPARED(overstated);
  const std::size_t runs = overstated.stats().runs;
  const kevo::Evaluation e = overstated.evaluate(overstated.default_candidate(), 11);
  INFO(e.diagnostics.message << "\n" << e.diagnostics.detail);
  CHECK(overstated.stats().runs == runs + 1);
  require_named(e, FailureKind::implausible, "of this machine's measured roofline");
  CHECK(e.speedup == 0);
  // A race is held to the same rule, on its own runs: the new best's settling and the final
  // verification figure are both races.
  auto race = overstated.compare_with_reference(overstated.default_candidate(), 12);
  REQUIRE(race);
  INFO(race->challenger_message);
  CHECK(race->challenger_failure == FailureKind::implausible);
  CHECK_THAT(race->challenger_message, Catch::StartsWith("re-timed: implausible: ") && Catch::Contains("of this machine's measured roofline"));
  auto against_incumbent = overstated.compare(overstated.default_candidate(), overstated.reference_candidate(), 13);
  REQUIRE(against_incumbent);
  CHECK(against_incumbent->challenger_failure == FailureKind::implausible);
}

// ---- and the evaluator still works ----

TEST_CASE("anti-cheat: after the hostile suite, correct candidates (one of them threaded) still evaluate ok") {
  auto& evaluator = softmax_evaluator();
  REQUIRE_PREPARED(evaluator);
  const kevo::Problem& problem = evaluator.problem();
  kevo::Knobs threaded = problem.default_knobs();
  threaded["threads"] = "2";
  for (const kevo::Candidate& candidate : {evaluator.default_candidate(), kevo::Candidate{.source = problem.render(threaded), .knobs = threaded}}) {
    INFO(kevo::to_string(candidate.knobs));
    const std::size_t runs = evaluator.stats().runs;
    const kevo::Evaluation e = evaluator.evaluate(candidate, 13);
    INFO(to_string(e.failure) << ": " << e.diagnostics.message << "\n" << e.diagnostics.detail);
    CHECK(e.ok());
    CHECK(e.speedup > 0.33);
    CHECK(evaluator.stats().runs == runs + 1);
  }
}

}  // namespace kevo_tests::anti_cheat_test
