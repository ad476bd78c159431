// KernelBench-format problems (kevo/eval/torch_problem.hpp) with Debian's PyTorch on the CPU: what kevo learns
// of each shipped file (problems/kernelbench), the one-line refusal of a file it cannot use, each template
// family's kernels checked against PyTorch through the jailed evaluator, and hostile candidates against a
// PyTorch reference. Sizes are scaled down (--size-scale), as CI's two cores need.
#include <kevo/default_search_loop.hpp>
#include <kevo/eval/cpu_evaluator.hpp>
#include <kevo/eval/cuda_evaluator.hpp>
#include <kevo/eval/torch_problem.hpp>
#include <kevo/memory/operators.hpp>
#include <kevo/net/llm_client.hpp>
#include <kevo/search/greedy.hpp>
#include <kevo/store/sqlite_store.hpp>
#include <kevo/synth/llm_synthesizer.hpp>
#include <kevo/synth/template_synthesizer.hpp>

#include <catch2/catch.hpp>

#include "support/fake_llm_server.hpp"
#include "support/quick_llm_options.hpp"
#include "support/process_temp_dir.hpp"
#include "support/require_prepared.hpp"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace kevo_tests::kernelbench_test {

namespace {

namespace fs = std::filesystem;

const fs::path shipped = fs::path(KEVO_SOURCE_DIR) / "problems" / "kernelbench";
constexpr double scale = 0.02;

kevo::eval::EvaluatorOptions test_options() {
  kevo::eval::EvaluatorOptions o;
  o.cache_dir = fs::temp_directory_path() / "kevo-test-cache";
  o.repetitions = 5;
  o.reference_repetitions = 5;
  return o;
}

kevo::Problem load(const std::string& file, double size_scale = scale) {
  auto p = kevo::eval::load_torch_problem(shipped / file, {.size_scale = size_scale, .cache_dir = test_options().cache_dir});
  INFO(file);
  if (!p) FAIL(p.error().message);
  return *p;
}

const kevo::TensorSpec& tensor(const kevo::Problem& p, const std::string& name) {
  for (const auto& t : p.tensors)
    if (t.name == name) return t;
  FAIL("no tensor " << name);
  return p.tensors.front();
}

// A file of the user's, in a directory of this process's that goes when the process ends.
fs::path write_file(const std::string& name, const std::string& text) {
  static const kevo::testing::ProcessTempDir files("kevo-kernelbench");
  std::ofstream(files.path() / name) << text;
  return files.path() / name;
}

// The template rendered with every knob at its last value (threads, blocking, other loop orders).
kevo::Candidate last_knobs(const kevo::Problem& p) {
  kevo::Knobs k = p.default_knobs();
  for (const auto& spec : p.knobs) k[spec.name] = spec.domain.back();
  return kevo::Candidate{.source = p.render(k), .knobs = k, .origin = "last knobs"};
}

// Both ends of the family's knobs are correct against PyTorch on fresh inputs (checked by the jailed checker).
void check_family(const std::string& file) {
  INFO(file);
  const kevo::Problem p = load(file);
  REQUIRE(p.torch);
  REQUIRE_FALSE(p.torch->family.empty());
  kevo::eval::CpuEvaluator evaluator(p, test_options());
  REQUIRE_PREPARED(evaluator);
  CHECK(evaluator.reference_seconds() > 0);  // PyTorch eager, timed
  CHECK_FALSE(evaluator.torch_peers().compile_note.empty());  // Debian's PyTorch 1.13 has no torch.compile: said so
  for (const kevo::Candidate& c : {evaluator.default_candidate(), last_knobs(p)}) {
    const kevo::Evaluation e = evaluator.evaluate(c, 11);
    INFO(kevo::to_string(c.knobs) << ": " << kevo::to_string(e.failure) << ": " << e.diagnostics.message);
    CHECK(e.ok());
    CHECK(e.speedup > 0);
  }
}

}  // namespace

