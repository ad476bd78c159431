// kevo/retrieval/half.hpp: IEEE binary16 conversions on the host, without CUDA headers.
//
//   std::uint16_t bits = kevo::retrieval::float_to_half(0.1f);   // round to nearest even
//   float back = kevo::retrieval::half_to_float(bits);           // exact
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

// Host compilation only: a CUDA device pass (nvcc's, or clang's, which also defines __x86_64__)
// knows no CPU features, and floats_to_halves is a host function.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__)
#include <cpuid.h>
#include <immintrin.h>
#define KEVO_HAVE_F16C_PATH 1
#endif

namespace kevo::retrieval {

/// Rounds a float to the nearest binary16 (ties to even), as the GPU's __float2half_rn does.
inline std::uint16_t float_to_half(float value) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (abs < 0x38800000u) {
    // Subnormal half (or zero): shift the mantissa with its implicit bit into place.
    if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);  // below half the smallest subnormal
    const std::uint32_t exponent = abs >> 23;
    const std::uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exponent;  // 14..24
    std::uint32_t half = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t half = ((abs - 0x38000000u) >> 13);
  const std::uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return static_cast<std::uint16_t>(sign | half);
}

/// Widens a binary16 to float exactly.
inline float half_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu;
  std::uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    if (mantissa == 0) return std::bit_cast<float>(sign);
    int e = -1;  // normalise the subnormal
    do { ++e; mantissa <<= 1; } while ((mantissa & 0x400u) == 0);
    return std::bit_cast<float>(sign | ((112u - e) << 23) | ((mantissa & 0x3ffu) << 13));
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

#if defined(KEVO_HAVE_F16C_PATH)
namespace detail {
/// AVX with the OS saving its registers (the compiler's own check), and F16C (CPUID leaf 1: clang
/// 15's __builtin_cpu_supports does not know "f16c").
inline bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}
/// The whole groups of 8 of in[0, n) through F16C's vcvtps2ph (round to nearest even, as
/// float_to_half); returns how many it converted.
__attribute__((target("avx,f16c"))) inline std::size_t floats_to_halves_f16c(const float* in, std::uint16_t* out,
                                                                              std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
  return i;
}
}  // namespace detail
#endif

/// float_to_half over n values, 8 at a time with the CPU's F16C instructions where it has them:
/// an upsert rounds d values an ad, and the software path takes ~5 ns a value.
inline void floats_to_halves(const float* in, std::uint16_t* out, std::size_t n) {
  std::size_t done = 0;
#if defined(KEVO_HAVE_F16C_PATH)
  static const bool f16c = detail::cpu_has_f16c();
  if (f16c) done = detail::floats_to_halves_f16c(in, out, n);
#endif
  for (; done < n; ++done) out[done] = float_to_half(in[done]);
}

/// Rounds a float through binary16 and back: what "rounded to fp16" means in the spec.
inline float round_to_half(float value) { return half_to_float(float_to_half(value)); }

}  // namespace kevo::retrieval
