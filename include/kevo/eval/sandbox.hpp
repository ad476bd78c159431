// kevo/eval/sandbox.hpp: run one program under limits and collect what it did. This is the piece
// every executor shares (local processes now, Slurm jobs later): argv in; exit status, signal,
// captured stdout/stderr, and whether a limit stopped it out.
//
//   kevo::eval::SandboxLimits limits{.wall_time = std::chrono::seconds(3)};
//   kevo::eval::SandboxResult r = kevo::eval::run_sandboxed({"/usr/bin/env"}, limits);
//   if (r.timed_out) ...; fmt::print("{}", r.stdout_text);
//
// How a run is contained (Linux):
// - the child starts its own process group and, where allowed, enters fresh PID and network
//   namespaces behind a tiny reaper that is pid 1 there, so anything it forks dies with it;
// - when kevo dies (even of SIGKILL), the child kills its whole group (PR_SET_PDEATHSIG to a
//   handler), so a compiler's own children (g++'s cc1plus and as) go too, not only the compiler;
// - rlimits on CPU (soft below hard, so SIGXCPU names the cause), address space, file size,
//   open files and processes (after dropping root to an unprivileged uid of the run's own, since
//   root ignores NPROC), no core files, PR_SET_NO_NEW_PRIVS;
// - stdin is /dev/null, the environment is rebuilt from scratch (nothing of the parent's), the
//   program is opened before privileges drop and started with fexecve;
// - the child's first act is to close every descriptor it inherited but its own, and no other run
//   forks until it has (the fork gate): a file that another thread was writing is never held open
//   by a child of a run, so a program written and then started never fails with ETXTBSY;
// - stdout and stderr are read through pipes with a cap; past it the group is killed;
// - a wall-clock timeout kills the whole group; the child is always reaped.
//
// Why one file of about 550 lines: the plan made before fork (rlimits, uid, namespaces, descriptors)
// and the supervision after it are one protocol; split, the plan would travel between files.
#pragma once

#include <kevo/expected.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kevo::eval {

/// Limits for one sandboxed run. A zero limit leaves that resource as the parent has it.
struct SandboxLimits {
  std::chrono::milliseconds wall_time{20'000};
  std::chrono::seconds cpu_time{0};          ///< RLIMIT_CPU soft limit (hard = soft + 1 s)
  std::size_t memory_bytes = 0;              ///< RLIMIT_AS
  std::size_t file_size_bytes = 64u << 20;   ///< RLIMIT_FSIZE
  std::size_t output_bytes = 1u << 20;       ///< cap on stdout and on stderr, each
  int max_processes = 0;                     ///< RLIMIT_NPROC (set only with the uid drop: it counts per uid)
  int max_open_files = 0;                    ///< RLIMIT_NOFILE
  bool drop_privileges = true;               ///< when root: run as `unprivileged_uid`
  bool isolate = true;                       ///< try new PID + network namespaces
  /// The uid to drop to. 0: a uid of the run's own (`per_run_uid_base` + the child's pid), so
  /// that runs side by side never share a process count (RLIMIT_NPROC is per uid) nor can signal
  /// each other.
  unsigned unprivileged_uid = 0;
  unsigned per_run_uid_base = 1'000'000;
  std::filesystem::path working_directory = "/";
  std::vector<std::string> environment = {"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C", "LC_ALL=C"};
  /// Descriptors the program inherits at the same numbers (a control socket, a seccomp filter,
  /// bwrap's info pipe). The caller's copies are closed once the child is forked, so that the
  /// program's end of a socket is held by the program alone and its death reads as end-of-file.
  std::vector<int> handed_over_fds = {};
};

/// What a sandboxed run did.
struct SandboxResult {
  bool started = false;           ///< false: the program never ran (see setup_error)
  bool exited = false;            ///< exited by itself with `exit_code`
  int exit_code = 0;
  int signal = 0;                 ///< the signal that ended it, if one did
  bool timed_out = false;         ///< ran past the wall-clock limit; kevo killed it
  bool output_limit = false;      ///< wrote past the output cap; kevo killed it
  bool isolated = false;          ///< ran in its own PID and network namespaces
  std::string stdout_text;        ///< at most `output_bytes`
  std::string stderr_text;        ///< at most `output_bytes`
  std::string setup_error;        ///< why the sandbox could not start the program
  std::chrono::duration<double> wall{0};

