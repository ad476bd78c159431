// kevo-tune-pipeline: kevo's search tunes the retrieval pipeline's kernel policies on this GPU, for
// one pool shape and request kind, and records the verified best in a tuning file that
// FusedRetrievalPipeline::Options::choose_policy (tuned_policies(file)) then serves with.
//
//   kevo-tune-pipeline --ads 100000000 --budget 40 --out kevo-tuning.json
#include "device_timer.hpp"

#include <kevo/gpu_presence.hpp>
#include <kevo/tuning/pipeline_tuning.hpp>

#include "../common/command_line.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace {

struct Options {
  kevo_tune::DeviceTimerOptions device;
  std::string dtype = "fp16";
  std::size_t budget = 40;
  std::uint64_t seed = 1;
  std::string store = "kevo-runs/pipeline.db";
  std::string out = "kevo-tuning.json";
};

// The command line, with CLI11: --help, unknown flags and bad values are its job.
void describe(CLI::App& app, Options& o) {
  app.description(
      "Tunes the retrieval pipeline's kernel policies on this GPU with kevo's search: each candidate policy runs the pipeline on a "
      "synthetic pool, its answers checked against the default policy's, and the verified best is written to the tuning file the "
      "pipeline serves with.");
  using kevo_examples::whole_number;  // sizes, counts and seeds: digits only, no sign
  app.add_option("--ads", o.device.ads, "ads in the pool")
      ->capture_default_str()
      ->transform(whole_number)
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 32));
  app.add_option("--dim", o.device.dim, "embedding width")->capture_default_str()->transform(whole_number)->check(CLI::Range(1, 1024));
  app.add_option("--dtype", o.dtype, fmt::format("embedding type: {}", kevo::retrieval::kEmbeddingTypeNames))
      ->capture_default_str()
      ->check(kevo_examples::embedding_type);
  app.add_option("--requests", o.device.request_kind, "request kind")->capture_default_str()->check(CLI::IsMember({"typical", "broad", "narrow"}));
  app.add_option("--k", o.device.k, "results a search")->capture_default_str()->transform(whole_number)->check(CLI::Range(1, 4096));
  app.add_option("--batch", o.device.batch, "1: searches one by one; more: batches of that many (tunes batched scoring)")
      ->capture_default_str()
      ->transform(whole_number)
      ->check(CLI::Range(1, 64));
  app.add_option("--load-order", o.device.load_order,
                 "the order the pool's ads take their slots: id, or targeting (as retrieval_server --load-order targeting serves)")
      ->capture_default_str()
      ->check(CLI::IsMember({"id", "targeting"}));
  app.add_option("--budget", o.budget, "policies to evaluate")
      ->capture_default_str()
      ->transform(whole_number)
      ->check(CLI::Range(std::size_t{1}, std::size_t{100000}));
  app.add_option("--seed", o.seed, "random seed")->capture_default_str()->transform(whole_number);
  app.add_option("--store", o.store, "SQLite store")->capture_default_str();
  app.add_option("--out", o.out, "the tuning file to add this shape's entry to")->capture_default_str();
}

int fail(const std::string& message) {
  std::fprintf(stderr, "kevo-tune-pipeline: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"", "kevo-tune-pipeline"};
  describe(app, o);
  if (auto stop = kevo_examples::parse_command_line(app, argc, argv)) return *stop;
  o.device.dtype = *kevo::retrieval::embedding_type_named(o.dtype);
  std::string error;
  if (auto here = kevo::nvidia_device_present(); !here) return fail(here.error().message);  // exit 2, before any work
#ifdef KEVO_DEVICE_CODE_CHECK_ONLY
  return fail("built with KEVO_CUDA_DEVICE_CODE=check (configured where no GPU was found): its device code is unoptimized PTX, built to be compiled, not timed; reconfigure with -DKEVO_CUDA_DEVICE_CODE=sass and build again");  // (CMakeLists.txt)
#endif
  if (const std::filesystem::path store = o.store; store.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(store.parent_path(), ec);
    if (ec) return fail(fmt::format("--store {}: {}", o.store, ec.message()));
  }
  auto store = kevo::store::SqliteStore::open(o.store);
  if (!store) return fail(store.error().message);

  fmt::print("kevo-tune-pipeline: building a pool of {} {} ads at d = {} on the GPU...\n", o.device.ads, o.dtype, o.device.dim);
  std::fflush(stdout);
  auto device = kevo_tune::make_device_timer(o.device, error);
  if (!device) return fail(error);
  const kevo::retrieval::DeviceIdentity identity = device->device();

  const kevo::eval::PipelineWorkload workload{
      .shape = {o.device.dim, o.device.dtype, kevo::retrieval::pool_class(o.device.ads),
                *kevo::retrieval::slot_order_named(o.device.load_order)},  // checked by CLI11
      .ads = o.device.ads,
      .request_kind = o.device.request_kind,
      .k = o.device.k};
  fmt::print("{} with CUDA {}; tuning {} ({} requests a seed{}), budget {}, store {}\n", identity.gpu, identity.cuda,
             kevo::retrieval::to_string(workload.shape), o.device.request_kind,
             o.device.batch > 1 ? fmt::format(", batches of {}", o.device.batch) : std::string(), o.budget, o.store);

  auto on_progress = [&](const kevo::Progress& p) {
    const kevo::Evaluation& e = *p.evaluation;
    fmt::print("[{:3}/{}] best {:5.2f}x  {}{}\n", p.evaluations, o.budget, p.best_speedup,
               e.ok() ? fmt::format("{:.2f}x", e.speedup) : std::string(kevo::to_string(e.failure)), p.new_best ? " (new)" : "");
    std::fflush(stdout);
  };
  auto tuned = kevo::tuning::tune_pipeline(workload,
                                         kevo::tuning::policy_timer([&](const kevo::retrieval::PipelinePolicy& policy, std::uint64_t seed) {
                                           return device->time(policy, seed);
                                         }),
                                         device->defaults(), *store, {.budget = o.budget, .seed = o.seed, .on_progress = on_progress});
  if (!tuned) return fail(tuned.error().message);
  const kevo::retrieval::TuningEntry& entry = tuned->entry;
  fmt::print("defaults: {:.4g} ms a request; tuned: {:.4g} ms ({:.2f}x, {}verified beside the defaults) after {} policies\n",
             entry.default_seconds * 1e3, entry.tuned_seconds * 1e3, entry.default_seconds / entry.tuned_seconds,
             tuned->search.verified ? "" : "not ", entry.evaluations);
  fmt::print("policy: {}\n", kevo::retrieval::to_string(entry.policy));
  if (auto written = kevo::tuning::record_tuning(o.out, identity, entry); !written) return fail(written.error().message);
  fmt::print("wrote {} (the pipeline serves it through tuned_policies(\"{}\"))\n", o.out, o.out);
  return 0;
}
