#!/usr/bin/env bash
# Builds retrieval_server here (the device image has no Boost or simdjson to build it with) and
# packs it with the shared libraries the device may lack into .carry/server, for
# `run_on_device.sh server` (carry `.carry`). Run from the repository root after the release preset
# has been configured (`cmake --preset release`).
set -euo pipefail
cmake --build build/release --target retrieval_server
mkdir -p .carry/server
binary=build/release/examples/retrieval_server/retrieval_server
cp "$binary" .carry/server/
# Everything it links but the C and C++ runtimes, which the device has.
ldd "$binary" | awk '/=> \// {print $3}' | grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libdl|libpthread|librt)\.so' |
  while read -r lib; do cp -L "$lib" .carry/server/; done
ls -la .carry/server
