#!/usr/bin/env bash
# Builds what a device call needs to run the GPU search and its device tests, here, into
# .carry/search: kevo-search, test_eval_cuda_device, kevo-tune-pipeline and retrieval_server (the device image has no simdjson, fmt or
# libseccomp to build them with), the shared libraries they link that the device may lack, and
# bubblewrap (the jail), plus retrieval_benchmark (the pipeline's own stages, which run_on_device.sh
# times beside scoring's best), all stripped to stay under a call's 64 MiB of carry. The candidates
# themselves are compiled there, by nvcc, in the jail.
# Run from the repository root after `cmake --preset release` (or name another build: KEVO_BUILD_DIR).
set -euo pipefail
build=${KEVO_BUILD_DIR:-build/release}
# Built here, where no GPU is, the tuner and the benchmark would be compile checks that refuse to
# time anything (CMakeLists.txt, KEVO_CUDA_DEVICE_CODE): built to run on the device instead.
cmake -S . -B "$build" -DKEVO_CUDA_DEVICE_CODE=sass > /dev/null
cmake --build "$build" --target kevo-search test_eval_cuda_device kevo-tune-pipeline retrieval_server retrieval_benchmark -j2
mkdir -p .carry/search
cp "$build"/examples/search/kevo-search "$build"/tests/device/test_eval_cuda_device "$build"/examples/tune_pipeline/kevo-tune-pipeline \
  "$build"/examples/retrieval_server/retrieval_server "$build"/benchmarks/retrieval/retrieval_benchmark "$(command -v bwrap)" .carry/search/
strip .carry/search/kevo-search .carry/search/test_eval_cuda_device .carry/search/kevo-tune-pipeline .carry/search/retrieval_server \
  .carry/search/retrieval_benchmark
ldd .carry/search/kevo-search .carry/search/test_eval_cuda_device .carry/search/kevo-tune-pipeline .carry/search/retrieval_server .carry/search/bwrap | awk '/=> \// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libdl|libpthread|librt)\.so' |
  while read -r lib; do cp -L "$lib" .carry/search/; done
ls -la .carry/search
