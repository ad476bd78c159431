// checker.cpp's problem unit for the stub problem, as harness.hpp's checker_problem_part makes it: the interface,
// then checker_problem.cpp.in filled (by tests/harness/CMakeLists.txt; the plain or the PyTorch reference's).
#include <kevo/eval/harness/checker_interface.cpp>
#include "checker_problem.cpp"