TEST_CASE("kernelbench: each shipped file is learned from PyTorch: its tensors, the family of its forward, KernelBench's tolerance") {
  const std::map<std::string, std::string> family = {
      {"01_relu.py", "elementwise (relu)"},     {"02_gelu.py", "elementwise (gelu)"},      {"03_leaky_relu.py", "elementwise (leaky_relu)"},
      {"04_softmax.py", "softmax"},             {"05_log_softmax.py", "softmax"},           {"06_layer_norm.py", "norm (layer)"},
      {"07_rms_norm.py", "norm (rms)"},         {"08_l2_norm.py", "norm (l2)"},             {"09_frobenius_norm.py", "norm (fro)"},
      {"10_sum_reduction.py", "reduction (sum)"}, {"11_argmax.py", "reduction (argmax)"}, {"12_max_reduction.py", "reduction (max)"},
      {"13_matmul.py", "matmul"},               {"14_batched_matmul.py", "matmul"},        {"15_matmul_transposed_b.py", "matmul"},
      {"16_matvec.py", "matmul"},               {"17_linear.py", "matmul"},                 {"18_min_and_max.py", ""},
      {"19_scaled_residual.py", ""}};
  std::size_t files = 0;
  for (const auto& entry : fs::directory_iterator(shipped))
    if (entry.path().extension() == ".py") ++files;
  CHECK(files == family.size());  // a new file gets its expectation here
  for (const auto& [file, expected] : family) {
    INFO(file);
    const kevo::Problem p = load(file);
    REQUIRE(p.torch);
    CHECK(p.torch->family == expected);
    CHECK(p.torch->size_scale == scale);
    CHECK(p.reference_source.find("class Model") != std::string::npos);
    CHECK(p.tolerance.relative == 1e-4);
    CHECK(p.tolerance.absolute <= 1e-4);
    CHECK(p.check_shapes.size() == 1);
  }

  // A linear layer: the module's weight and bias are kernel inputs, after forward's own, named as PyTorch names them.
  const kevo::Problem linear = load("17_linear.py");
  REQUIRE(linear.tensors.size() == 4);
  CHECK(linear.tensors[0].name == "x");
  CHECK(linear.tensors[1].name == "fc_weight");
  CHECK(linear.tensors[2].name == "fc_bias");
  CHECK(linear.tensors[3].name == "out");
  CHECK(tensor(linear, "fc_weight").role == kevo::TensorRole::input);
  CHECK(tensor(linear, "out").role == kevo::TensorRole::output);
  CHECK(linear.timing_shape.at("x_1") == 82);  // in_features 4096 scaled by 0.02
  CHECK(linear.timing_shape.at("fc_weight_0") == 41);
  CHECK(tensor(linear, "fc_weight").size == "fc_weight_0 * fc_weight_1");

  // argmax returns int64: an int output in kernels.
  CHECK(tensor(load("11_argmax.py"), "out").type == kevo::ElementType::i32);

  // Two outputs, and a forward of three ops: no family; the description says so, by name.
  const kevo::Problem two = load("18_min_and_max.py");
  CHECK(tensor(two, "out0").role == kevo::TensorRole::output);
  CHECK(tensor(two, "out1").role == kevo::TensorRole::output);
  const kevo::Problem residual = load("19_scaled_residual.py");
  CHECK(residual.description.find("no template family matches its forward") != std::string::npos);
  CHECK(residual.description.find("(its forward calls sigmoid, mul, add), so an LLM writes its kernels") != std::string::npos);
  CHECK(residual.template_source.find("void kernel(const Shape& shape, const float* x, const float* gate, float* out)") != std::string::npos);

  // Softmax's outputs are about 1/C each: the absolute tolerance is tightened so that zeros cannot pass.
  CHECK(load("04_softmax.py").tolerance.absolute < 1e-4);
  CHECK(load("01_relu.py").tolerance.absolute == 1e-4);

  // The scale is part of the problem's identity: a store's run at one scale is not resumed at another.
  CHECK(load("01_relu.py").identity() != load("01_relu.py", 0.03).identity());
}