  bool ok() const { return started && exited && exit_code == 0 && !timed_out && !output_limit; }
};

/// "SIGSEGV (segmentation fault)" for a signal number.
inline std::string signal_name(int sig) {
  const char* abbrev = nullptr;
  switch (sig) {
    case SIGSEGV: abbrev = "SIGSEGV"; break;
    case SIGABRT: abbrev = "SIGABRT"; break;
    case SIGFPE: abbrev = "SIGFPE"; break;
    case SIGILL: abbrev = "SIGILL"; break;
    case SIGBUS: abbrev = "SIGBUS"; break;
    case SIGKILL: abbrev = "SIGKILL"; break;
    case SIGTERM: abbrev = "SIGTERM"; break;
    case SIGXCPU: abbrev = "SIGXCPU"; break;
    case SIGXFSZ: abbrev = "SIGXFSZ"; break;
    case SIGPIPE: abbrev = "SIGPIPE"; break;
    case SIGTRAP: abbrev = "SIGTRAP"; break;
    case SIGSYS: abbrev = "SIGSYS"; break;
    default: break;
  }
  const char* description = strsignal(sig);
  if (abbrev) return fmt::format("{} ({})", abbrev, description ? description : "?");
  return fmt::format("signal {} ({})", sig, description ? description : "?");
}

/// Searches PATH (of this process) for a program name without a slash.
inline std::optional<std::filesystem::path> find_program(std::string_view name) {
  namespace fs = std::filesystem;
  if (name.find('/') != std::string_view::npos) {
    if (::access(std::string(name).c_str(), X_OK) == 0) return fs::path(name);
    return std::nullopt;
  }
  const char* path = std::getenv("PATH");
  std::string_view dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  while (!dirs.empty()) {
    const auto colon = dirs.find(':');
    const std::string_view dir = dirs.substr(0, colon);
    fs::path candidate = fs::path(dir.empty() ? "." : std::string(dir)) / std::string(name);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string_view::npos) break;
    dirs.remove_prefix(colon + 1);
  }
  return std::nullopt;
}

