// retrieval_server: kevo's fused retrieval pipeline behind HTTP.
//
// It loads a model (a safetensors file, or the workload's own), fills the ad pool from an ad file
// (ad_file.hpp) or with the spec's synthetic workload, and serves top-K requests and real-time ad updates as JSON over HTTP
// (serving.hpp lists the endpoints). It runs on the GPU where one exists and on the
// CPU reference elsewhere; the GPU backend comes from cuda_backend.cu beside this file, a separate
// translation unit because Boost.Beast does not compile under nvcc:
//
//   retrieval_server --port 8080 --ads 1000000 [--dtype int8_group32] [--save-ads pool.safetensors]
//   retrieval_server --port 8080 --ads-file pool.safetensors --model model.safetensors   # the file's dtype
//   retrieval_server --port 8080 --search-threads 8 --max-queue 1024 --deadline-ms 30000 --drain-ms 10000
//   retrieval_server --port 8080 --ads 10000000 --gpus 0,1     # one pool, a shard on each GPU (ShardedBackend)
//   retrieval_server --port 8080 --ads 10000000 --load-order targeting   # slots grouped by targeting
//   retrieval_server --port 8080 --backend cpu --shards 4      # one pool over four CPU engines
//   retrieval_server --help   # every flag, its default and its range
//   curl -s localhost:8080/search -d '{"features":[...256 floats...],"query":[{"category":0,"values":[1]}],"k":10}'
#include <kevo/gpu_presence.hpp>
#include <kevo/retrieval/retrieval.hpp>
#include "serving.hpp"
#include <kevo/retrieval/sharded_backend.hpp>
#include <kevo/retrieval/tuning/tuning_file.hpp>

#include <boost/asio/signal_set.hpp>

#include "../common/command_line.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#if defined(KEVO_RETRIEVAL_SERVER_CUDA)
#include "cuda_backend.hpp"  // make_cuda_backend, from cuda_backend.cu
#endif

using namespace kevo::retrieval;

namespace {

struct Options {
  std::string host = "127.0.0.1";
  unsigned short port = 8080;
  std::uint64_t ads = 100000;
  std::uint64_t seed = 1;
  std::string model;
  std::string ads_file;  // load the pool from here instead of generating it
  std::string save_ads;  // write the generated pool here before serving
  std::string tuning;    // kernel policies a search found (kevo-tune-pipeline --out), for the GPU backend
  std::string backend = "auto";
  std::string load_order = "id";  // "targeting": each chunk of the load grouped by targeting (slot_order.hpp)
  unsigned shards = 1;   // engines the pool is split over (ShardedBackend), of the chosen backend
  std::string gpus;      // --gpus as given: "all" or ordinals "0,1" (empty: not given)
  std::vector<int> devices;  // --gpus's ordinals, a device once per shard on it ("all": filled at start-up)
  unsigned threads = 4;   // I/O threads: read, parse, write
  std::size_t batch = 8;  // concurrent searches answered together (1: one at a time)
  EmbeddingType dtype = EmbeddingType::fp16;
  bool dtype_given = false;  // --dtype on the command line: an ad file that records another is refused
  ServingOptions serving;
  std::chrono::milliseconds drain{10000};  // on SIGTERM: how long queued work may still run
};

using kevo_examples::whole_number;  // what every number flag takes (examples/common/command_line.hpp)

/// A number flag in [least, most].
template <class T>
CLI::Option* number(CLI::Option* option, T least, T most) {
  return option->capture_default_str()->transform(whole_number)->check(CLI::Range(least, most));
}

/// --gpus's device ordinals ("0,1": {0, 1}; a device may repeat), or nothing where `text` is not such a list.
std::optional<std::vector<int>> gpu_ordinals(std::string_view text) {
  std::vector<int> ordinals;
  for (std::size_t begin = 0;;) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    int ordinal = 0;
    const auto [at, ec] = std::from_chars(text.data() + begin, text.data() + end, ordinal);
    if (end == begin || ec != std::errc() || at != text.data() + end || ordinal < 0) return std::nullopt;
    ordinals.push_back(ordinal);
    if (end == text.size()) return ordinals;
    begin = end + 1;
  }
}