TEST_CASE("kernelbench: a file kevo cannot use gets one line naming it and the reason, and no problem") {
  // A Model whose forward returns `result`.
  auto model = [](std::string_view result) {
    return fmt::format("import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x):\n        return {}\n", result);
  };
  struct Case {
    std::string name, text, reason;
  };
  const std::vector<Case> cases = {
      {"no_model.py", "import torch\ndef get_inputs():\n    return [torch.randn(4)]\n", "it defines no `class Model(nn.Module)`"},
      {"import_error.py", "import torch\nimport no_such_module_here\n", "importing it raised ModuleNotFoundError: No module named 'no_such_module_here'"},
      {"inputs_raise.py", model("x") + "def get_inputs():\n    raise RuntimeError('broken sizes')\ndef get_init_inputs():\n    return []\n",
       "get_inputs() raised RuntimeError: broken sizes"},
      {"not_a_tensor.py", model("x.sum().item()") + "def get_inputs():\n    return [torch.randn(8)]\n", "forward() returns a float, not a tensor"},
      {"nested.py", model("(x, (x, x))") + "def get_inputs():\n    return [torch.randn(8)]\n",
       "forward() returns a nested or non-tensor sequence"},
      {"float64.py", model("x * 2") + "def get_inputs():\n    return [torch.randn(8, dtype=torch.float64)]\n",
       "input x is float64: kevo has no kernel type for it"},
      {"scalar_input.py", model("x * 2") + "def get_inputs():\n    return [torch.randn(8), 3.0]\n",
       "get_inputs() item 1 is a float, not a tensor"},
      {"too_big.py", model("x * 2") + "def get_inputs():\n    return [torch.empty(600, 1024, 1024, dtype=torch.float32)]\n",
       "its inputs take 2.34 GiB a call, and this target holds 2.00 GiB for two calls' worth (try --size-scale)"},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    const fs::path file = write_file(c.name, c.text);
    auto p = kevo::eval::load_torch_problem(file, {.cache_dir = test_options().cache_dir});
    REQUIRE_FALSE(p);
    const std::string& message = p.error().message;
    INFO(message);
    CHECK(message.starts_with(file.string() + ": cannot be used as a problem: "));
    CHECK(message.find(c.reason) != std::string::npos);
    CHECK(message.find('\n') == std::string::npos);
  }
  auto missing = kevo::eval::load_torch_problem("/no/such/dir/19_ReLU.py");
  REQUIRE_FALSE(missing);
  CHECK(missing.error().message == "/no/such/dir/19_ReLU.py: cannot be used as a problem: no such file");
  auto no_python = kevo::eval::load_torch_problem(shipped / "01_relu.py", {.python = "/no/such/python3"});
  REQUIRE_FALSE(no_python);
  CHECK(no_python.error().message.find("no Python to run PyTorch ('/no/such/python3')") != std::string::npos);
}

TEST_CASE("kernelbench: the elementwise and softmax families' kernels are correct against PyTorch at both ends of their knobs") {
  for (const char* file : {"01_relu.py", "02_gelu.py", "03_leaky_relu.py", "04_softmax.py", "05_log_softmax.py"}) check_family(file);
}

TEST_CASE("kernelbench: the norm and reduction families' kernels are correct against PyTorch at both ends of their knobs") {
  for (const char* file : {"06_layer_norm.py", "07_rms_norm.py", "08_l2_norm.py", "09_frobenius_norm.py", "10_sum_reduction.py", "11_argmax.py",
                           "12_max_reduction.py"})
    check_family(file);
}

TEST_CASE("kernelbench: the matmul family's kernels are correct against PyTorch at both ends of their knobs") {
  for (const char* file : {"13_matmul.py", "14_batched_matmul.py", "15_matmul_transposed_b.py", "16_matvec.py", "17_linear.py"}) check_family(file);
}

