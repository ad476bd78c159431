// kevo/retrieval/device_intrinsics.cuh: the device-side half of portability.cuh, and the only inline PTX
// of the retrieval half: tensor-core products, streaming loads, asynchronous copies, warp intrinsics.
// Apart from portability.cuh because it needs no CUB: a search candidate that includes the scoring
// agent (problems/cuda_scoring) is then still read by the candidate screen, whose clang-15 cannot parse
// CUDA 13's CUB.
//
// Two platforms, one source: CUDA (nvcc) and HIP on AMD (hipcc, KEVO_GPU_AMD). Where AMD has no
// counterpart of a PTX feature, the AMD branch takes a plain path, said beside it: no programmatic
// dependent launch (stream order already holds), loads without cache hints, cp.async as a plain copy.
// AMD's CDNA GPUs (gfx90a, gfx940) run 64-lane waves: gpu_warp_size and gpu_lane_mask_t say so. kevo's
// kernels work in logical warps of 32 lanes on both (gpu_logical_warp_size), as CUB's logical warps may
// be smaller than the hardware's: a CDNA wave runs two, and no lane math spells out 32.
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__HIP__) || defined(__HIP_PLATFORM_AMD__)
#define KEVO_GPU_AMD 1
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#else
#define KEVO_GPU_AMD 0
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

