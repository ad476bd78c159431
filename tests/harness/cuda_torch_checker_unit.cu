// checker.cu's body for a KernelBench-format problem (its reference PyTorch's), in the order harness.hpp's checker_body joins its parts (the problem's unit is
// checker_problem_unit.cu).
#include <kevo/eval/harness/checker_interface.cpp>
#include <kevo/eval/harness/checker_process_head.cpp>
#include <kevo/eval/harness/wire_protocol.cpp>
#include <kevo/eval/harness/checker_process.cpp>
#include <kevo/eval/harness/torch_reference.cpp>
#include <kevo/eval/harness/cuda_checker.cu>
