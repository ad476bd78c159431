//! The wire between checker and runner, the same text in both: checker.cpp has it after
//! checker_process_head.cpp, runner.cpp.in at @protocol@. Sits inside an anonymous namespace.
//! Lines that start with //! are not embedded (cmake/EmbedHarnessSources.cmake).

constexpr std::size_t max_params = 16, max_tensors = 16, max_batch = 8;
enum : std::uint64_t { command_call = 1, command_quit = 2, reply_ready = 1, reply_done = 2, reply_failed = 3 };
// Calls kernel() `count` times, the i-th on the tensors at offset[i], then answers once.
struct Command {
  std::uint64_t kind, seq, count;
  std::int64_t shape[max_params];
  std::uint64_t offset[max_batch][max_tensors];
};
struct Reply {
  std::uint64_t kind, seq;
  char text[240];
};