namespace detail {

// Records the children write on the status pipe: {kind, value}. The first child's first record
// says that it holds no descriptor but its own any more (status_record_inherited_closed).
enum : int { status_record_wait = 0, status_record_setup = 1, status_record_isolated = 2, status_record_inherited_closed = 3 };
struct StatusRecord {
  int kind;
  int value;   // a wait status, or an errno
  int stage;   // for setup failures: which step failed
};

inline const char* setup_stage_name(int stage) {
  static const char* names[] = {"fork", "setrlimit", "setgroups/setgid/setuid", "prctl(NO_NEW_PRIVS)", "chdir", "fexecve"};
  return stage >= 0 && stage < 6 ? names[stage] : "setup";
}

inline void write_all(int fd, const void* data, std::size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

// Closes every descriptor >= 3 except those in `keep` (sorted here); only system calls (fork-safe).
inline void close_other_descriptors(int* keep, std::size_t count) {
  std::sort(keep, keep + count);
  auto close_range_or_loop = [](unsigned first, unsigned last) {
    if (first > last) return;
#ifdef SYS_close_range
    if (::syscall(SYS_close_range, first, last, 0) == 0) return;
#endif
    struct rlimit rl {};
    ::getrlimit(RLIMIT_NOFILE, &rl);
    const unsigned top = std::min<unsigned long>(last, rl.rlim_cur == RLIM_INFINITY ? 65536 : rl.rlim_cur);
    for (unsigned fd = first; fd <= top; ++fd) ::close(static_cast<int>(fd));
  };
  unsigned next = 3;
  for (std::size_t i = 0; i < count; ++i) {
    if (keep[i] < 3 || static_cast<unsigned>(keep[i]) < next) continue;
    close_range_or_loop(next, static_cast<unsigned>(keep[i]) - 1);
    next = static_cast<unsigned>(keep[i]) + 1;
  }
  close_range_or_loop(next, ~0u);
}

// The fork gate. A child holds a copy of every descriptor of this process, close-on-exec or not,
// from fork until it closes it: a file that another thread is writing (a program it then starts, as
// a test or a caller writes one) stays open for writing in that child meanwhile, and exec of that
// file fails with ETXTBSY ("Text file busy"). So each run holds this gate from its fork until its
// child has closed every inherited descriptor: a program whose writer closed it before starting
// it is then held open by no child of any run, whichever thread forked it and when.
inline std::mutex& fork_gate() {
  static std::mutex gate;
  return gate;
}

// Reads from `fd` until `size` bytes or end-of-file; what was read.
inline std::size_t read_fully(int fd, void* data, std::size_t size) {
  char* p = static_cast<char*>(data);
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, p + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  return done;
}

// Everything the child needs, prepared before fork so that the child only makes system calls.
struct ChildPlan {
  std::vector<char*> argv;
  std::vector<char*> envp;
  int program_fd = -1;
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  int status_fd = -1;
  const SandboxLimits* limits = nullptr;
  pid_t parent = 0;  // kevo: when it dies, the run's whole group dies
  const char* working_directory = "/";
  bool drop_uid = false;
  uid_t run_uid = 65534;
};

[[noreturn]] inline void fail_setup(int status_fd, int stage) {
  const StatusRecord record{status_record_setup, errno, stage};
  write_all(status_fd, &record, sizeof record);
  _exit(127);
}

// The workload: limits, privileges, exec. Never returns.
[[noreturn]] inline void exec_workload(const ChildPlan& plan) {
  const SandboxLimits& l = *plan.limits;
  auto set_limit = [&](int resource, rlim_t soft, rlim_t hard) {
    const struct rlimit rl{soft, hard};
    if (::setrlimit(resource, &rl) != 0) fail_setup(plan.status_fd, 1);
  };
  set_limit(RLIMIT_CORE, 0, 0);
  if (l.cpu_time.count() > 0) set_limit(RLIMIT_CPU, static_cast<rlim_t>(l.cpu_time.count()), static_cast<rlim_t>(l.cpu_time.count() + 1));
  if (l.memory_bytes > 0) set_limit(RLIMIT_AS, l.memory_bytes, l.memory_bytes);
  if (l.file_size_bytes > 0) set_limit(RLIMIT_FSIZE, l.file_size_bytes, l.file_size_bytes);
  if (l.max_open_files > 0) set_limit(RLIMIT_NOFILE, static_cast<rlim_t>(l.max_open_files), static_cast<rlim_t>(l.max_open_files));
  // RLIMIT_NPROC counts every process of the uid: only a uid of the run's own makes it a limit on the
  // run (under the caller's uid it would count the caller's other processes, and a desktop's
  // hundred would fail every threaded candidate).
  if (l.max_processes > 0 && plan.drop_uid)
    set_limit(RLIMIT_NPROC, static_cast<rlim_t>(l.max_processes), static_cast<rlim_t>(l.max_processes));
  if (plan.drop_uid) {
    const uid_t uid = plan.run_uid;
    const gid_t gid = static_cast<gid_t>(uid);
    const pid_t reaper = ::getppid();
    if (::setgroups(0, nullptr) != 0 || ::setresgid(gid, gid, gid) != 0 || ::setresuid(uid, uid, uid) != 0)
      fail_setup(plan.status_fd, 2);
    // A change of uid clears the parent-death signal: set it again.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != reaper) _exit(127);
  }
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail_setup(plan.status_fd, 3);
  if (::chdir(plan.working_directory) != 0) fail_setup(plan.status_fd, 4);
  ::fexecve(plan.program_fd, plan.argv.data(), plan.envp.data());
  fail_setup(plan.status_fd, 5);
}

// Forks the workload, reaps every child until the workload is gone, reports its wait status.
// Once the program is started, a process that only waits for it holds nothing of the program's: a socket
// handed over to the program then ends when the program does (its peer sees it closed), not when the
// waiting process gets round to exiting.
inline void keep_only_status_pipe(const ChildPlan& plan) {
  int keep[1] = {plan.status_fd};
  close_other_descriptors(keep, 1);
}

[[noreturn]] inline void run_reaper(const ChildPlan& plan) {
  const pid_t workload = ::fork();
  if (workload < 0) fail_setup(plan.status_fd, 0);
  if (workload == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    exec_workload(plan);
  }
  keep_only_status_pipe(plan);
  int status = 0;
  for (;;) {
    int st = 0;
    const pid_t done = ::waitpid(-1, &st, 0);
    if (done < 0 && errno == EINTR) continue;
    if (done < 0) break;
    if (done == workload) {
      status = st;
      break;
    }
  }
  const StatusRecord record{status_record_wait, status, 0};
  write_all(plan.status_fd, &record, sizeof record);
  // As pid 1 of a PID namespace, exiting takes every leftover process of the namespace with it.
  _exit(0);
}

// The signal the first child gets when kevo dies. Not SIGKILL: the first child must live long
// enough to kill its group, or a compiler's children outlive it (the compiler alone would die).
inline constexpr int parent_death_signal = SIGHUP;

inline pid_t& own_group() {
  static pid_t group = 0;  // set in the first child only, after it leads its own group
  return group;
}

inline void kill_own_group(int) {
  if (own_group() > 0) ::kill(-own_group(), SIGKILL);  // the run's group, never kevo's own
  ::_exit(137);
}

// The first child: first of all closes what it inherited but its own descriptors (the fork gate
// waits for that), then its own process group, takes the group down when kevo dies, tries the namespaces.
[[noreturn]] inline void run_first_child(ChildPlan& plan, bool try_isolate) {
  ::dup2(plan.stdin_fd, 0);
  ::dup2(plan.stdout_fd, 1);
  ::dup2(plan.stderr_fd, 2);
  int keep[18] = {plan.status_fd, plan.program_fd};
  std::size_t kept = 2;
  for (int fd : plan.limits->handed_over_fds) {
    if (kept == 18) break;
    ::fcntl(fd, F_SETFD, 0);  // created close-on-exec for thread safety; the program inherits it
    keep[kept++] = fd;
  }
  close_other_descriptors(keep, kept);
  const StatusRecord closed{status_record_inherited_closed, 0, 0};
  write_all(plan.status_fd, &closed, sizeof closed);
  if (::setpgid(0, 0) == 0) own_group() = ::getpid();
  if (plan.limits->unprivileged_uid == 0) plan.run_uid = static_cast<uid_t>(plan.limits->per_run_uid_base + static_cast<unsigned>(::getpid()));
  struct sigaction on_parent_death {};
  on_parent_death.sa_handler = kill_own_group;
  ::sigaction(parent_death_signal, &on_parent_death, nullptr);
  // The calling thread's mask is inherited (and kept across exec): a blocked signal here would
  // never take the group down, and the program should start with none blocked anyway.
  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::prctl(PR_SET_PDEATHSIG, parent_death_signal);
  if (::getppid() != plan.parent) kill_own_group(0);  // kevo died before the line above
  // Root may unshare directly; anyone else may where unprivileged user namespaces are allowed.
  if (try_isolate && (::unshare(CLONE_NEWPID | CLONE_NEWNET) == 0 ||
                      (!plan.drop_uid && ::unshare(CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET) == 0))) {
    const StatusRecord record{status_record_isolated, 1, 0};
    write_all(plan.status_fd, &record, sizeof record);
    // Our next child is pid 1 of the new namespace: it is the reaper.
    const pid_t reaper = ::fork();
    if (reaper < 0) fail_setup(plan.status_fd, 0);
    if (reaper == 0) {
      ::signal(parent_death_signal, SIG_DFL);  // pid 1 here: its death takes the namespace
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      run_reaper(plan);
    }
    keep_only_status_pipe(plan);
    int st = 0;
    while (::waitpid(reaper, &st, 0) < 0 && errno == EINTR) {
    }
    _exit(0);
  }
  run_reaper(plan);
}

}  // namespace detail

/// Runs argv[0] (a path, or a name looked up in PATH) with argv under `limits`. Thread-safe: call
/// it from several threads at once. Never throws for the program's sake; a sandbox that cannot
/// start the program says why in `setup_error`.
inline SandboxResult run_sandboxed(const std::vector<std::string>& argv, const SandboxLimits& limits) {
  using clock = std::chrono::steady_clock;
  SandboxResult result;
  const auto started_at = clock::now();
  // The handed-over descriptors are the program's, on every path: closed here once it is forked,
  // or at once where it never starts.
  struct HandOver {
    const std::vector<int>& fds;
    bool done = false;
    void close_all() {
      if (!done)
        for (int fd : fds) ::close(fd);
      done = true;
    }
    ~HandOver() { close_all(); }
  } hand_over{limits.handed_over_fds};
  if (argv.empty()) {
    result.setup_error = "empty argv";
    return result;
  }
  const auto program = find_program(argv[0]);
  if (!program) {
    result.setup_error = fmt::format("{}: not found or not executable", argv[0]);
    return result;
  }

  // Every descriptor is close-on-exec, so a sibling thread's concurrent fork+exec leaks nothing.
  const int program_fd = ::open(program->c_str(), O_RDONLY | O_CLOEXEC);
  if (program_fd < 0) {
    result.setup_error = fmt::format("{}: cannot be opened: {}", program->string(), std::strerror(errno));
    return result;
  }
  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1}, status_pipe[2] = {-1, -1};
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  auto close_all = [&] {
    for (int fd : {program_fd, devnull, out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1], status_pipe[0], status_pipe[1]})
      if (fd >= 0) ::close(fd);
  };
  if (devnull < 0 || ::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0 || ::pipe2(status_pipe, O_CLOEXEC) != 0) {
    result.setup_error = fmt::format("cannot open /dev/null or a pipe: {}", std::strerror(errno));
    close_all();
    return result;
  }

  std::vector<std::string> args = argv;
  std::vector<std::string> env = limits.environment;
  const std::string working_directory = limits.working_directory.string();
  detail::ChildPlan plan;
  for (auto& a : args) plan.argv.push_back(a.data());
  plan.argv.push_back(nullptr);
  for (auto& e : env) plan.envp.push_back(e.data());
  plan.envp.push_back(nullptr);
  plan.program_fd = program_fd;
  plan.stdin_fd = devnull;
  plan.stdout_fd = out_pipe[1];
  plan.stderr_fd = err_pipe[1];
  plan.status_fd = status_pipe[1];
  plan.limits = &limits;
  plan.parent = ::getpid();
  plan.working_directory = working_directory.c_str();
  plan.drop_uid = limits.drop_privileges && ::geteuid() == 0;
  plan.run_uid = static_cast<uid_t>(limits.unprivileged_uid);

  // Output this process has buffered but not written would otherwise be copied into the child,
  // and written into its pipes should anything there flush on exit (sanitizer runtimes do).
  std::fflush(nullptr);
  std::unique_lock forking(detail::fork_gate());
  const pid_t child = ::fork();
  if (child < 0) {
    forking.unlock();
    result.setup_error = fmt::format("fork: {}", std::strerror(errno));
    close_all();
    return result;
  }
  if (child == 0) detail::run_first_child(plan, limits.isolate);
  ::setpgid(child, child);  // also here, so killpg below can never hit our own group
  hand_over.close_all();
  for (int fd : {program_fd, devnull, out_pipe[1], err_pipe[1], status_pipe[1]}) ::close(fd);
  // The gate opens once the child holds nothing it inherited (its first record), or is gone.
  std::string status_bytes(sizeof(detail::StatusRecord), '\0');
  status_bytes.resize(detail::read_fully(status_pipe[0], status_bytes.data(), status_bytes.size()));
  forking.unlock();

  const auto deadline = started_at + limits.wall_time;
  bool killed = false;
  auto kill_group = [&] {
    if (!killed) ::killpg(child, SIGKILL);
    killed = true;
  };

  struct Stream {
    int fd;
    std::string* text;
    bool open = true;
  } streams[3] = {{out_pipe[0], &result.stdout_text}, {err_pipe[0], &result.stderr_text}, {status_pipe[0], &status_bytes}};
  char buffer[65536];
  bool workload_done = false;
  for (;;) {
    const bool any_open = streams[0].open || streams[1].open || streams[2].open;
    if (!any_open) break;
    pollfd fds[3];
    int count = 0;
    int index_of[3];
    for (int i = 0; i < 3; ++i)
      if (streams[i].open) {
        fds[count] = {streams[i].fd, POLLIN, 0};
        index_of[count++] = i;
      }
    const auto now = clock::now();
    if (now >= deadline && !killed) {
      result.timed_out = true;
      kill_group();
    }
    // Once the workload is gone or killed, leftovers must not hold the pipes open for long.
    const int wait_ms = killed ? 1000
                               : static_cast<int>(std::max<long long>(
                                     1, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1));
    const int ready = ::poll(fds, static_cast<nfds_t>(count), wait_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0 && killed) break;  // killed, and nothing arrives any more
    for (int k = 0; k < count && ready > 0; ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Stream& s = streams[index_of[k]];
      const ssize_t n = ::read(s.fd, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        s.open = false;
        continue;
      }
      const std::size_t room = index_of[k] == 2 ? sizeof buffer : (limits.output_bytes > s.text->size() ? limits.output_bytes - s.text->size() : 0);
      s.text->append(buffer, std::min<std::size_t>(room, static_cast<std::size_t>(n)));
      if (index_of[k] != 2 && static_cast<std::size_t>(n) > room) {
        result.output_limit = true;
        kill_group();
      }
    }
    if (!workload_done && streams[2].open == false) {
      // The reaper has reported (or died): whatever the workload left behind goes now.
      workload_done = true;
      kill_group();
    }
  }
  kill_group();  // the group may still hold grandchildren; the first child is not yet reaped
  for (int i = 0; i < 3; ++i) ::close(streams[i].fd);
  int first_status = 0;
  while (::waitpid(child, &first_status, 0) < 0 && errno == EINTR) {
  }
  result.wall = clock::now() - started_at;

  // Parse the status records: a setup failure, then (or only) the workload's wait status.
  bool have_wait = false;
  int wait_status = 0;
  for (std::size_t at = 0; at + sizeof(detail::StatusRecord) <= status_bytes.size(); at += sizeof(detail::StatusRecord)) {
    detail::StatusRecord record;
    std::memcpy(&record, status_bytes.data() + at, sizeof record);
    if (record.kind == detail::status_record_setup && result.setup_error.empty())
      result.setup_error = fmt::format("sandbox {} failed: {}", detail::setup_stage_name(record.stage), std::strerror(record.value));
    if (record.kind == detail::status_record_isolated) result.isolated = true;
    if (record.kind == detail::status_record_wait) {
      have_wait = true;
      wait_status = record.value;
    }
  }
  if (!result.setup_error.empty()) return result;
  result.started = true;
  if (have_wait) {
    if (WIFEXITED(wait_status)) {
      result.exited = true;
      result.exit_code = WEXITSTATUS(wait_status);
    } else if (WIFSIGNALED(wait_status)) {
      result.signal = WTERMSIG(wait_status);
    }
  } else if (!result.timed_out && !result.output_limit) {
    // No report: the whole group died, most likely killed from outside (the OOM killer).
    result.signal = WIFSIGNALED(first_status) ? WTERMSIG(first_status) : SIGKILL;
  }
  return result;
}

}  // namespace kevo::eval
