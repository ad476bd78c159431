// The portability layer's plain paths, which AMD takes where PTX has an instruction (device_intrinsics.cuh),
// checked against that instruction here: the fp16 product by lane shuffles against mma.sync's tensor
// cores on random fragments, and the byte compare by arithmetic against __vcmpne4 (on the host too,
// against a byte loop). No AMD GPU is lent, so this is where those paths run.
// (One of the files of test_cuda_retrieval_pipeline; its main is main.cu.)
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "../support/pipeline_fixtures.cuh"

using namespace kevo::retrieval;
using kevo_tests::retrieval_pipeline::download;

namespace {

std::uint32_t bytes_differ_by_loop(std::uint32_t a, std::uint32_t b) {
  std::uint32_t out = 0;
  for (int i = 0; i < 4; ++i)
    if (((a >> (8 * i)) & 0xffu) != ((b >> (8 * i)) & 0xffu)) out |= 0xffu << (8 * i);
  return out;
}

// Each warp multiplies its own fragments both ways; d starts from the given accumulators.
__global__ void products_kernel(const std::uint32_t* a, const std::uint32_t* b, const float* c, float* by_tensor_cores,
                                float* by_shuffles) {
  const int t = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  float d[4], e[4];
  for (int i = 0; i < 4; ++i) d[i] = e[i] = c[4 * t + i];
  gpu_mma_m16n8k16(d, a[4 * t], a[4 * t + 1], a[4 * t + 2], a[4 * t + 3], b[2 * t], b[2 * t + 1]);
  gpu_mma_m16n8k16_by_shuffles(e, a[4 * t], a[4 * t + 1], a[4 * t + 2], a[4 * t + 3], b[2 * t], b[2 * t + 1]);
  for (int i = 0; i < 4; ++i) {
    by_tensor_cores[4 * t + i] = d[i];
    by_shuffles[4 * t + i] = e[i];
  }
}

__global__ void bytes_kernel(const std::uint32_t* a, const std::uint32_t* b, std::uint32_t* by_instruction,
                             std::uint32_t* by_arithmetic, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  by_instruction[i] = gpu_bytes_differ(a[i], b[i]);
  by_arithmetic[i] = detail::bytes_differ_by_arithmetic(a[i], b[i]);
}

template <class T>
DeviceBuffer<T> to_device(const std::vector<T>& host) {
  DeviceBuffer<T> device;
  KEVO_GPU_ASSERT(gpu_allocate(device, host.size() * sizeof(T)));
  KEVO_GPU_ASSERT(gpu_copy(device.get(), host.data(), host.size() * sizeof(T)));
  return device;
}
template <class T>
DeviceBuffer<T> poisoned(std::size_t count) {
  DeviceBuffer<T> device;
  KEVO_GPU_ASSERT(gpu_allocate(device, count * sizeof(T)));
  KEVO_GPU_ASSERT(gpu_memset(device.get(), 0xab, count * sizeof(T)));
  return device;
}

}  // namespace

TEST_CASE("the byte compare by arithmetic is a byte loop's, for every byte pair and at random", "[host][portability]") {
  for (std::uint32_t x = 0; x < 256; ++x)
    for (std::uint32_t y = 0; y < 256; ++y) {
      const std::uint32_t a = x | (y << 8) | (x << 16) | (0x80u << 24), b = y | (y << 8) | (0x80u << 16) | (x << 24);
      REQUIRE(detail::bytes_differ_by_arithmetic(a, b) == bytes_differ_by_loop(a, b));
    }
  std::mt19937 random(52);
  for (int i = 0; i < 100000; ++i) {
    const std::uint32_t a = random(), mask = random();
    const std::uint32_t b = a ^ (mask & 0x01800180u);  // some bytes equal, some differing in their top or low bit
    REQUIRE(detail::bytes_differ_by_arithmetic(a, b) == bytes_differ_by_loop(a, b));
  }
}

TEST_CASE("AMD's plain paths equal the PTX instructions they stand in for", "[cuda][portability]") {
  std::mt19937 random(5252);
  SECTION("the fp16 product by shuffles against mma.sync, on random fragments") {
    constexpr int warps = 64, threads = 32 * warps;
    std::uniform_real_distribution<float> value(-2.0f, 2.0f);
    auto half_pair = [&] {
      const auto bits = [&] { return static_cast<std::uint32_t>(__half_as_ushort(__float2half_rn(value(random)))); };
      return bits() | (bits() << 16);
    };
    std::vector<std::uint32_t> a(4 * threads), b(2 * threads);
    std::vector<float> c(4 * threads);
    for (auto& x : a) x = half_pair();
    for (auto& x : b) x = half_pair();
    for (auto& x : c) x = value(random);
    const auto device_a = to_device(a), device_b = to_device(b);
    const auto device_c = to_device(c);
    const auto by_tensor_cores = poisoned<float>(4 * threads), by_shuffles = poisoned<float>(4 * threads);
    products_kernel<<<warps / 4, 128>>>(device_a.get(), device_b.get(), device_c.get(), by_tensor_cores.get(),
                                        by_shuffles.get());
    KEVO_GPU_ASSERT(gpu_device_synchronize());
    const auto expected = download<float>(by_tensor_cores.get(), 4 * threads);
    const auto got = download<float>(by_shuffles.get(), 4 * threads);
    // The same 16 products per output, fp32 sums in another order: within a few ulps of the sum of |terms|.
    double worst = 0;
    for (std::size_t i = 0; i < expected.size(); ++i) {
      INFO("output " << i);
      REQUIRE(std::isfinite(expected[i]));
      REQUIRE(std::fabs(got[i] - expected[i]) <= 1e-4f * (1.0f + std::fabs(expected[i])) * 16.0f);
      worst = std::max(worst, static_cast<double>(std::fabs(got[i] - expected[i])));
    }
    REQUIRE(std::any_of(expected.begin(), expected.end(), [&](float x) { return std::fabs(x - expected[0]) > 0.1f; }));
  }
  SECTION("the byte compare by arithmetic against __vcmpne4") {
    constexpr int n = 1 << 16;
    std::vector<std::uint32_t> a(n), b(n);
    for (int i = 0; i < n; ++i) {
      a[i] = random();
      b[i] = a[i] ^ (random() & 0x81008100u);
    }
    const auto device_a = to_device(a), device_b = to_device(b);
    const auto by_instruction = poisoned<std::uint32_t>(n), by_arithmetic = poisoned<std::uint32_t>(n);
    bytes_kernel<<<n / 256, 256>>>(device_a.get(), device_b.get(), by_instruction.get(), by_arithmetic.get(), n);
    KEVO_GPU_ASSERT(gpu_device_synchronize());
    const auto expected = download<std::uint32_t>(by_instruction.get(), n);
    const auto got = download<std::uint32_t>(by_arithmetic.get(), n);
    for (int i = 0; i < n; ++i) {
      INFO("pair " << i);
      REQUIRE(expected[i] == bytes_differ_by_loop(a[i], b[i]));
      REQUIRE(got[i] == expected[i]);
    }
  }
}
