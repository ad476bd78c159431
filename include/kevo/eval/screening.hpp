// kevo/eval/screening.hpp: refuses a hostile candidate before it is compiled, with a named reason the
// synthesizer can act on. Defence in depth: the sandbox still contains whatever gets past this.
//
//   kevo::eval::ScreeningRules rules = kevo::eval::ScreeningRules::for_target(kevo::Target::cpu);
//   kevo::eval::ScreeningVerdict v = kevo::eval::screen_candidate(source, kevo::Target::cpu, include_dir, rules);
//   if (v.refused) return feedback(v.reason);  // "line 12: calls fopen (file access is not allowed in a kernel)"
//
// Two passes:
// - the text: every preprocessor directive (#include outside the allow-list, #line, pragmas that silence
//   diagnostics or rename symbols) and `.incbin` anywhere, strings included;
// - clang-15's JSON AST of the candidate's own code, plus its -Wglobal-constructors warnings: code that
//   runs before main or at exit, asm, and calls to process, network, file, environment and
//   dynamic-loading functions (one table, `forbidden_calls`).
// Only the candidate's own declarations are dumped: its #includes are hoisted into a prelude that opens
// a namespace with a name of this screen's own (unknowable to the candidate), and
// `-ast-dump-filter` dumps that namespace alone. A dump of everything is ~175 MB for <cmath> and
// <vector> (1.2 s to write); the filtered one ~30 kB (0.3 s in all, about clang's bare parse). A
// precompiled header shrinks the dump as well, but clang-15 reads a CUDA one back as ODR violations
// (host and device overloads), and it needs a cache. A candidate that closes the namespace to escape
// the dump fails the sentinel after it, and is refused.
// CUDA is parsed as nvcc compiles it: once for each of nvcc's passes (the host's, and each device
// architecture's, as `nvcc --dryrun` with the evaluator's flags lists them), the candidate's code seeing
// the macros nvcc defines there (__NVCC__, __CUDACC_VER_MAJOR__, __CUDA_ARCH__), so that code under
// `#ifdef __NVCC__` or `#ifdef __CUDA_ARCH__` is screened too. A finding of any pass counts. A pass
// whose preprocessed candidate equals the host's is not parsed again.
// Where clang cannot parse the candidate (in any pass), the screen does not refuse for that alone: the
// verdict's note says so, and the sandbox is relied on. clang-15 cannot parse CUB, cooperative groups
// or libcu++ of CUDA 13 in any pass.
//
// Why one file of about 1330 lines: the rules, the text scan and the AST walk that enforces them sit
// together, so that a reader checks each rule against its enforcement in one place.
#pragma once

#include <kevo/candidate.hpp>
#include <kevo/eval/sandbox.hpp>
#include <kevo/expected.hpp>

#include <fmt/format.h>
#include <simdjson.h>

#include <stdlib.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

