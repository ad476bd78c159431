// retrieval_server: kevo's fused retrieval pipeline behind HTTP.
//
// It loads a model (a safetensors file, or the workload's own), fills the ad pool from an ad file
// (ad_file.hpp) or with the spec's synthetic workload, and serves top-K requests and real-time ad updates as JSON over HTTP
// (kevo/retrieval/serving.hpp lists the endpoints). It runs on the GPU where one exists and on the
// CPU reference elsewhere; the GPU backend comes from cuda_backend.cu beside this file, a separate
// translation unit because Boost.Beast does not compile under nvcc:
//
//   retrieval_server --port 8080 --ads 1000000 [--dtype int8] [--save-ads pool.safetensors]
//   retrieval_server --port 8080 --ads-file pool.safetensors --model model.safetensors
//   retrieval_server --port 8080 --search-threads 8 --max-queue 1024 --deadline-ms 30000 --drain-ms 10000
//   curl -s localhost:8080/search -d '{"features":[...256 floats...],"query":[{"category":0,"values":[1]}],"k":10}'
#include <kevo/retrieval/retrieval.hpp>
#include <kevo/retrieval/serving.hpp>
#include <kevo/retrieval/tuning/tuning_file.hpp>

#include <boost/asio/signal_set.hpp>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <iterator>
#include <optional>
#include <string>
#include <thread>

using namespace kevo::retrieval;

#if defined(KEVO_RETRIEVAL_SERVER_CUDA)
namespace kevo::retrieval {
// In cuda_backend.cu: the GPU backend, or nullptr with the reason in `why` (no GPU, no memory).
std::unique_ptr<RetrievalBackend> make_cuda_backend(const Schema& schema, const Model& model, std::size_t capacity,
                                                    PolicyChooser choose_policy, std::string& why);
}  // namespace kevo::retrieval
#endif

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
  unsigned threads = 4;   // I/O threads: read, parse, write
  std::size_t batch = 8;  // concurrent searches answered together (1: one at a time)
  EmbeddingType dtype = EmbeddingType::fp16;
  ServingOptions serving;
  std::chrono::milliseconds drain{10000};  // on SIGTERM: how long queued work may still run
};

constexpr const char* kUsage =
    "usage: %s [--host 127.0.0.1] [--port 8080] [--ads 100000] [--seed 1] "
    "[--model FILE.safetensors] [--ads-file FILE.safetensors | --save-ads FILE.safetensors] "
    "[--backend auto|cpu|gpu] [--tuning kevo-tuning.json] [--threads 4] [--batch 8] [--dtype fp16|int8] [--search-threads 8] "
    "[--max-queue 1024] [--deadline-ms 30000] [--drain-ms 10000] [--max-connections 1024] "
    "[--max-body-bytes 67108864] [--max-body-bytes-in-flight 1073741824] [--io-timeout-ms 10000]\n";

/// `text` as a whole decimal number in [least, most], or a message naming the flag.
std::optional<std::string> number(const std::string& flag, const char* text, std::uint64_t least, std::uint64_t most,
                                  std::uint64_t& out) {
  const char* end = text + std::strlen(text);
  const auto [at, ec] = std::from_chars(text, end, out);
  if (ec != std::errc() || at != end || *text == '\0' || out < least || out > most)
    return flag + " takes a whole number from " + std::to_string(least) + " to " + std::to_string(most) + ", not '" +
           text + "'";
  return std::nullopt;
}

/// The flags, or the reason they are refused (usage, or a flag's message).
std::optional<std::string> parse(int argc, char** argv, Options& o) {
  using ms = std::chrono::milliseconds;
  constexpr std::uint64_t most = std::numeric_limits<std::uint32_t>::max();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return std::string("usage");
    const char* v = argv[++i];
    std::uint64_t n = 0;
    auto take = [&](std::uint64_t least, std::uint64_t top) { return number(a, v, least, top, n); };
    std::optional<std::string> bad;
    if (a == "--host") {
      boost::system::error_code ec;
      boost::asio::ip::make_address(v, ec);
      if (ec) return "--host takes an IP address, not '" + std::string(v) + "'";
      o.host = v;
    } else if (a == "--port") { if (!(bad = take(0, 65535))) o.port = static_cast<unsigned short>(n); }
    else if (a == "--ads") { if (!(bad = take(0, most))) o.ads = n; }
    else if (a == "--seed") { if (!(bad = take(0, std::numeric_limits<std::uint64_t>::max()))) o.seed = n; }
    else if (a == "--model") o.model = v;
    else if (a == "--ads-file") o.ads_file = v;
    else if (a == "--save-ads") o.save_ads = v;
    else if (a == "--tuning") {
      if (!std::filesystem::is_regular_file(v)) return "--tuning names no file: '" + std::string(v) + "'";
      o.tuning = v;
    }
    else if (a == "--backend" && (std::strcmp(v, "auto") == 0 || std::strcmp(v, "cpu") == 0 || std::strcmp(v, "gpu") == 0)) o.backend = v;
    else if (a == "--threads") { if (!(bad = take(1, 1024))) o.threads = static_cast<unsigned>(n); }
    else if (a == "--batch") { if (!(bad = take(1, 4096))) o.batch = n; }
    else if (a == "--dtype" && (std::strcmp(v, "fp16") == 0 || std::strcmp(v, "int8") == 0))
      o.dtype = std::strcmp(v, "int8") == 0 ? EmbeddingType::int8 : EmbeddingType::fp16;
    else if (a == "--search-threads") { if (!(bad = take(1, 1024))) o.serving.search_threads = static_cast<unsigned>(n); }
    else if (a == "--max-queue") { if (!(bad = take(1, most))) o.serving.max_queued = n; }
    else if (a == "--deadline-ms") { if (!(bad = take(1, most))) o.serving.request_deadline = ms(n); }
    else if (a == "--drain-ms") { if (!(bad = take(0, most))) o.drain = ms(n); }
    else if (a == "--io-timeout-ms") { if (!(bad = take(1, most))) o.serving.io_timeout = ms(n); }
    else if (a == "--max-connections") { if (!(bad = take(1, most))) o.serving.max_connections = n; }
    else if (a == "--max-body-bytes") { if (!(bad = take(1, std::uint64_t{1} << 40))) o.serving.max_body_bytes = n; }
    else if (a == "--max-body-bytes-in-flight") { if (!(bad = take(1, std::uint64_t{1} << 48))) o.serving.max_body_bytes_in_flight = n; }
    else return std::string("usage");
    if (bad) return bad;
  }
  return std::nullopt;
}

