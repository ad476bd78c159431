// CudaEvaluator where no GPU is needed: the generated CUDA checker and runner and the problem's
// reference compile with nvcc inside the jail, a candidate compiles with ptxas's notes in its
// diagnostics, compile errors and screen refusals are named, and without a GPU prepare() says so
// instead of failing later. The device half is tests/device/eval_cuda_device.cpp.
#include <kevo/problem_loader.hpp>
#include <kevo/eval/cuda_evaluator.hpp>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

namespace kevo_tests::eval_cuda_test {

namespace {

const std::filesystem::path problems = std::filesystem::path(KEVO_TEST_DATA_DIR) / "problems";

bool have_nvcc() { return kevo::eval::find_program(kevo::eval::CudaToolchain::default_compiler()).has_value(); }

kevo::eval::CudaEvaluator make_evaluator() {
  auto problem = kevo::load_problem(problems / "cuda_axpy");
  if (!problem) FAIL(problem.error().message);
  kevo::eval::EvaluatorOptions options;
  options.cache_dir = std::filesystem::temp_directory_path() / "kevo-test-cache";
  options.compile_timeout = std::chrono::seconds(120);
  return kevo::eval::CudaEvaluator(*problem, options);
}

const std::filesystem::path shipped_problems = std::filesystem::path(KEVO_SOURCE_DIR) / "problems";

// The test cache, with time for the slow compiles of the shipped problems' kernels.
kevo::eval::EvaluatorOptions shipped_options() {
  kevo::eval::EvaluatorOptions options;
  options.cache_dir = std::filesystem::temp_directory_path() / "kevo-test-cache";
  options.compile_timeout = std::chrono::seconds(180);
  return options;
}

// A problem's first starting point, rendered as the template synthesizer renders it.
kevo::Candidate first_starting_point(const kevo::Problem& problem) {
  REQUIRE_FALSE(problem.starting_points.empty());
  kevo::Knobs knobs = problem.default_knobs();
  for (const auto& [knob, value] : problem.starting_points.front().knobs) knobs[knob] = value;
  return kevo::Candidate{.source = problem.render(knobs), .knobs = knobs, .origin = "starting point"};
}

std::string nonce() {
  std::random_device entropy;
  return "\n// nonce " + std::to_string(entropy()) + std::to_string(entropy()) + "\n";
}

}  // namespace

TEST_CASE("a CUDA problem's checker, runner and candidates compile with nvcc in the jail, with ptxas's notes") {
  if (!have_nvcc()) {
    WARN("no nvcc here: the CUDA compile path is not tested");
    return;
  }
  auto evaluator = make_evaluator();
  const kevo::Candidate candidate{.source = evaluator.default_candidate().source + nonce()};
  const kevo::Evaluation e = evaluator.compile(candidate);
  INFO(to_string(e.failure) << ": " << e.diagnostics.message << "\n" << e.diagnostics.detail);
  REQUIRE(e.failure == kevo::FailureKind::none);
  CHECK_THAT(e.diagnostics.detail, Catch::Contains("registers"));
  CHECK(std::filesystem::exists(evaluator.build_directory() / "checker"));
  CHECK(std::filesystem::exists(evaluator.build_directory() / "runner.o"));
  CHECK(evaluator.stats().compiles == 1);
  // The same source again is the cache's.
  CHECK(evaluator.compile(candidate).failure == kevo::FailureKind::none);
  CHECK(evaluator.stats().cache_hits >= 1);
}

TEST_CASE("a CUDA candidate that does not compile, or that the screen refuses, is named") {
  if (!have_nvcc()) {
    WARN("no nvcc here: the CUDA compile path is not tested");
    return;
  }
  auto evaluator = make_evaluator();
  const kevo::Evaluation broken = evaluator.compile({.source = "#include \"kevo_problem.hpp\"\nvoid kernel(const Shape& shape, const float* x, "
                                                               "const __half* y, float* out) { undeclared_launch<<<1, 1>>>(); }\n" + nonce()});
  CHECK(broken.failure == kevo::FailureKind::compile_error);
  CHECK_THAT(broken.diagnostics.message, Catch::Contains("undeclared_launch"));
  const kevo::Evaluation reader = evaluator.compile(
      {.source = "#include \"kevo_problem.hpp\"\n#include <cstdio>\nvoid kernel(const Shape& shape, const float* x, const __half* y, float* out) {\n"
                 "  std::FILE* f = std::fopen(\"/etc/passwd\", \"r\"); (void)f; }\n" + nonce()});
  CHECK(reader.failure == kevo::FailureKind::screened_out);
  CHECK_THAT(reader.diagnostics.message, Catch::Contains("refused before compiling"));
}

TEST_CASE("without a GPU, preparing a CUDA problem is a clear error, not a crash") {
  if (!have_nvcc() || !kevo::eval::detail::gpu_name_and_capability().empty()) {
    WARN("a GPU is here (or no nvcc): tests/device covers this machine");
    return;
  }
  auto evaluator = make_evaluator();
  auto ready = evaluator.prepare();
  REQUIRE_FALSE(ready);
  INFO(ready.error().message);
  CHECK_THAT(ready.error().message, Catch::Contains("cuda_axpy"));
  // Said before any compile, in the words every kevo program stops with (kevo/gpu_presence.hpp).
  CHECK_THAT(ready.error().message, Catch::Contains(kevo::no_nvidia_device_message));
  CHECK(evaluator.stats().compiles == 0);
  // An evaluation says the problem is not ready, and costs nothing.
  const kevo::Evaluation e = evaluator.evaluate(evaluator.default_candidate(), 1);
  CHECK(e.failure == kevo::FailureKind::sandbox_error);
  CHECK_THAT(e.diagnostics.message, Catch::Contains("not ready"));
}

TEST_CASE("the shipped CUDA problems load, and their default kernels pass the screen and compile") {
  for (const char* name : {"cuda_softmax", "cuda_layernorm", "cuda_gemm", "cuda_topk", "cuda_scoring"}) {
    auto problem = kevo::load_problem(shipped_problems / name);
    INFO(name << ": " << (problem ? "" : problem.error().message));
    REQUIRE(problem);
    CHECK(problem->target == kevo::Target::cuda);
  }
  if (!have_nvcc()) {
    WARN("no nvcc here: the shipped CUDA kernels are not compiled");
    return;
  }
  // The quick ones (top-K's CUB takes ~25 s a candidate; the device run compiles it).
  for (const char* name : {"cuda_softmax", "cuda_layernorm", "cuda_scoring"}) {
    kevo::eval::CudaEvaluator evaluator(*kevo::load_problem(shipped_problems / name), shipped_options());
    const kevo::Evaluation e = evaluator.compile(evaluator.default_candidate());
    INFO(name << ": " << to_string(e.failure) << ": " << e.diagnostics.message << "\n" << e.diagnostics.detail);
    CHECK(e.failure == kevo::FailureKind::none);
  }
  // GEMM's first starting point: ldmatrix and mma.sync as inline PTX, which its manifest's allow_asm
  // lets past the screen; without allow_asm the same source is refused before compiling.
  auto gemm = kevo::load_problem(shipped_problems / "cuda_gemm");
  REQUIRE(gemm);
  REQUIRE(gemm->allow_asm);
  const kevo::Candidate mma = first_starting_point(*gemm);
  REQUIRE(mma.knobs.at("engine") == "mma");
  const kevo::eval::EvaluatorOptions options = shipped_options();
  kevo::eval::CudaEvaluator allowing(*gemm, options);
  const kevo::Evaluation built = allowing.compile(mma);
  INFO("cuda_gemm mma: " << to_string(built.failure) << ": " << built.diagnostics.message << "\n" << built.diagnostics.detail);
  CHECK(built.failure == kevo::FailureKind::none);
  CHECK_THAT(built.diagnostics.detail, Catch::Contains("registers"));
  gemm->allow_asm = false;
  kevo::eval::CudaEvaluator refusing(*gemm, options);
  CHECK(refusing.compile(mma).failure == kevo::FailureKind::screened_out);
}

TEST_CASE("the scoring problem's agent starting point includes kevo's own scoring agent, copied into its build directory, read by the screen and compiled") {
  if (!have_nvcc()) {
    WARN("no nvcc here: the scoring agent's starting point is not compiled");
    return;
  }
  auto scoring = kevo::load_problem(shipped_problems / "cuda_scoring");
  REQUIRE(scoring);
  REQUIRE(scoring->library_headers == std::vector<std::string>{"kevo/retrieval/agent/scoring.cuh"});
  REQUIRE_FALSE(scoring->allow_asm);  // the agent's inline PTX is its own; a candidate's asm stays refused
  const kevo::Candidate agent = first_starting_point(*scoring);
  REQUIRE(agent.knobs.at("math") == "pipeline_agent");
  const kevo::eval::EvaluatorOptions options = shipped_options();
  kevo::eval::CudaEvaluator evaluator(*scoring, options);
  const kevo::Evaluation built = evaluator.compile(agent);
  INFO("cuda_scoring agent: " << to_string(built.failure) << ": " << built.diagnostics.message << "\n" << built.diagnostics.detail);
  CHECK(built.failure == kevo::FailureKind::none);
  CHECK_THAT(built.diagnostics.detail, Catch::Contains("registers"));
  // The copy the jail compiled against is kevo's header, byte for byte.
  std::ifstream copy(evaluator.build_directory() / "kevo/retrieval/agent/scoring.cuh"), real(std::filesystem::path(KEVO_SOURCE_DIR) / "include/kevo/retrieval/agent/scoring.cuh");
  REQUIRE(copy);
  CHECK(std::string(std::istreambuf_iterator<char>(copy), {}) == std::string(std::istreambuf_iterator<char>(real), {}));
  // Without the manifest's library_headers the same candidate is refused by its #include line, before compiling.
  scoring->library_headers.clear();
  kevo::eval::CudaEvaluator refusing(*scoring, options);
  const kevo::Evaluation refused = refusing.compile(agent);
  CHECK(refused.failure == kevo::FailureKind::screened_out);
  CHECK_THAT(refused.diagnostics.message + refused.diagnostics.detail, Catch::Contains("kevo/retrieval/agent/scoring.cuh"));
}

}  // namespace kevo_tests::eval_cuda_test