TEST_CASE("kernelbench: hostile candidates against a PyTorch reference fail: cached outputs, zeros, changed inputs, the starter") {
  const kevo::Problem relu = load("01_relu.py");
  kevo::eval::CpuEvaluator evaluator(relu, test_options());
  REQUIRE_PREPARED(evaluator);
  const std::string head = "#include \"kevo_problem.hpp\"\n#include <cstring>\n#include <vector>\n";
  const std::string signature = "void kernel(const Shape& s, const float* x, float* out) {\n  const long n = s.x_0 * s.x_1;\n";
  struct Case {
    std::string name, body;
    std::vector<kevo::FailureKind> allowed;
  };
  const std::vector<Case> cases = {
      // The first call's answer, kept and returned ever after: later calls have fresh inputs.
      {"cached", "  static std::vector<float> kept;\n  if (kept.empty()) { kept.resize(n); for (long i = 0; i < n; ++i) kept[i] = x[i] > 0 ? x[i] : 0; }\n"
                 "  std::memcpy(out, kept.data(), n * sizeof(float));\n}\n",
       {kevo::FailureKind::wrong_answer, kevo::FailureKind::replayed_output}},
      {"zeros", "  for (long i = 0; i < n; ++i) out[i] = 0;\n}\n", {kevo::FailureKind::wrong_answer}},
      {"changes its input", "  float* w = const_cast<float*>(x);\n  for (long i = 0; i < n; ++i) { out[i] = x[i] > 0 ? x[i] : 0; w[i] = out[i]; }\n}\n",
       {kevo::FailureKind::mutated_input}},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    const kevo::Evaluation e = evaluator.evaluate(kevo::Candidate{.source = head + signature + c.body, .origin = c.name}, 5);
    INFO(kevo::to_string(e.failure) << ": " << e.diagnostics.message);
    CHECK(std::find(c.allowed.begin(), c.allowed.end(), e.failure) != c.allowed.end());
    CHECK(e.speedup == 0);
  }
  // A problem no family matches starts from a kernel that writes nothing: every output named unwritten.
  const kevo::Problem residual = load("19_scaled_residual.py");
  kevo::eval::CpuEvaluator starter(residual, test_options());
  REQUIRE_PREPARED(starter);
  const kevo::Evaluation e = starter.evaluate(starter.default_candidate(), 3);
  CHECK(e.failure == kevo::FailureKind::unwritten_output);
  // A correct kernel written by hand for it passes: the reference's second input and the output line up.
  const std::string fused = head + "#include <cmath>\nvoid kernel(const Shape& s, const float* x, const float* gate, float* out) {\n"
                                   "  for (long i = 0; i < s.x_0 * s.x_1; ++i) out[i] = x[i] / (1.0f + std::exp(-gate[i])) + x[i];\n}\n";
  const kevo::Evaluation ok = starter.evaluate(kevo::Candidate{.source = fused, .origin = "by hand"}, 4);
  INFO(ok.diagnostics.message);
  CHECK(ok.ok());
}

TEST_CASE("kernelbench: the LLM path sees the PyTorch source, and a wrong kernel from the model is caught, then a right one verified") {
  using kevo::testing::openai_answer;
  using kevo::testing::Reply;
  const kevo::Problem residual = load("19_scaled_residual.py");
  kevo::testing::LoopbackServer server;
  const std::string head = "Here is the kernel.\n\n```cpp\n#include \"kevo_problem.hpp\"\n#include <cmath>\n"
                           "void kernel(const Shape& s, const float* x, const float* gate, float* out) {\n"
                           "  for (long i = 0; i < s.x_0 * s.x_1; ++i) out[i] = ";
  const std::string wrong = head + "x[i] / (1.0f + std::exp(-gate[i]));\n}\n```\n";  // forgets the residual
  const std::string right = head + "x[i] / (1.0f + std::exp(-gate[i])) + x[i];\n}\n```\n";
  server.script({Reply{.body = openai_answer(wrong)}});
  server.always(Reply{.body = openai_answer(right)});
  auto llm = kevo::net::BlockingLlmClient::create(kevo::testing::quick_llm_options(server, "KEVO_TEST_KERNELBENCH_KEY", "sk-kernelbench-test")).value();
  kevo::eval::CpuEvaluator evaluator(residual, test_options());
  REQUIRE_PREPARED(evaluator);
  auto store = kevo::store::SqliteStore::open(":memory:").value();
  kevo::SearchLoop<kevo::synth::LlmSynthesizer<kevo::net::BlockingLlmClient>, kevo::search::Greedy, kevo::memory::Combined, kevo::eval::CpuEvaluator,
                   kevo::knowledge::NullRetriever, kevo::store::SqliteStore>
      loop(residual, kevo::synth::LlmSynthesizer(llm), kevo::search::Greedy{}, kevo::memory::Combined{}, evaluator, kevo::knowledge::NullRetriever{},
           store, {.jobs = 1, .max_evaluations = 3, .seed = 5});
  auto result = loop.run(kevo::synth::TemplateSynthesizer(residual).seed());
  REQUIRE(result);
  INFO(result->verification_message);
  CHECK(result->failures[kevo::FailureKind::unwritten_output] == 1);  // the starter
  CHECK(result->failures[kevo::FailureKind::wrong_answer] == 1);      // the model's first kernel
  CHECK(result->verified);
  CHECK(result->verified_speedup > 0);
  CHECK(result->best_candidate->source.find("+ x[i]") != std::string::npos);
  const auto received = server.received();
  REQUIRE_FALSE(received.empty());
  const std::string prompt = kevo::testing::first_user_message(received.front().body);
  CHECK(prompt.find("## Reference implementation (PyTorch)") != std::string::npos);
  CHECK(prompt.find("```python") != std::string::npos);
  CHECK(prompt.find("return x * torch.sigmoid(gate) + x") != std::string::npos);
  CHECK(prompt.find("void kernel(const Shape& shape, const float* x, const float* gate, float* out)") != std::string::npos);
}