/// The GPU backend where this build has CUDA and the machine a GPU (unless --backend cpu), else the
/// CPU one; null where --backend gpu was asked for and no GPU backend can be had (a server meant for
/// a GPU should not quietly serve from the CPU).
std::unique_ptr<RetrievalBackend> make_backend(const Options& o, const Schema& schema, const Model& model) {
  std::string why = "this build has no CUDA";
#if defined(KEVO_RETRIEVAL_SERVER_CUDA)
  if (o.backend != "cpu") {
    // The tuning file is read here, in host code (simdjson); the pipeline only calls the chooser.
    PolicyChooser choose_policy = o.tuning.empty() ? PolicyChooser{} : tuned_policies(o.tuning);
    if (auto gpu = make_cuda_backend(schema, model, o.ads + (1u << 20), std::move(choose_policy), why)) return gpu;
  }
#endif
  if (o.backend == "gpu") {
    std::fprintf(stderr, "--backend gpu: no GPU backend (%s)\n", why.c_str());
    return nullptr;
  }
  if (o.backend == "auto") std::fprintf(stderr, "no GPU backend (%s); serving from the CPU\n", why.c_str());
  if (!o.tuning.empty()) std::fprintf(stderr, "--tuning: the CPU backend runs no tuned kernels; %s is not used\n", o.tuning.c_str());
  return std::make_unique<CpuRetrievalBackend>(schema, model);
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
  if (auto refused = parse(argc, argv, o)) {
    if (*refused != "usage") std::fprintf(stderr, "retrieval_server: %s\n", refused->c_str());
    std::fprintf(stderr, kUsage, argv[0]);
    return 2;
  }
  if (!o.ads_file.empty() && !o.save_ads.empty()) return std::fprintf(stderr, "--ads-file and --save-ads exclude each other\n"), 2;
  // The port first: one in use is reported at once, not after loading every ad.
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor acceptor(io);
  if (auto why = listen(acceptor, o.host, o.port))
    return std::fprintf(stderr, "retrieval_server: cannot listen on %s:%u: %s\n", o.host.c_str(), o.port, why->c_str()), 2;
  std::optional<AdFileReader> file;
  if (!o.ads_file.empty()) {
    auto opened = AdFileReader::open(o.ads_file);
    if (!opened) return std::fprintf(stderr, "%s\n", opened.error().message.c_str()), 1;
    file.emplace(std::move(*opened));
    o.ads = file->size();
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
  std::unique_ptr<RetrievalBackend> backend = make_backend(o, schema, model);
  if (!backend) return 1;
  if (const std::string policy = backend->kernel_policy(); !policy.empty()) std::fprintf(stderr, "kernel policy: %s\n", policy.c_str());
  std::vector<AdRecord> generated;  // kept only for --save-ads
  for (std::uint64_t begin = 0; begin < o.ads; begin += 10000) {
    std::vector<AdRecord> batch;
    if (file) {
      auto slice = file->read(begin, 10000);
      if (!slice) return std::fprintf(stderr, "%s\n", slice.error().message.c_str()), 1;
      batch = std::move(*slice);
    } else {
      for (std::uint64_t i = begin; i < std::min(o.ads, begin + 10000); ++i) batch.push_back(workload.ad(i));
    }
    if (auto ok = backend->upsert(std::span<const AdRecord>(batch.data(), batch.size())); !ok)
      return std::fprintf(stderr, "%s\n", ok.error().message.c_str()), 1;
    if (!o.save_ads.empty())
      generated.insert(generated.end(), std::make_move_iterator(batch.begin()), std::make_move_iterator(batch.end()));
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
  std::printf("serving %llu ads on http://%s:%u with the %s backend\n", static_cast<unsigned long long>(o.ads),
              o.host.c_str(), static_cast<unsigned>(server.port()), backend->name().c_str());
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