// The command line, with CLI11 (examples/common/command_line.hpp): --help lists the flags; a bad flag or
// value is one line that names it, and exit code 2, before anything is bound or loaded.
void describe(CLI::App& app, Options& o, std::uint64_t& deadline_ms, std::uint64_t& drain_ms, std::uint64_t& io_timeout_ms,
              std::string& dtype) {
  constexpr std::uint64_t most = std::numeric_limits<std::uint32_t>::max();
  const CLI::Validator ip_address(
      [](std::string& text) -> std::string {
        boost::system::error_code ec;
        boost::asio::ip::make_address(text, ec);
        return ec ? "not an IP address: '" + text + "'" : std::string();
      },
      "IP", "IP address");
  app.description("kevo's fused retrieval pipeline behind HTTP: top-K searches and real-time ad updates as JSON.");
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a flag given twice: the last counts
  app.add_option("--host", o.host, "the address to listen on")->capture_default_str()->check(ip_address);
  number(app.add_option("--port", o.port, "the port to listen on (0: any free one)"), 0, 65535);
  number(app.add_option("--ads", o.ads, "synthetic ads to serve (the spec's workload)"), std::uint64_t{0}, most);
  app.add_option("--seed", o.seed, "the synthetic workload's seed")->capture_default_str()->transform(whole_number);
  app.add_option("--model", o.model, "the model, a safetensors file (default: the workload's own)");
  auto* ads_file = app.add_option("--ads-file", o.ads_file, "load the pool from this ad file instead of generating it");
  auto* save_ads = app.add_option("--save-ads", o.save_ads, "write the generated pool to this ad file before serving");
  ads_file->excludes(save_ads);
  save_ads->excludes(ads_file);
  app.add_option("--backend", o.backend, "the engine: the GPU where one exists (auto), or cpu, or gpu")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "gpu"}));
  app.add_option("--load-order", o.load_order,
                 "the order the pool's ads take their slots: id, or targeting (a request's eligible ads in longer runs of "
                 "slots, which the GPU gathers faster; the answers are the same)")
      ->capture_default_str()
      ->check(CLI::IsMember({"id", "targeting"}));
  const CLI::Validator gpu_list(
      [](std::string& text) -> std::string {
        if (text == "all" || gpu_ordinals(text)) return {};
        return "takes all, or device ordinals such as 0,1; not '" + text + "'";
      },
      "all|0,1,...", "GPU list");
  number(app.add_option("--shards", o.shards, "engines the pool is split over, of the chosen backend (ads placed by id)"), 1u, 64u);
  app.add_option("--gpus", o.gpus,
                 "the GPU backend's devices: all, or ordinals such as 0,1, one shard on each (0,0: two shards on GPU 0)")
      ->check(gpu_list);
  app.add_option("--tuning", o.tuning, "kernel policies a search found (kevo-tune-pipeline --out), for the GPU backend")
      ->check(CLI::ExistingFile);
  number(app.add_option("--threads", o.threads, "I/O threads: read, parse, write"), 1u, 1024u);
  number(app.add_option("--batch", o.batch, "concurrent searches answered together (1: one at a time)"), std::size_t{1},
         std::size_t{4096});
  app.add_option("--dtype", dtype,
                 "the pool's embeddings: " + std::string(kEmbeddingTypeNames) +
                     " (with --ads-file: the type the file records, where it records one; another is refused)")
      ->capture_default_str()
      ->check(kevo_examples::embedding_type);
  number(app.add_option("--search-threads", o.serving.search_threads, "workers that run searches and batches"), 1u, 1024u);
  number(app.add_option("--max-queue", o.serving.max_queued, "searches, batches and updates queued or running; more: 503"),
         std::size_t{1}, std::size_t{most});
  number(app.add_option("--deadline-ms", deadline_ms, "a search still queued after this: 503, not run"), std::uint64_t{1}, most);
  number(app.add_option("--drain-ms", drain_ms, "on SIGTERM: how long queued work may still run"), std::uint64_t{0}, most);
  number(app.add_option("--max-connections", o.serving.max_connections, "open connections; more: 503 and closed"),
         std::size_t{1}, std::size_t{most});
  number(app.add_option("--max-body-bytes", o.serving.max_body_bytes, "a larger body: 413"), std::size_t{1},
         std::size_t{1} << 40);
  number(app.add_option("--max-body-bytes-in-flight", o.serving.max_body_bytes_in_flight,
                        "declared bodies being read or served; more: 503"),
         std::size_t{1}, std::size_t{1} << 48);
  number(app.add_option("--io-timeout-ms", io_timeout_ms, "a whole request's read (header and body), and each write"),
         std::uint64_t{1}, most);
}

