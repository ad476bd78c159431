// Problem directories: the shipped problems load; malformed ones fail with errors that name the
// file and the field at fault.
#include <kevo/eval/cpu_evaluator.hpp>
#include <kevo/problem_loader.hpp>

#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace kevo_tests::problem_test {

namespace {

const std::filesystem::path shipped = std::filesystem::path(KEVO_SOURCE_DIR) / "problems";
const std::filesystem::path fixtures = std::filesystem::path(KEVO_TEST_DATA_DIR) / "problems";

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("every shipped problem loads and renders its defaults") {
  const auto name = GENERATE(as<std::string>{}, "cpu_scoring", "softmax", "gemm");
  auto problem = kevo::load_problem(shipped / name);
  INFO(name);
  REQUIRE(problem);
  CHECK(problem->name == name);
  CHECK(problem->target == kevo::Target::cpu);
  CHECK(problem->check_shapes.size() >= 3);
  CHECK_FALSE(problem->bytes_model.empty());
  CHECK_FALSE(problem->flops_model.empty());
  CHECK(problem->knobs.size() >= 4);
  for (const auto& knob : problem->knobs) {
    INFO(knob.name);
    CHECK(knob.domain.size() >= 2);
    CHECK(knob.index_of(knob.default_value));
  }
  const std::string source = problem->render(problem->default_knobs());
  CHECK_FALSE(contains(source, "${"));
  CHECK(contains(source, "#include \"kevo_problem.hpp\""));
  CHECK(contains(problem->reference_source, "void reference("));
}

TEST_CASE("cpu_scoring exposes the knobs the issue names, each on a sensible side") {
  auto problem = kevo::load_problem(shipped / "cpu_scoring");
  REQUIRE(problem);
  for (auto [name, side] : {std::pair{"vector_width", kevo::KnobSide::compute},
                            {"accumulators", kevo::KnobSide::compute},
                            {"ads_per_block", kevo::KnobSide::memory},
                            {"loop_order", kevo::KnobSide::memory},
                            {"prefetch_distance", kevo::KnobSide::memory},
                            {"threads", kevo::KnobSide::parallel}}) {
    INFO(name);
    const kevo::KnobSpec* knob = problem->knob(name);
    REQUIRE(knob);
    CHECK(knob->side == side);
  }
}

TEST_CASE("a manifest without a required key names the file and the key") {
  auto problem = kevo::load_problem(fixtures / "missing_key");
  REQUIRE_FALSE(problem);
  const std::string& message = problem.error().message;
  INFO(message);
  CHECK(contains(message, "missing_key/problem.json"));
  CHECK(contains(message, "missing key 'tolerance'"));
}

TEST_CASE("a knob with an empty domain names the file and the knob") {
  auto problem = kevo::load_problem(fixtures / "empty_domain");
  REQUIRE_FALSE(problem);
  const std::string& message = problem.error().message;
  INFO(message);
  CHECK(contains(message, "empty_domain/problem.json"));
  CHECK(contains(message, "knobs.unroll.domain"));
  CHECK(contains(message, "empty"));
}

TEST_CASE("allow_asm that is not true or false names the file and the key") {
  auto problem = kevo::load_problem(fixtures / "bad_allow_asm");
  REQUIRE_FALSE(problem);
  const std::string& message = problem.error().message;
  INFO(message);
  CHECK(contains(message, "bad_allow_asm/problem.json"));
  CHECK(contains(message, "allow_asm"));
  CHECK(contains(message, "true or false"));
}

TEST_CASE("library_headers that could leave kevo/ names the file and the key") {
  auto problem = kevo::load_problem(fixtures / "bad_library_headers");
  REQUIRE_FALSE(problem);
  const std::string& message = problem.error().message;
  INFO(message);
  CHECK(contains(message, "bad_library_headers/problem.json"));
  CHECK(contains(message, "'library_headers[0]'"));
  CHECK(contains(message, "'..'"));
}

TEST_CASE("library_headers is read, and each malformed value is refused naming the file and the key") {
  // The header's name is a path inside the build directory the headers are copied to: it stays inside kevo/.
  const auto dir = std::filesystem::temp_directory_path() / ("kevo-test-library-headers-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::copy(fixtures / "axpy", dir, std::filesystem::copy_options::recursive);
  const std::string manifest = kevo::detail::read_text_file(dir / "problem.json").value();
  const std::string anchor = "\"knobs\":";
  REQUIRE(contains(manifest, anchor));
  auto load_with = [&](const std::string& value) {
    std::string text = manifest;
    text.insert(text.find(anchor), "\"library_headers\": " + value + ",\n  ");
    std::ofstream(dir / "problem.json") << text;
    return kevo::load_problem(dir);
  };
  {
    auto problem = kevo::load_problem(dir);
    REQUIRE(problem);
    CHECK(problem->library_headers.empty());
    problem = load_with(R"(["kevo/retrieval/agent/scoring.cuh", "kevo/retrieval/half.hpp"])");
    REQUIRE(problem);
    CHECK(problem->library_headers == std::vector<std::string>{"kevo/retrieval/agent/scoring.cuh", "kevo/retrieval/half.hpp"});
  }
  const auto [value, key, why] = GENERATE(table<std::string, std::string, std::string>({
      {R"("kevo/retrieval/half.hpp")", "'library_headers'", "an array"},
      {R"(["kevo/retrieval/half.hpp", 3])", "'library_headers[1]'", "a string"},
      {R"([""])", "'library_headers[0]'", "is empty"},
      {R"(["/usr/include/kevo/retrieval/half.hpp"])", "'library_headers[0]'", "absolute path"},
      {R"(["kevo/../../etc/passwd"])", "'library_headers[0]'", "'..' component"},
      {R"(["kevo/retrieval/.."])", "'library_headers[0]'", "'..' component"},
      {R"(["kevo\\retrieval\\half.hpp"])", "'library_headers[0]'", "backslash"},
      {R"(["fmt/format.h"])", "'library_headers[0]'", "does not start with kevo/"},
      {R"(["kevo/retrieval/"])", "'library_headers[0]'", "a directory"},
  }));
  auto problem = load_with(value);
  INFO(value);
  REQUIRE_FALSE(problem);
  const std::string& message = problem.error().message;
  INFO(message);
  CHECK(contains(message, (dir / "problem.json").string()));
  CHECK(contains(message, key));
  CHECK(contains(message, why));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a template that uses an undeclared knob names the template, its line and the knob") {
  auto problem = kevo::load_problem(fixtures / "undeclared_knob");
  REQUIRE_FALSE(problem);
  const std::string& message = problem.error().message;
  INFO(message);
  CHECK(contains(message, "undeclared_knob/kernel.cpp.tmpl:4"));
  CHECK(contains(message, "'tile'"));
}

// The evaluator's options for these tests: a build cache of their own.
kevo::eval::CpuEvaluatorOptions test_cache() {
  kevo::eval::CpuEvaluatorOptions options;
  options.cache_dir = std::filesystem::temp_directory_path() / "kevo-test-cache";
  return options;
}

TEST_CASE("a reference that does not compile fails prepare() with the file and the compiler's error") {
  auto problem = kevo::load_problem(fixtures / "broken_reference");
  REQUIRE(problem);  // loading reads the files; compiling is prepare()'s job
  kevo::eval::CpuEvaluator evaluator(*problem, test_cache());
  auto ready = evaluator.prepare();
  REQUIRE_FALSE(ready);
  const std::string& message = ready.error().message;
  INFO(message);
  CHECK(contains(message, "broken_reference/reference.cpp does not compile:"));
  CHECK(contains(message, "error:"));
  CHECK(message.size() < 2500);  // trimmed
  // An evaluation against a broken problem is a sandbox error, not the candidate's fault.
  const kevo::Evaluation e = evaluator.evaluate(evaluator.default_candidate(), 1);
  CHECK(e.failure == kevo::FailureKind::sandbox_error);
  CHECK(contains(e.diagnostics.message, "does not compile"));
}

TEST_CASE("a reference that leaves an output element unwritten fails prepare(), naming the reference, not the seed") {
  auto problem = kevo::load_problem(fixtures / "lazy_reference");
  REQUIRE(problem);
  kevo::eval::CpuEvaluator evaluator(*problem, test_cache());
  auto ready = evaluator.prepare();
  REQUIRE_FALSE(ready);
  const std::string& message = ready.error().message;
  INFO(message);
  CHECK(contains(message, "lazy_reference"));
  CHECK(contains(message, "the reference left 1 of 1 elements of out unwritten on shape N=1"));
}

TEST_CASE("a name that is not a plain file name is refused, since it names kevo's files") {
  // kevo-runs/<name>.db, .best.cpp and .html: "../../escaped" would write two directories above it.
  const auto dir = std::filesystem::temp_directory_path() / "kevo-test-unsafe-name";
  std::filesystem::remove_all(dir);
  std::filesystem::copy(fixtures / "axpy", dir, std::filesystem::copy_options::recursive);
  std::string manifest = kevo::detail::read_text_file(dir / "problem.json").value();
  const std::string plain = "\"name\": \"axpy\"";
  REQUIRE(contains(manifest, plain));
  for (const std::string name : {"../../escaped", "a/b", ".hidden", "", "x y"}) {
    std::string text = manifest;
    text.replace(text.find(plain), plain.size(), "\"name\": \"" + name + "\"");
    std::ofstream(dir / "problem.json") << text;
    auto problem = kevo::load_problem(dir);
    INFO(name);
    REQUIRE_FALSE(problem);
    const std::string& message = problem.error().message;
    INFO(message);
    CHECK(contains(message, "problem.json: 'name'"));
    CHECK(contains(message, "plain file name"));
  }
  std::ofstream(dir / "problem.json") << manifest;
  auto problem = kevo::load_problem(dir);
  REQUIRE(problem);
  CHECK(problem->name == "axpy");
  // What a stored run records to know its problem again: the manifest, the reference and the template.
  const std::string identity = problem->identity();
  CHECK(identity.size() == 16);
  std::ofstream(dir / "kernel.cpp.tmpl", std::ios::app) << "\n// changed\n";
  CHECK(kevo::load_problem(dir)->identity() != identity);
  std::filesystem::remove_all(dir);
}

TEST_CASE("the best kernel as kevo-search writes it compiles on its own, outside the build cache") {
  auto problem = kevo::load_problem(fixtures / "axpy");
  REQUIRE(problem);
  const std::string source = problem->render(problem->default_knobs());
  const auto dir = std::filesystem::temp_directory_path() / ("kevo-test-standalone-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto compiles = [&](const std::string& text) {
    std::ofstream(dir / "best.cpp") << text;
    const std::string command = "g++ -std=c++20 -c -o " + (dir / "best.o").string() + " " + (dir / "best.cpp").string() + " 2>/dev/null";
    return std::system(command.c_str()) == 0;
  };
  CHECK_FALSE(compiles(source));  // as the cache holds it: kevo_problem.hpp is not here
  const std::string standalone = kevo::eval::standalone_source(*problem, source);
  CHECK(standalone.find("#include \"kevo_problem.hpp\"") == std::string::npos);
  CHECK(standalone.find("struct Shape") != std::string::npos);
  CHECK(compiles(standalone));
  std::filesystem::remove_all(dir);
}

}  // namespace kevo_tests::problem_test
