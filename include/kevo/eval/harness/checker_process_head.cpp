//! checker.cpp's body, the same for every problem (after checker_interface.cpp): the process part's includes; it
//! opens the namespace that wire_protocol.cpp, checker_process.cpp, the reference part and the target's part (which
//! closes it) share, where the problem is seen through checker_interface.cpp alone.
//! Lines that start with //! are not embedded (cmake/EmbedHarnessSources.cmake).

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <poll.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <new>
#include <random>
#include <string>
#include <vector>

#ifdef __CUDACC__  // the CUDA part's __half, which a CUDA problem's own header brings to its unit
#include <cuda_fp16.h>
#endif
#if defined(__x86_64__) && !defined(__CUDACC__)  // the CPU checker evicts a call's data (evict_call_data)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace {

using namespace kevo_checker;
using Shape = ShapeValues;  // the body's name for one call's sizes: the wire's form, never the problem's struct
