// kevo-tune-pipeline: kevo's search tunes the retrieval pipeline's kernel policies on this GPU, for
// one pool shape and request kind, and records the verified best in a tuning file that
// FusedRetrievalPipeline::Options::choose_policy (tuned_policies(file)) then serves with.
//
//   kevo-tune-pipeline --ads 100000000 --budget 40 --out kevo-tuning.json
#include "device_timer.hpp"

#include <kevo/eval/pipeline_tuning.hpp>

#include <fmt/format.h>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

namespace {

constexpr const char* usage = R"(usage: kevo-tune-pipeline [options]

Tunes the retrieval pipeline's kernel policies on this GPU with kevo's search: each candidate policy
runs the pipeline on a synthetic pool, its answers checked against the default policy's, and the
verified best is written to the tuning file the pipeline serves with.

options:
  --ads N           ads in the pool (default 100000000)
  --dim D           embedding width (default 128)
  --dtype T         fp16 (default) or int8
  --requests KIND   typical (default), broad or narrow
  --k K             results a search (default 1000)
  --batch N         1 (default): searches one by one; more: batches of N (tunes batched scoring)
  --budget N        policies to evaluate (default 40)
  --seed S          random seed (default 1)
  --store PATH      SQLite store (default kevo-runs/pipeline.db)
  --out PATH        the tuning file to add this shape's entry to (default kevo-tuning.json)
)";

struct Options {
  kevo_tune::DeviceTimerOptions device;
  std::string dtype = "fp16";
  std::size_t budget = 40;
  std::uint64_t seed = 1;
  std::filesystem::path store = "kevo-runs/pipeline.db";
  std::filesystem::path out = "kevo-tuning.json";
};

template <class T>
bool parse_number(std::string_view text, T& out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

kevo::expected<Options, kevo::Error> parse_arguments(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") return kevo::make_error("");
    if (!arg.starts_with("--")) return kevo::make_error(fmt::format("unexpected argument '{}'", arg));
    if (i + 1 >= argc) return kevo::make_error(fmt::format("{} needs a value", arg));
    const std::string_view value = argv[++i];
    bool ok = true;
    if (arg == "--ads") ok = parse_number(value, o.device.ads) && o.device.ads > 0;
    else if (arg == "--dim") ok = parse_number(value, o.device.dim) && o.device.dim > 0;
    else if (arg == "--dtype") {
      ok = value == "fp16" || value == "int8";
      o.dtype = value;
    }
    else if (arg == "--requests") o.device.request_kind = value;
    else if (arg == "--k") ok = parse_number(value, o.device.k) && o.device.k > 0;
    else if (arg == "--batch") ok = parse_number(value, o.device.batch) && o.device.batch > 0;
    else if (arg == "--budget") ok = parse_number(value, o.budget) && o.budget > 0;
    else if (arg == "--seed") ok = parse_number(value, o.seed);
    else if (arg == "--store") o.store = value;
    else if (arg == "--out") o.out = value;
    else return kevo::make_error(fmt::format("unknown option {}", arg));
    if (!ok) return kevo::make_error(fmt::format("{} does not take '{}'", arg, value));
  }
  o.device.int8 = o.dtype == "int8";
  return o;
}

int fail(const std::string& message) {
  std::fprintf(stderr, "kevo-tune-pipeline: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  auto options = parse_arguments(argc, argv);
  if (!options) {
    if (options.error().message.empty()) {
      std::fputs(usage, stdout);
      return 0;
    }
    std::fprintf(stderr, "kevo-tune-pipeline: %s\n\n%s", options.error().message.c_str(), usage);
    return 2;
  }
  const Options& o = *options;
  std::string error;
  if (!kevo_tune::device_present(error)) return fail(error);
  if (o.store.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(o.store.parent_path(), ec);
    if (ec) return fail(fmt::format("--store {}: {}", o.store.string(), ec.message()));
  }
  auto store = kevo::store::SqliteStore::open(o.store);
  if (!store) return fail(store.error().message);

  fmt::print("kevo-tune-pipeline: building a pool of {} {} ads at d = {} on the GPU...\n", o.device.ads, o.dtype, o.device.dim);
  std::fflush(stdout);
  auto device = kevo_tune::make_device_timer(o.device, error);
  if (!device) return fail(error);
  const kevo::retrieval::DeviceIdentity identity = device->device();

  const kevo::eval::PipelineWorkload workload{
      .shape = {o.device.dim, o.device.int8 ? kevo::retrieval::EmbeddingType::int8 : kevo::retrieval::EmbeddingType::fp16,
                kevo::retrieval::pool_class(o.device.ads)},
      .ads = o.device.ads,
      .request_kind = o.device.request_kind,
      .k = o.device.k};
  fmt::print("{} with CUDA {}; tuning {} ({} requests a seed{}), budget {}, store {}\n", identity.gpu, identity.cuda,
             kevo::retrieval::to_string(workload.shape), o.device.request_kind,
             o.device.batch > 1 ? fmt::format(", batches of {}", o.device.batch) : std::string(), o.budget, o.store.string());

  auto on_progress = [&](const kevo::Progress& p) {
    const kevo::Evaluation& e = *p.evaluation;
    fmt::print("[{:3}/{}] best {:5.2f}x  {}{}\n", p.evaluations, o.budget, p.best_speedup,
               e.ok() ? fmt::format("{:.2f}x", e.speedup) : std::string(kevo::to_string(e.failure)), p.new_best ? " (new)" : "");
    std::fflush(stdout);
  };
  auto tuned = kevo::eval::tune_pipeline(workload,
                                         kevo::eval::policy_timer([&](const kevo::retrieval::PipelinePolicy& policy, std::uint64_t seed) {
                                           return device->time(policy, seed);
                                         }),
                                         device->defaults(), *store, {.budget = o.budget, .seed = o.seed, .on_progress = on_progress});
  if (!tuned) return fail(tuned.error().message);
  const kevo::retrieval::TuningEntry& entry = tuned->entry;
  fmt::print("defaults: {:.4g} ms a request; tuned: {:.4g} ms ({:.2f}x, {}verified beside the defaults) after {} policies\n",
             entry.default_seconds * 1e3, entry.tuned_seconds * 1e3, entry.default_seconds / entry.tuned_seconds,
             tuned->search.verified ? "" : "not ", entry.evaluations);
  fmt::print("policy: {}\n", kevo::retrieval::to_string(entry.policy));
  if (auto written = kevo::eval::record_tuning(o.out, identity, entry); !written) return fail(written.error().message);
  fmt::print("wrote {} (the pipeline serves it through tuned_policies(\"{}\"))\n", o.out.string(), o.out.string());
  return 0;
}
