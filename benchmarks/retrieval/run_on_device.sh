#!/usr/bin/env bash
# Builds the retrieval tests and benchmark with nvcc directly (the device image need not hold
# kevo's host dependencies), runs them, and writes logs to $OUT. Usage, from the repo root:
#   bash benchmarks/retrieval/run_on_device.sh [tests] [bench ARGS...] [torch N] [ncu] [server]
# (`server` runs the serving example packed by pack_server.sh: GPU backend against CPU backend.)
set -u -o pipefail
OUT=${OUT:-/tmp/kevo-out}
mkdir -p "$OUT" build-gpu
flags=(-std=c++20 -O3 -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=sm_90
       --expt-relaxed-constexpr -Iinclude -I.carry)
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
want() { [[ " $* " == *" $1 "* ]]; }
pids=()
if [[ " $* " == *" tests "* ]]; then
  nvcc "${flags[@]}" -Xptxas -v tests/cuda/retrieval_pipeline.test.cu -o build-gpu/retrieval_pipeline_test > "$OUT/build-test.log" 2>&1 &
  pids+=($!)
fi
if [[ " $* " == *" bench "* ]]; then
  nvcc "${flags[@]}" benchmarks/retrieval/retrieval_benchmark.cu -o build-gpu/retrieval_benchmark > "$OUT/build-bench.log" 2>&1 &
  pids+=($!)
fi
for p in "${pids[@]}"; do wait "$p" || { echo "build failed"; tail -30 "$OUT"/build-*.log; exit 1; }; done
status=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    tests) shift; ./build-gpu/retrieval_pipeline_test --durations yes 2>&1 | tee "$OUT/test.log" | grep -v "^ *[0-9.]* s: " ; status=$((status | $?)) ;;
    bench) shift; args=(); while [[ $# -gt 0 && "$1" != tests && "$1" != torch && "$1" != ncu && "$1" != server ]]; do args+=("$1"); shift; done
           ./build-gpu/retrieval_benchmark "${args[@]}" 2>&1 | tee "$OUT/bench.log"; status=$((status | $?)) ;;
    ncu) shift; ncu --clock-control none --kernel-name regex:"scoring|matching" --launch-skip 6 --launch-count 4 \
           --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
           --section LaunchStats ./build-gpu/retrieval_benchmark --n 8000000 --quick --stages-only > "$OUT/ncu.log" 2>&1
         status=$((status | $?)); grep -E "^  [a-z_]+.*\(|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Stall|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth" "$OUT/ncu.log" | head -120 ;;
    server) shift; LD_LIBRARY_PATH=.carry/server:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1 \
             python3 benchmarks/retrieval/server_check.py .carry/server/retrieval_server 2>&1 | tee "$OUT/server.log"
            status=$((status | $?)) ;;
    torch) shift; PYTHONUNBUFFERED=1 python3 benchmarks/retrieval/torch_peer.py "${1:-100000000}" 2>&1 | tee "$OUT/torch.log"; shift; status=$((status | $?)) ;;
    *) echo "unknown step $1"; exit 2 ;;
  esac
done
exit $status
