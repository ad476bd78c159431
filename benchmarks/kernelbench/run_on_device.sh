#!/usr/bin/env bash
# On the device (carry .carry): KernelBench-format problems searched on the GPU, PyTorch (the device's python3,
# CUDA) as the reference and the peer. Each part's log and results go under $OUT.
#   bash benchmarks/kernelbench/run_on_device.sh smoke          one template search (01_relu) and the LLM path (19, replayed)
#   SUITE_TIME=400 bash benchmarks/kernelbench/run_on_device.sh suite [problems...]
#                                                               kevo-suite at full size; resumes from $SUITE_DIR
set -uo pipefail
part=${1:-smoke}
shift || true
out=${OUT:-/tmp/out}
mkdir -p "$out"
bin=$PWD/.carry/kernelbench
export PATH=$bin:/usr/local/cuda/bin:$PATH
export KEVO_INCLUDE_DIR=$PWD/include
export LD_LIBRARY_PATH=$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())' | tee -a "$out/gpu.txt"
jobs=${JOBS:-6}
if [ "$part" = smoke ]; then
  start=$(date +%s)
  timeout ${SMOKE_TIME:-200} kevo-search problems/kernelbench/01_relu.py --device cuda --python python3 --budget ${BUDGET:-8} --jobs "$jobs" \
    --time 120 --store /tmp/relu.db --json "$out/01_relu.json" --out "$out/01_relu.best.cu" > "$out/01_relu.log" 2>&1
  echo "01_relu: exit $?, $(( $(date +%s) - start )) s"; tail -15 "$out/01_relu.log"
  answers=benchmarks/kernelbench/llm_answers
  python3 benchmarks/kernelbench/replay_llm.py --port 8765 "$answers"/19_scaled_residual_cuda.1_wrong.md "$answers"/19_scaled_residual_cuda.2_right.md \
    > "$out/replay.log" 2>&1 &
  replay=$!
  sleep 1
  start=$(date +%s)
  KEVO_LLM_BASE_URL=http://127.0.0.1:8765/v1 KEVO_LLM_MODEL=replay KEVO_LLM_API_KEY_ENV= timeout ${SMOKE_TIME:-200} \
    kevo-llm-search problems/kernelbench/19_scaled_residual.py --device cuda --python python3 --budget 3 --jobs 1 --store /tmp/residual.db \
    --json "$out/19_scaled_residual.json" > "$out/19_scaled_residual.log" 2>&1
  echo "19_scaled_residual (LLM, replayed): exit $?, $(( $(date +%s) - start )) s"; tail -15 "$out/19_scaled_residual.log"
  kill $replay
  cat "$out/replay.log"
else
  dir=${SUITE_DIR:-$out/suite}
  mkdir -p "$dir"
  problems=("$@")
  [ ${#problems[@]} -gt 0 ] || problems=(problems/kernelbench)
  timeout ${SUITE_TIME:-400} kevo-suite "${problems[@]}" --device cuda --python python3 --budget ${BUDGET:-8} --jobs "$jobs" --out "$dir" 2>&1 |
    tee "$out/suite.log" | grep -vE "^\s*$" | tail -60
  [ "$dir" = "$out/suite" ] || cp -r "$dir" "$out/suite"
fi
