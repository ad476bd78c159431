// kevo/config.hpp: the library's version and its KEVO_ macros.
#pragma once

#define KEVO_VERSION_MAJOR 0
#define KEVO_VERSION_MINOR 1
#define KEVO_VERSION_PATCH 0
#define KEVO_VERSION_STRING "0.1.0"

// Device-code qualifiers that vanish in host-only translation units.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define KEVO_HOST_DEVICE __host__ __device__
#else
#define KEVO_HOST_DEVICE
#endif