/// The flags into `o`, or the exit code where the program should stop now (--help: 0; a bad flag: 2).
std::optional<int> parse(int argc, char** argv, Options& o) {
  using ms = std::chrono::milliseconds;
  auto deadline_ms = static_cast<std::uint64_t>(o.serving.request_deadline.count());
  auto drain_ms = static_cast<std::uint64_t>(o.drain.count());
  auto io_timeout_ms = static_cast<std::uint64_t>(o.serving.io_timeout.count());
  std::string dtype = to_string(o.dtype);
  CLI::App app{"", "retrieval_server"};
  describe(app, o, deadline_ms, drain_ms, io_timeout_ms, dtype);
  if (auto stop = kevo_examples::parse_command_line(app, argc, argv)) return stop;
  // What one flag's check cannot see: --gpus against --backend and --shards.
  const auto refuse = [&app](const std::string& why) { return std::optional<int>(kevo_examples::refuse_command_line(app, why)); };
  if (!o.gpus.empty()) {
    if (o.backend == "cpu") return refuse("--gpus " + o.gpus + " names GPUs, and --backend cpu serves from the CPU");
    if (o.gpus != "all") {
      o.devices = *gpu_ordinals(o.gpus);  // the validator has taken it
      if (o.devices.size() > 64) return refuse("--gpus lists " + std::to_string(o.devices.size()) + " devices; 64 at most");
      if (o.shards != 1 && o.shards != o.devices.size())
        return refuse("--shards " + std::to_string(o.shards) + " with --gpus " + o.gpus + ": --gpus makes one shard per device listed (" +
                      std::to_string(o.devices.size()) + "), so --shards must be 1 or that");
    }
  }
  o.serving.request_deadline = ms(deadline_ms);
  o.drain = ms(drain_ms);
  o.serving.io_timeout = ms(io_timeout_ms);
  o.dtype = *embedding_type_named(dtype);  // the validator has taken it
  o.dtype_given = app.get_option("--dtype")->count() > 0;
  return std::nullopt;
}

/// One engine of the pool: the GPU backend where this build has CUDA and the machine a GPU (unless
/// --backend cpu), else the CPU one; null where --backend gpu (or --gpus) was asked for and no GPU
/// backend can be had (a server meant for a GPU should not quietly serve from the CPU). `device`:
/// the GPU to create it on and keep it on (-1: the current one, as without --gpus). `cpu_threads`:
/// the CPU engine's threads for one search.
std::unique_ptr<RetrievalBackend> make_engine(const Options& o, const Schema& schema, const Model& model, std::size_t capacity,
                                              int device, unsigned cpu_threads, bool quiet) {
  std::string why = "this build has no CUDA";
#if defined(KEVO_RETRIEVAL_SERVER_CUDA)
  if (o.backend != "cpu") {
    // The tuning file is read here, in host code (simdjson); the pipeline only calls the chooser.
    PolicyChooser choose_policy =
        o.tuning.empty() ? PolicyChooser{} : tuned_policies(o.tuning, *slot_order_named(o.load_order));  // checked by CLI11
    auto gpu = device < 0 ? make_cuda_backend(schema, model, capacity, std::move(choose_policy), why)
                          : make_cuda_backend_on(device, schema, model, capacity, std::move(choose_policy), why);
    if (gpu) return gpu;
  }
#else
  (void)capacity;
#endif
  if (o.backend == "gpu" || device >= 0) {
    std::fprintf(stderr, "%s: no GPU backend (%s)\n", device >= 0 ? ("--gpus " + o.gpus).c_str() : "--backend gpu", why.c_str());
    return nullptr;
  }
  if (!quiet && o.backend == "auto") std::fprintf(stderr, "no GPU backend (%s); serving from the CPU\n", why.c_str());
  if (!quiet && !o.tuning.empty())
    std::fprintf(stderr, "--tuning: the CPU backend runs no tuned kernels; %s is not used\n", o.tuning.c_str());
  return std::make_unique<CpuRetrievalBackend>(schema, model, cpu_threads);
}

