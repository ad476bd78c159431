// kevo/retrieval/rocprim_cub.cuh: on AMD, the few CUB algorithms the pipeline calls, under CUB's names
// and signatures, each a call of its rocPRIM twin (portability.cuh makes this gpu_cub there). hipCUB
// is this adapter in full, but Debian 12 packages rocPRIM and not hipCUB, so kevo carries the part it uses.
// Empty where the target is not AMD (CUB itself is gpu_cub there).
#pragma once

#include "kevo/retrieval/device_intrinsics.cuh"

#if KEVO_GPU_AMD

#include <cstddef>
#include <cstdint>
#include <iterator>

#include <hip/hip_runtime.h>
#include <rocprim/rocprim.hpp>

namespace kevo::retrieval::rocprim_cub {

/// cub::BlockScan's exclusive prefix sums over a block of `BlockThreads` threads.
template <class T, int BlockThreads>
class BlockScan {
  using Scan = ::rocprim::block_scan<T, BlockThreads>;

 public:
  using TempStorage = typename Scan::storage_type;
  __device__ explicit BlockScan(TempStorage& storage) : storage_(storage) {}
  __device__ void ExclusiveSum(T input, T& output) { Scan().exclusive_scan(input, output, T{0}, storage_); }
  /// `block_total` is every thread's input summed, given to each thread.
  __device__ void ExclusiveSum(T input, T& output, T& block_total) {
    Scan().exclusive_scan(input, output, T{0}, block_total, storage_);
  }

 private:
  TempStorage& storage_;
};

/// cub::BlockMergeSort's keys-only sort, blocked arrangement (thread t holds items t * Items + i), as a
/// rocPRIM block sort. Items at positions from `valid_items` on sort as `out_of_bounds`, as in CUB.
template <class Key, int BlockThreads, int Items>
class BlockMergeSort {
  using Sorter = ::rocprim::block_sort<Key, BlockThreads, Items>;

 public:
  using TempStorage = typename Sorter::storage_type;
  __device__ explicit BlockMergeSort(TempStorage& storage) : storage_(storage) {}
  template <class Compare>
  __device__ void Sort(Key (&keys)[Items], Compare compare, int valid_items, Key out_of_bounds) {
    for (int i = 0; i < Items; ++i)
      if (static_cast<int>(threadIdx.x) * Items + i >= valid_items) keys[i] = out_of_bounds;
    Sorter().sort(keys, storage_, compare);
  }

 private:
  TempStorage& storage_;
};

/// cub::DeviceRadixSort::SortPairs: a call with `temp` null sets `temp_bytes` and does nothing else.
struct DeviceRadixSort {
  template <class Key, class Value>
  static hipError_t SortPairs(void* temp, std::size_t& temp_bytes, const Key* keys_in, Key* keys_out,
                              const Value* values_in, Value* values_out, std::size_t count, int begin_bit = 0,
                              int end_bit = 8 * sizeof(Key), hipStream_t stream = nullptr) {
    return ::rocprim::radix_sort_pairs(temp, temp_bytes, keys_in, keys_out, values_in, values_out, count,
                                       static_cast<unsigned>(begin_bit), static_cast<unsigned>(end_bit), stream);
  }
};

/// cub::DeviceScan::ExclusiveSum.
struct DeviceScan {
  template <class In, class Out>
  static hipError_t ExclusiveSum(void* temp, std::size_t& temp_bytes, In input, Out output, std::size_t count,
                                 hipStream_t stream = nullptr) {
    using T = typename std::iterator_traits<In>::value_type;
    return ::rocprim::exclusive_scan(temp, temp_bytes, input, output, T{0}, count, ::rocprim::plus<T>(), stream);
  }
};

/// cub::DeviceRunLengthEncode::Encode: the distinct keys of sorted input, each run's length, and the
/// number of runs.
struct DeviceRunLengthEncode {
  template <class In, class Unique, class Counts, class Runs>
  static hipError_t Encode(void* temp, std::size_t& temp_bytes, In input, Unique unique_out, Counts counts_out,
                           Runs runs_out, std::size_t count, hipStream_t stream = nullptr) {
    return ::rocprim::run_length_encode(temp, temp_bytes, input, static_cast<unsigned>(count), unique_out,
                                        counts_out, runs_out, stream);
  }
};

}  // namespace kevo::retrieval::rocprim_cub

#endif  // KEVO_GPU_AMD
