// CpuEvaluator on the shipped problems: defaults are correct, the reference-equivalent runs at
// speedup ~1, builds are cached, compare() re-times fairly, the roofline is cached and the
// bottleneck classification is sensible.
#include <kevo/problem_loader.hpp>
#include <kevo/eval/cpu_evaluator.hpp>

#include <catch2/catch.hpp>

#include "support/require_prepared.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <string>


namespace kevo_tests::eval_cpu_test {

namespace {

const std::filesystem::path shipped = std::filesystem::path(KEVO_SOURCE_DIR) / "problems";
const std::filesystem::path fixtures = std::filesystem::path(KEVO_TEST_DATA_DIR) / "problems";

kevo::eval::CpuEvaluatorOptions test_options() {
  kevo::eval::CpuEvaluatorOptions o;
  o.cache_dir = std::filesystem::temp_directory_path() / "kevo-test-cache";
  o.run_timeout = std::chrono::seconds(20);
  return o;
}

kevo::eval::CpuEvaluator make_evaluator(const std::string& name) {
  auto problem = kevo::load_problem(shipped / name);
  if (!problem) FAIL(problem.error().message);
  return kevo::eval::CpuEvaluator(*problem, test_options());
}

kevo::Candidate with_knobs(const kevo::Problem& problem, const kevo::Knobs& changes) {
  kevo::Knobs knobs = problem.default_knobs();
  for (const auto& [name, value] : changes) knobs[name] = value;
  return kevo::Candidate{.source = problem.render(knobs), .knobs = knobs};
}

// A source no earlier run has built, so the first evaluation must compile it.
std::string unique_comment() {
  std::random_device entropy;
  return fmt::format("\n// nonce {:016x}{:08x}\n", std::uint64_t(entropy()) << 32 | entropy(), entropy());
}

}  // namespace

TEST_CASE("each shipped problem prepares, and its default candidate is correct at speedup ~1") {
  const auto name = GENERATE(as<std::string>{}, "cpu_scoring", "softmax", "gemm");
  INFO(name);
  auto evaluator = make_evaluator(name);
  auto ready = evaluator.prepare();
  INFO((ready ? "" : ready.error().message));
  REQUIRE(ready);
  CHECK(evaluator.reference_seconds() > 0);
  const kevo::Evaluation e = evaluator.evaluate(evaluator.default_candidate(), 7);
  INFO(to_string(e.failure) << ": " << e.diagnostics.message << "\n" << e.diagnostics.detail);
  REQUIRE(e.ok());
  CHECK(e.reference_seconds == evaluator.reference_seconds());
  // The defaults are the plain loop: about as fast as the reference (wide bounds: CI machines are
  // shared and noisy; compare() is what makes a timing trustworthy).
  CHECK(e.speedup > 0.33);
  CHECK(e.speedup < 3.0);
  CHECK(e.diagnostics.bottleneck != kevo::Bottleneck::unknown);
  CHECK_FALSE(e.diagnostics.message.empty());
}

TEST_CASE("the reference run as a candidate has speedup ~1") {
  auto evaluator = make_evaluator("cpu_scoring");
  const kevo::Evaluation e = evaluator.evaluate(evaluator.reference_candidate(), 3);
  INFO(e.diagnostics.message);
  REQUIRE(e.ok());
  CHECK(e.speedup > 0.33);
  CHECK(e.speedup < 3.0);
  auto race = evaluator.compare_with_reference(evaluator.reference_candidate(), 3);
  REQUIRE(race);
  CHECK(race->incumbent_seconds / race->challenger_seconds == Approx(1.0).epsilon(0.5));
}

TEST_CASE("the build cache hits on the second evaluation of the same source") {
  auto evaluator = make_evaluator("softmax");
  REQUIRE_PREPARED(evaluator);
  kevo::Candidate candidate = evaluator.default_candidate();
  candidate.source += unique_comment();
  const auto before = evaluator.stats();
  const kevo::Evaluation first = evaluator.evaluate(candidate, 1);
  REQUIRE(first.ok());
  const auto after_first = evaluator.stats();
  CHECK(after_first.compiles == before.compiles + 1);
  const kevo::Evaluation second = evaluator.evaluate(candidate, 2);  // new seed: new inputs, same build
  REQUIRE(second.ok());
  const auto after_second = evaluator.stats();
  CHECK(after_second.compiles == after_first.compiles);
  CHECK(after_second.cache_hits == after_first.cache_hits + 1);
  CHECK(after_second.runs == after_first.runs + 1);
}

TEST_CASE("a tuned cpu_scoring candidate is correct and well ahead of the reference") {
  auto evaluator = make_evaluator("cpu_scoring");
  const auto tuned = with_knobs(evaluator.problem(), {{"vector_width", "16"}, {"loop_order", "experts_inner"}, {"reduction", "halving"}});
  const kevo::Evaluation e = evaluator.evaluate(tuned, 5);
  INFO(e.diagnostics.message << "\n" << e.diagnostics.detail);
  REQUIRE(e.ok());
  // About 9x alone on the 2-core machine it was tuned on; CI runs two tests at once on two cores,
  // which halves what a threaded candidate gets (2.0x seen). The figure itself is a benchmark's.
  CHECK(e.speedup > 1.5);
}

TEST_CASE("compare() re-times both sides and sees which is faster") {
  auto evaluator = make_evaluator("gemm");
  const auto blocked = with_knobs(evaluator.problem(), {{"loop_order", "ikj"}, {"vector_width", "16"}, {"block_n", "64"}, {"rows_per_step", "4"}});
  auto race = evaluator.compare(blocked, evaluator.default_candidate(), 9);
  INFO((race ? "" : race.error().message));
  REQUIRE(race);
  CHECK(race->challenger_seconds > 0);
  CHECK(race->challenger_seconds < race->incumbent_seconds);

  auto verified = evaluator.compare_with_reference(blocked, 9);
  REQUIRE(verified);
  CHECK(verified->incumbent_seconds / verified->challenger_seconds > 1.5);  // 2.1x seen with another test beside it

  // A candidate that fails cannot win a race.
  kevo::Candidate broken = blocked;
  broken.source += "\nint this does not compile;\n";
  auto refused = evaluator.compare(broken, evaluator.default_candidate(), 9);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().message.find("challenger") != std::string::npos);
}

