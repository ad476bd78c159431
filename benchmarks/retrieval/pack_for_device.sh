#!/usr/bin/env bash
# Builds the device binaries here, so that a device call spends its minutes running, not compiling:
# the retrieval tests and benchmark (nvcc), and the serving example (CMake; the device image has no
# Boost or simdjson to build it with), with the shared libraries the device may lack, into
# .carry/bin, stamped with the sources' hash. run_on_device.sh uses them while the stamp matches
# (carry `.carry`) and builds there otherwise. Run from the repository root after
# `cmake --preset release`.
set -euo pipefail
source benchmarks/retrieval/device_common.sh
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
mkdir -p .carry/bin
# Headers the device image lacks, for when it must build there (-I.carry): Catch2 for the tests, and
# the Boost headers the index's id map pulls in (found by the compiler itself, ~1 MB).
mkdir -p .carry/catch2
cp /usr/include/catch2/catch.hpp .carry/catch2/
printf '#include <boost/unordered/unordered_flat_map.hpp>\n#include <boost/unordered/unordered_flat_set.hpp>\n' |
  g++ -std=c++20 -M -x c++ - | tr ' \\' '\n\n' | grep '^/usr/include/boost/' | sort -u |
  while read -r header; do
    relative=${header#/usr/include/}
    mkdir -p ".carry/${relative%/*}" && cp "$header" ".carry/$relative"
  done
build_pipeline_test .carry/bin/retrieval_pipeline_test &
tests=$!
build_benchmark .carry/bin/retrieval_benchmark &
bench=$!
cmake --build build/release --target retrieval_server
wait "$tests"
wait "$bench"
server=build/release/examples/retrieval_server/retrieval_server
cp "$server" .carry/bin/
# Everything the binaries link but the C and C++ runtimes, which the device has.
ldd "$server" .carry/bin/retrieval_benchmark | awk '/=> \// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libdl|libpthread|librt)\.so' |
  while read -r lib; do cp -L "$lib" .carry/bin/; done
source_stamp > .carry/bin/STAMP
ls -la .carry/bin
