// kevo/eval/jail.hpp: the room a candidate (or a compiler reading a candidate) runs in, built
// with bubblewrap: fresh user, PID, network, IPC and mount namespaces; the system's programs and
// libraries read-only; no /etc, no /home, no /root; private size-capped tmpfs for /tmp, /var/tmp,
// /dev/shm and its scratch directory, all gone when it exits; and, for a candidate, a seccomp
// filter (libseccomp) that refuses new processes, sockets, ptrace and the other ways out.
//
//   kevo::eval::Jail jail = kevo::eval::make_jail({.program = runner, .seccomp = true}).value();
//   limits.handed_over_fds = jail.handed_over_fds();
//   run_sandboxed(jail.command({"--control", "3"}), limits);
//
// The sandbox (sandbox.hpp) still sets the rlimits, drops root to a uid of the run's own and
// keeps the wall clock; the jail only decides what the program can see and call.
#pragma once

#include <kevo/eval/sandbox.hpp>
#include <kevo/expected.hpp>

#include <fmt/format.h>
#include <seccomp.h>

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kevo::eval {

/// What a jail lets its program see.
struct JailOptions {
  std::filesystem::path program;                        ///< copied read-only to /run/kevo/<its file name>
  std::vector<std::filesystem::path> read_only = {};    ///< more paths, bound read-only where they are
  std::vector<std::filesystem::path> writable = {};     ///< paths bound writable where they are (a compile's output)
  std::filesystem::path working_directory = "/scratch";
  std::size_t tmpfs_bytes = std::size_t{64} << 20;     ///< each of /tmp, /var/tmp, /dev/shm, /scratch
  bool seccomp = true;                                  ///< refuse new processes, sockets and the like
  bool gpu = false;                                     ///< the NVIDIA device nodes and driver files
  bool info_pipe = false;                               ///< bwrap reports the program's pid (see Jail::info_read)
  /// A program that starts `program` inside the jail (a profiler: ncu): its argv, before the
  /// program's. It runs under the same filter, less `seccomp_exempt`.
  std::vector<std::string> launcher = {};
  std::vector<std::string> seccomp_exempt = {};         ///< calls the filter lets through (a launcher's fork and exec)
};

/// A descriptor that closes itself.
class OwnedFd {
 public:
  OwnedFd() = default;
  explicit OwnedFd(int fd) : fd_(fd) {}
  OwnedFd(OwnedFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  OwnedFd& operator=(OwnedFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  ~OwnedFd() { reset(); }
  int get() const { return fd_; }
  /// Gives the descriptor away (to run_sandboxed's handed_over_fds, which closes it).
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

/// A prepared bwrap command line and the descriptors it needs handed over.
struct Jail {
  std::vector<std::string> prefix;   ///< bwrap and its options, ending in "--" and the program
  OwnedFd seccomp_filter;            ///< the compiled filter bwrap loads (--seccomp)
  OwnedFd info_read;                 ///< bwrap writes {"child-pid": N, ...} here (with info_pipe)
  OwnedFd info_write;
  OwnedFd program;                   ///< the program, copied into the jail by bwrap

  /// The whole argv: the jail's prefix, then the program's own arguments.
  std::vector<std::string> command(const std::vector<std::string>& program_args) const {
    std::vector<std::string> argv = prefix;
    argv.insert(argv.end(), program_args.begin(), program_args.end());
    return argv;
  }
  /// The descriptors to hand to run_sandboxed (given away: the jail no longer owns them).
  std::vector<int> release_handed_over_fds() {
    std::vector<int> fds;
    if (seccomp_filter) fds.push_back(seccomp_filter.release());
    if (info_write) fds.push_back(info_write.release());
    if (program) fds.push_back(program.release());
    return fds;
  }
};

namespace detail {

/// The calls the candidate's filter refuses. Threads may be made; processes may not (so one
/// process's CPU clock and one SIGSTOP cover all of a candidate's work): `clone` is refused
/// without CLONE_THREAD, and `clone3` answers ENOSYS so that glibc falls back to clone. No
/// sockets, no ptrace or cross-process memory, no mounts or namespaces, no kernel keyrings, no
/// io_uring (it would do file I/O past this filter), no memfd or SysV shared memory (memory that
/// outlives the run or escapes its limit). The GPU driver needs memfd_create and a local (AF_UNIX)
/// socket to start (seen on the H200: with no socket calls, cudaSetDevice fails with
/// cudaErrorOperatingSystem), so a GPU jail keeps those; the jail's own network namespace and
/// file system leave such a socket nothing outside to reach.
inline std::vector<std::string> seccomp_refused_calls(bool gpu) {
  std::vector<std::string> names = {"fork", "vfork", "execveat", "ptrace", "process_vm_readv", "process_vm_writev", "socket",
                                    "socketpair", "connect", "bind", "listen", "accept", "accept4", "mount", "umount2",
                                    "pivot_root", "chroot", "setns", "unshare", "bpf", "perf_event_open", "keyctl", "add_key",
                                    "request_key", "userfaultfd", "io_uring_setup", "shmget", "kill", "personality",
                                    "open_by_handle_at", "name_to_handle_at", "kexec_load", "init_module", "finit_module",
                                    "reboot", "swapon", "acct", "settimeofday", "clock_settime", "setpgid", "setsid", "clone", "clone3", "memfd_create"};
  if (!gpu) return names;
  std::erase_if(names, [](const std::string& name) { return name == "memfd_create" || name == "socketpair" || name == "connect" || name == "bind" ||
                                                          name == "listen" || name == "accept" || name == "accept4"; });
  return names;
}

/// The candidate's filter, compiled to BPF in a memfd; `exempt` lets calls through (a test's bisection).
inline expected<OwnedFd, Error> compile_seccomp_filter(bool gpu, const std::vector<std::string>& exempt = {}) {
  std::unique_ptr<void, void (*)(scmp_filter_ctx)> ctx(seccomp_init(SCMP_ACT_ALLOW), seccomp_release);
  if (!ctx) return make_error("seccomp_init failed");
  const std::uint32_t denied = SCMP_ACT_ERRNO(EPERM);
  for (const std::string& name : seccomp_refused_calls(gpu)) {
    if (std::find(exempt.begin(), exempt.end(), name) != exempt.end()) continue;
    const int nr = seccomp_syscall_resolve_name(name.c_str());
    if (nr == __NR_SCMP_ERROR) continue;  // not on this architecture
    int added = 0;
    if (name == "socket" && gpu) added = seccomp_rule_add(ctx.get(), denied, nr, 1, SCMP_A0(SCMP_CMP_NE, AF_UNIX));
    else if (name == "clone") added = seccomp_rule_add(ctx.get(), denied, nr, 1, SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0));
    else if (name == "clone3") added = seccomp_rule_add(ctx.get(), SCMP_ACT_ERRNO(ENOSYS), nr, 0);
    else added = seccomp_rule_add(ctx.get(), denied, nr, 0);
    if (added != 0) return make_error(fmt::format("seccomp: cannot add a rule for {}", name));
  }
  OwnedFd fd(::memfd_create("kevo-seccomp", MFD_CLOEXEC));
  if (!fd) return make_error(fmt::format("memfd_create: {}", std::strerror(errno)));
  if (seccomp_export_bpf(ctx.get(), fd.get()) != 0) return make_error("seccomp_export_bpf failed");
  ::lseek(fd.get(), 0, SEEK_SET);
  return fd;
}

}  // namespace detail

/// Where bwrap is, or an error that says how to install it.
inline expected<std::filesystem::path, Error> find_bwrap() {
  if (auto path = find_program("bwrap")) return *path;
  return make_error("bubblewrap (bwrap) is not installed, and kevo never runs a candidate outside its jail: apt-get install bubblewrap");
}

/// Builds the jail for `options`. Fails where bwrap is missing or the filter cannot be built.
inline expected<Jail, Error> make_jail(const JailOptions& options) {
  namespace fs = std::filesystem;
  auto bwrap = find_bwrap();
  if (!bwrap) return unexpected(bwrap.error());
  Jail jail;
  auto& a = jail.prefix;
  a = {bwrap->string(), "--die-with-parent", "--new-session", "--unshare-all", "--as-pid-1", "--ro-bind", "/usr", "/usr"};
  // Merged-/usr systems make these links; older ones have directories.
  for (const char* top : {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
    std::error_code ec;
    if (fs::is_symlink(top, ec)) a.insert(a.end(), {"--symlink", fs::read_symlink(top, ec).string(), top});
    else if (fs::is_directory(top, ec)) a.insert(a.end(), {"--ro-bind", top, top});
  }
  a.insert(a.end(), {"--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache", "--proc", "/proc", "--dev", "/dev"});
  const std::string size = std::to_string(options.tmpfs_bytes);
  for (const char* dir : {"/tmp", "/var/tmp", "/dev/shm", "/scratch"}) a.insert(a.end(), {"--size", size, "--tmpfs", dir});
  if (options.gpu) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator("/dev", ec))
      if (entry.path().filename().string().starts_with("nvidia")) a.insert(a.end(), {"--dev-bind", entry.path().string(), entry.path().string()});
    // The driver's libraries and the toolkit lie under /usr, bound already; /usr/local/cuda is
    // often a link through /etc/alternatives, and binding over a link that leads out of the jail fails.
    for (const char* dir : {"/sys", "/etc/alternatives"}) a.insert(a.end(), {"--ro-bind-try", dir, dir});
  }
  for (const auto& path : options.read_only) a.insert(a.end(), {"--ro-bind", path.string(), path.string()});
  for (const auto& path : options.writable) a.insert(a.end(), {"--bind", path.string(), path.string()});
  a.insert(a.end(), {"--chdir", options.working_directory.string()});
  if (options.seccomp) {
    auto filter = detail::compile_seccomp_filter(options.gpu, options.seccomp_exempt);
    if (!filter) return unexpected(filter.error());
    jail.seccomp_filter = std::move(*filter);
    a.insert(a.end(), {"--seccomp", std::to_string(jail.seccomp_filter.get())});
  }
  if (options.info_pipe) {
    int info[2];
    if (::pipe2(info, O_CLOEXEC) != 0) return make_error(fmt::format("pipe: {}", std::strerror(errno)));
    jail.info_read.reset(info[0]);
    jail.info_write.reset(info[1]);
    a.insert(a.end(), {"--info-fd", std::to_string(info[1])});
  }
  // The program travels as a descriptor that kevo opened: bwrap may run under a uid that cannot
  // reach the build's directory (a cache under /root), and the jail gets a copy no one can change.
  std::string inside;
  if (!options.program.empty()) {
    jail.program.reset(::open(options.program.c_str(), O_RDONLY | O_CLOEXEC));
    if (!jail.program) return make_error(fmt::format("{}: cannot be opened: {}", options.program.string(), std::strerror(errno)));
    inside = "/run/kevo/" + options.program.filename().string();
    a.insert(a.end(), {"--perms", "0555", "--ro-bind-data", std::to_string(jail.program.get()), inside});
  }
  a.push_back("--");
  a.insert(a.end(), options.launcher.begin(), options.launcher.end());
  if (!inside.empty()) a.push_back(inside);
  return jail;
}

/// What the candidates' jail really has on this machine: checked by running a shell inside it (its
/// builtins only, so the filter's ban on new processes holds), not assumed. Where namespaces are
/// blocked (Docker's default seccomp profile blocks them), `jail` is false and `problem` holds
/// bwrap's words: kevo then runs no candidate at all.
struct IsolationReport {
  bool jail = false;          ///< bwrap made its namespaces and ran a program in them
  bool private_proc = false;  ///< the jail's /proc shows its own process only
  bool no_network = false;    ///< only the loopback device
  bool unprivileged = false;  ///< not uid 0 inside
  bool no_secrets = false;    ///< /etc/shadow and /root are not there
  std::string problem;        ///< why a layer is missing

  bool complete() const { return jail && private_proc && no_network && unprivileged && no_secrets; }
  /// One line for a program's start: what holds, and what is missing.
  std::string summary() const {
    if (!jail) return "isolation: MISSING, candidates cannot be jailed here (" + problem + "); kevo will not run them";
    std::string missing;
    for (auto [ok, what] : {std::pair{private_proc, "a private /proc"}, std::pair{no_network, "no network"},
                            std::pair{unprivileged, "an unprivileged uid"}, std::pair{no_secrets, "no host secrets"}})
      if (!ok) missing += std::string(missing.empty() ? "" : ", ") + what;
    return missing.empty() ? "isolation: candidates run jailed (namespaces, a private /proc, no network, an unprivileged uid, no host secrets)"
                           : "isolation: candidates run jailed, but WITHOUT " + missing;
  }
};

inline IsolationReport inspect_isolation(SandboxLimits limits = {}) {
  IsolationReport report;
  auto jail = make_jail({});
  if (!jail) {
    report.problem = jail.error().message;
    return report;
  }
  const std::string script =
      "set -- /proc/[0-9]*; echo processes $#\n"
      "n=0; while read -r line; do n=$((n+1)); done < /proc/net/dev; echo netdev_lines $n\n"
      "while read -r key value rest; do [ \"$key\" = Uid: ] && echo uid $value; done < /proc/self/status\n"
      "[ -e /etc/shadow ] || [ -e /root ] && echo secrets visible\n"
      "echo done\n";
  limits.isolate = false;  // bwrap makes the namespaces
  limits.wall_time = std::chrono::seconds(10);
  limits.handed_over_fds = jail->release_handed_over_fds();
  const SandboxResult r = run_sandboxed(jail->command({"/bin/sh", "-c", script}), limits);
  if (!r.ok() || r.stdout_text.find("done") == std::string::npos) {
    report.problem = r.setup_error.empty() ? r.stderr_text.substr(0, r.stderr_text.find('\n')) : r.setup_error;
    if (report.problem.empty()) report.problem = "bwrap ended with code " + std::to_string(r.exit_code);
    return report;
  }
  report.jail = true;
  const std::string& out = r.stdout_text;
  report.private_proc = out.find("processes 1\n") != std::string::npos;
  report.no_network = out.find("netdev_lines 3\n") != std::string::npos;  // two header lines and lo
  report.unprivileged = out.find("uid ") != std::string::npos && out.find("uid 0\n") == std::string::npos;
  report.no_secrets = out.find("secrets visible") == std::string::npos;
  return report;
}

}  // namespace kevo::eval
