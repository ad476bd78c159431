//! checker.cpp's body, its process side, the same for every target (after
//! wire_protocol.cpp, inside the namespace checker_process_head.cpp opened).
//! Lines that start with //! are not embedded (cmake/EmbedHarnessSources.cmake).
// Elements past each tensor's end, poisoned, catch writes out of bounds.
constexpr long guard_elements = 64;

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') { out += '\\'; out += c; }
    else if (static_cast<unsigned char>(c) < 0x20) out += ' ';
    else out += c;
  }
  return out;
}

pid_t runner = -1;

[[noreturn]] void report(const std::string& json) {
  if (runner > 0) ::kill(runner, SIGKILL);  // nothing of the candidate outlives the verdict
  std::string line = json + "\n";
  const char* p = line.data();
  std::size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(1, p, left);
    if (n <= 0) break;
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  std::_Exit(0);
}

[[noreturn]] void report_status(const char* status, const std::string& detail) {
  report(std::string("{\"status\":\"") + status + "\",\"detail\":\"" + json_escape(detail) + "\"}");
}

struct Options {
  std::uint64_t seed = 1;
  int warmup = 2, repetitions = 7;
  double call_timeout = 20;
  int control_fd = -1, info_fd = -1;
  bool flush = true;
  bool validate_tolerance = false;
  double round_trip = -1;  // seconds; < 0: measure it here
  bool profile = false;    // one checked call on the timing shape, for a profiler that started the runner; no timing
  int torch_helper_fd = -1;  // a connection to a PyTorch helper that kevo keeps running (KernelBench-format problems)
} options;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// ---- the runner's process, seen from outside ----

// bwrap's info pipe carries {"child-pid": N, ...}: the runner's pid in our namespace.
pid_t read_runner_pid() {
  std::string text;
  const double deadline = now() + options.call_timeout;
  while (text.find('}') == std::string::npos) {
    pollfd p{options.info_fd, POLLIN, 0};
    const int left_ms = static_cast<int>(std::max(1.0, (deadline - now()) * 1e3));
    if (::poll(&p, 1, left_ms) <= 0) return -1;
    char buffer[512];
    const ssize_t n = ::read(options.info_fd, buffer, sizeof buffer);
    if (n <= 0) return -1;
    text.append(buffer, static_cast<std::size_t>(n));
  }
  const auto at = text.find("\"child-pid\"");
  if (at == std::string::npos) return -1;
  const auto colon = text.find(':', at);
  return colon == std::string::npos ? -1 : static_cast<pid_t>(std::strtol(text.c_str() + colon + 1, nullptr, 10));
}

[[noreturn]] void runner_gone(const std::string& when) { report_status("runner_exited", when); }

