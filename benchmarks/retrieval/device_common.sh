# Shared by run_on_device.sh and pack_for_device.sh (sourced, from the repository root).
# The nvcc flags of the device binaries, and a stamp of the sources they are built from: binaries
# packed here are used on the device only while the stamp still matches.
nvcc_flags=(-std=c++20 -O3 -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=sm_90
            --expt-relaxed-constexpr -Iinclude -I.carry)
source_stamp() {
  find include tests/cuda benchmarks/retrieval examples/retrieval_server -type f \
       \( -name '*.hpp' -o -name '*.cuh' -o -name '*.cu' -o -name '*.cpp' \) -print0 |
    LC_ALL=C sort -z | xargs -0 sha1sum | sha1sum | cut -d' ' -f1
}
# Builds the retrieval pipeline's test binary ($1) from tests/cuda/retrieval_pipeline/ (main.cu and
# one *.test.cu per facility) compiled as one translation unit: each file on its own compiles the
# whole pipeline's kernels again (several times the time, and a binary too large to carry). Further
# arguments go to nvcc. Uses $nvcc where the caller set it, else nvcc on PATH.
build_pipeline_test() {
  local out=$1 unit source status=0
  shift
  unit=$(mktemp --suffix=.cu)
  for source in tests/cuda/retrieval_pipeline/main.cu tests/cuda/retrieval_pipeline/*.test.cu; do
    echo "#include \"$PWD/$source\""  # main.cu first: it includes Catch2 with its runner
  done > "$unit"
  "${nvcc:-nvcc}" "${nvcc_flags[@]}" "$@" "$unit" -o "$out" || status=1
  rm -f "$unit"
  return $status
}
# Builds the retrieval benchmark ($1): its CUDA file and the sharded timing's host file, which nvcc
# hands to the host compiler. Further arguments go to nvcc.
build_benchmark() {
  local out=$1
  shift
  "${nvcc:-nvcc}" "${nvcc_flags[@]}" "$@" benchmarks/retrieval/retrieval_benchmark.cu \
    benchmarks/retrieval/sharded_bench.cpp -o "$out"
}
