// A search killed while it races a new best against the old one: its evaluator announces the race
// (the challenger's hash in a file) and hangs; the test kills the searching process right there.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <thread>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace kevo::testing {

/// From an evaluator's compare(): writes `challenger` to `racing_file` whole (a rename), then
/// hangs far longer than any test waits, so that the kill lands inside the race.
inline void announce_race_and_hang(const std::filesystem::path& racing_file, std::uint64_t challenger) {
  std::ofstream(racing_file.string() + ".part") << challenger << "\n";
  std::filesystem::rename(racing_file.string() + ".part", racing_file);  // the test never reads half of it
  std::this_thread::sleep_for(std::chrono::seconds(60));
}

/// Runs `search` in a child process, waits up to 20 s for its race to be announced in
/// `racing_file`, and kills the child with SIGKILL; the challenger's hash, 0 where no race began.
template <class Search>
std::uint64_t kill_during_race(const std::filesystem::path& racing_file, Search search) {
  std::filesystem::remove(racing_file);
  const pid_t child = ::fork();
  if (child < 0) return 0;
  if (child == 0) {
    search();
    ::_exit(0);
  }
  std::uint64_t racing = 0;
  for (int i = 0; i < 400 && !racing; ++i) {
    ::usleep(50 * 1000);
    std::ifstream in(racing_file);
    in >> racing;
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  return racing;
}

}  // namespace kevo::testing
