# Every dependency comes from Debian's packages (see scripts/install-deps).
include(GNUInstallDirs)
set(THREADS_PREFER_PTHREAD_FLAG ON)
find_package(Threads REQUIRED)
find_package(Boost 1.81 CONFIG REQUIRED)
find_package(simdjson CONFIG REQUIRED)
find_package(fmt CONFIG REQUIRED)
find_package(SQLite3 REQUIRED)
find_package(OpenSSL REQUIRED)
# libseccomp has no CMake package: pkg-config's imported target (the candidate jail's filter).
find_package(PkgConfig REQUIRED)
pkg_check_modules(libseccomp REQUIRED IMPORTED_TARGET GLOBAL libseccomp)
