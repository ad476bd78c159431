// The portability layer's AMD branch, instantiated (compiled with hipcc for gfx90a and gfx940 by
// tests/hip/CMakeLists.txt, never run: no AMD GPU is lent). Each function below uses one family of
// what kevo's kernels call through it, so that a mapping that compiles only as an unused template
// cannot hide here.
#include <cstdint>

#include "kevo/retrieval/portability.cuh"

namespace kr = kevo::retrieval;

static_assert(KEVO_GPU_AMD, "this unit is compiled for AMD");
static_assert(kr::gpu_warp_size == 64 && sizeof(kr::gpu_lane_mask_t) == 8, "CDNA's waves have 64 lanes");
static_assert(kr::gpu_logical_warp_size == 32, "the kernels' logical warps: two a wave");

// Lanes: shuffles, the lane barrier, the reduction, byte compares, and the loads past L1 and without hints.
__global__ void lanes_kernel(const std::uint32_t* in, std::uint32_t* out, const uint4* rows) {
  const std::uint32_t v = in[threadIdx.x];
  std::uint32_t sum = v;
  for (int distance = kr::gpu_warp_size / 2; distance > 0; distance /= 2)
    sum += kr::gpu_shfl_xor(kr::gpu_all_lanes, sum, distance);
  kr::gpu_sync_lanes(kr::gpu_all_lanes);
  const std::uint32_t largest = kr::gpu_reduce_max(kr::gpu_all_lanes, v);
  const std::uint32_t neighbour = kr::gpu_shfl<kr::gpu_logical_warp_size>(kr::gpu_all_lanes, v, (threadIdx.x + 1) % kr::gpu_logical_warp_size);
  const uint4 row = kr::gpu_load_streaming<128>(rows + threadIdx.x);
  out[threadIdx.x] = sum + largest + neighbour + kr::gpu_bytes_equal(v, row.x) + kr::gpu_bytes_differ(v, row.y) +
                     kr::gpu_load_past_l1(in + 1) + kr::gpu_byte_perm(row.z, row.w, 0x5410);
}

// Copies to shared memory (plain on AMD), then the fp16 product in mma.sync's layout.
__global__ void copies_and_product_kernel(const uint4* rows, const std::uint32_t* words, float* out) {
  __shared__ uint4 staged[64];
  __shared__ std::uint32_t small[64];
  kr::gpu_copy_async_16<256>(staged + threadIdx.x, rows + threadIdx.x, threadIdx.x % 2 ? 16u : 8u);
  kr::gpu_copy_async_small<4>(small + threadIdx.x, words + threadIdx.x, threadIdx.x % 3 != 0);
  kr::gpu_copy_async_commit();
  kr::gpu_copy_async_wait<0>();
  __syncthreads();
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  const uint4 a = staged[threadIdx.x ^ 1];
  kr::gpu_mma_m16n8k16(d, a.x, a.y, a.z, a.w, small[threadIdx.x], small[threadIdx.x ^ 2]);
  for (int i = 0; i < 4; ++i) out[4 * threadIdx.x + i] = d[i];
}

// rocPRIM behind CUB's block-wide names, as topk.cuh and topk_kernels.cuh use them.
template <int Threads, int Items>
__global__ void block_algorithms_kernel(const unsigned long long* in, std::uint32_t count, unsigned long long* out) {
  using Scan = kr::gpu_cub::BlockScan<std::uint32_t, Threads>;
  using Sort = kr::gpu_cub::BlockMergeSort<unsigned long long, Threads, Items>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ typename Sort::TempStorage sort_storage;
  std::uint32_t before = 0, total = 0;
  Scan(scan_storage).ExclusiveSum(static_cast<std::uint32_t>(in[threadIdx.x]), before, total);
  unsigned long long keys[Items];
  for (int i = 0; i < Items; ++i) keys[i] = in[threadIdx.x * Items + i] + before + total;
  Sort(sort_storage).Sort(keys, [](unsigned long long a, unsigned long long b) { return a > b; }, static_cast<int>(count), 0ull);
  for (int i = 0; i < Items; ++i) out[threadIdx.x * Items + i] = keys[i];
}

// A cooperative grid, launched as kevo's kernels launch one.
__global__ void grid_kernel(std::uint32_t* flags) {
  kr::gpu_wait_for_prior_grid();
  flags[blockIdx.x] = 1;
  kr::gpu_grid_sync();
  if (threadIdx.x == 0) flags[gridDim.x + blockIdx.x] = flags[(blockIdx.x + 1) % gridDim.x];
}

