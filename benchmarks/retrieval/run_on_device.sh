#!/usr/bin/env bash
# Builds the retrieval tests and benchmark with nvcc directly (the device image need not hold
# kevo's host dependencies), runs them, and writes logs to $OUT. Usage, from the repo root:
#   bash benchmarks/retrieval/run_on_device.sh [tests] [bench ARGS...] [torch N] [ncu] [server]
# Binaries packed by pack_for_device.sh (carried in .carry/bin) are used instead of building while
# their source stamp matches. `server` runs the packed serving example: GPU backend against CPU.
# Back here, `build/release/benchmarks/retrieval/retrieval_report bench.log --torch torch.log -o
# report.html` draws the logs (the device image has no fmt to build it with).
set -u -o pipefail
OUT=${OUT:-/tmp/kevo-out}
mkdir -p "$OUT" build-gpu
source benchmarks/retrieval/device_common.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
prebuilt=0
if [[ -f .carry/bin/STAMP && "$(cat .carry/bin/STAMP)" == "$(source_stamp)" ]]; then
  cp .carry/bin/retrieval_pipeline_test .carry/bin/retrieval_benchmark build-gpu/
  export LD_LIBRARY_PATH=$PWD/.carry/bin:${LD_LIBRARY_PATH:-}
  prebuilt=1
  echo "using the binaries packed here (stamp $(cat .carry/bin/STAMP))"
elif [[ -f .carry/bin/STAMP ]]; then
  echo "packed binaries are stale (sources changed since pack_for_device.sh): building here"
fi
pids=()
if [[ $prebuilt == 0 && " $* " == *" tests "* ]]; then
  build_pipeline_test build-gpu/retrieval_pipeline_test -Xptxas -v > "$OUT/build-test.log" 2>&1 &
  pids+=($!)
fi
if [[ $prebuilt == 0 && " $* " == *" bench "* ]]; then
  build_benchmark build-gpu/retrieval_benchmark > "$OUT/build-bench.log" 2>&1 &
  pids+=($!)
fi
for p in "${pids[@]}"; do wait "$p" || { echo "build failed"; tail -30 "$OUT"/build-*.log; exit 1; }; done
status=0
benches=0  # the first bench step logs to bench.log, later ones to bench-2.log, ...
while [[ $# -gt 0 ]]; do
  case "$1" in
    tests) shift; ./build-gpu/retrieval_pipeline_test --durations yes 2>&1 | tee "$OUT/test.log" | grep -v "^ *[0-9.]* s: " ; status=$((status | $?)) ;;
    bench) shift; args=(); while [[ $# -gt 0 && "$1" != tests && "$1" != bench && "$1" != torch && "$1" != ncu && "$1" != server ]]; do args+=("$1"); shift; done
           benches=$((benches + 1)); log="$OUT/bench.log"; [[ $benches == 1 ]] || log="$OUT/bench-$benches.log"
           ./build-gpu/retrieval_benchmark "${args[@]}" 2>&1 | tee "$log"; status=$((status | $?)) ;;
    ncu) shift; ncu --clock-control none --kernel-name regex:"scoring|matching" --launch-skip 6 --launch-count 4 \
           --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
           --section LaunchStats ./build-gpu/retrieval_benchmark --n 8000000 --quick --stages-only > "$OUT/ncu.log" 2>&1
         status=$((status | $?)); grep -E "^  [a-z_]+.*\(|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Stall|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth" "$OUT/ncu.log" | head -120 ;;
    server) shift; [[ $prebuilt == 1 ]] || { echo "server: no up-to-date packed server (run pack_for_device.sh)"; exit 1; }
            PYTHONUNBUFFERED=1 python3 benchmarks/retrieval/server_check.py .carry/bin/retrieval_server 2>&1 | tee "$OUT/server.log"
            status=$((status | $?)) ;;
    torch) shift; PYTHONUNBUFFERED=1 python3 benchmarks/retrieval/torch_peer.py "${1:-100000000}" 2>&1 | tee "$OUT/torch.log"; shift; status=$((status | $?)) ;;
    *) echo "unknown step $1"; exit 2 ;;
  esac
done
exit $status
