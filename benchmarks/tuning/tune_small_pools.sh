#!/usr/bin/env bash
# On the device (carry .carry): kevo-tune-pipeline on the pools below 100M, every d and dtype of issue
# 20's grid (run 124): one tuning-file entry a shape, added to $OUT/h200-small-pools.json.
#   bash benchmarks/tuning/tune_small_pools.sh [budget]
set -uo pipefail
budget=${1:-24}
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PATH=$PWD/.carry/search:/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH=$PWD/.carry/search${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for ads in 1000000 10000000; do
  for dim in 64 128 256; do
    for dtype in fp16 int8; do
      log="$out/tune_${ads}_${dim}_${dtype}.log"
      start=$(date +%s)
      timeout 120 kevo-tune-pipeline --ads "$ads" --dim "$dim" --dtype "$dtype" --budget "$budget" --store /tmp/tune.db \
        --out "$out/h200-small-pools.json" > "$log" 2>&1
      rc=$?
      echo "N=$ads d=$dim $dtype ($(( $(date +%s) - start )) s, exit $rc): $(grep -E '^defaults:' "$log")"
    done
  done
done
