// kevo/eval/torch_helper.hpp: a PyTorch helper that an evaluator keeps running for the checked runs of a
// KernelBench-format problem (kevo_torch.py serve-runs). PyTorch is imported, the module loaded and the
// device's context made once; a helper that each run's checker started paid that on every run (about 6 s on
// the GPU machine, more than the run itself). It stays trusted and outside every jail, as before.
//
//   TorchHelperServer helper({.argv = {python, "kevo_torch.py", "serve-runs", "module.py", ...}, .limits = limits});
//   if (auto connection = helper.connect()) request.torch_helper_fd = connection->release();  // the checker's end
//
// Each run gets a connection of its own: a socket pair, one end sent to the helper on its control socket
// (SCM_RIGHTS), the other handed to the checker. A checker that dies mid-run ends only its connection. A
// helper that died is started again on the next connect().
#pragma once

#include <kevo/eval/jail.hpp>
#include <kevo/eval/sandbox.hpp>
#include <kevo/expected.hpp>

#include <fmt/format.h>

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace kevo::eval {

class TorchHelperServer {
 public:
  struct Launch {
    std::vector<std::string> argv;  ///< kevo_torch.py serve-runs ...; "--control-fd N" is added
    SandboxLimits limits;           ///< its wall time bounds the helper's whole life
    std::chrono::seconds start_timeout{180};
  };

  explicit TorchHelperServer(Launch launch) : launch_(std::move(launch)) {}
  TorchHelperServer(const TorchHelperServer&) = delete;
  TorchHelperServer& operator=(const TorchHelperServer&) = delete;
  ~TorchHelperServer() { stop(); }

  /// How many times the helper was started: once, and once more for each death.
  std::size_t starts() const { return starts_.load(); }

  /// A connection of its own for one run: the checker's end. Starts the helper where none runs.
  expected<OwnedFd, Error> connect() {
    std::lock_guard lock(mutex_);
    for (int attempt = 0; attempt < 2; ++attempt) {  // a helper that died since the last run is started again, once
      if (!control_.get() || attempt > 0) {
        stop();
        if (auto started = start(); !started) return make_error(started.error().message);
      }
      int pair[2];
      if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
        return make_error(fmt::format("socketpair: {}", std::strerror(errno)));
      OwnedFd helper_end(pair[0]), checker_end(pair[1]);
      // Taken once it says so: a helper that died (or is dying) since the last run is started again now, and
      // costs no run. It may still be finishing the last run's connection: it answers after that.
      char taken = 0;
      if (send_descriptor(control_.get(), helper_end.get()) && read_within(control_.get(), &taken, 1, launch_.start_timeout) == 1 && taken == 'a')
        return checker_end;
    }
    return make_error("the PyTorch helper stopped taking runs: " + last_words_);
  }

  /// A request of kevo's own on a connection of its own (`request` ends with "quit"): all the helper
  /// answered, up to its closing the connection; nothing where it could not be reached or took past `timeout`.
  std::optional<std::string> converse(const std::string& request, std::chrono::seconds timeout) {
    auto connection = connect();
    if (!connection) return std::nullopt;
    const int fd = connection->get();
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) return std::nullopt;
    std::string answer;
    char buffer[4096];
    for (ssize_t n = 0; (n = read_within(fd, buffer, sizeof buffer, timeout)) != 0;) {
      if (n < 0) return std::nullopt;
      answer.append(buffer, static_cast<std::size_t>(n));
    }
    return answer;
  }

 private:
  expected<void, Error> start() {
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return make_error(fmt::format("socketpair: {}", std::strerror(errno)));
    OwnedFd ours(pair[0]), theirs(pair[1]);
    ++starts_;
    std::vector<std::string> argv = launch_.argv;
    argv.insert(argv.end(), {"--control-fd", std::to_string(theirs.get())});
    SandboxLimits limits = launch_.limits;
    limits.handed_over_fds = {theirs.release()};  // run_sandboxed closes our copy
    running_ = std::async(std::launch::async, [argv = std::move(argv), limits = std::move(limits)] { return run_sandboxed(argv, limits); });
    control_ = std::move(ours);
    // "ready PID" once PyTorch is imported and the module loaded; anything else is the helper's last words.
    std::string line;
    for (char c = 0; line.size() < 4096 && read_within(control_.get(), &c, 1, launch_.start_timeout) == 1 && c != '\n';) line += c;
    if (line.starts_with("ready ")) {
      pid_ = std::atoi(line.c_str() + 6);
      return {};
    }
    stop();
    return make_error("the PyTorch helper did not start: " + (last_words_.empty() ? line : last_words_));
  }

  // Ends the helper: with its control socket closed it has no more runs to take, and exits; one that does
  // not (hung in PyTorch) is killed. Its pid is still its own until run_sandboxed has reaped it.
  void stop() {
    control_.reset();
    if (!running_.valid()) return;
    if (running_.wait_for(std::chrono::seconds(5)) != std::future_status::ready && pid_ > 0) ::kill(pid_, SIGKILL);
    pid_ = -1;
    const SandboxResult r = running_.get();
    const std::string& said = r.stderr_text.empty() ? r.stdout_text : r.stderr_text;
    last_words_ = said.size() > 2000 ? said.substr(said.size() - 2000) : said;
    if (last_words_.empty()) last_words_ = r.setup_error;
  }

  // Up to `size` bytes from `fd` once it has some within `timeout`: what read() returns (0 at its end), -1 past the timeout.
  static ssize_t read_within(int fd, char* data, std::size_t size, std::chrono::seconds timeout) {
    pollfd p{fd, POLLIN, 0};
    int ready = 0;
    while ((ready = ::poll(&p, 1, static_cast<int>(std::chrono::milliseconds(timeout).count()))) < 0 && errno == EINTR) {
    }
    return ready > 0 ? ::read(fd, data, size) : -1;
  }

  static bool send_descriptor(int socket, int fd) {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    char byte = 'r';
    iovec data{&byte, 1};
    msghdr message{};
    message.msg_iov = &data;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof control;
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(header), &fd, sizeof(int));
    return ::sendmsg(socket, &message, MSG_NOSIGNAL) == 1;
  }

  Launch launch_;
  std::mutex mutex_;
  OwnedFd control_;
  std::future<SandboxResult> running_;
  std::string last_words_;
  pid_t pid_ = -1;  // the helper's, from its "ready"
  std::atomic<std::size_t> starts_{0};
};

}  // namespace kevo::eval
