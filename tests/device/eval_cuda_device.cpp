// CudaEvaluator on a GPU: the default candidate is right at ~1x, and hostile CUDA candidates are
// each contained, named and cost one evaluation, after which the device is healthy for the next.
// Without a GPU the program exits 77 (ctest: skipped).
#define CATCH_CONFIG_RUNNER
#include <kevo/eval/cuda_evaluator.hpp>

#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <random>
#include <string>

namespace {

const std::filesystem::path problems = std::filesystem::path(KEVO_TEST_DATA_DIR) / "problems";

kevo::eval::CudaEvaluator& evaluator() {
  static kevo::eval::CudaEvaluator e = [] {
    auto problem = kevo::load_problem(problems / "cuda_axpy");
    if (!problem) throw std::runtime_error(problem.error().message);
    kevo::eval::EvaluatorOptions options;
    options.cache_dir = std::filesystem::temp_directory_path() / "kevo-device-cache";
    options.run_timeout = std::chrono::seconds(5);
    options.compile_timeout = std::chrono::seconds(120);
    options.screen = false;  // the hostile candidates test the jail and the checker, the wall behind the screen
    return kevo::eval::CudaEvaluator(*problem, options);
  }();
  return e;
}

const std::string head = "#include \"kevo_problem.hpp\"\n#include <cstdio>\n#include <cstdlib>\n#include <cerrno>\n#include <thread>\n#include <chrono>\n"
                         "#include <unistd.h>\n#include <fcntl.h>\n#include <sys/socket.h>\n"
                         "template <class = void> __global__ void right(long n, const float* x, const __half* y, float* out) {\n"
                         "  long i = blockIdx.x * (long)blockDim.x + threadIdx.x; if (i < n) out[i] = 2.0f * x[i] + __half2float(y[i]); }\n"
                         "static void compute(const Shape& s, const float* x, const __half* y, float* out) {\n"
                         "  right<<<(unsigned)((s.N + 255) / 256), 256>>>(s.N, x, y, out); }\n";

kevo::Candidate hostile(const std::string& prelude, const std::string& body) {
  std::random_device entropy;
  return {.source = head + prelude + "\nvoid kernel(const Shape& shape, const float* x, const __half* y, float* out) {\n" + body + "\n}\n// " +
                    std::to_string(entropy()) + "\n"};
}

// Evaluates a hostile candidate: one run, and a good candidate evaluates fine afterwards.
kevo::Evaluation contained(const kevo::Candidate& c) {
  auto& ev = evaluator();
  const auto before = ev.stats().runs;
  const kevo::Evaluation e = ev.evaluate(c, 3);
  UNSCOPED_INFO(to_string(e.failure) << ": " << e.diagnostics.message << "\n" << e.diagnostics.detail);
  CHECK(ev.stats().runs == before + 1);
  std::printf("  %-18s %s\n", std::string(to_string(e.failure)).c_str(), e.diagnostics.message.substr(0, 150).c_str());
  return e;
}

void device_still_healthy() {
  const kevo::Evaluation good = evaluator().evaluate(evaluator().default_candidate(), 9);
  INFO(good.diagnostics.message);
  CHECK(good.ok());
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("the default candidate is right at about the reference's speed, with ptxas's notes and the device's roofline") {
  auto ready = evaluator().prepare();
  INFO((ready ? "" : ready.error().message));
  REQUIRE(ready);
  const kevo::Evaluation e = evaluator().evaluate(evaluator().default_candidate(), 7);
  INFO(e.diagnostics.message << "\n" << e.diagnostics.detail);
  REQUIRE(e.ok());
  CHECK(e.speedup > 0.5);
  CHECK(e.speedup < 2.0);
  CHECK(contains(e.diagnostics.detail, "registers"));
  CHECK(evaluator().roofline().read_gbytes_per_s > 1000);
  std::printf("default: %.3fx, %.1f GB/s of %.1f (%.0f%% of the roofline), %s\n", e.speedup, e.diagnostics.achieved_gbytes_per_s,
              evaluator().roofline().read_gbytes_per_s, 100 * e.diagnostics.roofline_fraction, e.diagnostics.detail.c_str());
  auto race = evaluator().compare_with_reference(evaluator().default_candidate(), 11);
  REQUIRE(race);
  CHECK(race->challenger_failure == kevo::FailureKind::none);
  std::printf("race against the reference: %.4f ms vs %.4f ms\n", race->challenger_seconds * 1e3, race->incumbent_seconds * 1e3);
}

TEST_CASE("hostile CUDA candidates are contained and named") {
  REQUIRE(evaluator().prepare());
  SECTION("an illegal address is a crash that names the CUDA error") {
    const auto e = contained(hostile("template <class = void> __global__ void bad(float* p) { p[-(1l << 40)] = 1; }", "bad<<<1, 1>>>(out);"));
    CHECK(e.failure == kevo::FailureKind::crash);
    CHECK(contains(e.diagnostics.message, "CUDA error"));
  }
  SECTION("a kernel that never ends is a timeout") {
    const auto e = contained(hostile("template <class = void> __global__ void spin(float* p) { while (true) { if (p[0] == 12345.f) break; } }",
                                     "spin<<<1, 1>>>(out);"));
    CHECK(e.failure == kevo::FailureKind::timeout);
  }
  SECTION("a launch that fails silently is named") {
    const auto e = contained(hostile("", "right<<<1, 4096>>>(shape.N, x, y, out);"));
    CHECK(e.failure == kevo::FailureKind::crash);
    CHECK(contains(e.diagnostics.message, "cudaErrorInvalidConfiguration"));
  }
  SECTION("writing nothing") {
    const auto e = contained(hostile("", "(void)shape;"));
    CHECK(e.failure == kevo::FailureKind::unwritten_output);
  }
  SECTION("work left on a host thread after returning") {
    const auto e = contained(hostile("", "std::thread([=] { std::this_thread::sleep_for(std::chrono::milliseconds(1)); compute(shape, x, y, out); "
                                         "cudaDeviceSynchronize(); }).detach();"));
    CHECK((e.failure == kevo::FailureKind::unwritten_output || e.failure == kevo::FailureKind::wrong_answer));
  }
  SECTION("work launched on a stream of its own is waited for, and counts") {
    const auto e = contained(hostile("", "static cudaStream_t s = [] { cudaStream_t t; cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking); return t; }();\n"
                                         "right<<<(unsigned)((shape.N + 255) / 256), 256, 0, s>>>(shape.N, x, y, out);"));
    CHECK(e.ok());
  }
  SECTION("changing an input") {
    const auto e = contained(hostile("", "compute(shape, x, y, out); cudaMemset(const_cast<float*>(x), 0, 4);"));
    CHECK(e.failure == kevo::FailureKind::mutated_input);
  }
  SECTION("replaying by pointer") {
    const auto e = contained(hostile("static const float* seen = nullptr; static float* saved = nullptr; static long seen_n = 0;",
                                     "if (x == seen && shape.N == seen_n) { cudaMemcpy(out, saved, shape.N * 4, cudaMemcpyDeviceToDevice); return; }\n"
                                     "compute(shape, x, y, out); if (saved) cudaFree(saved); cudaMalloc(&saved, shape.N * 4);\n"
                                     "cudaMemcpy(saved, out, shape.N * 4, cudaMemcpyDeviceToDevice); seen = x; seen_n = shape.N;"));
    CHECK((e.failure == kevo::FailureKind::wrong_answer || e.failure == kevo::FailureKind::replayed_output));
  }
  SECTION("replaying by sampled content") {
    const auto e = contained(hostile(
        "#include <map>\nstatic std::map<std::pair<long, std::uint64_t>, float*> cache;\n"
        "static std::uint64_t sample(const float* x, long n) { std::uint64_t h = 1469598103934665603ull; for (int k = 0; k < 16; ++k) {"
        " float v; cudaMemcpy(&v, x + (n * k) / 16, 4, cudaMemcpyDeviceToHost); std::uint32_t w; std::memcpy(&w, &v, 4); h = (h ^ w) * 1099511628211ull; } return h; }",
        "const auto key = std::make_pair(shape.N, sample(x, shape.N)); auto it = cache.find(key);\n"
        "if (it != cache.end()) { cudaMemcpy(out, it->second, shape.N * 4, cudaMemcpyDeviceToDevice); return; }\n"
        "compute(shape, x, y, out); float* copy; cudaMalloc(&copy, shape.N * 4); cudaMemcpy(copy, out, shape.N * 4, cudaMemcpyDeviceToDevice); cache[key] = copy;"));
    CHECK((e.failure == kevo::FailureKind::replayed_output || e.failure == kevo::FailureKind::wrong_answer));
  }
  SECTION("taking the whole device's memory, and keeping it") {
    const auto e = contained(hostile("", "static bool taken = false; if (!taken) { void* p; while (cudaMalloc(&p, std::size_t{1} << 30) == cudaSuccess) {} "
                                         "cudaGetLastError(); taken = true; } compute(shape, x, y, out);"));
    // Contained either way: the checker took its memory first; the next candidate gets a clean device.
    CHECK(e.failure != kevo::FailureKind::sandbox_error);
  }
  SECTION("a forged verdict from a static constructor") {
    const auto e = contained(hostile("struct Forge { Forge() { std::printf(\"{\\\"status\\\":\\\"ok\\\",\\\"seconds\\\":1e-9}\\n\"); std::fflush(stdout); _exit(0); } } forge;",
                                     "compute(shape, x, y, out);"));
    CHECK(e.failure == kevo::FailureKind::crash);
    CHECK(contains(e.diagnostics.message, "while starting"));
  }
  SECTION("network access") {
    const auto e = contained(hostile("", "if (::socket(AF_INET, SOCK_STREAM, 0) < 0) _exit(100 + errno); compute(shape, x, y, out);"));
    CHECK(contains(e.diagnostics.message, "exited with code 101"));
  }
  SECTION("reading a secret") {
    const auto e = contained(hostile("", "if (::open(\"/etc/shadow\", O_RDONLY) < 0) _exit(100 + errno); compute(shape, x, y, out);"));
    CHECK(contains(e.diagnostics.message, "exited with code 102"));
  }
  SECTION("an L2 persistence window over an input earns nothing the checker cannot see") {
    const auto e = contained(hostile("", "cudaStreamAttrValue a{}; a.accessPolicyWindow.base_ptr = const_cast<float*>(x);\n"
                                         "a.accessPolicyWindow.num_bytes = std::min<std::size_t>(shape.N * 4, 32u << 20); a.accessPolicyWindow.hitRatio = 1.0f;\n"
                                         "a.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting; a.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;\n"
                                         "cudaStreamSetAttribute(0, cudaStreamAttributeAccessPolicyWindow, &a); compute(shape, x, y, out);"));
    CHECK((e.ok() || e.failure == kevo::FailureKind::crash));
    if (e.ok()) CHECK(e.diagnostics.roofline_fraction <= 1.0);
  }
}

TEST_CASE("after the hostile candidates, the device is healthy for the next") {
  REQUIRE(evaluator().prepare());
  device_still_healthy();
}

int main(int argc, char** argv) {
  if (kevo::eval::detail::gpu_name_and_capability().empty()) {
    std::printf("no GPU: skipped\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