TEST_CASE("kernelbench: on a cuda target each family's kernels pass the screen and compile with nvcc, the checker too, with no GPU here") {
  // One problem a family, learned on the CPU (a machine with no GPU can load a cuda problem); its first starting
  // point (the vectorized, tiled one) compiled in the jail. The device run checks and times them (benchmarks/RESULTS.md).
  for (const char* file : {"03_leaky_relu.py", "05_log_softmax.py", "06_layer_norm.py", "11_argmax.py", "17_linear.py"}) {
    INFO(file);
    auto p = kevo::eval::load_torch_problem(shipped / file, {.size_scale = scale, .target = kevo::Target::cuda, .cache_dir = test_options().cache_dir});
    REQUIRE(p);
    CHECK(p->target == kevo::Target::cuda);
    REQUIRE(p->torch);
    CHECK(p->torch->device == "cuda");
    REQUIRE_FALSE(p->torch->family.empty());
    REQUIRE_FALSE(p->starting_points.empty());
    if (!kevo::eval::find_program(kevo::eval::CudaToolchain::default_compiler())) {
      WARN("no nvcc here: the CUDA family kernels are not compiled");
      continue;
    }
    kevo::Knobs knobs = p->default_knobs();
    for (const auto& [knob, value] : p->starting_points.front().knobs) knobs[knob] = value;
    kevo::eval::CudaEvaluator evaluator(*p, test_options());
    const kevo::Evaluation e = evaluator.compile({.source = p->render(knobs), .knobs = knobs, .origin = "starting point"});
    INFO(kevo::to_string(knobs) << ": " << kevo::to_string(e.failure) << ": " << e.diagnostics.message << "\n" << e.diagnostics.detail);
    CHECK(e.failure == kevo::FailureKind::none);
  }
}

TEST_CASE("kernelbench: the evaluator keeps one PyTorch helper for all its runs, and a crashed candidate or a killed helper costs one run, no more") {
  // A cache of its own: the helper's command line names it, so that only this test's helper is killed below.
  kevo::eval::EvaluatorOptions options = test_options();
  options.cache_dir = fs::temp_directory_path() / fmt::format("kevo-kept-helper-{}", ::getpid());
  const kevo::Problem relu = load("01_relu.py");
  kevo::eval::CpuEvaluator evaluator(relu, options);
  REQUIRE_PREPARED(evaluator);  // PyTorch eager timed through the kept helper
  CHECK(evaluator.stats().torch_helper_starts == 1);
  for (std::uint64_t seed : {1, 2, 3}) {
    const kevo::Evaluation e = evaluator.evaluate(evaluator.default_candidate(), seed);
    INFO(kevo::to_string(e.failure) << ": " << e.diagnostics.message);
    CHECK(e.ok());
  }
  CHECK(evaluator.stats().runs == 3);
  CHECK(evaluator.stats().torch_helper_starts == 1);  // not one a run

  // A candidate that crashes mid-run ends its checker while the helper serves it: the next run is served.
  const std::string crash = "#include \"kevo_problem.hpp\"\nvoid kernel(const Shape&, const float*, float*) { *static_cast<volatile int*>(nullptr) = 1; }\n";
  const kevo::Evaluation crashed = evaluator.evaluate(kevo::Candidate{.source = crash, .origin = "crash"}, 4);
  CHECK(crashed.failure == kevo::FailureKind::crash);
  const kevo::Evaluation after_crash = evaluator.evaluate(evaluator.default_candidate(), 5);
  INFO(after_crash.diagnostics.message);
  CHECK(after_crash.ok());
  CHECK(evaluator.stats().torch_helper_starts == 1);

  // A helper killed between runs is started again for the next one, which passes.
  const std::string pattern = (options.cache_dir / "problems").string() + ".*[s]erve-runs";  // [s]: not the shell that runs pkill
  REQUIRE(std::system(("pkill -KILL -f '" + pattern + "'").c_str()) == 0);
  const kevo::Evaluation after_kill = evaluator.evaluate(evaluator.default_candidate(), 6);
  INFO(after_kill.diagnostics.message);
  CHECK(after_kill.ok());
  CHECK(evaluator.stats().torch_helper_starts == 2);
  fs::remove_all(options.cache_dir);
}

}  // namespace kevo_tests::kernelbench_test