/// The pool as /health and the start-up line name it: "3 shards of cpu", "2 shards of cuda on GPUs 0,0".
class NamedPool final : public RetrievalBackend {
 public:
  NamedPool(std::unique_ptr<ShardedBackend> pool, std::string name) : pool_(std::move(pool)), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  std::string kernel_policy() const override { return pool_->kernel_policy(); }
  const Schema& schema() const override { return pool_->schema(); }
  const Model& model() const override { return pool_->model(); }
  kevo::expected<std::vector<ScoredAd>, kevo::Error> search_checked(const CheckedRequest& request) override {
    return pool_->search_checked(request);
  }
  kevo::expected<std::vector<std::vector<ScoredAd>>, kevo::Error> search_batch_checked(std::span<const CheckedRequest> requests) override {
    return pool_->search_batch_checked(requests);
  }
  kevo::expected<void, kevo::Error> upsert(std::span<const AdRecord> ads) override { return pool_->upsert(ads); }
  kevo::expected<std::size_t, kevo::Error> expire(std::span<const std::uint32_t> ids) override { return pool_->expire(ids); }
  kevo::expected<void, kevo::Error> reindex() override { return pool_->reindex(); }
  kevo::expected<void, kevo::Error> regroup() override { return pool_->regroup(); }

 private:
  std::unique_ptr<ShardedBackend> pool_;
  std::string name_;
};

/// The serving engine: one engine as before where neither --shards (past 1) nor --gpus is given,
/// else the pool split over --shards engines, or one on each --gpus device, as a ShardedBackend.
/// Null, having said why, where an engine cannot be had.
std::unique_ptr<RetrievalBackend> make_backend(const Options& o, const Schema& schema, const Model& model) {
  constexpr std::size_t headroom = std::size_t{1} << 20;  // room for ads upserted while serving, over the whole pool
  const bool on_gpus = !o.devices.empty();
  const std::size_t count = on_gpus ? o.devices.size() : o.shards;
  if (count == 1 && !on_gpus) return make_engine(o, schema, model, o.ads + headroom, -1, default_thread_count(), false);
  // Each shard holds its share of the pool (ads are placed by a hash of the id, so the shares are
  // nearly even: 1% more covers the spread) and of the headroom; the total stays as one engine's.
  const std::size_t share = (o.ads + count - 1) / count;
  const std::size_t capacity = share + share / 100 + std::max<std::size_t>(headroom / count, 4096);
  // The CPU engines search all at once (ShardedBackend asks every shard together), so each takes its
  // share of the machine's threads, at least one: together they use what one engine would.
  const unsigned cpu_threads = std::max(1u, default_thread_count() / static_cast<unsigned>(count));
  std::vector<std::unique_ptr<RetrievalBackend>> engines;
  for (std::size_t i = 0; i < count; ++i) {
    auto engine = make_engine(o, schema, model, capacity, on_gpus ? o.devices[i] : -1, cpu_threads, i > 0);
    if (!engine) return nullptr;
    engines.push_back(std::move(engine));
  }
  auto pool = ShardedBackend::create(std::move(engines));
  if (!pool) return std::fprintf(stderr, "%s\n", pool.error().message.c_str()), nullptr;
  std::string name = std::to_string(count) + (count == 1 ? " shard of " : " shards of ") + (*pool)->shard(0).name();
  if (on_gpus) {
    name += o.devices.size() == 1 ? " on GPU " : " on GPUs ";
    for (std::size_t i = 0; i < o.devices.size(); ++i) name += (i ? "," : "") + std::to_string(o.devices[i]);
  }
  return std::make_unique<NamedPool>(std::move(*pool), std::move(name));
}

