// checker.cu for the stub problem as a KernelBench-format one (its reference PyTorch's, its tensors crossing
// in device memory shared with kevo's helper), in the order cuda_harness.hpp's cuda_checker_source joins its parts.
#include "checker_problem.cpp"  // checker_problem.cpp.in, filled by tests/harness/CMakeLists.txt
#include <kevo/eval/harness/checker_process_head.cpp>
#include <kevo/eval/harness/wire_protocol.cpp>
#include <kevo/eval/harness/checker_process.cpp>
#include "torch_reference.cpp"  // harness/torch_reference.cpp, filled by tests/harness/CMakeLists.txt
#include <kevo/eval/harness/cuda_checker.cu>