// The host runtime and the device-wide algorithms, each call once.
kevo::expected<void, kevo::Error> portability_amd_host(std::uint32_t n) {
  kr::gpu_stream_t stream{};
  KEVO_GPU_TRY(kr::gpu_stream_create(&stream));
  kr::GpuScratch scratch;
  std::uint32_t *keys = nullptr, *sorted = nullptr, *values = nullptr, *sorted_values = nullptr, *runs = nullptr;
  KEVO_GPU_TRY(scratch.allocate(keys, n));
  KEVO_GPU_TRY(scratch.allocate(sorted, n));
  KEVO_GPU_TRY(scratch.allocate(values, n));
  KEVO_GPU_TRY(scratch.allocate(sorted_values, n));
  KEVO_GPU_TRY(scratch.allocate(runs, 1));
  std::size_t sort_bytes = 0, scan_bytes = 0, encode_bytes = 0;
  KEVO_GPU_TRY(kr::gpu_cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, sorted, values, sorted_values, n));
  KEVO_GPU_TRY(kr::gpu_cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, keys, values, n));
  KEVO_GPU_TRY(kr::gpu_cub::DeviceRunLengthEncode::Encode(nullptr, encode_bytes, sorted, keys, values, runs, n));
  unsigned char* temp = nullptr;
  KEVO_GPU_TRY(scratch.allocate(temp, std::max({sort_bytes, scan_bytes, encode_bytes})));
  KEVO_GPU_TRY(kr::gpu_cub::DeviceRadixSort::SortPairs(temp, sort_bytes, keys, sorted, values, sorted_values, n, 0, 20, stream));
  KEVO_GPU_TRY(kr::gpu_cub::DeviceScan::ExclusiveSum(temp, scan_bytes, keys, values, n, stream));
  KEVO_GPU_TRY(kr::gpu_cub::DeviceRunLengthEncode::Encode(temp, encode_bytes, sorted, keys, values, runs, n, stream));

  kr::DeviceBuffer<unsigned long long> candidates;
  kr::PinnedBuffer<std::uint32_t> pinned;
  KEVO_GPU_TRY(kr::gpu_allocate(candidates, 2 * 256 * sizeof(unsigned long long)));
  KEVO_GPU_TRY(kr::gpu_allocate(pinned, 64));
  KEVO_GPU_TRY(kr::gpu_memset_async(candidates.get(), 0, 2 * 256 * sizeof(unsigned long long), stream));
  KEVO_GPU_TRY(kr::gpu_launch_after_prior(block_algorithms_kernel<256, 2>, dim3(1), dim3(256), 0, stream,
                                          candidates.get(), n, candidates.get() + 256));
  KEVO_GPU_TRY(kr::gpu_launch_after_prior_if(false, lanes_kernel, dim3(1), dim3(64), 0, stream, keys, values,
                                             reinterpret_cast<const uint4*>(temp)));
  KEVO_GPU_TRY(kr::gpu_launch_cooperative_after_prior(grid_kernel, dim3(4), dim3(64), 0, stream, runs));
  copies_and_product_kernel<<<1, 64, 0, stream>>>(reinterpret_cast<const uint4*>(temp), keys,
                                                  reinterpret_cast<float*>(sorted));
  KEVO_GPU_TRY(kr::gpu_last_error());
  KEVO_GPU_TRY(kr::gpu_copy_async(pinned.get(), runs, 4, stream));

  kr::gpu_event_t done{};
  KEVO_GPU_TRY(kr::gpu_event_create(&done));
  KEVO_GPU_TRY(kr::gpu_event_record(done, stream));
  KEVO_GPU_TRY(kr::gpu_stream_wait_event(stream, done));
  KEVO_GPU_TRY(kr::gpu_event_synchronize(done));
  KEVO_GPU_TRY(kr::gpu_event_destroy(done));
  KEVO_GPU_TRY(kr::gpu_stream_synchronize(stream));

  int device = 0, multiprocessors = 0, shared = 0, resident = 0;
  KEVO_GPU_TRY(kr::gpu_current_device(&device));
  KEVO_GPU_TRY(kr::gpu_multiprocessor_count(&multiprocessors, device));
  KEVO_GPU_TRY(kr::gpu_max_shared_memory_optin(&shared, device));
  KEVO_GPU_TRY(kr::gpu_resident_blocks(&resident, grid_kernel, 64, 0));
  KEVO_GPU_TRY(kr::gpu_allow_dynamic_shared(reinterpret_cast<const void*>(&lanes_kernel), shared));
  (void)kr::gpu_static_shared_bytes(copies_and_product_kernel);
  std::string name, version;
  KEVO_GPU_TRY(kr::gpu_device_name(&name, device));
  KEVO_GPU_TRY(kr::gpu_runtime_version(&version));
  KEVO_GPU_TRY(kr::gpu_copy(keys, values, 4));
  KEVO_GPU_TRY(kr::gpu_memset(keys, 0, 4));
  KEVO_GPU_TRY(kr::gpu_device_synchronize());
  KEVO_GPU_TRY(kr::gpu_stream_destroy(stream));
  if (kr::gpu_device_count() <= 0) return kevo::unexpected(kevo::Error{"no AMD GPU"});
  return {};
}
