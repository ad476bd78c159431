// checker.cu's problem unit for the stub problem: checker_problem_unit.cpp, compiled by nvcc as a CUDA problem's is.
#include "checker_problem_unit.cpp"