TEST_CASE("evaluate() is safe from several threads at once") {
  auto evaluator = make_evaluator("softmax");
  REQUIRE_PREPARED(evaluator);
  const auto& problem = evaluator.problem();
  std::vector<std::future<kevo::Evaluation>> runs;
  for (const char* width : {"4", "8", "16"})
    runs.push_back(std::async(std::launch::async, [&, width] {
      auto c = with_knobs(problem, {{"vector_width", width}, {"exp_impl", "polynomial"}});
      c.source += unique_comment();
      return evaluator.evaluate(c, 21);
    }));
  for (auto& run : runs) {
    const kevo::Evaluation e = run.get();
    INFO(e.diagnostics.message << "\n" << e.diagnostics.detail);
    CHECK(e.ok());
    CHECK(e.speedup > 1);
  }
}

TEST_CASE("the roofline is measured once and then read from the cache") {
  auto evaluator = make_evaluator("gemm");
  REQUIRE_PREPARED(evaluator);
  const auto path = kevo::eval::roofline_cache_path(test_options().cache_dir);
  CHECK(std::filesystem::exists(path));
  auto again = kevo::eval::load_or_measure_roofline(test_options().cache_dir, "g++");
  REQUIRE(again);
  CHECK(again->from_cache);
  CHECK(again->read_gbytes_per_s == Approx(evaluator.roofline().read_gbytes_per_s));
  CHECK(again->peak_gflops > 1);
  CHECK(again->read_gbytes_per_s > 0.5);
  CHECK(again->ridge_intensity() > 0);
  CHECK_FALSE(again->cpu_model.empty());
}

