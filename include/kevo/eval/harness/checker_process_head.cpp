//! checker.cpp, part 2 of 4: the process part's includes; it opens the namespace that
//! wire_protocol.cpp, checker_process.cpp and the target's checker body (which closes it) share.
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

#if defined(__x86_64__) && !defined(__CUDACC__)  // the CPU checker evicts a call's data (evict_call_data)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace {
