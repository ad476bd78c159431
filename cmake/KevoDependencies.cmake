# Every dependency comes from Debian's packages (see .ci/install-deps).
include(GNUInstallDirs)
set(THREADS_PREFER_PTHREAD_FLAG ON)
find_package(Threads REQUIRED)
find_package(Boost 1.81 CONFIG REQUIRED)
find_package(simdjson CONFIG REQUIRED)
find_package(fmt CONFIG REQUIRED)
find_package(SQLite3 REQUIRED)
find_package(OpenSSL REQUIRED)
