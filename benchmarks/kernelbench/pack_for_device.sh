#!/usr/bin/env bash
# Builds what a device call needs to search KernelBench-format problems on the GPU, here, into
# .carry/kernelbench: kevo-search, kevo-llm-search and kevo-suite (the device image has no simdjson, fmt or
# libseccomp to build them with), the shared libraries they link that the device may lack, and bubblewrap
# (the jail), stripped to stay under a call's 64 MiB of carry. Candidates, checkers and PyTorch run there.
# Run from the repository root after `cmake --preset release` (or name another build: KEVO_BUILD_DIR).
set -euo pipefail
build=${KEVO_BUILD_DIR:-build/release}
cmake --build "$build" --target kevo-search kevo-llm-search kevo-suite -j2
mkdir -p .carry/kernelbench
bins=(.carry/kernelbench/kevo-search .carry/kernelbench/kevo-llm-search .carry/kernelbench/kevo-suite)
cp "$build"/examples/search/kevo-search "$build"/examples/llm_search/kevo-llm-search "$build"/examples/suite/kevo-suite "$(command -v bwrap)" .carry/kernelbench/
strip "${bins[@]}"
ldd "${bins[@]}" .carry/kernelbench/bwrap | awk '/=> \// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libdl|libpthread|librt)\.so' |
  while read -r lib; do cp -L "$lib" .carry/kernelbench/; done
ls -la .carry/kernelbench
