#!/usr/bin/env bash
# Sweeps a problem's knob settings on the device: renders each line of a settings file (knob=value
# words), compiles them in parallel with nvcc, then checks and times each alone (the problem's
# check_and_time.cu: benchmarks/search/gemm_variants for cuda_gemm, softmax_variants for cuda_softmax).
#   PROBLEM=cuda_gemm bash benchmarks/search/variants/sweep.sh settings.txt OUT_DIR
# Prints one line per variant, fastest first, to OUT_DIR/sweep.txt. TIMING_N passes a timing size to
# harnesses that take one (scoring).
set -uo pipefail
settings=$1
out=$2
problem=${PROBLEM:-cuda_gemm}
here=benchmarks/search/${problem#cuda_}_variants
mkdir -p "$out/variants"
export PATH=/usr/local/cuda/bin:$PATH
nvcc -std=c++20 -O3 -arch=sm_90 -I"$here" -c -o "$out/check.o" "$here/check_and_time.cu" &
nvcc -std=c++20 -O3 -arch=sm_90 -I"$here" -c -o "$out/reference.o" problems/$problem/reference.cu &
wait
n=0
while read -r line; do
  [ -z "$line" ] && continue
  n=$((n + 1))
  echo "$line" > "$out/variants/$n.knobs"
  python3 benchmarks/search/variants/render.py problems/$problem "$out/variants/$n.cu" $line
done < "$settings"
build() {
  nvcc -std=c++20 -O3 -arch=sm_90 -I"$3" -Iinclude -o "$2/variants/$1.bin" "$2/variants/$1.cu" "$2/check.o" "$2/reference.o" \
    > "$2/variants/$1.build.log" 2>&1
}
export -f build
seq 1 $n | xargs -P "${BUILD_JOBS:-16}" -I{} bash -c "build {} $out $here"
for i in $(seq 1 $n); do
  if [ -x "$out/variants/$i.bin" ]; then
    result=$(timeout 120 "$out/variants/$i.bin" ${TIMING_N:-} 2>&1 | tail -1)  # TIMING_N: scoring's timing size
  else
    result="BUILD FAILED: $(head -c 200 "$out/variants/$i.build.log" | tr '\n' ' ')"
  fi
  echo "$result | $(cat "$out/variants/$i.knobs")" | tee -a "$out/raw.txt"
done
{ grep " ms " "$out/raw.txt" | sort -n; grep -v " ms " "$out/raw.txt"; } > "$out/sweep.txt"