TEST_CASE("classify() names memory-, compute- and latency-bound kernels") {
  kevo::eval::Roofline machine;
  machine.read_gbytes_per_s = 50;  // 50 GB/s
  machine.peak_gflops = 500;       // ridge at 10 FLOP/byte

  // 1 GB at 45 GB/s, almost no arithmetic: memory-bound at 90%.
  auto memory = kevo::eval::classify(1e9, 1e8, 1e9 / 45e9, machine);
  CHECK(memory.bottleneck == kevo::Bottleneck::memory);
  CHECK(memory.roofline_fraction == Approx(0.9));
  CHECK(memory.achieved_gbytes_per_s == Approx(45));

  // 100 GFLOP at 400 GFLOP/s over little data: compute-bound at 80%.
  auto compute = kevo::eval::classify(1e8, 1e11, 1e11 / 400e9, machine);
  CHECK(compute.bottleneck == kevo::Bottleneck::compute);
  CHECK(compute.roofline_fraction == Approx(0.8));
  CHECK(compute.achieved_gflops == Approx(400));

  // The same work 50x slower than the roof: latency-bound.
  auto latency = kevo::eval::classify(1e8, 1e11, 50 * 1e11 / 500e9, machine);
  CHECK(latency.bottleneck == kevo::Bottleneck::latency);
  CHECK(latency.roofline_fraction == Approx(0.02));
  CHECK(latency.message.find("latency-bound") != std::string::npos);

  // Without a timing there is nothing to say.
  CHECK(kevo::eval::classify(1, 1, 0, machine).bottleneck == kevo::Bottleneck::unknown);
}

TEST_CASE("the shipped problems classify sensibly: the scalar references are latency-bound") {
  auto evaluator = make_evaluator("cpu_scoring");
  const kevo::Evaluation plain = evaluator.evaluate(evaluator.default_candidate(), 4);
  REQUIRE(plain.ok());
  CHECK(plain.diagnostics.bottleneck == kevo::Bottleneck::latency);
  CHECK(plain.diagnostics.roofline_fraction < 0.1);
  CHECK(plain.diagnostics.achieved_gflops > 0);
}

TEST_CASE("a problem's allow_asm lets asm statements past the screen, without it they are refused") {
  auto problem = kevo::load_problem(shipped / "softmax");
  REQUIRE(problem);
  REQUIRE_FALSE(problem->allow_asm);
  // A compiler barrier in the kernel: harmless, but an asm statement all the same.
  const kevo::Candidate with_asm{.source = "#include \"kevo_problem.hpp\"\n"
                                           "void kernel(const Shape& shape, const float* x, float* y) {\n"
                                           "  asm volatile(\"\" ::: \"memory\");\n  reference(shape, x, y);\n}\n" +
                                           unique_comment()};
  {
    kevo::eval::CpuEvaluator refusing(*problem, test_options());
    REQUIRE(refusing.prepare());
    const kevo::Evaluation e = refusing.evaluate(with_asm, 1);
    CHECK(e.failure == kevo::FailureKind::screened_out);
    CHECK_THAT(e.diagnostics.message, Catch::Contains("asm statement"));
  }
  problem->allow_asm = true;
  kevo::eval::CpuEvaluator allowing(*problem, test_options());
  REQUIRE(allowing.prepare());
  const kevo::Evaluation e = allowing.evaluate(with_asm, 2);
  INFO(e.diagnostics.message);
  CHECK(e.ok());
}

TEST_CASE("a problem's library_headers let its candidates include kevo's own headers, and without them the include is refused") {
  auto problem = kevo::load_problem(fixtures / "library_header");
  REQUIRE(problem);
  REQUIRE(problem->library_headers == std::vector<std::string>{"kevo/retrieval/half.hpp"});
  kevo::Candidate candidate{.source = problem->render(problem->default_knobs()) + unique_comment()};
  {
    // kevo's include root found on its own: the headers this test was built against.
    kevo::eval::CpuEvaluator allowing(*problem, test_options());
    REQUIRE_PREPARED(allowing);
    const kevo::Evaluation e = allowing.evaluate(candidate, 1);
    INFO(to_string(e.failure) << ": " << e.diagnostics.message << "\n" << e.diagnostics.detail);
    CHECK(e.ok());
    const auto copy = allowing.build_directory() / "kevo" / "retrieval" / "half.hpp";
    REQUIRE(std::filesystem::exists(copy));
    CHECK(kevo::detail::read_text_file(copy).value() ==
          kevo::detail::read_text_file(std::filesystem::path(KEVO_SOURCE_DIR) / "include" / "kevo" / "retrieval" / "half.hpp").value());
  }
  problem->library_headers.clear();
  kevo::eval::CpuEvaluator refusing(*problem, test_options());
  REQUIRE_PREPARED(refusing);
  const auto before = refusing.stats();
  const kevo::Evaluation e = refusing.evaluate(candidate, 2);
  INFO(e.diagnostics.message);
  CHECK(e.failure == kevo::FailureKind::screened_out);
  CHECK_THAT(e.diagnostics.message, Catch::Contains("kevo/retrieval/half.hpp") && Catch::Contains("allow-list"));
  CHECK(refusing.stats().compiles == before.compiles);
}

