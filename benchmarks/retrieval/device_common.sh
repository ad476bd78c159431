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
