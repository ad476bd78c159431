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
"$nvcc" "${nvcc_flags[@]}" tests/cuda/retrieval_pipeline.test.cu -o .carry/bin/retrieval_pipeline_test &
tests=$!
"$nvcc" "${nvcc_flags[@]}" benchmarks/retrieval/retrieval_benchmark.cu -o .carry/bin/retrieval_benchmark &
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