namespace kevo::retrieval {

// ---- lanes -------------------------------------------------------------------------------------
/// Threads that execute in lockstep: a CUDA warp (32) or a CDNA wave (64; kevo targets no RDNA,
/// whose waves may be 32), and the type of a mask with a bit per lane.
#if KEVO_GPU_AMD
inline constexpr int gpu_warp_size = 64;
using gpu_lane_mask_t = std::uint64_t;
#if defined(__AMDGCN_WAVEFRONT_SIZE)
static_assert(__AMDGCN_WAVEFRONT_SIZE == gpu_warp_size, "kevo's AMD targets are CDNA, whose waves have 64 lanes");
#endif
#else
inline constexpr int gpu_warp_size = 32;
using gpu_lane_mask_t = std::uint32_t;
#endif
inline constexpr gpu_lane_mask_t gpu_all_lanes = ~gpu_lane_mask_t{0};

/// The lanes that kevo's kernels treat as one warp ("a warp a row", the m16n8k16 product's fragments),
/// on both platforms: a CUDA warp, or half a CDNA wave. A logical warp's exchanges stay inside it (XOR
/// distances below it, widths at most it), so the two in one wave never mix.
inline constexpr int gpu_logical_warp_size = 32;
static_assert(gpu_warp_size % gpu_logical_warp_size == 0, "a wave holds whole logical warps");

/// `value` of the lane whose index is this lane's XOR `lane_mask`, among `lanes` (all of which call it).
template <class T>
__device__ __forceinline__ T gpu_shfl_xor(gpu_lane_mask_t lanes, T value, int lane_mask) {
#if KEVO_GPU_AMD
  (void)lanes;  // HIP 5.2 has no masked shuffles: a wave's active lanes are the ones that call it
  return __shfl_xor(value, lane_mask);
#else
  return __shfl_xor_sync(lanes, value, lane_mask);
#endif
}

/// `value` of lane `source` of this lane's group of `Width` lanes (a power of two, at most the warp).
template <int Width = gpu_warp_size, class T>
__device__ __forceinline__ T gpu_shfl(gpu_lane_mask_t lanes, T value, int source) {
  static_assert(Width > 0 && Width <= gpu_warp_size && (Width & (Width - 1)) == 0, "a power of two, at most the warp");
#if KEVO_GPU_AMD
  (void)lanes;
  return __shfl(value, source, Width);
#else
  return __shfl_sync(lanes, value, source, Width);
#endif
}

/// A barrier of `lanes` of one warp or wave: their shared-memory writes before it are seen after it.
__device__ __forceinline__ void gpu_sync_lanes(gpu_lane_mask_t lanes) {
#if KEVO_GPU_AMD
  (void)lanes;  // HIP 5.2 has no __syncwarp: a wave is in lockstep, so a fence each side of the scheduling barrier
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#else
  __syncwarp(lanes);
#endif
}

/// The largest `value` over `lanes` of this logical warp, returned to each of them.
__device__ __forceinline__ std::uint32_t gpu_reduce_max(gpu_lane_mask_t lanes, std::uint32_t value) {
  // AMD has no reduce instruction, and clang 15 (the candidate screen's CUDA parser) does not declare
  // nvcc's __reduce_max_sync: both take a butterfly over the logical warp.
#if KEVO_GPU_AMD || defined(__clang__)
  for (int distance = gpu_logical_warp_size / 2; distance > 0; distance /= 2) {
    const std::uint32_t other = gpu_shfl_xor(lanes, value, distance);
    value = other > value ? other : value;
  }
  return value;
#else
  return __reduce_max_sync(lanes, value);
#endif
}

namespace detail {
/// gpu_bytes_differ's arithmetic, where no SIMD-within-a-word compare exists (AMD): bit 7 of a byte of
/// `nonzero` is set where that byte of a ^ b is (its low 7 bits plus 0x7f carry into bit 7, its own
/// bit 7 is or-ed in), then spread to 0xff. No carry crosses a byte. Host-callable, so that tests check it.
__host__ __device__ constexpr std::uint32_t bytes_differ_by_arithmetic(std::uint32_t a, std::uint32_t b) {
  const std::uint32_t x = a ^ b;
  const std::uint32_t nonzero = (((x & 0x7f7f7f7fu) + 0x7f7f7f7fu) | x) & 0x80808080u;
  return (nonzero >> 7) * 0xffu;
}
}  // namespace detail

/// 0xff in each byte where a's and b's bytes differ (gpu_bytes_equal: where they are equal), 0 elsewhere.
__device__ __forceinline__ std::uint32_t gpu_bytes_differ(std::uint32_t a, std::uint32_t b) {
#if KEVO_GPU_AMD
  return detail::bytes_differ_by_arithmetic(a, b);
#else
  return __vcmpne4(a, b);
#endif
}
__device__ __forceinline__ std::uint32_t gpu_bytes_equal(std::uint32_t a, std::uint32_t b) {
#if KEVO_GPU_AMD
  return ~detail::bytes_differ_by_arithmetic(a, b);
#else
  return __vcmpeq4(a, b);
#endif
}

/// A load past this multiprocessor's L1 (L2 keeps it), for what other blocks of a running grid write:
/// L1 is not coherent across multiprocessors.
template <class T>
__device__ __forceinline__ T gpu_load_past_l1(const T* address) {
#if KEVO_GPU_AMD
  return __atomic_load_n(address, __ATOMIC_RELAXED);  // an atomic load skips the CU's vector cache
#else
  return __ldcg(address);
#endif
}

/// First thing in a kernel launched by gpu_launch_after_prior: waits until the grid before it has
/// finished and its writes are visible. In a kernel launched the ordinary way it returns at once.
__device__ __forceinline__ void gpu_wait_for_prior_grid() {
#if !KEVO_GPU_AMD && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // AMD: launches are ordinary, stream order holds
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

namespace detail {
/// The two fp16 values of a fragment register as floats (the lower-indexed one in the low half).
__device__ __forceinline__ float2 unpack_half2(std::uint32_t pair) {
  return {__half2float(__ushort_as_half(static_cast<unsigned short>(pair & 0xffffu))),
          __half2float(__ushort_as_half(static_cast<unsigned short>(pair >> 16)))};
}
__device__ __forceinline__ float dot2(std::uint32_t a, std::uint32_t b) {
  const float2 x = unpack_half2(a), y = unpack_half2(b);
  return x.x * y.x + x.y * y.y;
}
}  // namespace detail

/// gpu_mma_m16n8k16's product without tensor cores: fp32 arithmetic over lane shuffles, in the same
/// fragment layout, within each logical warp of a 1-D block. Lane l of a logical warp holds rows l/4 and
/// l/4 + 8 of A (columns 2(l%4) + {0,1} and + 8) and column l/4 of B (those rows), and gets D's rows
/// l/4 and l/4 + 8, columns 2(l%4) + {0,1}. All its 32 lanes call it. It is AMD's path until
/// the scoring kernel has an MFMA tiling of its own (matrix cores lay fragments out across 64 lanes);
/// tests/cuda checks it against mma.sync on the GPU.
__device__ __forceinline__ void gpu_mma_m16n8k16_by_shuffles(float (&d)[4], std::uint32_t a0, std::uint32_t a1,
                                                             std::uint32_t a2, std::uint32_t a3, std::uint32_t b0,
                                                             std::uint32_t b1) {
  const int lane = static_cast<int>(threadIdx.x) % gpu_logical_warp_size;
  const int group = lane >> 2, quad = lane & 3;
  auto from = [](std::uint32_t value, int source) { return gpu_shfl<gpu_logical_warp_size>(gpu_all_lanes, value, source); };
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    // A's rows `group` and `group` + 8 at columns 2j, 2j + 1 (a0, a1) and 2j + 8, 2j + 9 (a2, a3): lane 4 group + j's.
    const int a_lane = 4 * group + j;
    const std::uint32_t row_lo = from(a0, a_lane), row8_lo = from(a1, a_lane), row_hi = from(a2, a_lane), row8_hi = from(a3, a_lane);
    // B's columns 2 quad and 2 quad + 1 at those rows: lanes 4 (2 quad) + j and 4 (2 quad + 1) + j.
    const int b_lane = 8 * quad + j;
    const std::uint32_t col0_lo = from(b0, b_lane), col0_hi = from(b1, b_lane), col1_lo = from(b0, b_lane + 4), col1_hi = from(b1, b_lane + 4);
    d[0] += detail::dot2(row_lo, col0_lo) + detail::dot2(row_hi, col0_hi);
    d[1] += detail::dot2(row_lo, col1_lo) + detail::dot2(row_hi, col1_hi);
    d[2] += detail::dot2(row8_lo, col0_lo) + detail::dot2(row8_hi, col0_hi);
    d[3] += detail::dot2(row8_lo, col1_lo) + detail::dot2(row8_hi, col1_hi);
  }
}

/// D += A * B on tensor cores: one m16n8k16 tile, fp16 inputs, fp32 accumulators (mma.sync
/// fragment layouts: a = 4 regs of half2, b = 2 regs of half2, d = 4 floats). AMD: by shuffles, above.
__device__ __forceinline__ void gpu_mma_m16n8k16(float (&d)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2,
                                                 std::uint32_t a3, std::uint32_t b0, std::uint32_t b1) {
#if KEVO_GPU_AMD
  gpu_mma_m16n8k16_by_shuffles(d, a0, a1, a2, a3, b0, b1);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

/// The L2 prefetch sizes the loads below take: none, 128 or 256 bytes (PTX also has 64, which a
/// row never needs: a row that small arrives in one request).
template <int Bytes>
inline constexpr bool is_l2_prefetch_size = Bytes == 0 || Bytes == 128 || Bytes == 256;

/// A 16-byte load of data read once: through the non-coherent path, not kept in L1. With
/// `L2PrefetchBytes` 128 or 256, a miss asks L2 to fetch the aligned 128- or 256-byte span around
/// it: worth it only where later loads ask for the rest of that span (benchmarks/RESULTS.md, runs
/// 159 and 161-163). AMD: a plain load, the hints not mapped.
template <int L2PrefetchBytes = 0>
__device__ __forceinline__ uint4 gpu_load_streaming(const void* address) {
  static_assert(is_l2_prefetch_size<L2PrefetchBytes>, "L2 prefetches 0, 128 or 256 bytes here");
  uint4 v;
#if KEVO_GPU_AMD
  v = *static_cast<const uint4*>(address);
#else
  if constexpr (L2PrefetchBytes == 128)
    asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(address));
  else if constexpr (L2PrefetchBytes == 256)
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(address));
  else
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(address));
#endif
  return v;
}

