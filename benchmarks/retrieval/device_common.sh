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
# Builds the retrieval pipeline's test binary ($1) from tests/cuda/retrieval_pipeline/*.cu (one file
# per facility): one nvcc per file, up to NVCC_JOBS (default: the cores) at once, then the link.
# Further arguments go to every compile. Uses $nvcc where the caller set it, else nvcc on PATH.
build_pipeline_test() {
  local out=$1 objects status=0
  shift
  objects=$(mktemp -d)
  printf '%s\0' tests/cuda/retrieval_pipeline/*.cu |
    xargs -0 -n 1 -P "${NVCC_JOBS:-$(nproc)}" bash -c \
      'source=${!#}; exec "${@:1:$#-1}" -c "$source" -o "$0/$(basename "$source" .cu).o"' \
      "$objects" "${nvcc:-nvcc}" "${nvcc_flags[@]}" "$@" || status=1
  if [[ $status == 0 ]]; then
    "${nvcc:-nvcc}" "${nvcc_flags[@]}" "$objects"/*.o -o "$out" || status=1
  fi
  rm -rf "$objects"
  return $status
}
