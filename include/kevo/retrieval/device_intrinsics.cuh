// kevo/retrieval/device_intrinsics.cuh: the device-side half of portability.cuh, the only inline PTX
// of the retrieval half: tensor-core products, streaming loads, asynchronous copies. Apart from
// portability.cuh because it needs no CUB: a search candidate that includes the scoring agent
// (problems/cuda_scoring) is then still read by the candidate screen, whose clang-15 cannot parse
// CUDA 13's CUB.
#pragma once

#include <cstdint>

#if defined(__HIPCC__)
#error "kevo retrieval: the HIP branch of portability.cuh is not written yet (a later issue)"
#else
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

namespace kevo::retrieval {

/// First thing in a kernel launched by gpu_launch_after_prior: waits until the grid before it has
/// finished and its writes are visible. In a kernel launched the ordinary way it returns at once.
__device__ __forceinline__ void gpu_wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/// D += A * B on tensor cores: one m16n8k16 tile, fp16 inputs, fp32 accumulators (mma.sync
/// fragment layouts: a = 4 regs of half2, b = 2 regs of half2, d = 4 floats).
__device__ __forceinline__ void gpu_mma_m16n8k16(float (&d)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2,
                                                 std::uint32_t a3, std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/// The L2 prefetch sizes the loads below take: none, 128 or 256 bytes (PTX also has 64, which a
/// row never needs: a row that small arrives in one request).
template <int Bytes>
inline constexpr bool is_l2_prefetch_size = Bytes == 0 || Bytes == 128 || Bytes == 256;

/// A 16-byte load of data read once: through the non-coherent path, not kept in L1. With
/// `L2PrefetchBytes` 128 or 256, a miss asks L2 to fetch the aligned 128- or 256-byte span around
/// it: worth it only where later loads ask for the rest of that span (benchmarks/RESULTS.md, runs
/// 159 and 161-163).
template <int L2PrefetchBytes = 0>
__device__ __forceinline__ uint4 gpu_load_streaming(const void* address) {
  static_assert(is_l2_prefetch_size<L2PrefetchBytes>, "L2 prefetches 0, 128 or 256 bytes here");
  uint4 v;
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
  return v;
}

/// Asynchronous global-to-shared copies (cp.async): each thread's copies form groups that it commits
/// and later waits for, so loads stay in flight while the thread computes on earlier ones. A copy
/// with `valid` false reads nothing and fills its destination with zeros. `L2PrefetchBytes` is
/// gpu_load_streaming's.
template <int L2PrefetchBytes = 0>
__device__ __forceinline__ void gpu_copy_async_16(void* shared_dst, const void* src, unsigned valid_bytes) {
  static_assert(is_l2_prefetch_size<L2PrefetchBytes>, "L2 prefetches 0, 128 or 256 bytes here");
  const auto dst = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared_dst));
  if constexpr (L2PrefetchBytes == 128)
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid_bytes));
  else if constexpr (L2PrefetchBytes == 256)
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid_bytes));
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid_bytes));
}
/// A 4- or 8-byte copy (cp.async.ca: through L1, as small copies must be).
template <int Bytes>
__device__ __forceinline__ void gpu_copy_async_small(void* shared_dst, const void* src, bool valid) {
  static_assert(Bytes == 4 || Bytes == 8, "cp.async.ca copies 4, 8 or 16 bytes; 16 is gpu_copy_async_16");
  const auto dst = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(Bytes), "r"(valid ? Bytes : 0));
}
__device__ __forceinline__ void gpu_copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/// Waits until at most `Pending` of this thread's most recently committed groups are still in flight.
template <int Pending>
__device__ __forceinline__ void gpu_copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}

/// Bytes picked from the pair (a, b) by selector nibbles, as PTX prmt does.
__device__ __forceinline__ std::uint32_t gpu_byte_perm(std::uint32_t a, std::uint32_t b, std::uint32_t selector) {
  return __byte_perm(a, b, selector);
}

}  // namespace kevo::retrieval