namespace kevo::eval {

/// The rule a finding broke: the kind of a refusal, for code that reacts to it.
enum class ScreeningRule : std::uint8_t {
  none,
  static_initializer,  ///< code that runs at start-up or exit: a global's dynamic initializer, constructor attributes
  inline_asm,          ///< asm statements, file-scope asm, asm labels
  incbin,              ///< `.incbin` anywhere in the text
  forbidden_call,      ///< a call into `forbidden_calls`, or a file stream constructed
  include,             ///< an #include outside the allow-list
  directive,           ///< a directive or pragma that hides code or changes diagnostics (#line, pragma diagnostic)
  unbalanced,          ///< the candidate closes a scope it did not open: it would escape the screen
};

inline constexpr std::string_view to_string(ScreeningRule r) {
  switch (r) {
    case ScreeningRule::none: return "none";
    case ScreeningRule::static_initializer: return "static_initializer";
    case ScreeningRule::inline_asm: return "inline_asm";
    case ScreeningRule::incbin: return "incbin";
    case ScreeningRule::forbidden_call: return "forbidden_call";
    case ScreeningRule::include: return "include";
    case ScreeningRule::directive: return "directive";
    case ScreeningRule::unbalanced: return "unbalanced";
  }
  return "?";
}

/// What a problem allows its candidates. The rest of the screen is fixed.
struct ScreeningRules {
  bool allow_asm = false;                     ///< asm statements inside functions (CUDA: inline PTX); file-scope asm never
  std::vector<std::string> allowed_includes;  ///< "cmath", "kevo_problem.hpp"; a trailing '/' allows a directory: "cub/"
  std::vector<std::string> clang_flags;       ///< added to clang's command line, e.g. -march=native (intrinsics need it)
  std::string clang = "clang-15";             ///< a name looked up in PATH, or a path
  std::filesystem::path cuda_path = "/usr/local/cuda";  ///< CUDA sources only: the toolkit clang parses against
  /// CUDA only: the flags nvcc builds the candidate with (-arch, -D). nvcc's dry run with them names its
  /// passes, host and one for each device architecture, and the macros of each; the candidate is parsed
  /// once for each pass, with those macros. for_target: -arch=$KEVO_CUDA_ARCH, else sm_90a, as the evaluator.
  std::vector<std::string> nvcc_flags = {"-std=c++20", "-arch=sm_90a"};
  std::chrono::milliseconds wall_time{30'000};
  std::size_t max_ast_bytes = std::size_t{64} << 20;    ///< the cap on clang's output; past it the screen gives up

  /// The C++ standard headers a kernel needs, the CPU's intrinsics, and the problem's own header; for
  /// CUDA also the CUDA runtime, half types, cooperative groups, mma, CUB and libcu++.
  static ScreeningRules for_target(Target target);
};

/// One broken rule, where it was broken.
struct ScreeningFinding {
  ScreeningRule rule = ScreeningRule::none;
  int line = 0;         ///< in the candidate's source, from 1
  std::string message;  ///< "line 12: calls fopen (file access is not allowed in a kernel)"
};

/// What the screen decided about one candidate.
struct ScreeningVerdict {
  bool refused = false;
  ScreeningRule rule = ScreeningRule::none;  ///< the first finding's rule
  std::string reason;                        ///< one line: the findings by line, "line 12: calls fopen (...)"
  std::string note;                          ///< why the screen was partial: "clang-15 could not parse ...; relying on the sandbox"
  std::vector<ScreeningFinding> findings;    ///< every finding, by line
  bool parsed = false;                       ///< clang parsed the candidate and its AST was screened
  std::chrono::duration<double> wall{0};
};

namespace detail {

/// Why a family of library calls has no place in a kernel: the text the synthesizer reads.
enum class CallFamily : std::uint8_t {
  process, exit, network, file, memory_mapping, environment, dynamic_loading, system_call, raw_io, signal, output, interprocess
};

inline constexpr std::string_view why(CallFamily f) {
  switch (f) {
    case CallFamily::process: return "starting or controlling processes is not allowed in a kernel";
    case CallFamily::exit: return "ending the process or hooking its exit is not allowed in a kernel: the harness reports the result";
    case CallFamily::network: return "network access is not allowed in a kernel";
    case CallFamily::file: return "file access is not allowed in a kernel";
    case CallFamily::memory_mapping: return "mapping memory is not allowed in a kernel: use new or std::vector";
    case CallFamily::environment: return "reading or changing the environment is not allowed in a kernel";
    case CallFamily::dynamic_loading: return "loading code at run time is not allowed in a kernel";
    case CallFamily::system_call: return "raw system calls are not allowed in a kernel";
    case CallFamily::raw_io: return "reading or writing file descriptors is not allowed in a kernel: fds 1 and 2 belong to the harness";
    case CallFamily::signal: return "signal handling is not allowed in a kernel";
    case CallFamily::output: return "printing is not allowed in a kernel: stdout is the harness's report channel";
    case CallFamily::interprocess: return "sharing memory or handles with another process is not allowed in a kernel";
  }
  return "not allowed in a kernel";
}

struct ForbiddenCall {
  std::string_view name;
  CallFamily family;
};

/// Calls a kernel never makes, matched on the referenced function's name however it is spelt (`::name`,
/// `std::name`, plain, `__builtin_name`, glibc's `__libc_name`, `name64`, the fortified `__name_chk`).
/// Only plain functions match: a member function or a function template of the same name (std::remove
/// of <algorithm>, std::bind) does not.
inline constexpr ForbiddenCall forbidden_calls[] = {
    // process control
    {"fork", CallFamily::process}, {"vfork", CallFamily::process}, {"clone", CallFamily::process},
    {"clone3", CallFamily::process}, {"execve", CallFamily::process}, {"execv", CallFamily::process},
    {"execl", CallFamily::process}, {"execvp", CallFamily::process}, {"execlp", CallFamily::process},
    {"execle", CallFamily::process}, {"execvpe", CallFamily::process}, {"execveat", CallFamily::process},
    {"fexecve", CallFamily::process}, {"system", CallFamily::process}, {"popen", CallFamily::process},
    {"posix_spawn", CallFamily::process}, {"posix_spawnp", CallFamily::process}, {"kill", CallFamily::process},
    {"killpg", CallFamily::process}, {"tgkill", CallFamily::process}, {"ptrace", CallFamily::process},
    {"pthread_atfork", CallFamily::process}, {"daemon", CallFamily::process}, {"prctl", CallFamily::process},
    {"unshare", CallFamily::process}, {"setns", CallFamily::process}, {"chroot", CallFamily::process},
    {"mount", CallFamily::process}, {"umount", CallFamily::process}, {"umount2", CallFamily::process},
    {"pidfd_open", CallFamily::process}, {"pidfd_send_signal", CallFamily::process},
    {"process_vm_readv", CallFamily::process}, {"process_vm_writev", CallFamily::process},
    // ending the process, or code at its exit
    {"_exit", CallFamily::exit}, {"_Exit", CallFamily::exit}, {"exit", CallFamily::exit},
    {"quick_exit", CallFamily::exit}, {"abort", CallFamily::exit}, {"atexit", CallFamily::exit},
    {"at_quick_exit", CallFamily::exit}, {"on_exit", CallFamily::exit}, {"__cxa_atexit", CallFamily::exit},
    {"__cxa_thread_atexit", CallFamily::exit}, {"__cxa_thread_atexit_impl", CallFamily::exit},
    // network
    {"socket", CallFamily::network}, {"socketpair", CallFamily::network}, {"connect", CallFamily::network},
    {"bind", CallFamily::network}, {"listen", CallFamily::network}, {"accept", CallFamily::network},
    {"accept4", CallFamily::network}, {"sendto", CallFamily::network}, {"recvfrom", CallFamily::network},
    {"sendmsg", CallFamily::network}, {"recvmsg", CallFamily::network}, {"sendmmsg", CallFamily::network},
    {"recvmmsg", CallFamily::network}, {"send", CallFamily::network}, {"recv", CallFamily::network},
    {"setsockopt", CallFamily::network}, {"getsockopt", CallFamily::network}, {"getaddrinfo", CallFamily::network},
    {"getnameinfo", CallFamily::network}, {"gethostbyname", CallFamily::network}, {"gethostbyname2", CallFamily::network},
    {"gethostbyname_r", CallFamily::network}, {"gethostbyaddr", CallFamily::network},
    // files (std::ifstream and its kin: forbidden_stream_types)
    {"open", CallFamily::file}, {"openat", CallFamily::file}, {"openat2", CallFamily::file},
    {"creat", CallFamily::file}, {"fopen", CallFamily::file}, {"freopen", CallFamily::file},
    {"fdopen", CallFamily::file}, {"chdir", CallFamily::file}, {"fchdir", CallFamily::file},
    {"unlink", CallFamily::file}, {"unlinkat", CallFamily::file}, {"remove", CallFamily::file},
    {"rename", CallFamily::file}, {"renameat", CallFamily::file}, {"renameat2", CallFamily::file},
    {"mkdir", CallFamily::file}, {"mkdirat", CallFamily::file}, {"rmdir", CallFamily::file},
    {"truncate", CallFamily::file}, {"ftruncate", CallFamily::file}, {"link", CallFamily::file},
    {"linkat", CallFamily::file}, {"symlink", CallFamily::file}, {"symlinkat", CallFamily::file},
    {"readlink", CallFamily::file}, {"readlinkat", CallFamily::file}, {"chmod", CallFamily::file},
    {"fchmod", CallFamily::file}, {"fchmodat", CallFamily::file}, {"chown", CallFamily::file},
    {"fchown", CallFamily::file}, {"lchown", CallFamily::file}, {"fchownat", CallFamily::file},
    {"mknod", CallFamily::file}, {"mknodat", CallFamily::file}, {"mkfifo", CallFamily::file},
    {"mkfifoat", CallFamily::file}, {"utime", CallFamily::file}, {"utimes", CallFamily::file},
    {"utimensat", CallFamily::file}, {"futimens", CallFamily::file},
    // temporary files: each creates one
    {"mkstemp", CallFamily::file}, {"mkostemp", CallFamily::file}, {"mkstemps", CallFamily::file},
    {"mkostemps", CallFamily::file}, {"mkdtemp", CallFamily::file}, {"mktemp", CallFamily::file},
    {"tmpfile", CallFamily::file}, {"tmpnam", CallFamily::file}, {"tmpnam_r", CallFamily::file},
    {"tempnam", CallFamily::file},
    // directories
    {"opendir", CallFamily::file}, {"fdopendir", CallFamily::file}, {"readdir", CallFamily::file},
    {"readdir_r", CallFamily::file}, {"scandir", CallFamily::file}, {"scandirat", CallFamily::file},
    {"nftw", CallFamily::file}, {"ftw", CallFamily::file}, {"glob", CallFamily::file},
    // the user database: each reads /etc/passwd or /etc/group
    {"getpwnam", CallFamily::file}, {"getpwuid", CallFamily::file}, {"getgrnam", CallFamily::file},
    {"getgrgid", CallFamily::file},
    // memory mappings and shared memory; pinning and unmapping too (the harness's pages are mapped)
    {"mmap", CallFamily::memory_mapping}, {"mremap", CallFamily::memory_mapping}, {"mprotect", CallFamily::memory_mapping},
    {"pkey_mprotect", CallFamily::memory_mapping}, {"munmap", CallFamily::memory_mapping}, {"madvise", CallFamily::memory_mapping},
    {"mlock", CallFamily::memory_mapping}, {"mlock2", CallFamily::memory_mapping}, {"mlockall", CallFamily::memory_mapping},
    {"shm_open", CallFamily::memory_mapping}, {"shm_unlink", CallFamily::memory_mapping}, {"shmget", CallFamily::memory_mapping},
    {"shmat", CallFamily::memory_mapping}, {"shmctl", CallFamily::memory_mapping}, {"memfd_create", CallFamily::memory_mapping},
    // the environment
    {"getenv", CallFamily::environment}, {"secure_getenv", CallFamily::environment}, {"setenv", CallFamily::environment},
    {"putenv", CallFamily::environment}, {"unsetenv", CallFamily::environment}, {"clearenv", CallFamily::environment},
    // dynamic loading, and walking the loaded objects (it finds any function's address past this screen)
    {"dlopen", CallFamily::dynamic_loading}, {"dlmopen", CallFamily::dynamic_loading}, {"dlsym", CallFamily::dynamic_loading},
    {"dlvsym", CallFamily::dynamic_loading}, {"dladdr", CallFamily::dynamic_loading}, {"dladdr1", CallFamily::dynamic_loading},
    {"dlinfo", CallFamily::dynamic_loading}, {"dl_iterate_phdr", CallFamily::dynamic_loading},
    // raw system calls and file descriptors (fd 0 too: stdin is the harness's)
    {"syscall", CallFamily::system_call}, {"write", CallFamily::raw_io}, {"read", CallFamily::raw_io},
    {"pwrite", CallFamily::raw_io}, {"pread", CallFamily::raw_io}, {"writev", CallFamily::raw_io},
    {"readv", CallFamily::raw_io}, {"pwritev", CallFamily::raw_io}, {"preadv", CallFamily::raw_io},
    {"pwritev2", CallFamily::raw_io}, {"preadv2", CallFamily::raw_io}, {"dup", CallFamily::raw_io},
    {"dup2", CallFamily::raw_io}, {"dup3", CallFamily::raw_io}, {"close", CallFamily::raw_io},
    {"ioctl", CallFamily::raw_io}, {"fcntl", CallFamily::raw_io}, {"pipe", CallFamily::raw_io},
    {"pipe2", CallFamily::raw_io}, {"sendfile", CallFamily::raw_io}, {"splice", CallFamily::raw_io},
    {"tee", CallFamily::raw_io}, {"vmsplice", CallFamily::raw_io}, {"copy_file_range", CallFamily::raw_io},
    {"fread", CallFamily::raw_io}, {"fgets", CallFamily::raw_io}, {"fgetc", CallFamily::raw_io},
    {"getc", CallFamily::raw_io}, {"getchar", CallFamily::raw_io}, {"getline", CallFamily::raw_io},
    {"getdelim", CallFamily::raw_io}, {"scanf", CallFamily::raw_io}, {"fscanf", CallFamily::raw_io},
    {"vscanf", CallFamily::raw_io}, {"vfscanf", CallFamily::raw_io},
    // signals
    {"signal", CallFamily::signal}, {"sigaction", CallFamily::signal}, {"sigqueue", CallFamily::signal},
    {"raise", CallFamily::signal}, {"alarm", CallFamily::signal}, {"ualarm", CallFamily::signal},
    {"setitimer", CallFamily::signal}, {"timer_create", CallFamily::signal}, {"sigprocmask", CallFamily::signal},
    {"pthread_sigmask", CallFamily::signal}, {"pthread_kill", CallFamily::signal}, {"tkill", CallFamily::signal},
    // printing: every stdio write, since stdout and stderr are the harness's (<cstdio> is not on the
    // allow-list; these reach it through builtins, own declarations, or CUDA's device printf)
    {"printf", CallFamily::output}, {"puts", CallFamily::output}, {"putchar", CallFamily::output},
    {"fprintf", CallFamily::output}, {"fputs", CallFamily::output}, {"fwrite", CallFamily::output},
    {"fputc", CallFamily::output}, {"putc", CallFamily::output}, {"vprintf", CallFamily::output},
    {"vfprintf", CallFamily::output}, {"dprintf", CallFamily::output}, {"vdprintf", CallFamily::output},
    {"perror", CallFamily::output}, {"putchar_unlocked", CallFamily::output}, {"putc_unlocked", CallFamily::output},
    {"fputc_unlocked", CallFamily::output}, {"fputs_unlocked", CallFamily::output}, {"fwrite_unlocked", CallFamily::output},
    {"wprintf", CallFamily::output}, {"fwprintf", CallFamily::output}, {"vwprintf", CallFamily::output},
    {"vfwprintf", CallFamily::output}, {"fputwc", CallFamily::output}, {"putwc", CallFamily::output},
    {"putwchar", CallFamily::output}, {"fputws", CallFamily::output},
    // the CUDA runtime and driver: calls that write a file at a path they are given
    {"cudaGraphDebugDotPrint", CallFamily::file}, {"cuGraphDebugDotPrint", CallFamily::file},
    {"cudaLogsDumpToFile", CallFamily::file}, {"cuLogsDumpToFile", CallFamily::file},
    {"cuCoredumpSetAttribute", CallFamily::file}, {"cuCoredumpSetAttributeGlobal", CallFamily::file},
    // ... that load code the screen never saw (from a file or memory), or look up any driver function by name
    {"cudaLibraryLoadFromFile", CallFamily::dynamic_loading}, {"cuLibraryLoadFromFile", CallFamily::dynamic_loading},
    {"cudaLibraryLoadData", CallFamily::dynamic_loading}, {"cuLibraryLoadData", CallFamily::dynamic_loading},
    {"cuModuleLoad", CallFamily::dynamic_loading}, {"cuModuleLoadData", CallFamily::dynamic_loading},
    {"cuModuleLoadDataEx", CallFamily::dynamic_loading}, {"cuModuleLoadFatBinary", CallFamily::dynamic_loading},
    {"cuLinkAddFile", CallFamily::dynamic_loading}, {"cuLinkAddData", CallFamily::dynamic_loading},
    {"cudaGetDriverEntryPoint", CallFamily::dynamic_loading}, {"cudaGetDriverEntryPointByVersion", CallFamily::dynamic_loading},
    {"cuGetProcAddress", CallFamily::dynamic_loading},
    // ... that share device memory or events with another process, or import its file descriptors
    {"cudaIpcGetMemHandle", CallFamily::interprocess}, {"cudaIpcOpenMemHandle", CallFamily::interprocess},
    {"cudaIpcGetEventHandle", CallFamily::interprocess}, {"cudaIpcOpenEventHandle", CallFamily::interprocess},
    {"cuIpcGetMemHandle", CallFamily::interprocess}, {"cuIpcOpenMemHandle", CallFamily::interprocess},
    {"cuIpcGetEventHandle", CallFamily::interprocess}, {"cuIpcOpenEventHandle", CallFamily::interprocess},
    {"cudaMemPoolExportToShareableHandle", CallFamily::interprocess},
    {"cudaMemPoolImportFromShareableHandle", CallFamily::interprocess},
    {"cuMemPoolExportToShareableHandle", CallFamily::interprocess}, {"cuMemPoolImportFromShareableHandle", CallFamily::interprocess},
    {"cuMemExportToShareableHandle", CallFamily::interprocess}, {"cuMemImportFromShareableHandle", CallFamily::interprocess},
    {"cudaImportExternalMemory", CallFamily::interprocess}, {"cuImportExternalMemory", CallFamily::interprocess},
    {"cudaImportExternalSemaphore", CallFamily::interprocess}, {"cuImportExternalSemaphore", CallFamily::interprocess},
    // ... that checkpoint or restore the process
    {"cuCheckpointProcessCheckpoint", CallFamily::process}, {"cuCheckpointProcessRestore", CallFamily::process},
    {"cuCheckpointProcessLock", CallFamily::process}, {"cuCheckpointProcessUnlock", CallFamily::process},
};

/// Types whose construction opens a file: std::ifstream and its kin, by their name without namespace
/// or template arguments.
inline constexpr ForbiddenCall forbidden_stream_types[] = {
    {"ifstream", CallFamily::file}, {"ofstream", CallFamily::file}, {"fstream", CallFamily::file},
    {"wifstream", CallFamily::file}, {"wofstream", CallFamily::file}, {"wfstream", CallFamily::file},
    {"basic_ifstream", CallFamily::file}, {"basic_ofstream", CallFamily::file}, {"basic_fstream", CallFamily::file},
    {"filebuf", CallFamily::file}, {"basic_filebuf", CallFamily::file},
};

inline std::optional<CallFamily> forbidden_call_family(std::string_view name) {
  auto lookup = [](std::string_view n) -> std::optional<CallFamily> {
    for (const auto& c : forbidden_calls)
      if (c.name == n) return c.family;
    return std::nullopt;
  };
  // Each spelling glibc and the compiler give the same call: __builtin_fork, __libc_fork, __open_2, open64;
  // and the CUDA driver's versioned symbols, which cuda.h's macros call: cuGetProcAddress_v2.
  auto variants = [&](std::string_view n) -> std::optional<CallFamily> {
    for (std::string_view suffix : {"", "64", "_2", "_chk", "64_2", "_v2", "_v3"}) {
      if (!n.ends_with(suffix)) continue;
      if (auto f = lookup(n.substr(0, n.size() - suffix.size()))) return f;
    }
    return std::nullopt;
  };
  for (std::string_view prefix : {"__builtin_", "__libc_"})
    if (name.starts_with(prefix)) name.remove_prefix(prefix.size());
  if (auto f = variants(name)) return f;
  while (name.starts_with('_')) {
    name.remove_prefix(1);
    if (auto f = variants(name)) return f;
  }
  return std::nullopt;
}

/// "std::basic_ifstream<char>" -> "basic_ifstream"; "const std::ifstream" -> "ifstream".
inline std::string_view type_base_name(std::string_view type) {
  type = type.substr(0, type.find('<'));
  while (!type.empty() && (type.back() == ' ' || type.back() == '&' || type.back() == '*')) type.remove_suffix(1);
  if (const auto space = type.rfind(' '); space != std::string_view::npos) type.remove_prefix(space + 1);
  if (const auto colons = type.rfind("::"); colons != std::string_view::npos) type.remove_prefix(colons + 2);
  return type;
}

inline std::optional<CallFamily> forbidden_stream_family(std::string_view type) {
  const std::string_view base = type_base_name(type);
  for (const auto& t : forbidden_stream_types)
    if (t.name == base) return t.family;
  return std::nullopt;
}

inline bool is_identifier_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// ---------------------------------------------------------------------------------------------------
// The text pass.

/// One line as the preprocessor sees it: backslash-newlines spliced, comments replaced by a space.
/// `code` is `text` with the contents of string and character literals blanked (same length).
struct LogicalLine {
  int line = 1;                       ///< the physical line it starts on
  std::size_t begin = 0, end = 0;     ///< its span in the source, newline excluded
  std::string text;
  std::string code;
};

inline std::vector<LogicalLine> logical_lines(std::string_view s) {
  std::vector<LogicalLine> out;
  LogicalLine cur;
  int line = 1;
  enum class State { code, block_comment, line_comment, literal, raw_literal } state = State::code;
  char quote = 0;
  std::string raw_end;  // `)delim"` that closes a raw string
  auto splice_length = [&](std::size_t i) -> std::size_t {
    if (s[i] != '\\') return 0;
    if (i + 1 < s.size() && s[i + 1] == '\n') return 2;
    if (i + 2 < s.size() && s[i + 1] == '\r' && s[i + 2] == '\n') return 3;
    return 0;
  };
  auto emit = [&](char text_char, char code_char) {
    cur.text += text_char;
    cur.code += code_char;
  };
  auto end_line = [&](std::size_t at) {
    cur.end = at;
    out.push_back(std::move(cur));
    cur = LogicalLine{};
    cur.line = ++line;
    cur.begin = at + 1;
  };
  // A quote after a digit of a number is a digit separator (1'000), not a character literal.
  auto digit_separator = [&] {
    std::size_t k = cur.code.size();
    while (k > 0 && (is_identifier_char(cur.code[k - 1]) || cur.code[k - 1] == '.' || cur.code[k - 1] == '\'')) --k;
    return k < cur.code.size() && std::isdigit(static_cast<unsigned char>(cur.code[k])) &&
           std::isxdigit(static_cast<unsigned char>(cur.code.back()));
  };
  // R"delim( ... )delim", with an optional encoding prefix before the R.
  auto raw_prefix = [&] {
    const std::string& c = cur.code;
    if (c.empty() || c.back() != 'R') return false;
    std::size_t k = c.size() - 1;
    while (k > 0 && is_identifier_char(c[k - 1])) --k;
    const std::string_view prefix(c.data() + k, c.size() - k);
    return prefix == "R" || prefix == "LR" || prefix == "uR" || prefix == "UR" || prefix == "u8R";
  };
  for (std::size_t i = 0; i < s.size();) {
    if (state != State::raw_literal)
      if (const std::size_t k = splice_length(i)) {
        i += k;
        ++line;
        continue;
      }
    const char c = s[i];
    switch (state) {
      case State::code:
        if (c == '/' && i + 1 < s.size() && s[i + 1] == '*') {
          state = State::block_comment;
          emit(' ', ' ');
          i += 2;
          continue;
        }
        if (c == '/' && i + 1 < s.size() && s[i + 1] == '/') {
          state = State::line_comment;
          i += 2;
          continue;
        }
        if (c == '\n') {
          end_line(i);
          break;
        }
        if (c == '"' && raw_prefix()) {
          const std::size_t open = s.find('(', i + 1);
          if (open != std::string_view::npos && open - i - 1 <= 16) {
            raw_end = ")" + std::string(s.substr(i + 1, open - i - 1)) + "\"";
            state = State::raw_literal;
          }
          emit(c, c);
          break;
        }
        if (c == '"' || (c == '\'' && !digit_separator())) {
          state = State::literal;
          quote = c;
        }
        emit(c, c);
        break;
      case State::block_comment:
        if (c == '*' && i + 1 < s.size() && s[i + 1] == '/') {
          state = State::code;
          i += 2;
          continue;
        }
        if (c == '\n') ++line;
        break;
      case State::line_comment:
        if (c == '\n') {
          state = State::code;
          end_line(i);
        }
        break;
      case State::literal:
        if (c == '\n') {  // an unterminated literal ends with its line
          state = State::code;
          end_line(i);
          break;
        }
        if (c == '\\' && i + 1 < s.size() && s[i + 1] != '\n') {
          emit(c, ' ');
          emit(s[i + 1], ' ');
          i += 2;
          continue;
        }
        if (c == quote) {
          state = State::code;
          emit(c, c);
        } else {
          emit(c, ' ');
        }
        break;
      case State::raw_literal:
        if (s.substr(i).starts_with(raw_end)) {
          for (char r : raw_end) emit(r, r == '"' ? '"' : ' ');
          i += raw_end.size();
          state = State::code;
          continue;
        }
        if (c == '\n') ++line;  // a raw string spans lines inside one logical line
        emit(c == '\n' ? ' ' : c, ' ');
        break;
    }
    ++i;
  }
  cur.end = s.size();
  out.push_back(std::move(cur));
  return out;
}

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

inline std::vector<std::string_view> words(std::string_view s) {
  std::vector<std::string_view> out;
  for (std::size_t i = 0; i < s.size();) {
    if (!is_identifier_char(s[i])) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < s.size() && is_identifier_char(s[j])) ++j;
    out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

/// Pragmas a kernel may use: loop and vectorization hints, OpenMP, packing, nvcc's own warnings. The
/// rest is refused, above all those that silence clang's diagnostics (which the screen reads), mark
/// code as a system header, rename symbols (redefine_extname, weak) or place code in sections.
inline bool pragma_allowed(std::string_view pragma) {
  const auto w = words(pragma);
  if (w.empty()) return true;
  auto one_of = [](std::string_view x, std::initializer_list<std::string_view> set) {
    return std::find(set.begin(), set.end(), x) != set.end();
  };
  if (one_of(w[0], {"once", "omp", "unroll", "nounroll", "pack", "STDC", "message", "push_macro", "pop_macro", "ivdep",
                    "vector", "novector", "simd", "loop_count", "nv_diag_suppress", "nv_diag_default", "nv_diag_warning",
                    "nv_diag_once", "diag_suppress", "diag_default"}))
    return true;
  if (w[0] == "GCC")
    return w.size() > 1 && one_of(w[1], {"unroll", "ivdep", "novector", "optimize", "target", "push_options",
                                          "pop_options", "reset_options", "visibility", "poison", "warning", "error"});
  if (w[0] == "clang") return w.size() > 1 && one_of(w[1], {"loop", "fp", "max_tokens_here", "max_tokens_total"});
  return false;
}

inline bool include_allowed(std::string_view name, const std::vector<std::string>& allowed) {
  if (name.empty() || name.front() == '/' || name.find("..") != std::string_view::npos ||
      name.find('\\') != std::string_view::npos)
    return false;
  for (const auto& a : allowed) {
    const bool directory = !a.empty() && a.back() == '/';
    if (directory ? name.starts_with(a) && name.size() > a.size() : name == a) return true;
  }
  return false;
}

/// What the text pass found, and the #include lines it hoists into the prelude.
struct TextScan {
  std::vector<ScreeningFinding> findings;
  std::vector<std::string> includes;  ///< "#include <cmath>", in order
  std::string body;                   ///< the source with its #include lines blanked (newlines kept)
  bool has_code = false;              ///< anything outside directives: a dump without it is no surprise
};

inline void add_finding(std::vector<ScreeningFinding>& findings, ScreeningRule rule, int line, std::string what) {
  findings.push_back({rule, line, fmt::format("line {}: {}", line, what)});
}

// `.incbin` in any spelling that survives string concatenation and escapes: ".inc" "bin", "\x2eincbin".
inline void scan_incbin(std::string_view source, std::vector<ScreeningFinding>& findings) {
  std::string squeezed;
  std::vector<int> line_of;
  int line = 1;
  for (char c : source) {
    if (c == '\n') ++line;
    if (std::isspace(static_cast<unsigned char>(c)) || c == '"' || c == '\\') continue;
    squeezed += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    line_of.push_back(line);
  }
  if (const std::size_t at = squeezed.find("incbin"); at != std::string::npos)
    add_finding(findings, ScreeningRule::incbin, line_of[at],
                ".incbin (embeds a file of the build machine into the kernel; never allowed)");
}

inline TextScan scan_text(std::string_view source, const ScreeningRules& rules) {
  TextScan scan;
  scan.body = std::string(source);
  scan_incbin(source, scan.findings);
  for (const LogicalLine& l : logical_lines(source)) {
    std::string_view code = trim(l.code);
    auto text_at = [&](std::size_t from) { return std::string_view(l.text).substr(from); };
    // _Pragma("...") works anywhere, also from macros: its string must be a literal, and allowed.
    for (std::size_t at = l.code.find("_Pragma"); at != std::string::npos; at = l.code.find("_Pragma", at + 7)) {
      if (at > 0 && is_identifier_char(l.code[at - 1])) continue;
      std::string_view rest = trim(std::string_view(l.code).substr(at + 7));
      if (!rest.starts_with('(')) continue;
      rest = trim(rest.substr(1));
      const std::size_t from = static_cast<std::size_t>(rest.data() - l.code.data());
      const std::size_t quote = rest.find('"');
      const bool literal = quote != std::string_view::npos && quote <= 2 && words(rest.substr(0, quote)).size() <= 1 &&
                           std::all_of(rest.begin(), rest.begin() + quote, is_identifier_char);
      if (!literal) {
        add_finding(scan.findings, ScreeningRule::directive, l.line, "_Pragma with a computed argument (write the pragma out)");
        continue;
      }
      std::string_view text = text_at(from + quote + 1);
      std::string pragma;
      for (std::size_t k = 0; k < text.size() && text[k] != '"'; ++k) pragma += text[k] == '\\' && k + 1 < text.size() ? text[++k] : text[k];
      if (!pragma_allowed(pragma))
        add_finding(scan.findings, ScreeningRule::directive, l.line,
                    fmt::format("_Pragma(\"{}\") is not allowed (a pragma may not change diagnostics, sections or symbol names)", trim(pragma)));
    }
    std::size_t hash = 0;
    if (code.starts_with('#')) hash = 1;
    else if (code.starts_with("%:")) hash = 2;  // the digraph
    if (hash == 0) {
      if (!code.empty()) scan.has_code = true;
      continue;
    }
    std::string_view rest = trim(code.substr(hash));
    std::size_t name_length = 0;
    while (name_length < rest.size() && is_identifier_char(rest[name_length])) ++name_length;
    const std::string_view name = rest.substr(0, name_length);
    const std::size_t after = static_cast<std::size_t>(rest.data() - l.code.data()) + name_length;
    if (name.empty() && rest.empty()) continue;  // the null directive
    if ((!name.empty() && std::isdigit(static_cast<unsigned char>(name[0]))) || name == "line") {
      add_finding(scan.findings, ScreeningRule::directive, l.line,
                  "#line or a line marker (it hides where code comes from; not allowed)");
      continue;
    }
    if (name == "include") {
      const std::string_view spec = trim(text_at(after));
      const char open = spec.empty() ? 0 : spec[0];
      const std::size_t close = open == '<' ? spec.find('>', 1) : open == '"' ? spec.find('"', 1) : std::string_view::npos;
      if (close == std::string_view::npos) {
        add_finding(scan.findings, ScreeningRule::include, l.line,
                    "#include of a computed name (write #include <header> with a header from the allow-list)");
        continue;
      }
      const std::string_view header = spec.substr(1, close - 1);
      if (!include_allowed(header, rules.allowed_includes)) {
        add_finding(scan.findings, ScreeningRule::include, l.line,
                    fmt::format("#include {} is not on the allow-list (a kernel includes the standard library's computing "
                                "headers, \"kevo_problem.hpp\" and the kevo headers its problem's library_headers names; "
                                "no I/O, files or system headers)",
                                spec.substr(0, close + 1)));
        continue;
      }
      scan.includes.push_back(fmt::format("#include {}", spec.substr(0, close + 1)));
      for (std::size_t k = l.begin; k < l.end && k < scan.body.size(); ++k)
        if (scan.body[k] != '\n') scan.body[k] = ' ';
      continue;
    }
    static constexpr std::string_view plain[] = {"define", "undef", "if", "ifdef", "ifndef", "elif", "elifdef",
                                                 "elifndef", "else", "endif", "error", "warning"};
    if (std::find(std::begin(plain), std::end(plain), name) != std::end(plain)) continue;
    if (name == "pragma") {
      const std::string_view pragma = trim(text_at(after));
      if (!pragma_allowed(pragma))
        add_finding(scan.findings, ScreeningRule::directive, l.line,
                    fmt::format("#pragma {} is not allowed (a pragma may not change diagnostics, sections or symbol names)", pragma));
      continue;
    }
    add_finding(scan.findings, ScreeningRule::directive, l.line,
                fmt::format("#{} is not allowed (only #include, #define, #if and their kin, #pragma)", name.empty() ? rest.substr(0, 1) : name));
  }
  return scan;
}

// ---------------------------------------------------------------------------------------------------
// The AST pass.

/// Walks clang's JSON AST in document order. clang omits a location's "file" (and "line") when it
/// equals the previous location's, so the current file is a state carried through every location,
/// in order; a location in an included file also carries "includedFrom".
/// The candidate's code sits in the screen's namespace, where its own `read` (a function, a struct, a
/// variable) would hide libc's from the screen's name lookup but not from the real, global-scope
/// build: a namespace-scope declaration that takes a name of `forbidden_calls` is itself a finding.
class AstScreen {
 public:
  AstScreen(std::string main_file, const ScreeningRules& rules, std::vector<ScreeningFinding>& findings)
      : main_file_(std::move(main_file)), rules_(rules), findings_(findings) {}

  /// Walks one top-level node; false when the JSON could not be read (error() says why).
  bool walk(simdjson::ondemand::object root) {
    walk_node(root, {}, 0);
    return !error_;
  }
  simdjson::error_code error() const { return error_; }
  std::size_t main_nodes() const { return main_nodes_; }

  /// Deep enough for any real kernel; a deeper AST is not read (the note says so).
  static constexpr std::size_t max_depth = 2000;

 private:
  struct Point {
    bool valid = false;
    bool in_main = false;
    int line = 0;
  };
  struct Context {
    bool in_main = false;
    int line = 0;
    bool namespace_scope = false;  ///< a declaration here is at namespace scope
  };

  template <class T>
  bool ok(simdjson::simdjson_result<T> r, T& out) {
    if (error_) return false;
    if (auto e = std::move(r).get(out)) error_ = e;
    return !error_;
  }

  // A location: bare {offset, file?, line?, col, tokLen, includedFrom?}, or {spellingLoc, expansionLoc}
  // from a macro, where the expansion (the place the macro was used) decides.
  Point read_location(simdjson::ondemand::object loc) {
    Point bare, expansion;
    bool split = false, included = false;
    for (auto field : loc) {
      std::string_view key;
      if (!ok(field.unescaped_key(), key)) return {};
      if (key == "spellingLoc" || key == "expansionLoc") {
        simdjson::ondemand::object inner;
        if (!ok(field.value().get_object(), inner)) return {};
        const Point p = read_location(inner);
        if (key == "expansionLoc") {
          expansion = p;
          split = true;
        }
      } else if (key == "file") {
        std::string_view f;
        if (!ok(field.value().get_string(), f)) return {};
        last_file_.assign(f);
      } else if (key == "line") {
        std::int64_t l = 0;
        if (!ok(field.value().get_int64(), l)) return {};
        last_line_ = static_cast<int>(l);
      } else if (key == "offset") {
        bare.valid = true;
      } else if (key == "includedFrom") {
        included = true;
      }
    }
    if (split) return expansion;
    if (bare.valid) {
      bare.in_main = !included && last_file_ == main_file_;
      bare.line = last_line_;
    }
    return bare;
  }

  void read_strings(simdjson::ondemand::object obj, std::initializer_list<std::pair<std::string_view, std::string*>> wanted) {
    for (auto field : obj) {
      std::string_view key;
      if (!ok(field.unescaped_key(), key)) return;
      for (auto [name, out] : wanted)
        if (key == name) {
          std::string_view v;
          if (!ok(field.value().get_string(), v)) return;
          out->assign(v);
        }
    }
  }

  void walk_node(simdjson::ondemand::object node, Context parent, std::size_t depth) {
    if (depth > max_depth) {
      error_ = simdjson::DEPTH_ERROR;
      return;
    }
    Node n;
    Point where;
    auto here = [&] { return where.valid ? where : Point{true, parent.in_main, parent.line}; };
    for (auto field : node) {
      std::string_view key;
      if (!ok(field.unescaped_key(), key)) return;
      if (key == "kind" || key == "name") {
        std::string_view v;
        if (!ok(field.value().get_string(), v)) return;
        (key == "kind" ? n.kind : n.name).assign(v);
      } else if (key == "loc") {
        simdjson::ondemand::object loc;
        if (!ok(field.value().get_object(), loc)) return;
        const Point p = read_location(loc);
        if (p.valid && !where.valid) where = p;
      } else if (key == "range") {
        simdjson::ondemand::object range;
        if (!ok(field.value().get_object(), range)) return;
        for (auto end : range) {
          std::string_view which;
          simdjson::ondemand::object loc;
          if (!ok(end.unescaped_key(), which) || !ok(end.value().get_object(), loc)) return;
          const Point p = read_location(loc);
          if (which == "begin" && p.valid && !where.valid) where = p;
        }
      } else if (key == "referencedDecl" || key == "foundReferencedDecl" || key == "type") {
        simdjson::ondemand::object obj;
        if (!ok(field.value().get_object(), obj)) return;
        if (key == "referencedDecl") read_strings(obj, {{"kind", &n.ref_kind}, {"name", &n.ref_name}});
        else if (key == "foundReferencedDecl") read_strings(obj, {{"kind", &n.found_kind}});
        else read_strings(obj, {{"qualType", &n.type}, {"desugaredQualType", &n.desugared}});
      } else if (key == "inner") {
        simdjson::ondemand::array inner;
        if (!ok(field.value().get_array(), inner)) return;
        const Point p = here();
        const bool scope = n.kind == "NamespaceDecl" || n.kind == "LinkageSpecDecl" || n.kind == "ExportDecl";
        const Context context{p.in_main, p.line, scope};
        for (auto element : inner) {
          simdjson::ondemand::object child;
          if (!ok(element.get_object(), child)) return;
          walk_node(child, context, depth + 1);
          if (error_) return;
        }
      }
      if (error_) return;
    }
    const Point p = here();
    if (!p.in_main) return;
    ++main_nodes_;
    check(n, p.line, parent.namespace_scope);
  }

  struct Node {
    std::string kind, name, ref_kind, ref_name, found_kind, type, desugared;
  };

  void check(const Node& n, int line, bool namespace_scope) {
    auto add = [&](ScreeningRule rule, std::string what) { add_finding(findings_, rule, line, std::move(what)); };
    const std::string& kind = n.kind;
    if ((kind == "GCCAsmStmt" || kind == "MSAsmStmt") && !rules_.allow_asm)
      add(ScreeningRule::inline_asm, "asm statement (inline assembly is not allowed for this problem)");
    else if (kind == "FileScopeAsmDecl")
      add(ScreeningRule::inline_asm, "asm at file scope (assembly outside a function is never allowed)");
    else if (kind == "AsmLabelAttr")
      add(ScreeningRule::inline_asm, "asm label (binds a declaration to another symbol's name; not allowed)");
    else if (kind == "ConstructorAttr")
      add(ScreeningRule::static_initializer, "__attribute__((constructor)) (runs code at start-up, before main; not allowed)");
    else if (kind == "DestructorAttr")
      add(ScreeningRule::static_initializer, "__attribute__((destructor)) (runs code at exit; not allowed)");
    else if (kind == "SectionAttr" || kind == "CodeSegAttr")
      add(ScreeningRule::static_initializer, "__attribute__((section)) (a section such as .init_array runs code at start-up; not allowed)");
    else if (kind == "IFuncAttr")
      add(ScreeningRule::static_initializer, "__attribute__((ifunc)) (its resolver runs at load time; not allowed)");
    else if (kind == "AliasAttr" || kind == "WeakRefAttr")
      add(ScreeningRule::forbidden_call, "an alias attribute (binds a declaration to another symbol; not allowed)");
    else if (kind == "DeclRefExpr" && n.ref_kind == "FunctionDecl" && n.found_kind != "FunctionTemplateDecl") {
      if (const auto family = forbidden_call_family(n.ref_name))
        add(ScreeningRule::forbidden_call, fmt::format("calls {} ({})", n.ref_name, why(*family)));
    } else if (kind == "CXXConstructExpr" || kind == "CXXTemporaryObjectExpr") {
      auto family = forbidden_stream_family(n.type);
      if (!family && !n.desugared.empty()) family = forbidden_stream_family(n.desugared);
      if (family) add(ScreeningRule::forbidden_call, fmt::format("constructs {} ({})", n.type, why(*family)));
    } else if (namespace_scope && !n.name.empty() && kind.ends_with("Decl") && forbidden_call_family(n.name)) {
      add(ScreeningRule::forbidden_call,
          fmt::format("declares {} at namespace scope (it would hide or replace the library's {}, which a kernel may "
                      "not call: rename it)", n.name, n.name));
    }
  }

  std::string main_file_;
  const ScreeningRules& rules_;
  std::vector<ScreeningFinding>& findings_;
  std::string last_file_;
  int last_line_ = 0;
  std::size_t main_nodes_ = 0;
  simdjson::error_code error_ = simdjson::SUCCESS;
};

/// A private directory, removed with everything in it when this goes.
class PrivateDirectory {
 public:
  PrivateDirectory() {
    std::error_code ec;
    std::string pattern = (std::filesystem::temp_directory_path(ec) / "kevo-screen-XXXXXX").string();
    if (::mkdtemp(pattern.data())) path_ = pattern;
  }
  ~PrivateDirectory() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  PrivateDirectory(const PrivateDirectory&) = delete;
  PrivateDirectory& operator=(const PrivateDirectory&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline bool write_text(const std::filesystem::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  return static_cast<bool>(out);
}

/// A name no candidate can guess: the namespace that holds its code while clang parses it.
inline std::string screen_namespace() {
  std::random_device device;
  std::mt19937_64 bits((static_cast<std::uint64_t>(device()) << 32) ^ device() ^
                       static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  return fmt::format("kevo_screen_{:016x}", bits());
}

/// The language flags for a target (the pass's own come after them). CUDA is parsed with clang's CUDA
/// wrapper against the installed toolkit; CUDA 12 dropped texture references, which clang-15's wrapper
/// still names, so two tiny stand-ins fill in for them (`shim`).
inline std::vector<std::string> language_flags(Target target, const ScreeningRules& rules, const std::filesystem::path& shim) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (target == Target::cpu) return {"-x", "c++", "-std=c++20"};
  if (target == Target::hip) return {"-x", "hip", "-std=c++20", "-nogpuinc", "-nogpulib"};
  if (!fs::exists(rules.cuda_path / "include" / "cuda_runtime.h", ec))
    return {"-x", "cuda", "-std=c++20", "-nocudainc", "-nocudalib", "-Wno-unknown-cuda-version"};
  std::vector<std::string> flags{"-x", "cuda", "-std=c++20", "-nocudalib", "-Wno-unknown-cuda-version",
                                 "--cuda-path=" + rules.cuda_path.string()};
  if (!fs::exists(rules.cuda_path / "include" / "texture_fetch_functions.h", ec)) {
    fs::create_directories(shim / "crt", ec);
    write_text(shim / "crt" / "host_runtime.h",
               "#include_next <crt/host_runtime.h>\n"
               "template <class T, int texType = 1, enum cudaTextureReadMode mode = cudaReadModeElementType>\n"
               "struct texture {};\n");
    write_text(shim / "texture_fetch_functions.h", "");
    flags.push_back("-I" + shim.string());
  }
  if (fs::exists(rules.cuda_path / "include" / "cccl", ec)) flags.push_back("-I" + (rules.cuda_path / "include" / "cccl").string());
  return flags;
}

/// One pass of the real compiler over the candidate: the host's, or one device architecture's. Each
/// sees code the others' #ifs hide (`#ifdef __CUDA_ARCH__`, `#ifdef __NVCC__`), so each is parsed.
struct CompilePass {
  std::string name;                      ///< "the device pass for __CUDA_ARCH__=900": for the note; empty for C++
  std::vector<std::string> clang_flags;  ///< --cuda-host-only, or --cuda-device-only and the architecture
  std::vector<std::string> macros;       ///< "__NVCC__", "__CUDACC_VER_MAJOR__=13": defined for the candidate's code
};

/// Splits one line of `nvcc --dryrun` into its arguments, as the shell would (double quotes only).
inline std::vector<std::string> shell_words(std::string_view line) {
  std::vector<std::string> out;
  std::string word;
  bool quoted = false, any = false;
  for (char c : line) {
    if (c == '"') {
      quoted = !quoted;
      any = true;
    } else if (!quoted && std::isspace(static_cast<unsigned char>(c))) {
      if (any) out.push_back(std::move(word));
      word.clear();
      any = false;
    } else {
      word += c;
      any = true;
    }
  }
  if (any) out.push_back(std::move(word));
  return out;
}

/// clang-15 knows architectures up to sm_86: a later one is parsed as sm_86, with nvcc's __CUDA_ARCH__
/// put back on the command line, so that the toolkit's headers declare that architecture's intrinsics.
inline std::string clang_cuda_arch(int cuda_arch) {
  for (int known : {86, 80, 75, 72, 70, 62, 61, 60, 53, 52, 50, 37, 35})
    if (cuda_arch >= known * 10) return fmt::format("sm_{}", known);
  return "sm_35";
}

/// nvcc's passes for `rules.nvcc_flags`, read from its dry run: each `gcc -E` line there is one pass,
/// with the -D and -U nvcc gives it (__CUDA_ARCH__, __CUDA_ARCH_FEAT_SM90_ALL, the nvcc version
/// macros, the problem's -D), so nothing here restates what the installed nvcc does. -arch=sm_90a is
/// three passes: the host, compute_90 and compute_90a.
inline expected<std::vector<CompilePass>, Error> nvcc_passes(const ScreeningRules& rules, const std::filesystem::path& input) {
  const std::filesystem::path nvcc = rules.cuda_path / "bin" / "nvcc";
  std::vector<std::string> argv{nvcc.string()};
  argv.insert(argv.end(), rules.nvcc_flags.begin(), rules.nvcc_flags.end());
  argv.insert(argv.end(), {"--dryrun", "-c", input.string(), "-o", (input.parent_path() / "dryrun.o").string()});
  const SandboxResult r = run_sandboxed(argv, SandboxLimits{.wall_time = std::chrono::milliseconds(10'000),
                                                            .drop_privileges = false,
                                                            .isolate = false,
                                                            .working_directory = input.parent_path()});
  if (!r.ok()) return make_error(fmt::format("nvcc's dry run failed: {}", r.started ? trim(r.stderr_text).substr(0, 300) : r.setup_error));
  std::vector<CompilePass> passes;
  std::vector<std::vector<std::string>> seen;
  const std::string& listing = r.stderr_text.empty() ? r.stdout_text : r.stderr_text;
  for (std::size_t at = 0; at < listing.size();) {
    const std::size_t nl = std::min(listing.find('\n', at), listing.size());
    const std::string_view line = std::string_view(listing).substr(at, nl - at);
    at = nl + 1;
    if (!line.starts_with("#$ ")) continue;
    const auto args = shell_words(line.substr(3));
    if (std::find(args.begin(), args.end(), "-E") == args.end()) continue;  // not a preprocessing pass
    std::vector<std::string> macros;
    for (std::size_t i = 0; i < args.size(); ++i) {
      for (std::string_view flag : {"-D", "-U"}) {
        if (!std::string_view(args[i]).starts_with(flag)) continue;
        std::string macro = args[i].size() > 2 ? args[i].substr(2) : i + 1 < args.size() ? args[++i] : "";
        if (!macro.empty()) macros.push_back(flag == "-U" ? "-" + macro : macro);  // "-NAME": undefined
      }
    }
    if (std::find(seen.begin(), seen.end(), macros) != seen.end()) continue;
    seen.push_back(macros);
    int cuda_arch = 0;
    for (const auto& m : macros)
      if (m.starts_with("__CUDA_ARCH__=")) cuda_arch = std::atoi(m.c_str() + 14);
    CompilePass pass;
    pass.name = cuda_arch ? fmt::format("nvcc's device pass for __CUDA_ARCH__={}", cuda_arch) : "nvcc's host pass";
    if (cuda_arch) {
      for (const auto& m : macros)
        if (m.starts_with("__CUDA_ARCH_FEAT") || m.starts_with("__CUDA_ARCH_SPECIFIC") || m.starts_with("__CUDA_ARCH_FAMILY"))
          pass.name += fmt::format(" ({})", m.substr(0, m.find('=')));
      // clang's driver tells the host side the toolkit's version but not the device side, which then
      // parses a launch (<<<>>>) through CUDA 9's cudaConfigureCall, gone from CUDA 12: any version from
      // 9.2 on parses it as the host does (11.5: the newest clang-15 knows).
      pass.clang_flags = {"--cuda-device-only", "--cuda-gpu-arch=" + clang_cuda_arch(cuda_arch), "-Xclang",
                          "-target-sdk-version=11.5", "-U__CUDA_ARCH__"};
    } else {
      pass.clang_flags = {"--cuda-host-only"};
    }
    // The architecture's macros reach the toolkit's headers too; nvcc's others only the candidate's code
    // (the prelude defines them after its #includes), since the headers parse in clang-15 only on its own path.
    for (const auto& m : macros)
      if (m.starts_with("__CUDA_ARCH")) pass.clang_flags.push_back("-D" + m);
    pass.macros = std::move(macros);
    passes.push_back(std::move(pass));
  }
  if (passes.empty()) return make_error("nvcc's dry run named no preprocessing pass");
  return passes;
}

/// The passes the candidate is parsed in. HIP: the host and one device pass (clang defines
/// __HIP_DEVICE_COMPILE__ there); gfx90a stands for every architecture, as no HIP evaluator names one.
inline expected<std::vector<CompilePass>, Error> compile_passes(Target target, const ScreeningRules& rules,
                                                                const std::filesystem::path& input) {
  if (target == Target::cpu) return std::vector<CompilePass>{CompilePass{}};
  if (target == Target::hip)
    return std::vector<CompilePass>{{"the host pass", {"--cuda-host-only"}, {}},
                                    {"the device pass (gfx90a)", {"--cuda-device-only", "--offload-arch=gfx90a"}, {}}};
  return nvcc_passes(rules, input);
}

/// "file:12:5: warning: declaration requires a global constructor" lines of the candidate's file, and
/// errors after the candidate's last line (the sentinel's), which mean its braces do not balance.
inline void read_diagnostics(std::string_view stderr_text, std::string_view main_file, std::string_view source,
                             int last_candidate_line, std::string_view nonce, std::vector<ScreeningFinding>& findings) {
  std::vector<std::string_view> source_lines;
  for (std::size_t at = 0; at <= source.size();) {
    const std::size_t nl = std::min(source.find('\n', at), source.size());
    source_lines.push_back(source.substr(at, nl - at));
    at = nl + 1;
  }
  // The sentinel fails by name when the candidate closed the namespace early and opened another, and
  // as an extraneous brace when it closed it without opening another.
  bool unbalanced = false, candidate_errors = false;
  for (std::size_t at = 0; at < stderr_text.size();) {
    const std::size_t nl = std::min(stderr_text.find('\n', at), stderr_text.size());
    const std::string_view line_text = stderr_text.substr(at, nl - at);
    at = nl + 1;
    const bool is_error = line_text.find(": error: ") != std::string_view::npos;
    if (is_error && line_text.find(nonce) != std::string_view::npos) unbalanced = true;
    if (!line_text.starts_with(main_file) || line_text.size() <= main_file.size() || line_text[main_file.size()] != ':') continue;
    int line = 0, column = 0;
    const std::string_view rest = line_text.substr(main_file.size() + 1);
    if (std::sscanf(std::string(rest.substr(0, 32)).c_str(), "%d:%d", &line, &column) != 2) continue;
    if (is_error && line <= last_candidate_line) candidate_errors = true;
    if (is_error && line > last_candidate_line && rest.find("extraneous closing brace") != std::string_view::npos) unbalanced = true;
    // A device pass drops a call of a host function from device code from its AST, with an error that
    // names it: nvcc refuses the call too, but the reason the synthesizer needs is the function's.
    if (is_error)
      for (std::string_view lead : {"reference to __host__ function '", "no matching function for call to '"})
        if (const std::size_t at = rest.find(lead); at != std::string_view::npos) {
          std::string_view name = rest.substr(at + lead.size());
          name = name.substr(0, name.find('\''));
          if (const std::size_t colons = name.rfind("::"); colons != std::string_view::npos) name.remove_prefix(colons + 2);
          if (const auto family = forbidden_call_family(name))
            add_finding(findings, ScreeningRule::forbidden_call, line, fmt::format("calls {} ({})", name, why(*family)));
        }
    const bool constructor = rest.find("declaration requires a global constructor") != std::string_view::npos;
    const bool destructor = rest.find("declaration requires a global destructor") != std::string_view::npos;
    if (!constructor && !destructor) continue;
    std::string name = "a namespace-scope variable";
    if (line >= 1 && static_cast<std::size_t>(line) <= source_lines.size() && column >= 1) {
      const std::string_view text = source_lines[line - 1];
      std::size_t b = static_cast<std::size_t>(column - 1), e = b;
      while (e < text.size() && is_identifier_char(text[e])) ++e;
      if (e > b) name = fmt::format("'{}'", text.substr(b, e - b));
    }
    add_finding(findings, ScreeningRule::static_initializer, line,
                constructor ? fmt::format("static initializer: {} needs code at start-up, before main (its initializer "
                                          "is not a constant; make it constexpr, or a function-local static)", name)
                            : fmt::format("static initializer: {} has a destructor that runs at exit (make it "
                                          "constexpr or trivially destructible, or a function-local static)", name));
  }
  // Where the candidate's own code has errors, a failed sentinel is one more: the note says it did not parse.
  if (unbalanced && !candidate_errors)
    add_finding(findings, ScreeningRule::unbalanced, last_candidate_line,
                "the braces do not balance: the candidate closes or leaves open a scope it did not open");
}

/// The first error, with the private directory left out; an error after the candidate's last line
/// (in the sentinel, where an unfinished declaration ends) is said to be at its end.
inline std::string first_error_line(std::string_view stderr_text, const std::string& private_prefix, std::string_view main_file,
                                    int last_candidate_line) {
  for (std::size_t at = 0; at < stderr_text.size();) {
    const std::size_t nl = std::min(stderr_text.find('\n', at), stderr_text.size());
    const std::string_view text = stderr_text.substr(at, nl - at);
    at = nl + 1;
    const std::size_t error = text.find("error: ");
    if (error == std::string_view::npos) continue;
    int line = 0;
    if (text.starts_with(main_file) && std::sscanf(std::string(text.substr(main_file.size())).c_str(), ":%d:", &line) == 1 &&
        line > last_candidate_line)
      return fmt::format("{} (at its end): {}", std::filesystem::path(main_file).filename().string(), text.substr(error));
    std::string out(text);
    for (std::size_t p = out.find(private_prefix); p != std::string::npos; p = out.find(private_prefix)) out.erase(p, private_prefix.size());
    return out;
  }
  return "no error message";
}

inline void finish(ScreeningVerdict& v, std::chrono::steady_clock::time_point started) {
  // Passes that see the same code find the same things: each finding once.
  std::vector<ScreeningFinding> unique;
  for (auto& f : v.findings)
    if (std::none_of(unique.begin(), unique.end(), [&](const auto& u) { return u.rule == f.rule && u.message == f.message; }))
      unique.push_back(std::move(f));
  v.findings = std::move(unique);
  std::stable_sort(v.findings.begin(), v.findings.end(), [](const auto& a, const auto& b) { return a.line < b.line; });
  v.refused = !v.findings.empty();
  if (v.refused) {
    v.rule = v.findings.front().rule;
    constexpr std::size_t shown = 4;
    for (std::size_t i = 0; i < v.findings.size() && i < shown; ++i) v.reason += (i ? "; " : "") + v.findings[i].message;
    if (v.findings.size() > shown) v.reason += fmt::format("; and {} more", v.findings.size() - shown);
  }
  v.wall = std::chrono::steady_clock::now() - started;
}

/// The files clang reads: the prelude (the candidate's #includes, the pass's macros, then the opening of
/// the namespace its code is dumped from) and the candidate, its #include lines blanked, then the
/// sentinel: our `}` must close our namespace (keywords freed from the candidate's macros first).
struct ScreenInputs {
  std::filesystem::path candidate;
  std::string nonce = screen_namespace();
  int last_line = 1;  ///< the candidate's; the sentinel's lines come after
};

inline expected<ScreenInputs, Error> write_inputs(const std::filesystem::path& dir, Target target, std::string_view source,
                                                  const TextScan& text) {
  ScreenInputs in;
  in.candidate = dir / (target == Target::cpu ? "candidate.cpp" : target == Target::cuda ? "candidate.cu" : "candidate.hip");
  in.last_line = static_cast<int>(std::count(source.begin(), source.end(), '\n')) + 1;
  const std::string body = text.body + fmt::format(
                                           "\n\n#undef inline\n#undef constexpr\n#undef int\n#undef static_assert\n"
                                           "inline constexpr int {0}_end = 1; }}\n"
                                           "static_assert({0}::{0}_end == 1, \"kevo screen: the braces do not balance\");\n",
                                           in.nonce);
  if (!write_text(in.candidate, body)) return make_error("the candidate could not be written to the screen's temporary directory");
  return in;
}

/// The prelude of one pass. The pass's macros come after the #includes: the candidate's code sees nvcc's
/// (__NVCC__, __CUDACC__ as 1, the version), the toolkit's headers clang's, which is the path they parse on.
inline expected<std::filesystem::path, Error> write_prelude(const std::filesystem::path& dir, std::size_t pass_index,
                                                            const TextScan& text, const CompilePass& pass,
                                                            const ScreenInputs& in) {
  std::string prelude;
  for (const auto& line : text.includes) prelude += line + "\n";
  for (const auto& m : pass.macros) {
    const bool undefine = m.starts_with('-');
    const std::string_view macro = std::string_view(m).substr(undefine ? 1 : 0);
    const std::size_t eq = macro.find('=');
    const std::string_view name = macro.substr(0, eq);
    if (name.empty() || !std::all_of(name.begin(), name.end(), is_identifier_char)) continue;  // a function-like -D: not nvcc's own
    prelude += fmt::format("#undef {}\n", name);
    if (!undefine) prelude += fmt::format("#define {} {}\n", name, eq == std::string_view::npos ? "1" : macro.substr(eq + 1));
  }
  prelude += fmt::format("namespace {} {{\n", in.nonce);
  const std::filesystem::path path = dir / fmt::format("kevo_screen_prelude_{}.hpp", pass_index);
  if (!write_text(path, prelude)) return make_error("the prelude could not be written to the screen's temporary directory");
  return path;
}

inline std::vector<std::string> clang_command(const std::vector<std::string>& language, const ScreeningRules& rules,
                                              const std::filesystem::path& include_dir, const ScreenInputs& in,
                                              const CompilePass& pass, const std::filesystem::path& prelude,
                                              bool preprocess_only = false) {
  std::vector<std::string> argv{rules.clang};
  argv.insert(argv.end(), language.begin(), language.end());
  argv.insert(argv.end(), pass.clang_flags.begin(), pass.clang_flags.end());
  argv.insert(argv.end(), rules.clang_flags.begin(), rules.clang_flags.end());
  std::error_code ec;
  const std::string includes = "-I" + std::filesystem::absolute(include_dir, ec).string();
  if (preprocess_only) {
    argv.insert(argv.end(), {"-E", "-Wno-everything", includes, "-include", prelude.string(), in.candidate.string()});
    return argv;
  }
  // No error limit: a header that fails to parse must not stop clang before the candidate's own code.
  argv.insert(argv.end(), {"-fsyntax-only", "-ferror-limit=0", "-fno-caret-diagnostics", "-fno-color-diagnostics",
                           "-Wno-everything", "-Wglobal-constructors", includes, "-include", prelude.string(), "-Xclang",
                           "-ast-dump=json", "-Xclang", "-ast-dump-filter=" + in.nonce, in.candidate.string()});
  return argv;
}

/// Walks clang's dump (`json` gets simdjson's padding in place); an error says why it could not.
inline expected<void, Error> walk_ast(std::string& json, AstScreen& ast) {
  if (json.empty()) return make_error("dumped no AST");
  json.reserve(json.size() + simdjson::SIMDJSON_PADDING);
  thread_local simdjson::ondemand::parser parser;  // reused: its buffers grow to the largest dump once
  simdjson::ondemand::document doc;
  simdjson::ondemand::object root;
  simdjson::error_code e = parser.allocate(json.size(), 2 * AstScreen::max_depth + 64);
  if (!e) e = parser.iterate(simdjson::padded_string_view(json.data(), json.size(), json.capacity())).get(doc);
  if (!e) e = doc.get_object().get(root);
  if (!e && !ast.walk(root)) e = ast.error();
  if (e) return make_error(fmt::format("AST could not be read ({})", simdjson::error_message(e)));
  return {};
}

}  // namespace detail

inline ScreeningRules ScreeningRules::for_target(Target target) {
  ScreeningRules r;
  r.allowed_includes = {
      "kevo_problem.hpp",
      // the standard library's computing and threading headers: no I/O, files, processes or locales
      "algorithm", "array", "atomic", "barrier", "bit", "bitset", "cassert", "cfloat", "climits", "cmath", "compare",
      "complex", "concepts", "condition_variable", "cstddef", "cstdint", "cstdlib", "cstring", "deque", "functional",
      "future", "initializer_list", "iterator", "latch", "limits", "map", "memory", "mutex", "new", "numbers",
      "numeric", "optional", "queue", "random", "ranges", "ratio", "semaphore", "set", "shared_mutex", "span",
      "stop_token", "string", "string_view", "thread", "tuple", "type_traits", "unordered_map", "unordered_set",
      "utility", "variant", "vector", "version", "assert.h", "float.h", "limits.h", "math.h", "stddef.h", "stdint.h",
      "stdlib.h", "string.h",
      // SIMD intrinsics
      "immintrin.h", "x86intrin.h", "xmmintrin.h", "emmintrin.h", "pmmintrin.h", "tmmintrin.h", "smmintrin.h",
      "nmmintrin.h", "wmmintrin.h", "arm_neon.h", "arm_sve.h"};
  if (target == Target::cpu) r.clang_flags = {"-march=native"};
  // The evaluator's architecture where it is set; on a GPU other than a Hopper the evaluator should pass its own.
  if (const char* arch = ::getenv("KEVO_CUDA_ARCH"); target == Target::cuda && arch && *arch)
    r.nvcc_flags = {"-std=c++20", fmt::format("-arch={}", arch)};
  if (target == Target::cuda)
    r.allowed_includes.insert(r.allowed_includes.end(),
                              {"cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "cuda_pipeline.h",
                               "cooperative_groups.h", "cooperative_groups/", "mma.h", "cub/cub.cuh", "cub/",
                               "cuda/std/", "cuda/barrier", "cuda/pipeline"});
  if (target == Target::hip)
    r.allowed_includes.insert(r.allowed_includes.end(), {"hip/hip_runtime.h", "hip/hip_fp16.h", "hip/hip_bf16.h",
                                                         "hip/hip_cooperative_groups.h", "hipcub/"});
  return r;
}

/// Screens one candidate. `include_dir` holds the problem's kevo_problem.hpp. Never throws for the
/// candidate's sake: what the screen could not do is in the verdict's note, not an error.
inline ScreeningVerdict screen_candidate(std::string_view source, Target target, const std::filesystem::path& include_dir,
                                         const ScreeningRules& rules) {
  const auto started = std::chrono::steady_clock::now();
  ScreeningVerdict v;
  const std::string clang_name = std::filesystem::path(rules.clang).filename().string();
  auto done = [&](std::string note) {
    if (!note.empty()) v.note = std::move(note) + "; relying on the sandbox";
    detail::finish(v, started);
    return v;
  };
  detail::TextScan text = detail::scan_text(source, rules);
  v.findings = std::move(text.findings);
  // A text refusal needs no parse: the synthesizer hears of the rest on its next attempt.
  if (!v.findings.empty()) return done("");
  if (!find_program(rules.clang))
    return done(fmt::format("{} is not installed: the candidate's code was not parsed, only its #include lines and text "
                            "were checked", rules.clang));
  detail::PrivateDirectory dir;
  if (dir.path().empty()) return done("no private temporary directory for the screen");
  const auto in = detail::write_inputs(dir.path(), target, source, text);
  if (!in) return done(in.error().message);

  // The passes the real compiler makes. Where nvcc cannot say, clang's own host pass is still parsed.
  std::string passes_note;
  std::vector<detail::CompilePass> passes;
  if (auto named = detail::compile_passes(target, rules, in->candidate)) {
    passes = std::move(*named);
  } else {
    passes = {{"clang's host pass", {"--cuda-host-only"}, {}}};
    passes_note = fmt::format("{}: only clang's own host pass was parsed, not nvcc's passes", named.error().message);
  }
  const std::vector<std::string> language = detail::language_flags(target, rules, dir.path() / "shim");

  struct PassOutcome {
    std::vector<ScreeningFinding> findings;
    std::string note;  ///< why this pass was not screened whole; empty when it was
  };
  std::vector<std::filesystem::path> preludes;
  for (std::size_t i = 0; i < passes.size(); ++i) {
    auto prelude = detail::write_prelude(dir.path(), i, text, passes[i], *in);
    if (!prelude) return done(prelude.error().message);
    preludes.push_back(std::move(*prelude));
  }
  const SandboxLimits limits{.wall_time = rules.wall_time,
                             .memory_bytes = std::size_t{8} << 30,
                             .output_bytes = rules.max_ast_bytes,
                             .drop_privileges = false,
                             .isolate = false,
                             .working_directory = dir.path()};
  auto screen_pass = [&](std::size_t index) {
    PassOutcome out;
    const detail::CompilePass& pass = passes[index];
    const std::string in_pass = pass.name.empty() ? "" : " in " + pass.name;
    SandboxResult r = run_sandboxed(detail::clang_command(language, rules, include_dir, *in, pass, preludes[index]), limits);
    if (!r.started) out.note = fmt::format("{} could not be started: {}", clang_name, r.setup_error);
    else if (r.timed_out) out.note = fmt::format("{} ran past its {} s limit{}", clang_name, rules.wall_time.count() / 1000.0, in_pass);
    else if (r.output_limit) out.note = fmt::format("{}'s AST of this candidate{} is over the {} MiB cap", clang_name, in_pass, rules.max_ast_bytes >> 20);
    else if (r.signal) out.note = fmt::format("{} died of {}{}", clang_name, signal_name(r.signal), in_pass);
    if (!out.note.empty()) return out;
    // The AST, partial where clang found errors: what it holds is still the candidate's code.
    detail::AstScreen ast(in->candidate.string(), rules, out.findings);
    const auto walked = detail::walk_ast(r.stdout_text, ast);
    detail::read_diagnostics(r.stderr_text, in->candidate.string(), source, in->last_line, in->nonce, out.findings);
    if (!(r.exited && r.exit_code == 0))
      out.note = fmt::format("{} could not parse this candidate{}: {}", clang_name, in_pass,
                             detail::first_error_line(r.stderr_text, dir.path().string() + "/", in->candidate.string(), in->last_line));
    else if (!walked) out.note = fmt::format("{} {}{}", clang_name, walked.error().message, in_pass);
    // A dump without a node of the candidate's own, when it has code, means the screen missed it.
    else if (ast.main_nodes() == 0 && text.has_code) out.note = fmt::format("{}'s AST held none of the candidate's code{}", clang_name, in_pass);
    return out;
  };
  // Runs `work(0 .. n-1)` side by side.
  auto side_by_side = [](std::size_t n, auto work) {
    std::vector<std::jthread> threads;
    for (std::size_t i = 0; i < n; ++i) threads.emplace_back([&, i] { work(i); });
  };
  // The first pass (the host's) is always parsed, and starts at once. A later pass whose preprocessed
  // candidate (everything after the prelude's namespace line) is the same as a parsed pass's holds the
  // same code, so its AST would hold the same calls and asm: it is not parsed again. A device pass
  // differs where the candidate has #if __CUDA_ARCH__ or the like. A preprocessing takes about a
  // quarter of a parse, and runs beside the host's parse: a CUDA screen without such #ifs takes about
  // one parse's time.
  std::vector<PassOutcome> outcomes(passes.size());
  {
    std::jthread first([&] { outcomes[0] = screen_pass(0); });
    if (passes.size() > 1) {
      std::vector<std::optional<std::string>> candidate_text(passes.size());
      side_by_side(passes.size(), [&](std::size_t i) {
        SandboxResult r = run_sandboxed(detail::clang_command(language, rules, include_dir, *in, passes[i], preludes[i], true), limits);
        const std::size_t at = r.stdout_text.find(fmt::format("namespace {} {{", in->nonce));
        if (r.ok() && at != std::string::npos) candidate_text[i] = r.stdout_text.substr(at);
      });
      std::vector<std::size_t> to_parse;
      for (std::size_t i = 1; i < passes.size(); ++i) {
        auto same = [&](std::size_t j) { return candidate_text[i] && candidate_text[j] == candidate_text[i]; };
        if (!same(0) && std::none_of(to_parse.begin(), to_parse.end(), same)) to_parse.push_back(i);
      }
      side_by_side(to_parse.size(), [&](std::size_t k) { outcomes[to_parse[k]] = screen_pass(to_parse[k]); });
    }
  }
  // A finding of any pass counts; the first pass that could not be screened whole is the note's.
  std::string note = passes_note;
  for (auto& o : outcomes) {
    v.findings.insert(v.findings.end(), std::make_move_iterator(o.findings.begin()), std::make_move_iterator(o.findings.end()));
    if (note.empty()) note = std::move(o.note);
  }
  v.parsed = note.empty();
  return done(std::move(note));
}

/// Screens with the target's default rules.
inline ScreeningVerdict screen_candidate(std::string_view source, Target target, const std::filesystem::path& include_dir) {
  return screen_candidate(source, target, include_dir, ScreeningRules::for_target(target));
}

}  // namespace kevo::eval
