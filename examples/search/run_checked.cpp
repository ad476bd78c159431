// kevo-run-checked: one checked run on this machine, for an executor that runs it elsewhere (a
// Slurm node, kevo/eval/slurm_executor.hpp). It reads the request (checked_run_wire.hpp: the
// problem's checker and the candidate's build, on a filesystem shared with the search), runs the
// checker beside the jailed candidate exactly as kevo-search does locally, and prints the report
// as one JSON line on stdout; its own complaints go to stderr.
//
//   kevo-run-checked --request '{"kevo_checked_run":1,"id":"kevo-axpy-...",...}'
//
// A separate, small program rather than a mode of kevo-search: the node runs only this trusted
// code path (no store, no synthesizer, no network client), and any front end (kevo-search,
// kevo-llm-search, a test) can dispatch to it. It sits beside kevo-search, where that looks for it.
#include <kevo/eval/checked_run.hpp>
#include <kevo/eval/checked_run_wire.hpp>

#include <fmt/format.h>

#include <cstdio>
#include <string_view>

int main(int argc, char** argv) {
  if (argc != 3 || std::string_view(argv[1]) != "--request") {
    fmt::print(stderr, "usage: kevo-run-checked --request JSON\n");
    return 2;
  }
  auto request = kevo::eval::request_from_json(argv[2]);
  if (!request) {
    fmt::print(stderr, "kevo-run-checked: {}\n", request.error().message);
    return 2;
  }
  const kevo::eval::RunReport report = kevo::eval::run_checked(request->request);
  fmt::print("{}\n", kevo::eval::report_to_json(report, request->id));
  return std::fflush(stdout) == 0 ? 0 : 1;
}