/// Asynchronous global-to-shared copies (cp.async): each thread's copies form groups that it commits
/// and later waits for, so loads stay in flight while the thread computes on earlier ones. A copy
/// with `valid_bytes` under 16 reads that many and fills the rest of its destination with zeros.
/// `L2PrefetchBytes` is gpu_load_streaming's. AMD has no asynchronous copy to shared memory: there
/// each copy is done when it returns, and committing and waiting do nothing.
template <int L2PrefetchBytes = 0>
__device__ __forceinline__ void gpu_copy_async_16(void* shared_dst, const void* src, unsigned valid_bytes) {
  static_assert(is_l2_prefetch_size<L2PrefetchBytes>, "L2 prefetches 0, 128 or 256 bytes here");
#if KEVO_GPU_AMD
  if (valid_bytes >= 16) {
    *static_cast<uint4*>(shared_dst) = *static_cast<const uint4*>(src);
    return;
  }
  auto* to = static_cast<unsigned char*>(shared_dst);
  const auto* from = static_cast<const unsigned char*>(src);
  for (unsigned i = 0; i < 16; ++i) to[i] = i < valid_bytes ? from[i] : 0;
#else
  const auto dst = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared_dst));
  if constexpr (L2PrefetchBytes == 128)
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid_bytes));
  else if constexpr (L2PrefetchBytes == 256)
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid_bytes));
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid_bytes));
#endif
}
/// A 4- or 8-byte copy (cp.async.ca: through L1, as small copies must be).
template <int Bytes>
__device__ __forceinline__ void gpu_copy_async_small(void* shared_dst, const void* src, bool valid) {
  static_assert(Bytes == 4 || Bytes == 8, "cp.async.ca copies 4, 8 or 16 bytes; 16 is gpu_copy_async_16");
#if KEVO_GPU_AMD
  using Word = std::conditional_t<Bytes == 4, std::uint32_t, std::uint64_t>;
  *static_cast<Word*>(shared_dst) = valid ? *static_cast<const Word*>(src) : Word{0};
#else
  const auto dst = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(Bytes), "r"(valid ? Bytes : 0));
#endif
}
__device__ __forceinline__ void gpu_copy_async_commit() {
#if !KEVO_GPU_AMD
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
/// Waits until at most `Pending` of this thread's most recently committed groups are still in flight.
template <int Pending>
__device__ __forceinline__ void gpu_copy_async_wait() {
#if !KEVO_GPU_AMD
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
#endif
}

/// Bytes picked from the pair (a, b) by selector nibbles, as PTX prmt does (HIP has the same intrinsic).
__device__ __forceinline__ std::uint32_t gpu_byte_perm(std::uint32_t a, std::uint32_t b, std::uint32_t selector) {
  return __byte_perm(a, b, selector);
}

}  // namespace kevo::retrieval
