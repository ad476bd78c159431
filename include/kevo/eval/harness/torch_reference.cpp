//! checker.cpp's body, before the target's part, for a KernelBench-format problem: the reference is PyTorch's. The
//! checker talks to kevo's helper: one that kevo keeps running for its runs (--torch-helper, a connection), else
//! one it starts itself (kevo_torch.py serve, beside this checker). It asks it for fresh inputs
//! (the module's get_inputs() and parameters under a seed) and for the reference's outputs on given inputs.
//! The problem's unit gives the helper's command and the spec (torch_python, torch_scale, torch_device, torch_spec), so
//! this text is the same for every problem. Lines that start with //! are not embedded.
// The reference runs in PyTorch, in kevo's helper process beside this checker (never in the candidate's jail).
constexpr bool inputs_from_torch = true;

// A descriptor the helper inherits as its fd 3, where the target's checker shares memory with it (the CUDA
// checker's device memory: tensors then cross at device speed, not through the pipes); -1 for none.
int torch_inherited_fd = -1;
enum class TorchCounts { none, of_inputs, of_outputs };

struct TorchHelper {
  pid_t pid = -1;
  int to = -1, from = -1;  // its stdin, its stdout; or both the connection
  bool connected = false;  // a helper kevo keeps running: descriptors cross the connection, not inheritance
};

[[noreturn]] void torch_failed(const std::string& what) { report_status("sandbox_error", "the PyTorch reference " + what); }

void torch_write(const TorchHelper& h, const void* data, std::size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(h.to, p, bytes);
    if (n <= 0) torch_failed("stopped reading its requests");
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void torch_read(const TorchHelper& h, void* data, std::size_t bytes) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::read(h.from, p, bytes);
    if (n <= 0) torch_failed("ended before it answered (its stderr is below)");
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

std::string torch_line(const TorchHelper& h) {
  std::string line;
  for (char c = 0; line.size() < 65536;) {
    torch_read(h, &c, 1);
    if (c == '\n') return line;
    line += c;
  }
  return line;
}

// "ok", or the helper's error, which fails the run as kevo's (a reference that fails is never the candidate's fault).
void torch_expect_ok(const TorchHelper& h, const char* request) {
  const std::string line = torch_line(h);
  if (line != "ok") torch_failed(std::string("failed on ") + request + ": " + line);
}

// A run's first words to the helper: the kernel's tensors (the spec), answered "ready".
void greet_torch_helper(const TorchHelper& h, const std::string& failure) {
  const std::string spec = std::string(torch_spec) + "\n";
  torch_write(h, spec.data(), spec.size());
  const std::string ready = torch_line(h);
  if (ready != "ready") torch_failed(failure + ready);
}

TorchHelper start_torch_helper() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) torch_failed("cannot be found: /proc/self/exe is unreadable");
  self[n] = 0;
  std::string dir(self);
  dir.erase(dir.rfind('/'));
  const std::string helper = dir + "/kevo_torch.py", module = dir + "/reference_module.py";
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) torch_failed("cannot start: no pipes");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  if (torch_inherited_fd >= 0) posix_spawn_file_actions_adddup2(&actions, torch_inherited_fd, 3);
  std::string python = torch_python, scale = torch_scale, device = torch_device;
  std::string serve = "serve", scale_flag = "--scale", device_flag = "--device";
  char* argv[] = {python.data(), const_cast<char*>(helper.c_str()), serve.data(), const_cast<char*>(module.c_str()), scale_flag.data(),
                  scale.data(), device_flag.data(), device.data(), nullptr};
  // Idle OpenMP threads sleep rather than spin: the helper waits while the candidate is timed.
  std::string path = "PATH=/usr/local/bin:/usr/bin:/bin", wait = "OMP_WAIT_POLICY=PASSIVE", bytecode = "PYTHONDONTWRITEBYTECODE=1",
              home = "HOME=/tmp", lang = "LANG=C";
  std::vector<std::string> environment{path, wait, bytecode, home, lang};
  // Which GPU is "device 0", and where the CUDA driver is found, as this checker sees them.
  for (const char* name : {"CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"})
    if (const char* value = std::getenv(name)) environment.push_back(std::string(name) + "=" + value);
  std::vector<char*> envp;
  for (std::string& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);
  TorchHelper h;
  if (::posix_spawn(&h.pid, python.c_str(), &actions, nullptr, argv, envp.data()) != 0) torch_failed("cannot start: " + python + " does not run");
  posix_spawn_file_actions_destroy(&actions);
  ::close(in[0]);
  ::close(out[1]);
  h.to = in[1];
  h.from = out[0];
  greet_torch_helper(h, "did not start: ");
  return h;
}