/// Binds and listens on host:port, or says why not (a port in use).
std::optional<std::string> listen(boost::asio::ip::tcp::acceptor& acceptor, const std::string& host, unsigned short port) {
  boost::system::error_code ec;
  const boost::asio::ip::tcp::endpoint endpoint(boost::asio::ip::make_address(host), port);
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(boost::asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(boost::asio::socket_base::max_listen_connections, ec);
  if (ec) return ec == boost::asio::error::address_in_use ? "the address is in use (" + ec.message() + ")" : ec.message();
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (auto stop = parse(argc, argv, o)) return *stop;
  // The port first: one in use is reported at once, not after loading every ad.
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor acceptor(io);
  if (auto why = listen(acceptor, o.host, o.port))
    return std::fprintf(stderr, "retrieval_server: cannot listen on %s:%u: %s\n", o.host.c_str(), o.port, why->c_str()), 2;
#if defined(KEVO_RETRIEVAL_SERVER_CUDA)
  // A GPU asked for where no driver or device is: a named stop, exit 2, before any work.
  if (o.backend == "gpu" || !o.gpus.empty())
    if (auto here = kevo::nvidia_device_present(); !here)
      return std::fprintf(stderr, "retrieval_server: %s: %s\n", o.backend == "gpu" ? "--backend gpu" : ("--gpus " + o.gpus).c_str(),
                          here.error().message.c_str()), 2;
#endif
  if (o.gpus == "all" || !o.devices.empty()) {  // the devices, against this machine's
#if defined(KEVO_RETRIEVAL_SERVER_CUDA)
    const int count = cuda_device_count();
    const char* none = "no GPU on this machine";
#else
    const int count = 0;
    const char* none = "this build has no CUDA";
#endif
    if (count == 0) return std::fprintf(stderr, "retrieval_server: --gpus %s: no GPU backend (%s)\n", o.gpus.c_str(), none), 2;
    if (o.gpus == "all") {
      for (int d = 0; d < std::min(count, 64); ++d) o.devices.push_back(d);
      if (o.shards != 1 && o.shards != o.devices.size())
        return std::fprintf(stderr, "retrieval_server: --shards %u with --gpus all: this machine has %zu GPUs, so --shards must be 1 or %zu\n",
                            o.shards, o.devices.size(), o.devices.size()), 2;
    }
    for (int d : o.devices)
      if (d >= count)
        return std::fprintf(stderr, "retrieval_server: --gpus %s: there is no GPU %d; this machine has %d (0 to %d)\n", o.gpus.c_str(), d,
                            count, count - 1), 2;
  }
  std::optional<AdFileReader> file;
  if (!o.ads_file.empty()) {
    auto opened = AdFileReader::open(o.ads_file);
    if (!opened) return std::fprintf(stderr, "%s\n", opened.error().message.c_str()), 1;
    file.emplace(std::move(*opened));
    o.ads = file->size();
    // The pool takes the dtype the file records; a file written before files recorded one takes --dtype.
    if (const std::optional<EmbeddingType> recorded = file->recorded_embedding_type()) {
      if (o.dtype_given && o.dtype != *recorded)
        return std::fprintf(stderr, "retrieval_server: --dtype %s, but %s records embedding_type %s: give --dtype %s or leave it out\n",
                            to_string(o.dtype), o.ads_file.c_str(), to_string(*recorded), to_string(*recorded)), 2;
      o.dtype = *recorded;
    }
  }
  WorkloadOptions shape{.seed = o.seed, .embedding_type = o.dtype};
  if (file) shape.dim = file->schema().dim;  // the workload's model, where no --model is given, takes the file's d
  Model model;
  if (!o.model.empty()) {
    auto loaded = load_model(o.model);
    if (!loaded) return std::fprintf(stderr, "%s\n", loaded.error().message.c_str()), 1;
    model = std::move(*loaded);
    shape.dim = model.dim, shape.features = model.features, shape.hidden = model.hidden, shape.experts = model.experts;
  }
  const Workload workload(shape);
  if (o.model.empty()) model = workload.model();
  Schema schema = workload.schema();
  if (file) {
    schema = file->schema();
    schema.embedding_type = o.dtype;
    if (schema.dim != model.dim)
      return std::fprintf(stderr, "%s holds d = %d, the model takes d = %d\n", o.ads_file.c_str(), schema.dim, model.dim), 1;
  }
  // What every engine's create checks (a pool of int8_group32 needs d in whole groups of 32), said once, before any is made.
  if (auto ok = CpuRetrievalBackend::check(schema, model); !ok)
    return std::fprintf(stderr, "retrieval_server: %s (--dtype %s)\n", ok.error().message.c_str(), to_string(schema.embedding_type)), 1;
  std::unique_ptr<RetrievalBackend> backend = make_backend(o, schema, model);
  if (!backend) return 1;
  if (const std::string policy = backend->kernel_policy(); !policy.empty()) std::fprintf(stderr, "kernel policy: %s\n", policy.c_str());
  std::vector<AdRecord> generated;  // kept only for --save-ads, in the order loaded
  // Upserts of 10,000 ads. With --load-order targeting, each chunk of 2^18 ads is handed over grouped
  // by targeting first: a new ad takes the next free slot, so the grouping is the slots'.
  constexpr std::uint64_t kUpsert = 10000;
  const std::uint64_t chunk = o.load_order == "targeting" ? std::uint64_t{1} << 18 : kUpsert;
  for (std::uint64_t begin = 0; begin < o.ads; begin += chunk) {
    const std::uint64_t end = std::min(o.ads, begin + chunk);
    std::vector<AdRecord> ads;
    for (std::uint64_t first = begin; first < end; first += kUpsert) {
      const std::uint64_t count = std::min(kUpsert, end - first);
      if (file) {
        auto slice = file->read(first, count);
        if (!slice) return std::fprintf(stderr, "%s\n", slice.error().message.c_str()), 1;
        ads.insert(ads.end(), std::make_move_iterator(slice->begin()), std::make_move_iterator(slice->end()));
      } else {
        for (std::uint64_t i = first; i < first + count; ++i) ads.push_back(workload.ad(i));
      }
    }
    if (o.load_order == "targeting") {
      std::vector<AdRecord> grouped;
      grouped.reserve(ads.size());
      for (std::size_t i : targeting_order(ads)) grouped.push_back(std::move(ads[i]));
      ads = std::move(grouped);
    }
    for (std::size_t first = 0; first < ads.size(); first += kUpsert)
      if (auto ok = backend->upsert(std::span<const AdRecord>(ads).subspan(first, std::min<std::size_t>(kUpsert, ads.size() - first))); !ok)
        return std::fprintf(stderr, "%s\n", ok.error().message.c_str()), 1;
    if (!o.save_ads.empty())
      generated.insert(generated.end(), std::make_move_iterator(ads.begin()), std::make_move_iterator(ads.end()));
  }
  if (!o.save_ads.empty())
    if (auto ok = save_ads(schema, generated, o.save_ads); !ok) return std::fprintf(stderr, "%s\n", ok.error().message.c_str()), 1;
  if (auto ok = backend->reindex(); !ok) return std::fprintf(stderr, "%s\n", ok.error().message.c_str()), 1;

  // Searches arriving on several threads while the engine is busy are answered as one batch.
  BatchingBackend batched(*backend, {.max_batch = o.batch});
  RetrievalBackend& serving = o.batch > 1 ? static_cast<RetrievalBackend&>(batched) : *backend;
  RetrievalHttpServer server(io, serving, std::move(acceptor), o.serving);
  server.start();
  // SIGTERM or SIGINT: stop accepting, answer new requests 503, finish what is queued up to
  // --drain-ms, then exit 0 (at once, at the deadline, whatever still runs).
  bool finished = true;
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](boost::system::error_code ec, int) {
    if (ec) return;
    std::fprintf(stderr, "draining (up to %lld ms)\n", static_cast<long long>(o.drain.count()));
    server.drain(o.drain, [&](bool all) { finished = all; io.stop(); });
  });
  std::printf("serving %llu ads (%s) on http://%s:%u with the %s backend, slots in %s order\n", static_cast<unsigned long long>(o.ads),
              to_string(schema.embedding_type), o.host.c_str(), static_cast<unsigned>(server.port()), backend->name().c_str(),
              o.load_order.c_str());
  std::fflush(stdout);
  std::vector<std::thread> threads;
  for (unsigned t = 1; t < o.threads; ++t) threads.emplace_back([&] { io.run(); });
  io.run();
  for (auto& t : threads) t.join();
  std::fprintf(stderr, finished ? "drained\n" : "drain deadline passed; exiting with work unfinished\n");
  std::fflush(nullptr);
  if (!finished) std::_Exit(0);  // a search still running is not waited for
  return 0;
}
