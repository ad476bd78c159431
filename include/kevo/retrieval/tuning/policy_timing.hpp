// kevo/retrieval/tuning/policy_timing.hpp: what timing one pipeline policy on the device found
// (pipeline_bench.cuh), in plain C++ so that host code compiled without nvcc can read it.
#pragma once

#include <string>

namespace kevo::retrieval {

struct PolicyTiming {
  enum class Outcome { ok, does_not_fit, wrong_answer, device_error };
  Outcome outcome = Outcome::ok;
  double seconds = 0;   ///< median a request, over every timed search
  std::string message;  ///< why, where not ok
};

}  // namespace kevo::retrieval