// A helper that kevo keeps running for one run after another (the module loaded and PyTorch imported once):
// this run is the connection it was handed.
TorchHelper connect_torch_helper(int fd) {
  TorchHelper h;
  h.to = h.from = fd;
  h.connected = true;
  greet_torch_helper(h, "did not take this run: ");
  return h;
}

const TorchHelper& torch_helper() {
  static const TorchHelper h = options.torch_helper_fd >= 0 ? connect_torch_helper(options.torch_helper_fd) : start_torch_helper();
  return h;
}

// A request that hands the helper a descriptor (the exchange's memory): inherited by a helper this checker
// started, sent with the request's bytes (SCM_RIGHTS) to one that kevo keeps running.
void torch_write_with_descriptor(const TorchHelper& h, const std::string& request, int fd) {
  if (!h.connected) return torch_write(h, request.data(), request.size());
  const ssize_t sent = send_with_descriptor(h.to, request.data(), request.size(), fd);
  if (sent < 0) torch_failed("stopped reading its requests");
  if (static_cast<std::size_t>(sent) < request.size()) torch_write(h, request.data() + sent, request.size() - static_cast<std::size_t>(sent));
}

// Fresh inputs under `seed`, as the module's get_inputs() and __init__ draw them, each `extra` elements longer
// (from another draw): one vector of words per tensor, the outputs' left empty.
std::vector<std::vector<std::uint32_t>> torch_draw(const Shape& shape, std::uint64_t seed, long extra) {
  const TorchHelper& h = torch_helper();
  const std::string request = "draw " + std::to_string(seed) + " " + std::to_string(extra) + "\n";
  torch_write(h, request.data(), request.size());
  torch_expect_ok(h, "draw");
  std::vector<std::vector<std::uint32_t>> out(tensor_count);
  for (std::size_t i = 0; i < tensor_count; ++i) {
    if (tensors[i].output) continue;
    std::uint64_t count = 0;
    torch_read(h, &count, sizeof count);
    if (static_cast<long>(count) != tensors[i].size(shape) + extra)
      torch_failed("drew " + std::to_string(count) + " elements of " + tensors[i].name + ", not " + std::to_string(tensors[i].size(shape) + extra));
    out[i].resize(count);
    torch_read(h, out[i].data(), count * 4);
  }
  return out;
}

// The reference on the inputs at p[...], its outputs written to the outputs' p[...].
void torch_forward(const Shape& shape, void* const* p) {
  const TorchHelper& h = torch_helper();
  torch_write(h, "forward\n", 8);
  for (std::size_t i = 0; i < tensor_count; ++i) {
    if (tensors[i].output) continue;
    const std::uint64_t count = static_cast<std::uint64_t>(tensors[i].size(shape));
    torch_write(h, &count, sizeof count);
    torch_write(h, p[i], count * 4);
  }
  torch_expect_ok(h, "forward");
  for (std::size_t i = 0; i < tensor_count; ++i) {
    if (!tensors[i].output) continue;
    std::uint64_t count = 0;
    torch_read(h, &count, sizeof count);
    if (static_cast<long>(count) != tensors[i].size(shape))
      torch_failed("returned " + std::to_string(count) + " elements of " + tensors[i].name + ", not " + std::to_string(tensors[i].size(shape)));
    torch_read(h, p[i], count * 4);
  }
}

// The reference the target's part calls: PyTorch's.
void call_reference(const Shape& shape, void* const* p) { torch_forward(shape, p); }

// A request whose tensors cross in the memory shared through torch_inherited_fd: "ok", then a count for each
// input or each output, as asked (the other tensors' counts are left 0).
std::vector<std::uint64_t> torch_shared_request(const std::string& request, TorchCounts counts_of) {
  const TorchHelper& h = torch_helper();
  if (request.compare(0, 8, "exchange") == 0) torch_write_with_descriptor(h, request, torch_inherited_fd);
  else torch_write(h, request.data(), request.size());
  torch_expect_ok(h, request.substr(0, request.find(' ')).c_str());
  std::vector<std::uint64_t> counts(tensor_count, 0);
  for (std::size_t i = 0; i < tensor_count; ++i)
    if (counts_of != TorchCounts::none && tensors[i].output == (counts_of == TorchCounts::of_outputs)) torch_read(h, &counts[i], sizeof counts[i]);
  return counts;
}
