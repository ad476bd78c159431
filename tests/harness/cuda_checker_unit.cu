// checker.cu for the stub problem, in the order cuda_harness.hpp's cuda_checker_source joins its parts.
#include "checker_problem.cpp"  // checker_problem.cpp.in, filled by tests/harness/CMakeLists.txt
#include <kevo/eval/harness/checker_process_head.cpp>
#include <kevo/eval/harness/wire_protocol.cpp>
#include <kevo/eval/harness/checker_process.cpp>
#include <kevo/eval/harness/plain_reference.cpp>
#include <kevo/eval/harness/cuda_checker.cu>