double runner_cpu_seconds() {
  clockid_t clock;
  timespec ts{};
  if (::clock_getcpuclockid(runner, &clock) != 0 || ::clock_gettime(clock, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

int runner_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(runner, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

// The state letter of a /proc stat file ('R', 'T', 'Z', ...), or 0 if it cannot be read. It
// follows the last ')': the comm field before it may itself hold ')' or spaces.
char stat_state(const std::string& path) {
  std::ifstream stat(path);
  const std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() ? 0 : text[paren + 2];
}

// Every thread of the runner stopped ('T' in /proc): from here on the arena holds still.
void freeze() {
  ::kill(runner, SIGSTOP);
  const std::string tasks = "/proc/" + std::to_string(runner) + "/task";
  const double deadline = now() + 5;
  for (;;) {
    bool all_stopped = true;
    DIR* dir = ::opendir(tasks.c_str());
    if (!dir) runner_gone("while it was being stopped");
    while (dirent* entry = ::readdir(dir)) {
      if (entry->d_name[0] == '.') continue;
      const char state = stat_state(tasks + "/" + entry->d_name + "/stat");  // 0: the thread is gone
      if (state != 0 && state != 'T' && state != 't' && state != 'Z' && state != 'X') all_stopped = false;
    }
    ::closedir(dir);
    if (all_stopped) return;
    if (now() > deadline) report_status("sandbox_error", "the candidate's process did not stop on SIGSTOP");
    ::sched_yield();
  }
}

void thaw() { ::kill(runner, SIGCONT); }

// Tells the runner to return from main(); a runner already gone is no error here.
void send_quit() {
  Command quit{};
  quit.kind = command_quit;
  ::send(options.control_fd, &quit, sizeof quit, MSG_NOSIGNAL);
}

// Whether a process is still running: not gone, and not a zombie its parent has yet to reap.
bool process_alive(pid_t pid) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  const char state = stat_state("/proc/" + std::to_string(pid) + "/stat");  // 0: unreadable, taken as alive
  return state != 'Z' && state != 'X';
}

Reply wait_reply(const std::string& during) {
  pollfd p{options.control_fd, POLLIN, 0};
  const int ready = ::poll(&p, 1, static_cast<int>(options.call_timeout * 1e3));
  if (ready == 0) {
    ::kill(runner, SIGKILL);
    report_status("timeout", "no answer within " + std::to_string(static_cast<int>(options.call_timeout)) + " s " + during);
  }
  Reply reply{};
  const ssize_t n = ::recv(options.control_fd, &reply, sizeof reply, 0);
  if (n <= 0) runner_gone(during);
  if (n != static_cast<ssize_t>(sizeof reply))
    report_status("bad_report", "sent the checker " + std::to_string(n) + " bytes that are not a message of kevo's runner " + during);
  reply.text[sizeof reply.text - 1] = 0;
  return reply;
}

// The runner's first message: its greeting, or why it could not start (kevo's own words). The
// candidate's static initializers ran before the runner's main() in the same process, and the same
// runner started beside the reference when the problem was prepared: a start that fails now (no
// device memory, no address space left) is the candidate's doing, and named as its crash.
void expect_greeting() {
  const Reply reply = wait_reply("while starting, before kevo's runner reached main() (a static initializer?)");
  if (reply.kind == reply_failed)
    report_status("crash", std::string("kevo's runner could not start in the candidate's process (its static initializers ran first): ") + reply.text);
  if (reply.kind != reply_ready) report_status("bad_report", "the runner's first message was not its greeting");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

std::uint64_t sequence = 0;

// Sends `bytes` of `data` on `socket` with `fd` riding along (SCM_RIGHTS): what sendmsg returns.
ssize_t send_with_descriptor(int socket, const void* data, std::size_t bytes, int fd) {
  iovec iov{const_cast<void*>(data), bytes};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(header), &fd, sizeof fd);
  return ::sendmsg(socket, &message, MSG_NOSIGNAL);
}

// Sends `fd` (the shared memory) and its size to the runner.
void send_descriptor(int fd, std::uint64_t size) {
  if (send_with_descriptor(options.control_fd, &size, sizeof size, fd) < 0) runner_gone("before it received its memory");
}

struct CallTiming {
  double wall = 0, cpu = 0;
};

// One command: the runner calls kernel() once per entry of `calls` (each the offsets of its
// tensors), then answers; it is frozen the moment it does. The clock and the runner's CPU clock
// span the command alone: the runner was stopped since the last check, and thaws as the clock starts.
CallTiming exchange(const Shape& shape, const std::vector<std::vector<std::size_t>>& calls, const std::string& what) {
  Command command{};
  command.kind = command_call;
  command.seq = ++sequence;
  command.count = calls.size();
  static_assert(max_params == max_shape_params, "a Shape is what the wire carries");
  std::memcpy(command.shape, shape.values, sizeof command.shape);
  for (std::size_t c = 0; c < calls.size(); ++c)
    for (std::size_t i = 0; i < tensor_count; ++i) command.offset[c][i] = calls[c][i];
  CallTiming timing;
  const double cpu0 = runner_cpu_seconds();
  const double t0 = now();
  thaw();
  if (::send(options.control_fd, &command, sizeof command, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof command)) runner_gone("before " + what);
  const Reply reply = wait_reply("in kernel() " + what);
  timing.wall = now() - t0;
  freeze();
  timing.cpu = runner_cpu_seconds() - cpu0;
  if (reply.kind == reply_failed) {
    const std::string text = reply.text;  // "threw ..." or "failed: ..." (a CUDA error)
    if (text.find("bad_alloc") != std::string::npos || text.find("out of memory") != std::string::npos)
      report_status("memory_limit", text.substr(text.find(' ') + 1) + " " + what);
    report_status("crash", "kernel() " + text + " " + what);
  }
  if (reply.kind != reply_done || reply.seq != command.seq) report_status("bad_report", "the runner answered out of turn " + what);
  return timing;
}

// Reads the checker's flags.
void parse_options(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--seed") options.seed = std::strtoull(value.c_str(), nullptr, 10);
    else if (flag == "--warmup") options.warmup = std::max(1, std::atoi(value.c_str()));
    else if (flag == "--repetitions") options.repetitions = std::max(1, std::atoi(value.c_str()));
    else if (flag == "--call-timeout") options.call_timeout = std::atof(value.c_str());
    else if (flag == "--control") options.control_fd = std::atoi(value.c_str());
    else if (flag == "--info") options.info_fd = std::atoi(value.c_str());
    else if (flag == "--flush") options.flush = value != "0";
    else if (flag == "--validate-tolerance") options.validate_tolerance = value != "0";
    else if (flag == "--round-trip") options.round_trip = std::atof(value.c_str());
    else if (flag == "--profile") options.profile = value != "0";
    else if (flag == "--torch-helper") options.torch_helper_fd = std::atoi(value.c_str());
  }
  ::signal(SIGPIPE, SIG_IGN);
}

// The runner's pid from the jail, and its greeting.
void meet_runner() {
  runner = read_runner_pid();
  if (runner <= 0) runner_gone("before it started (the jail did not report its pid)");
}
