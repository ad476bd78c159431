// CudaEvaluator on a GPU: the default candidate is right at ~1x, and hostile CUDA candidates are
// each contained, named and cost one evaluation, after which the device is healthy for the next.
// Without a GPU the program exits 77 (ctest: skipped).
#define CATCH_CONFIG_RUNNER
#include <kevo/problem_loader.hpp>
#include <kevo/eval/cuda_evaluator.hpp>

#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <random>
#include <string>

namespace {

const std::filesystem::path problems = std::filesystem::path(KEVO_TEST_DATA_DIR) / "problems";

kevo::eval::CudaEvaluator make_evaluator(bool profile) {
  auto problem = kevo::load_problem(problems / "cuda_axpy");
  if (!problem) throw std::runtime_error(problem.error().message);
  kevo::eval::EvaluatorOptions options;
  options.cache_dir = std::filesystem::temp_directory_path() / "kevo-device-cache";
  options.run_timeout = std::chrono::seconds(5);
  options.compile_timeout = std::chrono::seconds(120);
  options.screen = false;  // the hostile candidates test the jail and the checker, the wall behind the screen
  options.profile_new_bests = profile;
  return kevo::eval::CudaEvaluator(*problem, options);
}

kevo::eval::CudaEvaluator& evaluator() {
  static kevo::eval::CudaEvaluator e = make_evaluator(false);  // the profiler has its own test
  return e;
}

const std::string head = "#include \"kevo_problem.hpp\"\n#include <cstdio>\n#include <cstdlib>\n#include <cstring>\n#include <cerrno>\n#include <thread>\n#include <chrono>\n"
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

// A CUDA program that goes through each step the runner takes, printing each: the jail's GPU
// access is tested apart from the checker, so a failure names the step and the jail setting.
const char* const probe_source = R"PROBE(#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
template <class F> F entry(const char* name) {
  void* fn = nullptr; cudaDriverEntryPointQueryResult found{};
  cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found);
  return reinterpret_cast<F>(fn);
}
__global__ void add_one(float* p) { p[threadIdx.x] += 1.0f; }
#define STEP(what, call) do { auto r_ = (call); std::printf("%s: %d\n", what, (int)r_); std::fflush(stdout); if (r_ != 0) return 10; } while (0)
int main() {
  STEP("cudaSetDevice", cudaSetDevice(0));
  STEP("cudaFree(nullptr)", cudaFree(nullptr));
  float* p = nullptr;
  STEP("cudaMalloc", cudaMalloc(&p, 1024));
  STEP("cudaMemset", cudaMemset(p, 0, 1024));
  add_one<<<1, 256>>>(p);
  STEP("kernel", cudaDeviceSynchronize());
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t granularity = 0;
  STEP("cuMemGetAllocationGranularity", entry<decltype(&cuMemGetAllocationGranularity)>("cuMemGetAllocationGranularity")(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle handle;
  STEP("cuMemCreate", entry<decltype(&cuMemCreate)>("cuMemCreate")(&handle, granularity, &prop, 0));
  int fd = -1;
  STEP("cuMemExportToShareableHandle", entry<decltype(&cuMemExportToShareableHandle)>("cuMemExportToShareableHandle")(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CUmemGenericAllocationHandle imported;
  STEP("cuMemImportFromShareableHandle", entry<decltype(&cuMemImportFromShareableHandle)>("cuMemImportFromShareableHandle")(&imported, (void*)(long)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  std::printf("all steps passed\n");
  return 0;
}
)PROBE";

// Compiles the probe with the host's nvcc, outside any jail (the jail is what is under test).
std::filesystem::path build_probe() {
  const auto dir = std::filesystem::temp_directory_path() / "kevo-jail-probe";
  std::filesystem::create_directories(dir);
  {
    std::FILE* f = std::fopen((dir / "probe.cu").c_str(), "w");
    std::fputs(probe_source, f);
    std::fclose(f);
  }
  const std::string command = "nvcc -std=c++17 -o " + (dir / "probe").string() + " " + (dir / "probe.cu").string() + " 2>&1";
  if (std::system(command.c_str()) != 0) return {};
  return dir / "probe";
}

// `exempt`: kevo's filter with these calls let through, to find a call the driver needs.
kevo::eval::SandboxResult run_probe(const std::filesystem::path& probe, bool seccomp, bool drop_privileges,
                                    const std::vector<std::string>& exempt = {}) {
  auto jail = kevo::eval::make_jail({.program = probe, .seccomp = seccomp && exempt.empty(), .gpu = true});
  REQUIRE(jail);
  if (!exempt.empty()) {
    auto filter = kevo::eval::detail::compile_seccomp_filter(true, exempt);
    REQUIRE(filter);
    jail->prefix.insert(jail->prefix.begin() + 1, {"--seccomp", std::to_string(filter->get())});
    jail->seccomp_filter = std::move(*filter);
  }
  kevo::eval::SandboxLimits limits;
  limits.wall_time = std::chrono::seconds(60);
  limits.isolate = false;
  limits.drop_privileges = drop_privileges;
  limits.max_processes = 64;
  limits.max_open_files = 512;
  limits.handed_over_fds = jail->release_handed_over_fds();
  const auto result = kevo::eval::run_sandboxed(jail->command({}), limits);
  std::printf("probe (seccomp %s, privileges %s): exit %d signal %d\n%s%s%s\n", seccomp ? "on" : "off", drop_privileges ? "dropped" : "kept",
              result.exit_code, result.signal, result.stdout_text.c_str(), result.stderr_text.c_str(), result.setup_error.c_str());
  return result;
}

}  // namespace

TEST_CASE("a CUDA program runs in the GPU jail, through every step the runner takes") {
  const auto probe = build_probe();
  REQUIRE(!probe.empty());
  const auto bare = run_probe(probe, false, false);
  const auto dropped = run_probe(probe, false, true);
  const auto filtered = run_probe(probe, true, true);
  if (!filtered.ok()) {
    for (const std::string& call : kevo::eval::detail::seccomp_refused_calls(true))
      if (run_probe(probe, true, true, {call}).ok()) std::printf("the probe passes when %s is let through\n", call.c_str());
    run_probe(probe, true, true, {"socket", "socketpair", "connect", "bind", "listen", "accept", "accept4"});
  }
  CHECK(bare.ok());
  CHECK(dropped.ok());
  CHECK(filtered.ok());
}

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
  CHECK(contains(e.diagnostics.detail, "round trip"));  // measured by the reference's run, taken off each batch
  CHECK(evaluator().roofline().read_gbytes_per_s > 1000);
  std::printf("default: %.3fx, %.1f GB/s of %.1f (%.0f%% of the roofline), %s\n", e.speedup, e.diagnostics.achieved_gbytes_per_s,
              evaluator().roofline().read_gbytes_per_s, 100 * e.diagnostics.roofline_fraction, e.diagnostics.detail.c_str());
  auto race = evaluator().compare_with_reference(evaluator().default_candidate(), 11);
  REQUIRE(race);
  CHECK(race->challenger_failure == kevo::FailureKind::none);
  std::printf("race against the reference: %.4f ms vs %.4f ms\n", race->challenger_seconds * 1e3, race->incumbent_seconds * 1e3);
}

TEST_CASE("a new best is profiled by Nsight Compute in its jail, and ncu's class replaces the roofline's") {
  const auto ncu = kevo::eval::find_ncu();
  if (!ncu) {
    WARN("no ncu on this machine: the profile is not tested");
    return;
  }
  kevo::eval::CudaEvaluator profiling = make_evaluator(true);
  REQUIRE(profiling.prepare());
  const kevo::Evaluation first = profiling.evaluate(profiling.default_candidate(), 5);
  INFO(first.diagnostics.message << "\n" << first.diagnostics.detail);
  REQUIRE(first.ok());
  CHECK(contains(first.diagnostics.detail, "profiled by ncu"));
  CHECK(contains(first.diagnostics.message, "DRAM"));  // ncu's line, not the roofline's
  std::printf("profiled: %s\n", first.diagnostics.message.c_str());
  // No faster than the last profiled: not profiled again.
  const kevo::Evaluation again = profiling.evaluate(profiling.default_candidate(), 6);
  REQUIRE(again.ok());
  if (again.speedup <= 1.05 * first.speedup) CHECK_FALSE(contains(again.diagnostics.detail, "profiled"));
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
    CHECK(contains(e.diagnostics.message, "CUDA error cudaErrorInvalid"));  // InvalidConfiguration, or InvalidValue on CUDA 13
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
  SECTION("replaying by pointer, every address remembered") {
    const auto e = contained(hostile("#include <map>\nstatic std::map<std::pair<const float*, long>, float*> saved;",
                                     "auto it = saved.find({x, shape.N});\n"
                                     "if (it != saved.end()) { cudaMemcpy(out, it->second, shape.N * 4, cudaMemcpyDeviceToDevice); return; }\n"
                                     "compute(shape, x, y, out); float* copy; cudaMalloc(&copy, shape.N * 4);\n"
                                     "cudaMemcpy(copy, out, shape.N * 4, cudaMemcpyDeviceToDevice); saved[{x, shape.N}] = copy;"));
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
    CHECK(contains(e.diagnostics.message, "before it received its memory"));
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
