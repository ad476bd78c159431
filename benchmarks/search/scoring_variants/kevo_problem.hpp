// The declarations kevo's generated kevo_problem.hpp gives cuda_scoring, for check_and_time.cu.
#pragma once
#include <cuda_fp16.h>
struct Shape{long N,D,E,KE;};
void reference(const Shape&,const __half*,const __half*,const __half*,const float*,float*);
void kernel(const Shape&,const __half*,const __half*,const __half*,const float*,float*);