TEST_CASE("the library headers' text is part of the build directory's key, and a missing one names the root and how to set it") {
  auto problem = kevo::load_problem(fixtures / "library_header");
  REQUIRE(problem);
  const auto root = std::filesystem::temp_directory_path() / ("kevo-test-library-root-" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root / "kevo" / "retrieval");
  const kevo::Candidate candidate{.source = problem->render(problem->default_knobs())};

  kevo::eval::CpuEvaluatorOptions missing_options = test_options();
  missing_options.library_include_dir = root;
  kevo::eval::CpuEvaluator missing(*problem, missing_options);
  const kevo::Evaluation refused = missing.compile(candidate);
  INFO(refused.diagnostics.message);
  CHECK(refused.failure == kevo::FailureKind::sandbox_error);
  CHECK_THAT(refused.diagnostics.message, Catch::Contains("library_header/problem.json") && Catch::Contains("kevo/retrieval/half.hpp") &&
                                              Catch::Contains(root.string()) && Catch::Contains("KEVO_INCLUDE_DIR"));

  const std::string real =
      kevo::detail::read_text_file(std::filesystem::path(KEVO_SOURCE_DIR) / "include" / "kevo" / "retrieval" / "half.hpp").value();
  std::ofstream(root / "kevo" / "retrieval" / "half.hpp") << real << "\n// an edited copy\n";
  kevo::eval::CpuEvaluatorOptions edited_options = test_options();
  edited_options.library_include_dir = root;
  kevo::eval::CpuEvaluatorOptions real_options = test_options();
  real_options.library_include_dir = std::filesystem::path(KEVO_SOURCE_DIR) / "include";
  kevo::eval::CpuEvaluator edited(*problem, edited_options), original(*problem, real_options);
  const kevo::Evaluation a = edited.compile(candidate), b = original.compile(candidate);
  INFO(a.diagnostics.message << " | " << b.diagnostics.message);
  CHECK(a.ok());
  CHECK(b.ok());
  CHECK(edited.build_directory() != original.build_directory());
  CHECK(kevo::detail::read_text_file(edited.build_directory() / "kevo" / "retrieval" / "half.hpp").value() == real + "\n// an edited copy\n");
  std::filesystem::remove_all(root);
}

TEST_CASE("a candidate the screen refuses costs one evaluation, is named, and is never compiled") {
  auto evaluator = make_evaluator("softmax");
  REQUIRE(evaluator.prepare());
  // The forged verdict seen in the wild: a static constructor that prints a success line and exits.
  const kevo::Candidate forged{.source = "#include \"kevo_problem.hpp\"\nextern \"C\" int printf(const char*, ...);\nextern \"C\" void _exit(int);\n"
                                         "struct Forge { Forge() { std::printf(\"{\\\"status\\\":\\\"ok\\\"}\\n\"); _exit(0); } } forge;\n"
                                         "void kernel(const Shape& shape, const float* x, float* y) { reference(shape, x, y); }\n" +
                                         unique_comment()};
  const auto before = evaluator.stats();
  const kevo::Evaluation e = evaluator.evaluate(forged, 1);
  INFO(e.diagnostics.message);
  CHECK(e.failure == kevo::FailureKind::screened_out);
  CHECK_THAT(e.diagnostics.message, Catch::Contains("refused before compiling"));
  CHECK_THAT(e.diagnostics.message, Catch::Contains("line 4"));
  CHECK(evaluator.stats().compiles == before.compiles);
  CHECK(evaluator.stats().runs == before.runs);
  // Refusals are cached like compile errors.
  CHECK(evaluator.evaluate(forged, 2).failure == kevo::FailureKind::screened_out);
}

}  // namespace kevo_tests::eval_cpu_test
