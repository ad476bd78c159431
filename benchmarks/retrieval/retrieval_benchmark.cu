// retrieval_benchmark: each stage of the fused retrieval pipeline and the whole pipeline on one GPU,
// as throughput and as a fraction of the streaming-read roofline measured in the same run.
//
//   retrieval_benchmark [--n 100000000] [--quick]     (prints markdown tables; run on the device)
#include <algorithm>
#include <array>
#include <bit>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <numeric>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kevo/gpu_presence.hpp"
#include "kevo/retrieval/dispatch/cuda_backend.cuh"
#include "kevo/retrieval/dispatch/fused_retrieval_pipeline.cuh"
#include "kevo/retrieval/retrieval.hpp"
#include "kevo/retrieval/shard_placement.hpp"
#include "kevo/retrieval/tuning/pipeline_bench.cuh"  // the synthetic pool: targeting and embeddings
#include "sharded_bench.hpp"

using namespace kevo::retrieval;

namespace {

#define CHECK_OK(expr)                                                            \
  do {                                                                            \
    auto&& check_ok_result = (expr);                                              \
    if (!check_ok_result) {                                                       \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, check_ok_result.error().message.c_str()); \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Sum of 16-byte loads over a buffer: the streaming-read roofline.
__global__ void stream_read(const uint4* data, std::size_t count, unsigned* sink) {
  unsigned acc = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    const uint4 v = gpu_load_streaming(data + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads alive
}

/// The memory side of scoring alone: reads the rows and biases of the `*count` slots of `list`
/// in the order scoring does and writes one word per ad, with no arithmetic. Its speed over the
/// request's eligible list is the ceiling for scoring's gather. The variants tell its costs apart:
/// loads that ask L2 for the whole 256-byte block, no bias read, one word written per thread
/// instead of per ad (kept only to keep the loads alive). (Bools, not a struct: nvcc's kernel
/// stubs cannot name a class-type template argument.)
template <bool WholeBlockFetch = false, bool Bias = true, bool WordPerAd = true>
__global__ void gather_probe(IndexView index, const std::uint32_t* list, const std::uint32_t* count,
                             int row_pieces_log2, int side_width, std::uint32_t* out) {
  const int row_pieces = 1 << row_pieces_log2;
  const std::uint64_t pieces = static_cast<std::uint64_t>(*count) * row_pieces;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  std::uint32_t folded = 0;
  for (std::uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < pieces; i += 4 * stride) {
    uint4 v[4];
    float b[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const std::uint64_t at = i + u * stride;
      const std::uint32_t slot = at < pieces ? list[at >> row_pieces_log2] : 0u;
      const uint4* piece = static_cast<const uint4*>(index.embeddings) + (static_cast<std::uint64_t>(slot) << row_pieces_log2) +
                           (at & (row_pieces - 1));
      v[u] = at < pieces ? gpu_load_streaming<WholeBlockFetch ? 256 : 0>(piece) : make_uint4(0, 0, 0, 0);
      b[u] = Bias && at < pieces && (at & (row_pieces - 1)) == 0 ? index.side[static_cast<std::uint64_t>(slot) * side_width] : 0.0f;  // the bias (int8: its scale shares the sector)
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const std::uint64_t at = i + u * stride;
      const std::uint32_t word = v[u].x ^ v[u].w ^ __float_as_uint(b[u]);
      if (!WordPerAd) folded ^= word;
      else if (at < pieces && (at & (row_pieces - 1)) == 0) out[at >> row_pieces_log2] = word;
    }
  }
  if (!WordPerAd && folded == 0x9e3779b9u) out[0] = folded;  // keeps the loads alive
}

/// The no-word gather probe with each warp holding `Loads` loads of two rows in flight, those rows
/// either consecutive in the list (2 Loads rows in a run, as a scoring warp's pair of tiles) or
/// spread: load u of warp w takes rows 2 (w + u W), 2 (w + u W) + 1 of each round (W = warps).
/// Same bytes, same loads in flight; only where one warp's rows lie relative to each other differs.
template <int Loads, bool Spread>
__global__ void gather_probe_pattern(IndexView index, const std::uint32_t* list, const std::uint32_t* count,
                                     int side_width, std::uint32_t* out) {
  const std::uint32_t listed = *count;
  const int lane = static_cast<int>(threadIdx.x % 32), half = lane / 16, piece = lane % 16;  // fp16 rows: 16 pieces
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  std::uint32_t folded = 0;
  for (std::uint64_t round = 0; round * warps * 2 * Loads < listed; ++round) {
    uint4 v[Loads];
    float b[Loads];
#pragma unroll
    for (int u = 0; u < Loads; ++u) {
      const std::uint64_t pair = Spread ? round * warps * Loads + warp + u * warps : (round * warps + warp) * Loads + u;
      const std::uint64_t row = 2 * pair + half;
      const bool valid = row < listed;
      const std::uint32_t slot = valid ? list[row] : 0u;
      v[u] = valid ? gpu_load_streaming(static_cast<const uint4*>(index.embeddings) + 16 * static_cast<std::uint64_t>(slot) + piece)
                   : make_uint4(0, 0, 0, 0);
      b[u] = valid && piece == 0 ? index.side[static_cast<std::uint64_t>(slot) * side_width] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < Loads; ++u) folded ^= v[u].x ^ v[u].w ^ __float_as_uint(b[u]);
  }
  if (folded == 0x9e3779b9u) out[0] = folded;  // keeps the loads alive
}

/// The gather probe (fp16 rows and biases, nothing computed) with the rows copied into shared
/// memory instead of registers: by cp.async, 16 bytes a lane (`Bulk` false), or by one bulk copy a
/// row through the TMA unit (cp.async.bulk, completing on an mbarrier). Each warp copies
/// RowsPerWarp listed rows a round, consecutive or as pairs a grid of warps apart (`Spread`), waits
/// for them and folds a word of each; with Stages > 1 (cp.async only) the rounds go through a ring,
/// the next Stages - 1 rounds in flight while one is folded. Blocks of 256 threads; Stages *
/// RowsPerWarp * 2 KB of dynamic shared memory a block.
template <int RowsPerWarp, bool Bulk, bool Spread, int Stages = 1>
__global__ void gather_probe_shared(IndexView index, const std::uint32_t* list, const std::uint32_t* count,
                                    std::uint32_t* out) {
  static_assert(Stages == 1 || !Bulk, "the bulk copies wait round by round");
  extern __shared__ uint4 probe_rows[];
  __shared__ alignas(8) std::uint64_t barriers[8];
  const std::uint32_t listed = *count;
  const int lane = static_cast<int>(threadIdx.x % 32), warp_in_block = static_cast<int>(threadIdx.x / 32);
  uint4* rows = probe_rows + warp_in_block * Stages * RowsPerWarp * 16;
  const std::uint64_t warps = static_cast<std::uint64_t>(gridDim.x) * blockDim.x / 32;
  const std::uint64_t warp = (blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const auto barrier = static_cast<std::uint32_t>(__cvta_generic_to_shared(&barriers[warp_in_block]));
  if (Bulk && lane == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(barrier));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::);
  }
  __syncthreads();
  std::uint32_t folded = 0, phase = 0;
  // cp.async through a ring of Stages rounds: round q's copies are one commit group in stage q % Stages.
  auto position_in = [&](std::uint64_t round, int r) -> std::uint64_t {
    return Spread ? 2 * ((round * (RowsPerWarp / 2) + r / 2) * warps + warp) + (r & 1)
                  : (round * warps + warp) * RowsPerWarp + r;
  };
  auto issue = [&](std::uint64_t round) {
    uint4* stage = rows + (round % Stages) * RowsPerWarp * 16;
    for (int piece = lane; piece < RowsPerWarp * 16; piece += 32) {
      const std::uint64_t at = position_in(round, piece / 16);
      const bool valid = at < listed;
      const std::uint32_t slot = valid ? list[at] : 0u;
      gpu_copy_async_16(stage + piece, static_cast<const uint4*>(index.embeddings) + 16ull * slot + piece % 16,
                        valid ? 16u : 0u);
      if (piece % 16 == 0 && valid) folded ^= __float_as_uint(__ldg(index.side + slot));
    }
    gpu_copy_async_commit();
  };
  if constexpr (!Bulk)
    for (int q = 0; q < Stages - 1; ++q) issue(q);
  for (std::uint64_t round = 0; round * warps * RowsPerWarp < listed; ++round) {
    if constexpr (Bulk) {
      std::uint32_t valid_rows = 0;
      for (int r = 0; r < RowsPerWarp; ++r) valid_rows += position_in(round, r) < listed;
      if (lane == 0) {
        std::uint64_t state;
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], %2;\n"
                     : "=l"(state) : "r"(barrier), "r"(valid_rows * 256u));
      }
      __syncwarp();
      for (int r = lane; r < RowsPerWarp; r += 32) {
        const std::uint64_t at = position_in(round, r);
        if (at >= listed) continue;
        const std::uint32_t slot = list[at];
        const auto dst = static_cast<std::uint32_t>(__cvta_generic_to_shared(rows + 16 * r));
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 256, [%2];\n"
                     ::"r"(dst), "l"(static_cast<const char*>(index.embeddings) + 256ull * slot), "r"(barrier) : "memory");
        folded ^= __float_as_uint(__ldg(index.side + slot));
      }
      std::uint32_t done = 0;
      while (!done)
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(barrier), "r"(phase) : "memory");
      phase ^= 1u;
    } else {
      issue(round + Stages - 1);  // into the stage the previous round read
      gpu_copy_async_wait<Stages - 1>();
      __syncwarp();
    }
    const uint4* stage = rows + (round % Stages) * RowsPerWarp * 16;
    for (int r = lane; r < RowsPerWarp; r += 32) folded ^= stage[16 * r].x ^ stage[16 * r + 15].w;
    __syncwarp();
    if constexpr (Bulk) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // reads before the next copies
  }
  if (folded == 0x9e3779b9u) out[0] = folded;  // keeps the loads alive
}

/// list[i] = i * step for i < count: evenly spaced slots for the probe.
__global__ void fill_spaced_slots(std::uint32_t* list, std::uint32_t count, std::uint32_t step) {
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) list[i] = i * step;
}

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    cudaEventCreate(&a);
    cudaEventCreate(&b);
  }
  ~Timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
};

/// One pool on the device: the pipeline plus what the roofline counts need to know about it.
struct Pool {
  std::unique_ptr<FusedRetrievalPipeline> pipeline;
  void* temp = nullptr;  // search temp storage, sized for this pool's layout
  std::size_t temp_bytes = 0;
  void ensure_temp() {
    if (pipeline->search_temp_bytes() <= temp_bytes) return;
    if (temp) cudaFree(temp);
    temp_bytes = pipeline->search_temp_bytes();
    KEVO_GPU_ASSERT(cudaMalloc(&temp, temp_bytes));
  }
  Pool() = default;
  Pool(Pool&& o) noexcept : pipeline(std::move(o.pipeline)), temp(o.temp), temp_bytes(o.temp_bytes),
                            targeting(o.targeting), n(o.n) { o.temp = nullptr; }
  ~Pool() { if (temp) cudaFree(temp); }
  const std::vector<PackedAds>* targeting = nullptr;  // the ads' targeting, 1M ads per entry
  std::uint64_t n = 0;
};

/// Postings that matching must read for `request` over the first `slots` ads: the clauses of live
/// ads that name a value the user holds (what the inverted index lists under the query's bits).
double matched_postings(const Pool& pool, const Request& request, std::uint64_t slots) {
  const Schema& schema = pool.pipeline->schema();
  std::vector<std::vector<bool>> held(schema.category_values.size());
  for (std::size_t c = 0; c < held.size(); ++c) held[c].assign(schema.category_values[c], false);
  for (const CategoryQuery& q : request.query)
    for (std::uint32_t v : q.values) held[q.category][v] = true;
  const std::vector<PackedAds>& batches = *pool.targeting;
  std::vector<std::uint64_t> matched(batches.size(), 0);
  std::vector<std::thread> workers;
  for (std::size_t b = 0; b < batches.size(); ++b)  // one thread per 1M-ad batch: 100 at N = 100M
    workers.emplace_back([&, b] {
      const PackedAds& ads = batches[b];
      const std::uint64_t first = b << 20;
      for (std::size_t i = 0; i < ads.size() && first + i < slots; ++i)
        if (ads.live[i])
          for (std::uint32_t k = ads.clause_begin[i]; k < ads.clause_begin[i + 1]; ++k)
            matched[b] += held[clause_bits::category(ads.clauses[k])][clause_bits::value(ads.clauses[k])];
    });
  for (auto& w : workers) w.join();
  return static_cast<double>(std::accumulate(matched.begin(), matched.end(), std::uint64_t{0}));
}

Pool build_pool(const Workload& w, std::uint64_t n, std::uint64_t embedding_seed, std::vector<PackedAds>* cache,
                std::size_t clauses_per_slot = 8, SlotOrder order = SlotOrder::by_id) {
  Pool pool;
  pool.n = n;
  pool.targeting = cache;
  const auto a = std::chrono::steady_clock::now();
  auto built = build_synthetic_pool(w, n, embedding_seed, cache, clauses_per_slot, order);
  CHECK_OK(built);
  pool.pipeline = std::move(built->pipeline);
  std::printf("built a pool of %llu ads in %.1f ms (%zu left to walk their clause runs)\n", static_cast<unsigned long long>(n),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count() * 1e3, pool.pipeline->index().unindexed_count());
  pool.ensure_temp();
  return pool;
}

struct StageTimes {
  double prepare = 0, matching = 0, scoring = 0, topk = 0, total = 0;
  std::uint32_t eligible = 0;
};

/// Runs the stages of one request `repeats` times over the first `slots` slots; medians per stage.
StageTimes time_stages(Pool& pool, const Request& request, std::uint64_t slots, int repeats, SearchOutput out,
                       cudaStream_t stream) {
  FusedRetrievalPipeline& p = *pool.pipeline;
  pool.ensure_temp();
  void* temp = pool.temp;
  auto lock = p.index().search_lock();
  auto view = p.index().before_search(stream);
  CHECK_OK(view);
  view->slots = static_cast<std::uint32_t>(slots);
  cudaEvent_t e[5];
  for (auto& x : e) cudaEventCreate(&x);
  std::vector<double> t[5];
  for (int r = 0; r < repeats + 2; ++r) {
    cudaEventRecord(e[0], stream);
    CHECK_OK(p.enqueue_prepare(check_request(p.schema(), p.model(), request).value(), temp, stream));
    cudaEventRecord(e[1], stream);
    CHECK_OK(p.enqueue_matching(*view, temp, stream));
    cudaEventRecord(e[2], stream);
    CHECK_OK(p.enqueue_scoring(*view, temp, request.routing, stream));
    cudaEventRecord(e[3], stream);
    CHECK_OK(p.enqueue_topk(*view, temp, request.k, out, stream));
    cudaEventRecord(e[4], stream);
    KEVO_GPU_ASSERT(cudaEventSynchronize(e[4]));
    if (r < 2) continue;  // warm-up
    for (int s = 0; s < 4; ++s) {
      float ms;
      cudaEventElapsedTime(&ms, e[s], e[s + 1]);
      t[s].push_back(ms * 1e-3);
    }
    float ms;
    cudaEventElapsedTime(&ms, e[0], e[4]);
    t[4].push_back(ms * 1e-3);
  }
  CHECK_OK(p.index().after_search(stream));
  for (auto& x : e) cudaEventDestroy(x);
  StageTimes st{median(t[0]), median(t[1]), median(t[2]), median(t[3]), median(t[4]), 0};
  std::uint32_t count;
  KEVO_GPU_ASSERT(cudaMemcpy(&count, static_cast<unsigned char*>(temp) + p.temp_layout().state, 4, cudaMemcpyDeviceToHost));
  st.eligible = count;
  return st;
}

/// Median seconds of `repeats` runs of `enqueue()` on `stream` (after two warm-up runs), by events.
template <class Enqueue>
double median_seconds(int repeats, cudaStream_t stream, Enqueue enqueue) {
  Timer t;
  std::vector<double> times;
  for (int r = 0; r < repeats + 2; ++r) {
    cudaEventRecord(t.a, stream);
    enqueue();
    cudaEventRecord(t.b, stream);
    cudaEventSynchronize(t.b);
    float ms;
    cudaEventElapsedTime(&ms, t.a, t.b);
    if (r >= 2) times.push_back(ms * 1e-3);
  }
  KEVO_GPU_ASSERT(cudaGetLastError());
  return median(times);
}

/// Runs body(view, temp) with `request` prepared and matched over the first `slots` slots, inside
/// the index's search lock (as search_async would), and returns what it returns.
template <class Body>
auto with_matched_request(Pool& pool, const Request& request, std::uint64_t slots, cudaStream_t stream, Body body) {
  FusedRetrievalPipeline& p = *pool.pipeline;
  pool.ensure_temp();
  auto lock = p.index().search_lock();
  auto view = p.index().before_search(stream);
  CHECK_OK(view);
  view->slots = static_cast<std::uint32_t>(slots);
  CHECK_OK(p.enqueue_prepare(check_request(p.schema(), p.model(), request).value(), pool.temp, stream));
  CHECK_OK(p.enqueue_matching(*view, pool.temp, stream));
  auto result = body(*view, static_cast<unsigned char*>(pool.temp));
  CHECK_OK(p.index().after_search(stream));
  return result;
}

/// Scoring alone, run back to back (no top-K), for the "top-K adds at most 10%" comparison.
double time_scoring_only(Pool& pool, const Request& request, std::uint64_t slots, int repeats, cudaStream_t stream) {
  return with_matched_request(pool, request, slots, stream, [&](const IndexView& view, unsigned char* temp) {
    return median_seconds(repeats, stream, [&] {
      CHECK_OK(pool.pipeline->enqueue_scoring(view, temp, request.routing, stream));
    });
  });
}

/// The gather probe over the request's eligible list (after matching), back to back; with
/// `WholeBlockFetch`, each load's miss asks L2 for the whole 256-byte block around it.
template <bool WholeBlockFetch = false>
double time_gather_probe(Pool& pool, const Request& request, std::uint64_t slots, int repeats, cudaStream_t stream) {
  FusedRetrievalPipeline& p = *pool.pipeline;
  const SearchTempLayout& l = p.temp_layout();
  const int pieces_log2 = std::countr_zero(p.index().row_bytes() / 16);
  return with_matched_request(pool, request, slots, stream, [&](const IndexView& view, unsigned char* temp) {
    return median_seconds(repeats, stream, [&] {
      gather_probe<WholeBlockFetch><<<p.multiprocessors() * 8, 256, 0, stream>>>(
          view, reinterpret_cast<const std::uint32_t*>(temp + l.eligible),
          reinterpret_cast<const std::uint32_t*>(temp + l.state + offsetof(TopKState, eligible_count)), pieces_log2,
          p.index().side_width(), reinterpret_cast<std::uint32_t*>(temp + l.keys));
    });
  });
}

/// A filled device buffer for stream_read, and its launch on a grid of `blocks_per_sm` blocks of
/// 512 threads an SM: what the roofline, the read of the same bytes and the warm-up share.
struct StreamReadBuffer {
  DeviceBuffer<uint4> data;
  DeviceBuffer<unsigned> sink;
  std::size_t count = 0;  // 16-byte pieces
  int sms = 0;

  /// Allocates `bytes` (a multiple of 16) and fills them on `stream`; holds nothing where that fails.
  gpu_error_t allocate(std::size_t bytes, cudaStream_t stream) {
    if (const gpu_error_t e = gpu_allocate(data, bytes); e != gpu_success) return e;
    if (const gpu_error_t e = gpu_allocate(sink, 4); e != gpu_success) return data.reset(), e;
    count = bytes / 16;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    return cudaMemsetAsync(data.get(), 0x5a, bytes, stream);  // ordered before the reads
  }
  void read(int blocks_per_sm, cudaStream_t stream) const {
    stream_read<<<sms * blocks_per_sm, 512, 0, stream>>>(data.get(), count, sink.get());
  }
};

/// The roofline's own kernel over `bytes` contiguous bytes, timed as scoring and the probe are (one
/// launch between events, median of `repeats`): what a pass over that many bytes can reach, its
/// launch, first loads and last wave included. The fastest of grids of `blocks_per_sm` blocks of
/// 512 threads an SM: 8 is two waves (an SM holds 2,048 threads), which costs nothing over 8 GB but
/// a second ramp over a pass of 1M ads (run 169). Returns 0 where the bytes do not fit beside the pool.
double time_stream_read(std::size_t bytes, int repeats, cudaStream_t stream, std::initializer_list<int> blocks_per_sm = {8}) {
  bytes = bytes / 16 * 16;
  std::size_t free_bytes = 0, total_bytes = 0;
  KEVO_GPU_ASSERT(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (bytes == 0 || bytes + (1ull << 30) > free_bytes) return 0;
  StreamReadBuffer buffer;
  KEVO_GPU_ASSERT(buffer.allocate(bytes, stream));
  double t = 1e30;
  for (const int blocks : blocks_per_sm)
    t = std::min(t, median_seconds(repeats, stream, [&] { buffer.read(blocks, stream); }));
  return t;
}

/// Keeps the device busy for `milliseconds` with reads of a 256 MB buffer. A pool's build leaves it
/// idle for 13-40 s, and a few launches after that run slower than on a busy device: at 1M ads the
/// same kernels measured up to 12 points of the roofline higher after a sweep of 384 policies (runs
/// 165-168), a state a server under load stays in. Does nothing where the buffer does not fit.
void warm_up_device(double milliseconds, cudaStream_t stream) {
  StreamReadBuffer buffer;
  if (buffer.allocate(256ull << 20, stream) != gpu_success) {
    cudaGetLastError();  // (clears the failed allocation's error)
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() < milliseconds) {
    for (int i = 0; i < 10; ++i) buffer.read(4, stream);
    KEVO_GPU_ASSERT(cudaStreamSynchronize(stream));
  }
}

/// The streaming roofline, bytes/s: the median of 10 reads of 8 GB (8 blocks an SM, as in every run before).
double measure_roofline(cudaStream_t stream) {
  constexpr std::size_t bytes = 8ull << 30;
  const double seconds = time_stream_read(bytes, 10, stream);
  if (seconds == 0) {
    std::fprintf(stderr, "retrieval_benchmark: the roofline's 8 GB read does not fit in this GPU's free memory\n");
    std::exit(1);
  }
  return static_cast<double>(bytes) / seconds;
}

/// Where gather_probe_shared reads and what it is measured against.
struct SharedProbeRun {
  IndexView view;
  const std::uint32_t* list;
  const std::uint32_t* listed;
  std::uint32_t* out;
  std::uint32_t eligible;
  double bytes_per_ad, roofline;
  int repeats, multiprocessors;
  cudaStream_t stream;
};

/// Times one gather_probe_shared variant at `blocks_per_sm` blocks of 256 threads; its shared memory
/// and its label follow from the template arguments, so neither can disagree with the kernel.
template <int RowsPerWarp, bool Bulk, bool Spread, int Stages = 1>
void time_shared_probe(const SharedProbeRun& run, unsigned blocks_per_sm) {
  auto* kernel = gather_probe_shared<RowsPerWarp, Bulk, Spread, Stages>;
  const int bytes = Stages * RowsPerWarp * 2048;  // 8 warps' stages of 256-byte rows
  KEVO_GPU_ASSERT(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  const double t = median_seconds(run.repeats, run.stream, [&] {
    kernel<<<blocks_per_sm * run.multiprocessors, 256, bytes, run.stream>>>(run.view, run.list, run.listed, run.out);
  });
  const std::string label = std::string(Bulk ? "bulk" : "cp.async") +
                            (Stages > 1 ? " ring of " + std::to_string(Stages) : std::string()) + ", " +
                            std::to_string(8 * blocks_per_sm) + " warps/SM, " + std::to_string(RowsPerWarp) +
                            (Spread ? " rows a " : " consecutive rows a ") + (Stages > 1 ? "stage" : "warp") +
                            (Spread ? ", spread" : "");
  std::printf("gather probe into shared memory, %s: %.2f G ads/s (%.1f%% counting row, bias, list entry and word out)\n",
              label.c_str(), run.eligible / t * 1e-9, 100 * run.eligible * run.bytes_per_ad / t / run.roofline);
}

/// What bounds scoring's gather: the probe over the request's eligible list, with and without
/// whole-block L2 fetches, against the same probe over evenly spaced slots (every slot, every
/// second, every third). If spaced lists run near the roofline and the eligible list does not,
/// the loss is where the eligible rows lie, not how they are read.
void run_gather_probes(Pool& pool, const Request& request, std::uint64_t n, int repeats, double roofline,
                       SearchOutput search_out, cudaStream_t stream) {
  FusedRetrievalPipeline& p = *pool.pipeline;
  const SearchTempLayout& l = p.temp_layout();
  const int pieces_log2 = std::countr_zero(p.index().row_bytes() / 16);
  const int side = p.index().side_width();
  const double bytes_per_ad = p.index().row_bytes() + 4.0 + 8;  // row, bias, list entry, word out
  std::uint32_t* spaced = nullptr;
  std::uint32_t* spaced_count = nullptr;
  KEVO_GPU_ASSERT(cudaMalloc(&spaced, n * 4));
  KEVO_GPU_ASSERT(cudaMalloc(&spaced_count, 4));
  const unsigned grid = p.multiprocessors() * 8;
  auto report = [&](const char* label, const std::uint32_t* list, const std::uint32_t* count, std::uint32_t ads,
                    const IndexView& view, std::uint32_t* out) {
    auto time = [&](auto launch) { return median_seconds(repeats, stream, launch); };
    const std::pair<const char*, double> variants[] = {
        {"", time([&] { gather_probe<false, true, true><<<grid, 256, 0, stream>>>(view, list, count, pieces_log2, side, out); })},
        {", L2 256-byte fetch",
         time([&] { gather_probe<true, true, true><<<grid, 256, 0, stream>>>(view, list, count, pieces_log2, side, out); })},
        {", no bias", time([&] { gather_probe<false, false, true><<<grid, 256, 0, stream>>>(view, list, count, pieces_log2, side, out); })},
        {", no word per ad", time([&] { gather_probe<false, true, false><<<grid, 256, 0, stream>>>(view, list, count, pieces_log2, side, out); })},
        {", rows only (no bias, no word per ad)",
         time([&] { gather_probe<false, false, false><<<grid, 256, 0, stream>>>(view, list, count, pieces_log2, side, out); })},
    };
    for (const auto& [variant, t] : variants)
      std::printf("gather probe, %s%s: %.2f G ads/s (%.1f%% counting row, bias, list entry and word out; %.1f%% of the rows alone)\n",
                  label, variant, ads / t * 1e-9, 100 * ads * bytes_per_ad / t / roofline,
                  100 * ads * (bytes_per_ad - 12) / t / roofline);
  };
  const std::uint32_t eligible = time_stages(pool, request, n, 1, search_out, stream).eligible;
  with_matched_request(pool, request, n, stream, [&](const IndexView& view, unsigned char* temp) {
    auto* out = reinterpret_cast<std::uint32_t*>(temp + l.keys);
    const auto* list = reinterpret_cast<const std::uint32_t*>(temp + l.eligible);
    const auto* listed = reinterpret_cast<const std::uint32_t*>(temp + l.state + offsetof(TopKState, eligible_count));
    report("the request's eligible list", list, listed, eligible, view, out);
    if (pieces_log2 == 4) {  // fp16: one warp's rows consecutive or spread, as many in flight
      auto pattern = [&](const char* label, unsigned blocks_per_sm, auto* kernel) {
        const double t = median_seconds(repeats, stream, [&] {
          kernel<<<blocks_per_sm * p.multiprocessors(), 256, 0, stream>>>(view, list, listed, side, out);
        });
        std::printf("gather probe, no word per ad, %s: %.2f G ads/s (%.1f%% counting row, bias, list entry and word out)\n",
                    label, eligible / t * 1e-9, 100 * eligible * bytes_per_ad / t / roofline);
      };
      pattern("8 warps/SM, 32 consecutive rows a warp", 1, gather_probe_pattern<16, false>);
      pattern("8 warps/SM, 32 rows a warp, spread", 1, gather_probe_pattern<16, true>);
      pattern("16 warps/SM, 16 consecutive rows a warp", 2, gather_probe_pattern<8, false>);
      pattern("16 warps/SM, 16 rows a warp, spread", 2, gather_probe_pattern<8, true>);
      pattern("64 warps/SM, 8 consecutive rows a warp", 8, gather_probe_pattern<4, false>);
      pattern("64 warps/SM, 8 rows a warp, spread", 8, gather_probe_pattern<4, true>);
      const SharedProbeRun run{view, list, listed, out, eligible, bytes_per_ad, roofline, repeats, p.multiprocessors(), stream};
      time_shared_probe<8, false, true>(run, 8);
      time_shared_probe<8, false, false>(run, 8);
      time_shared_probe<32, false, false>(run, 2);
      time_shared_probe<64, false, false>(run, 1);
      time_shared_probe<8, true, true>(run, 8);
      time_shared_probe<8, true, false>(run, 8);
      time_shared_probe<32, true, false>(run, 2);
      time_shared_probe<32, true, true>(run, 2);
      time_shared_probe<64, true, false>(run, 1);
      time_shared_probe<64, true, true>(run, 1);
      time_shared_probe<32, false, false, 2>(run, 1);
      time_shared_probe<16, false, false, 4>(run, 1);
      time_shared_probe<16, false, false, 2>(run, 2);
      time_shared_probe<16, false, true, 2>(run, 2);
      time_shared_probe<8, false, false, 2>(run, 4);
      time_shared_probe<8, false, true, 2>(run, 4);
      time_shared_probe<4, false, false, 2>(run, 8);
      time_shared_probe<4, false, true, 2>(run, 8);
      time_shared_probe<16, false, false>(run, 4);
      time_shared_probe<16, false, true>(run, 4);
    }
    for (std::uint32_t step : {1u, 2u, 3u}) {
      const auto count = static_cast<std::uint32_t>(std::min<std::uint64_t>(eligible, n / step));
      fill_spaced_slots<<<grid, 256, 0, stream>>>(spaced, count, step);
      KEVO_GPU_ASSERT(cudaMemcpyAsync(spaced_count, &count, 4, cudaMemcpyHostToDevice, stream));
      KEVO_GPU_ASSERT(cudaStreamSynchronize(stream));
      const std::string label = "every " + std::to_string(step) + (step == 1 ? "st" : step == 2 ? "nd" : "rd") +
                                " slot (" + std::to_string(count) + " ads)";
      report(label.c_str(), spaced, spaced_count, count, view, out);
    }
    return 0;
  });
  cudaFree(spaced);
  cudaFree(spaced_count);
}

std::vector<ScoredAd> top_k(Pool& pool, const Request& request) {
  auto r = pool.pipeline->search(request);
  CHECK_OK(r);
  return std::move(*r);
}

/// search() as a serving thread sees it, request in and answer in a vector on the host: the median
/// host-clock time over `repeats` calls after two warm-ups, call r searching request_of(r). The
/// last answer's size lands in *results.
template <class RequestOf>
double median_search_seconds(Pool& pool, int repeats, RequestOf request_of, std::size_t* results = nullptr) {
  std::vector<double> seconds;
  for (int r = 0; r < repeats + 2; ++r) {
    const Request request = request_of(r);
    const auto a = std::chrono::steady_clock::now();
    const std::size_t size = top_k(pool, request).size();
    if (r >= 2) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
    if (results) *results = size;
  }
  return median(seconds);
}

/// Replaces random live ads (new embeddings and targeting) in batches of 10,000, alone and while
/// another thread searches back to back.
void run_updates(Pool& fp16, const Workload& fp16_workload, const Request& typical, std::uint64_t n, bool quick) {
  std::puts("\n## Ad updates (replacing live ads with new embeddings and targeting)\n");
  for (const int batch : {10000, 100000})
  for (bool with_search : {false, true}) {
    Rng rng(7);
    const int batches = (quick ? 200000 : 600000) / batch + (batch > 10000 ? 6 : 0);
    std::vector<std::vector<AdRecord>> prepared(static_cast<std::size_t>(batches), std::vector<AdRecord>(batch));
    for (auto& ads : prepared)
      for (AdRecord& ad : ads) {
        const std::uint64_t id = rng.next() % n;
        ad.id = static_cast<std::uint32_t>(id);
        ad.embedding.resize(128);
        for (float& x : ad.embedding) x = static_cast<float>(rng.normal() * 0.088);
        ad.bias = fp16_workload.ad_bias(id);
        ad.clauses = fp16_workload.ad_targeting(id);
        ad.live = true;
      }
    std::atomic<bool> stop{false};
    std::vector<double> search_ms;  // each search's host-visible time, request in to top-K out
    std::thread searcher;
    if (with_search)
      searcher = std::thread([&] {
        while (!stop) {
          const auto s0 = std::chrono::steady_clock::now();
          top_k(fp16, typical);
          search_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count());
        }
      });
    if (!with_search) {
      // The host's share alone: checking and packing the same batches (what upsert does before the
      // device is involved), on every core this process may use. Where this is near the applied
      // rate below, updates are bound by the host, and the rate follows its cores and load.
      const auto h = std::chrono::steady_clock::now();
      std::size_t packed = 0;
      for (const auto& ads : prepared) packed += PackedAds::from(ads, fp16.pipeline->schema(), default_thread_count()).size();
      const double host = std::chrono::duration<double>(std::chrono::steady_clock::now() - h).count();
      std::printf("batches of %d: host packing alone %.2f M ads/s on %u threads; %zu ads walked by their clause runs\n",
                  batch, packed / host * 1e-6, default_thread_count(), fp16.pipeline->index().unindexed_count());
      // The rest of upsert: the same batches packed beforehand, through upsert(PackedAds).
      std::vector<PackedAds> packed_batches;
      for (const auto& ads : prepared) packed_batches.push_back(PackedAds::from(ads, fp16.pipeline->schema(), default_thread_count()));
      const auto u = std::chrono::steady_clock::now();
      for (const PackedAds& ads : packed_batches) CHECK_OK(fp16.pipeline->index().upsert(ads));
      CHECK_OK(fp16.pipeline->index().synchronize());
      const double rest = std::chrono::duration<double>(std::chrono::steady_clock::now() - u).count();
      std::printf("batches of %d packed beforehand: upsert(PackedAds) %.2f M ads/s applied (%.1f ms per batch)\n", batch,
                  packed / rest * 1e-6, rest / batches * 1e3);
    }
    const auto a = std::chrono::steady_clock::now();
    for (const auto& ads : prepared) CHECK_OK(fp16.pipeline->index().upsert(ads));
    CHECK_OK(fp16.pipeline->index().synchronize());  // counted once applied, not once enqueued
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
    stop = true;
    if (searcher.joinable()) searcher.join();
    std::printf("batches of %d, %s: %.2f M ads/s applied (%.1f ms per batch)", batch,
                with_search ? "while searching" : "alone", batch * batches / t * 1e-6, t / batches * 1e3);
    if (search_ms.empty()) std::puts("");
    else {
      std::sort(search_ms.begin(), search_ms.end());
      std::printf("; %zu searches alongside, median %.2f ms, p99 %.2f ms, max %.2f ms\n", search_ms.size(),
                  search_ms[search_ms.size() / 2], search_ms[search_ms.size() * 99 / 100], search_ms.back());
    }
  }

}

/// Targeting-only PackedAds (rows left to the fill) split by the shard each ad's id places it on.
std::vector<PackedAds> split_by_shard(const PackedAds& ads, std::size_t shards) {
  std::vector<PackedAds> parts(shards);
  for (std::size_t i = 0; i < ads.size(); ++i) {
    PackedAds& part = parts[shard_of(ads.ids[i], shards)];
    part.ids.push_back(ads.ids[i]);
    part.bias.push_back(ads.bias[i]);
    part.live.push_back(ads.live[i]);
    part.clauses.insert(part.clauses.end(), ads.clauses.begin() + ads.clause_begin[i], ads.clauses.begin() + ads.clause_begin[i + 1]);
    part.clause_begin.push_back(static_cast<std::uint32_t>(part.clauses.size()));
  }
  return parts;
}

/// The workload's first `total` ads over shards on `gpus` (placed as ShardedBackend routes them), and
/// with `with_whole` all of them on gpus[0] as well; every ad's row drawn from its id, so the shards
/// and the whole pool hold the same ads. Each engine is created with its GPU current and stays there.
bench::ShardedPools build_sharded_pools(const Workload& w, std::uint64_t total, const std::vector<int>& gpus, bool with_whole) {
  const auto start = std::chrono::steady_clock::now();
  bench::ShardedPools pools;
  pools.gpus = gpus;
  pools.total_ads = total;
  pools.shard_ads.assign(gpus.size(), 0);
  auto engine_on = [&](int gpu, std::uint64_t capacity) {
    KEVO_GPU_ASSERT(cudaSetDevice(gpu));
    auto engine = CudaRetrievalBackend::create(w.schema(), w.model(), {.capacity = capacity, .clause_capacity = capacity * 8});
    CHECK_OK(engine);
    return std::move(*engine);
  };
  std::vector<CudaRetrievalBackend*> shards;
  const std::uint64_t shard_capacity = total / gpus.size() + total / gpus.size() / 50 + 4096;  // the hash's spread, and more
  for (int gpu : gpus) {
    auto engine = engine_on(gpu, shard_capacity);
    shards.push_back(engine.get());
    pools.shards.push_back(std::move(engine));
  }
  CudaRetrievalBackend* whole = nullptr;
  if (with_whole) {
    auto engine = engine_on(gpus[0], total);
    whole = engine.get();
    pools.whole = std::move(engine);
  }
  for (std::uint64_t b = 0; b < total; b += 1u << 20) {
    const PackedAds batch = generate_targeting(w, b, std::min(total, b + (1u << 20)));
    std::vector<PackedAds> parts = split_by_shard(batch, gpus.size());
    for (std::size_t s = 0; s < gpus.size(); ++s) {
      KEVO_GPU_ASSERT(cudaSetDevice(gpus[s]));
      CHECK_OK(shards[s]->pipeline().index().upsert(parts[s]));
      pools.shard_ads[s] += parts[s].size();
    }
    if (whole) {
      KEVO_GPU_ASSERT(cudaSetDevice(gpus[0]));
      CHECK_OK(whole->pipeline().index().upsert(batch));
    }
  }
  auto fill = [&](CudaRetrievalBackend& engine) {
    KEVO_GPU_ASSERT(cudaSetDevice(engine.pipeline().device()));
    CHECK_OK(fill_synthetic_embeddings(engine.pipeline().index(), w, 99));
  };
  for (CudaRetrievalBackend* shard : shards) fill(*shard);
  if (whole) fill(*whole);
  for (int gpu : std::set<int>(gpus.begin(), gpus.end())) {  // each device once, however many shards it holds
    std::size_t free_bytes = 0, total_bytes = 0;
    KEVO_GPU_ASSERT(cudaSetDevice(gpu));
    KEVO_GPU_ASSERT(cudaMemGetInfo(&free_bytes, &total_bytes));
    std::printf("GPU %d: %.1f of %.1f GB in use\n", gpu, (total_bytes - free_bytes) * 1e-9, total_bytes * 1e-9);
  }
  std::printf("built %zu shards%s of %llu ads in %.1f s\n", gpus.size(), with_whole ? " and the whole pool" : "",
              static_cast<unsigned long long>(total),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return pools;
}

}  // namespace

/// Batches of B typical requests (different users) through search_batch_async, one pass each,
/// against the same B requests searched one after another (search_async, back to back). Reports
/// the union the pass lists and scores, and the pass's bytes (the union's rows, biases, list and
/// masks read once, each eligible pair's key written) as a fraction of the roofline.
void run_batches(Pool& pool, const Workload& w, std::uint64_t n, int repeats, double roofline, SearchOutput out,
                 cudaStream_t stream) {
  FusedRetrievalPipeline& p = *pool.pipeline;
  pool.ensure_temp();
  void* batch_temp = nullptr;
  KEVO_GPU_ASSERT(cudaMalloc(&batch_temp, p.search_batch_temp_bytes()));
  const BatchTempLayout& b = p.batch_temp_layout();
  std::uint32_t* outs_memory = nullptr;
  constexpr int kMax = kernels::kMaxBatchRequests;
  KEVO_GPU_ASSERT(cudaMalloc(&outs_memory, kMax * (2ull * kMaxK + 1) * 4));
  std::vector<SearchOutput> outs(kMax);
  for (int r = 0; r < kMax; ++r)
    outs[r] = {outs_memory + r * kMaxK, reinterpret_cast<float*>(outs_memory + (kMax + r) * kMaxK),
               outs_memory + 2 * kMax * kMaxK + r};
  const double row = p.index().row_bytes() + 4.0 * p.index().side_width();
  const PipelinePolicy original = p.policy();
  for (int size : {1, 2, 4, 8}) {
    std::vector<Request> requests;
    for (int r = 0; r < size; ++r) requests.push_back(w.request(500 + r, RequestKind::typical, 1000));
    auto time_batched = [&] {
      return median_seconds(repeats, stream, [&] {
        CHECK_OK(p.search_batch_async(requests, batch_temp, p.search_batch_temp_bytes(), std::span(outs).first(size), stream));
      });
    };
    if (size >= 4) {  // the batch knobs (the default policy's line follows)
      for (int stages : BatchScoringPolicy::stages_domain)
        for (int group : BatchScoringPolicy::group_domain) {
          PipelinePolicy policy = original;
          policy.batch_scoring = {2, stages, group, 8};
          CHECK_OK(p.set_policy(policy));
          std::printf("%s batch of %d, %s: one pass %.3f ms\n", to_string(p.schema().embedding_type), size,
                      to_string(policy.batch_scoring).c_str(), time_batched() * 1e3);
        }
      CHECK_OK(p.set_policy(original));
    }
    const double batched = time_batched();
    const double alone = median_seconds(repeats, stream, [&] {
      for (const Request& r : requests) CHECK_OK(p.search_async(r, pool.temp, pool.temp_bytes, out, stream));
    });
    KEVO_GPU_ASSERT(cudaStreamSynchronize(stream));
    const auto* base = static_cast<unsigned char*>(batch_temp);
    std::uint32_t listed = 0;
    KEVO_GPU_ASSERT(cudaMemcpy(&listed, base + b.listed, 4, cudaMemcpyDeviceToHost));
    double pairs = 0;
    for (int r = 0; r < size; ++r) {
      TopKState state;
      KEVO_GPU_ASSERT(cudaMemcpy(&state, base + b.first_request + r * b.request_stride + b.request.state, sizeof(state),
                                 cudaMemcpyDeviceToHost));
      pairs += state.eligible_count;
    }
    const double bytes = listed * (row + 4 + 1) + pairs * 4;
    std::printf("%s batch of %d: one pass %.3f ms (%.3f ms a request) = %.2f G pool ads/s; one by one %.3f ms = %.2f G/s; "
                "%.2fx; union %.1f%% of the pool, %.2f eligible pairs per listed ad; %.2f G pairs/s; pass bytes %.0f%% of roofline\n",
                to_string(p.schema().embedding_type), size, batched * 1e3, batched / size * 1e3, size * n / batched * 1e-9,
                alone * 1e3, size * n / alone * 1e-9, alone / batched, 100.0 * listed / n, pairs / std::max(1u, listed),
                pairs / batched * 1e-9, 100 * bytes / batched / roofline);
  }
  cudaFree(batch_temp);
  cudaFree(outs_memory);
}

/// A server's view: `clients` threads searching at once (each its own users' typical requests),
/// through the pipeline's search() as it is (searches take turns) and through BatchingBackend
/// (searches that queue are answered together). Searches per second, and each search's latency
/// on the host, request in to top-K out.
void run_concurrent_searches(Pool& pool, const Workload& w, std::uint64_t n, bool quick) {
  CudaRetrievalBackend engine(*pool.pipeline);
  const double seconds = quick ? 0.5 : 2.0;
  for (int clients : {1, 4, 8, 16}) {
    std::vector<std::vector<Request>> requests(static_cast<std::size_t>(clients));
    for (int c = 0; c < clients; ++c)
      for (int i = 0; i < 32; ++i)
        requests[static_cast<std::size_t>(c)].push_back(
            w.request(static_cast<std::uint64_t>(5000 + 100 * c + i), RequestKind::typical, 1000));
    for (bool batching : {false, true}) {
      BatchingBackend batched(engine, {.max_batch = 8});
      RetrievalBackend& backend = batching ? static_cast<RetrievalBackend&>(batched) : engine;
      std::atomic<bool> stop{false};
      std::vector<std::vector<double>> latencies(static_cast<std::size_t>(clients));
      std::vector<std::thread> threads;
      for (int c = 0; c < clients; ++c)
        threads.emplace_back([&, c] {
          const auto& mine = requests[static_cast<std::size_t>(c)];
          for (std::size_t i = 0; !stop; ++i) {
            const auto a = std::chrono::steady_clock::now();
            CHECK_OK(backend.search(mine[i % mine.size()]));
            latencies[static_cast<std::size_t>(c)].push_back(
                std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
          }
        });
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
      stop = true;
      for (std::thread& t : threads) t.join();
      std::vector<double> all;
      for (auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
      std::sort(all.begin(), all.end());
      const double rate = all.size() / seconds;
      const auto counts = batched.counts();
      char per_batch[64] = "";
      if (batching)
        std::snprintf(per_batch, sizeof per_batch, ", %.1f searches a batch",
                      static_cast<double>(counts.searches) / std::max<std::size_t>(1, counts.batches));
      std::printf("%s, %2d clients, %s: %.0f searches/s = %.2f G pool ads/s; latency p50 %.2f ms, p99 %.2f ms%s\n",
                  to_string(pool.pipeline->schema().embedding_type), clients, batching ? "batching" : "in turn ",
                  rate, rate * n * 1e-9, all[all.size() / 2] * 1e3, all[all.size() * 99 / 100] * 1e3, per_batch);
    }
  }
}

/// Scoring alone under every policy the sweep covers (scoring policies are run-time or prebuilt
/// variants), for both pools, after each pool's gather probe. Chunks of 8 tiles are in it because
/// a smaller chunk leaves room in shared memory for a deeper ring.
void run_scoring_policy_sweep(const std::array<Pool*, 2>& pools, const Request& typical, std::uint64_t n, int repeats,
                              double roofline, SearchOutput out, cudaStream_t stream) {
  std::puts("\n## Scoring policy sweep (typical, fp16 and int8, K = 1000; scoring alone)\n");
  for (Pool* p : pools) {
    const PipelinePolicy original = p->pipeline->policy();
    const double bytes_per_ad = p->pipeline->index().row_bytes() + 4.0 * p->pipeline->index().side_width() + 8;
    const std::uint32_t eligible = time_stages(*p, typical, n, 1, out, stream).eligible;
    const double probe = time_gather_probe(*p, typical, n, repeats, stream);
    std::printf("%s gather probe (rows + bias read, one word written, no arithmetic): %.2f G ads/s (%.0f%%)\n",
                to_string(p->pipeline->schema().embedding_type), eligible / probe * 1e-9,
                100 * eligible * bytes_per_ad / probe / roofline);
    for (int stages : {0, 2, 3, 4})
      for (int threads : {128, 256})
        for (int tiles : {8, 16, 32})
          for (int blocks : {1, 2, 3, 4, 8}) {
            if (stages == 0 && (tiles != 16 || blocks < 4)) continue;
            PipelinePolicy policy = original;
            policy.scoring = {threads, tiles, blocks, 2, stages};
            if (auto ok = p->pipeline->set_policy(policy); !ok) continue;  // ring too deep for shared memory
            const double t = time_scoring_only(*p, typical, n, repeats, stream);
            std::printf("%s %s: scoring %.2f G ads/s (%.0f%%)\n", to_string(p->pipeline->schema().embedding_type),
                        to_string(policy.scoring).c_str(), eligible / t * 1e-9,
                        100 * eligible * bytes_per_ad / t / roofline);
          }
    CHECK_OK(p->pipeline->set_policy(original));
  }
}

/// Issue 20's grid of scoring shapes: for d in {64, 128, 256} and each storage, one pool of `n` ads,
/// and over its first 1M, 10M and n slots, scoring alone (the best of seven policies, the default
/// among them) beside the gather probe over the same eligible list: the probe reads exactly the
/// bytes scoring reads and computes nothing, so it is the ceiling the layout allows at that size.
void run_scoring_shapes(std::uint64_t n, std::span<const int> dims, std::span<const EmbeddingType> types, SlotOrder order,
                        bool all_policies, int repeats, double roofline, SearchOutput out, cudaStream_t stream) {
  // Seven policies (the pool's default first), or every one the description allows that fits. The
  // last two load rows into registers on a small grid: the best of all 384 at 1M ads (runs 167-168).
  std::vector<ScoringPolicy> candidates{ScoringPolicy{},                ScoringPolicy{128, 4, 8, 2, 2},
                                        ScoringPolicy{128, 8, 8, 2, 2}, ScoringPolicy{256, 8, 8, 2, 2},
                                        ScoringPolicy{256, 32, 8, 2, 2}, ScoringPolicy{256, 4, 2, 1, 0},
                                        ScoringPolicy{256, 4, 4, 2, 0}};
  if (all_policies) candidates = every_policy<ScoringPolicy>();
  std::printf("## Scoring shapes (typical, K = 1000; scoring alone, best of %zu policies, beside the gather probe; each row after 0.5 s of reads; slots %s)\n\n",
              candidates.size(), order == SlotOrder::by_id ? "in id order" : "grouped by targeting");
  std::puts("| d | dtype | N | eligible | scoring | % of roofline | gather probe | % of roofline | the probe with 256-byte "
            "L2 fetches, % of roofline | a read of the same bytes, % of roofline | scoring / probe | policy |");
  std::puts("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
  std::vector<PackedAds> targeting;  // the same ads' targeting for every pool
  for (const int dim : dims)
    for (EmbeddingType type : types) {
      // (At d = 64, int8_group32's bytes cannot reach int8's 1.8x of fp16: 76 an ad against fp16's 132.)
      if (type == EmbeddingType::int8_group32 && dim < 128) continue;
      const Workload w({.seed = 2026, .dim = dim, .embedding_type = type});
      Pool pool = build_pool(w, n, 99, &targeting, 8, order);
      const Request typical = w.request(1, RequestKind::typical, 1000);
      const PipelinePolicy original = pool.pipeline->policy();
      if (!all_policies) candidates.front() = original.scoring;  // the default for this d and storage
      const double bytes_per_ad = pool.pipeline->index().row_bytes() + 4.0 * pool.pipeline->index().side_width() + 8;
      for (const std::uint64_t slots : {std::uint64_t{1} << 20, std::uint64_t{10} << 20, n}) {
        if (slots > n) continue;
        warm_up_device(500, stream);  // each row from a busy device's state, not the build's idle one
        const std::uint32_t eligible = time_stages(pool, typical, slots, 1, out, stream).eligible;
        const double probe = time_gather_probe(pool, typical, slots, repeats, stream);
        const double probe_whole_blocks = time_gather_probe<true>(pool, typical, slots, repeats, stream);
        double best = 1e30;
        ScoringPolicy best_policy;
        for (const ScoringPolicy& s : candidates) {
          PipelinePolicy policy = original;
          policy.scoring = s;
          if (!pool.pipeline->set_policy(policy)) continue;
          if (const double t = time_scoring_only(pool, typical, slots, repeats, stream); t < best) best = t, best_policy = s;
        }
        CHECK_OK(pool.pipeline->set_policy(original));
        auto percent = [&](double t) { return 100 * eligible * bytes_per_ad / t / roofline; };
        // The same bytes read contiguously: at 1M and 10M, the ceiling that a pass of this size sets
        // before any gather (blank where they do not fit beside the pool).
        const double read = time_stream_read(static_cast<std::size_t>(eligible * bytes_per_ad), repeats, stream, {1, 2, 4, 8});
        const std::string read_percent = read > 0 ? std::to_string(std::lround(percent(read))) + "%" : "-";
        std::printf("| %d | %s | %.2fM | %.1f%% | %.2f G ads/s | %.0f%% | %.2f G ads/s | %.0f%% | %.0f%% | %s | %.0f%% | %s |\n",
                    dim, to_string(type), slots * 1e-6, 100.0 * eligible / slots, eligible / best * 1e-9, percent(best),
                    eligible / probe * 1e-9, percent(probe), percent(probe_whole_blocks), read_percent.c_str(),
                    100 * probe / best, to_string(best_policy).c_str());
        std::fflush(stdout);
      }
    }
}

/// About `fraction` of the live ads of [begin, end) (picked by a hash of the id), each with the
/// targeting and bias the workload draws for the ad `shift` ids on: replacements that keep their
/// rows (and their slots).
PackedAds retargeted(const Workload& w, std::uint64_t begin, std::uint64_t end, std::uint64_t shift, double fraction) {
  const PackedAds drawn = generate_targeting(w, begin + shift, end + shift);
  PackedAds picked;
  for (std::size_t i = 0; i < drawn.size(); ++i) {
    const auto id = static_cast<std::uint32_t>(drawn.ids[i] - shift);
    if (!drawn.live[i] || !w.ad_live(id) || (id * 2654435761u >> 8) % 1000 >= fraction * 1000) continue;
    picked.ids.push_back(id);
    picked.bias.push_back(drawn.bias[i]);
    picked.live.push_back(1);
    picked.clauses.insert(picked.clauses.end(), drawn.clauses.begin() + drawn.clause_begin[i],
                          drawn.clauses.begin() + drawn.clause_begin[i + 1]);
    picked.clause_begin.push_back(static_cast<std::uint32_t>(picked.clauses.size()));
  }
  return picked;
}

/// Matching's time under each segment schedule (MatchingPolicy::segment_queue): at the pool's own
/// other knobs, and the best over every other knob, with the policy that gave it.
struct MatchingBySchedule {
  static constexpr std::size_t kSchedules = MatchingPolicy::segment_queue_domain.size();
  double own[kSchedules] = {};
  double best[kSchedules] = {};
  std::string best_policy[kSchedules];
};
MatchingBySchedule time_matching_by_schedule(Pool& pool, const Request& request, std::uint64_t slots, int repeats,
                                             SearchOutput out, cudaStream_t stream) {
  const PipelinePolicy original = pool.pipeline->policy();
  MatchingBySchedule t;
  for (double& b : t.best) b = 1e9;
  for (const MatchingPolicy& m : every_policy<MatchingPolicy>()) {
    if (m.launch_after_prior != original.matching.launch_after_prior) continue;  // (stages are timed apart)
    PipelinePolicy policy = original;
    policy.matching = m;
    CHECK_OK(pool.pipeline->set_policy(policy));
    const double seconds = time_stages(pool, request, slots, repeats, out, stream).matching;
    const auto q = static_cast<std::size_t>(m.segment_queue);
    if (seconds < t.best[q]) t.best[q] = seconds, t.best_policy[q] = to_string(m);
    if (m.block_threads == original.matching.block_threads && m.blocks_per_sm == original.matching.blocks_per_sm)
      t.own[q] = seconds;
  }
  CHECK_OK(pool.pipeline->set_policy(original));
  return t;
}

/// What updates cost a pool loaded in targeting order, and what DeviceAdIndex::regroup() gives
/// back: scoring (the pool's own policy) and the gather probe over every slot, and the whole
/// search, when loaded; after a regroup of the pool as loaded (the same order, every row moved to
/// a new buffer); after `fraction` of the ads took new targeting in place; and after a regroup.
/// Each state is measured after a round of warm-up searches. The answers of 5 requests must not
/// change across a regroup.
void run_regroup(std::uint64_t n, int dim, EmbeddingType type, double fraction, int repeats, double roofline, SearchOutput out,
                 cudaStream_t stream) {
  const Workload w({.seed = 2026, .dim = dim, .embedding_type = type});
  std::vector<PackedAds> targeting;
  Pool pool = build_pool(w, n, 99, &targeting, 8, SlotOrder::by_targeting);
  DeviceAdIndex& index = pool.pipeline->index();
  const Request typical = w.request(1, RequestKind::typical, 1000);
  const double bytes_per_ad = index.row_bytes() + 4.0 * index.side_width() + 8;
  std::printf("\n## Slots regrouped by targeting after updates (d = %d, %s, %.0fM ads, typical request, K = 1000)\n\n", dim,
              to_string(type), n * 1e-6);
  std::puts("| pool | slots | eligible | scoring | % of roofline | gather probe | % of roofline | matching | scoring | top-K | search |");
  std::puts("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
  auto measure = [&](const char* label) {
    pool.ensure_temp();
    const std::uint64_t slots = index.slot_count();
    // Searches first: the first ones over freshly allocated rows run slower (run 143).
    (void)time_stages(pool, typical, slots, repeats, out, stream);
    const StageTimes st = time_stages(pool, typical, slots, repeats, out, stream);
    const double probe = time_gather_probe(pool, typical, slots, repeats, stream);
    auto percent = [&](double t) { return 100 * st.eligible * bytes_per_ad / t / roofline; };
    std::printf("| %s | %.2fM | %.1f%% | %.2f G ads/s | %.0f%% | %.2f G ads/s | %.0f%% | %.3f ms | %.3f ms | %.3f ms | %.3f ms |\n", label,
                slots * 1e-6, 100.0 * st.eligible / slots, st.eligible / st.scoring * 1e-9, percent(st.scoring),
                st.eligible / probe * 1e-9, percent(probe), st.matching * 1e3, st.scoring * 1e3, st.topk * 1e3, st.total * 1e3);
    const MatchingBySchedule m = time_matching_by_schedule(pool, typical, slots, repeats, out, stream);
    for (std::size_t q = 0; q < MatchingBySchedule::kSchedules; ++q)
      std::printf("(matching, segment_queue=%zu: %.3f ms at %s's other knobs; best %.3f ms, %s)\n", q, m.own[q] * 1e3,
                  to_string(pool.pipeline->policy().matching).c_str(), m.best[q] * 1e3, m.best_policy[q].c_str());
    std::fflush(stdout);
  };
  std::vector<std::vector<ScoredAd>> before;
  auto regroup = [&](const char* label) {
    before.clear();
    for (int r = 0; r < 5; ++r) before.push_back(top_k(pool, w.request(10 + r, RequestKind::typical, 1000)));
    const auto b = std::chrono::steady_clock::now();
    auto regrouped = index.regroup();
    CHECK_OK(regrouped);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - b).count();
    measure(label);
    int equal = 0;
    for (int r = 0; r < 5; ++r) equal += top_k(pool, w.request(10 + r, RequestKind::typical, 1000)) == before[static_cast<std::size_t>(r)];
    std::printf("(regroup(): %zu ads into targeting order, %zu free slots dropped, in %.1f ms; answers of 5 requests equal before "
                "and after: %d of 5)\n",
                regrouped->ads, regrouped->dropped_slots, seconds * 1e3, equal);
  };
  measure("loaded in targeting order");
  regroup("regrouped as loaded");
  const auto a = std::chrono::steady_clock::now();
  std::size_t replaced = 0;
  for (std::uint64_t begin = 0; begin < n; begin += 1u << 20) {
    const PackedAds batch = retargeted(w, begin, std::min<std::uint64_t>(n, begin + (1u << 20)), n, fraction);
    CHECK_OK(index.upsert(batch));
    replaced += batch.size();
  }
  CHECK_OK(index.reindex());  // matching as after a load: the order is what is measured
  std::printf("(replaced the targeting of %zu ads, %.0f%%, in %.1f s)\n", replaced, 100.0 * replaced / index.live_count(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  char label[96];
  std::snprintf(label, sizeof label, "after %.0f%% took new targeting in place", 100.0 * replaced / index.live_count());
  measure(label);
  regroup("after regroup()");
}

/// Top-K's time under every top-K policy: each boundary cap (a smaller cap refines one level more
/// often but leaves the sort fewer candidates, at most K + cap), each sort (one block's merge sort,
/// or ranks counted over many blocks) and each way to launch the select (a launch per level, or one
/// cooperative launch). Every build's answer must equal the first build's, id for id.
void run_topk_sweep(Pool& pool, const Workload& workload, std::uint64_t n, int repeats, SearchOutput out,
                    cudaStream_t stream) {
  std::puts("\n## Top-K builds (typical, fp16; top-K device time in ms; sort 0 = one block's merge sort, 1 = ranks "
            "counted over many blocks; one_launch 0 = a launch a level, 1 = one cooperative launch)\n");
  std::puts("| N | K | cap | sort 0, one_launch 0 | sort 1, one_launch 0 | sort 0, one_launch 1 | sort 1, one_launch 1 | "
            "answers |");
  std::puts("| --- | --- | --- | --- | --- | --- | --- | --- |");
  const PipelinePolicy original = pool.pipeline->policy();
  auto answer = [&](int k) {
    std::vector<std::uint32_t> ids(static_cast<std::size_t>(k));
    KEVO_GPU_ASSERT(cudaMemcpy(ids.data(), out.ids, ids.size() * 4, cudaMemcpyDeviceToHost));
    return ids;
  };
  bool all_same = true;
  for (const std::uint64_t slots : std::array<std::uint64_t, 3>{1ull << 20, 10ull << 20, n}) {
    if (slots > n) continue;
    for (int k : {1, 100, 1000, 4096}) {
      const Request request = workload.request(1, RequestKind::typical, k);
      for (int cap : TopKPolicy::boundary_cap_domain) {
        std::printf("| %llu | %d | %d |", static_cast<unsigned long long>(slots), k, cap);
        std::vector<std::uint32_t> first;
        bool same = true;
        for (int one_launch : TopKPolicy::one_launch_domain)
          for (int sort : TopKPolicy::sort_domain) {
            PipelinePolicy policy = original;
            policy.topk = {.boundary_cap = cap, .sort = sort, .one_launch = one_launch};
            CHECK_OK(pool.pipeline->set_policy(policy));
            KEVO_GPU_ASSERT(cudaMemset(out.ids, 0xff, static_cast<std::size_t>(k) * 4));  // poisoned
            std::printf(" %.4f |", time_stages(pool, request, slots, repeats, out, stream).topk * 1e3);
            const std::vector<std::uint32_t> ids = answer(k);
            if (first.empty()) first = ids;
            same = same && ids == first;
          }
        std::printf(" %s |\n", same ? "same" : "DIFFER");
        all_same = all_same && same;
      }
    }
  }
  CHECK_OK(pool.pipeline->set_policy(original));
  if (!all_same) {
    std::fprintf(stderr, "top-K builds gave different answers\n");
    std::exit(1);
  }
}

/// Where a small pool's search time goes: matching, scoring and top-K enqueued launch by launch on
/// the stream, against the same launches replayed from a CUDA graph captured once (no host launch
/// cost, only the device's own gaps between kernels), and the host time that enqueueing them takes.
void run_launch_costs(Pool& pool, const Request& request, int repeats, SearchOutput out, cudaStream_t stream) {
  FusedRetrievalPipeline& p = *pool.pipeline;
  // (Matched once beforehand as well: each timed run matches again from a reset state.)
  with_matched_request(pool, request, pool.n, stream, [&](const IndexView& view, unsigned char* temp) {
    auto enqueue = [&] {
      CHECK_OK(p.enqueue_matching(view, temp, stream));
      CHECK_OK(p.enqueue_scoring(view, temp, request.routing, stream));
      CHECK_OK(p.enqueue_topk(view, temp, request.k, out, stream));
    };
    // Each run starts from a reset top-K state, as enqueue_prepare leaves it.
    auto reset = [&] {
      KEVO_GPU_ASSERT(cudaMemsetAsync(temp + p.temp_layout().state, 0, sizeof(TopKState), stream));
    };
    std::vector<double> host;
    const double on_stream = median_seconds(repeats, stream, [&] {
      reset();
      const auto a = std::chrono::steady_clock::now();
      enqueue();
      host.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
    });
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    KEVO_GPU_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    reset();
    enqueue();
    KEVO_GPU_ASSERT(cudaStreamEndCapture(stream, &graph));
    KEVO_GPU_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
    std::size_t nodes = 0;
    KEVO_GPU_ASSERT(cudaGraphGetNodes(graph, nullptr, &nodes));
    const double replayed = median_seconds(repeats, stream, [&] { KEVO_GPU_ASSERT(cudaGraphLaunch(exec, stream)); });
    KEVO_GPU_ASSERT(cudaStreamSynchronize(stream));
    std::uint32_t count = 0;
    KEVO_GPU_ASSERT(cudaMemcpy(&count, out.count, 4, cudaMemcpyDeviceToHost));
    KEVO_GPU_ASSERT(cudaGraphExecDestroy(exec));
    KEVO_GPU_ASSERT(cudaGraphDestroy(graph));
    std::printf("| %s | %llu | %d | sort %d, one_launch %d | %zu | %.3f ms | %.3f ms | %.3f ms | %u |\n",
                to_string(p.schema().embedding_type), static_cast<unsigned long long>(pool.n), request.k,
                p.policy().topk.sort, p.policy().topk.one_launch, nodes, on_stream * 1e3, replayed * 1e3,
                median(host) * 1e3, count);
    return 0;
  });
}

/// search()'s latency at a small pool, one line per K (the same request each call).
void run_search_latency(Pool& pool, const Workload& workload, int repeats) {
  for (int k : {1, 1000, 4096}) {
    const Request request = workload.request(1, RequestKind::typical, k);
    std::size_t results = 0;
    const double t = median_search_seconds(pool, repeats, [&](int) { return request; }, &results);
    std::printf("search(): %s N %llu K %d: %.3f ms (median of %d), %zu results\n",
                to_string(pool.pipeline->schema().embedding_type), static_cast<unsigned long long>(pool.n), k, t * 1e3,
                repeats, results);
  }
}

/// Where search()'s time goes at a small pool, one line per K (the same request each call):
/// search() on the host clock; the same work (search_async, the answer's copy into pinned memory,
/// the wait) on the host clock and between events on the stream; and, with an event between them,
/// the device time of the request's preparation (upload, query bitmap, towers) and of matching,
/// scoring and top-K. Under both settings of MatchingPolicy::launch_after_prior. Medians of
/// `repeats` after two warm-ups.
void run_search_breakdown(Pool& pool, const Workload& workload, int repeats, SearchOutput out, cudaStream_t stream) {
  FusedRetrievalPipeline& p = *pool.pipeline;
  pool.ensure_temp();
  std::uint32_t* answer = nullptr;  // the count, then K ids, then K scores, as search() copies them
  KEVO_GPU_ASSERT(cudaMallocHost(&answer, (1 + 2 * kMaxK) * 4));
  cudaEvent_t events[3];
  for (cudaEvent_t& e : events) KEVO_GPU_ASSERT(cudaEventCreate(&e));
  auto elapsed = [&](int from, int to) {
    float ms = 0;
    KEVO_GPU_ASSERT(cudaEventElapsedTime(&ms, events[from], events[to]));
    return ms * 1e-3;
  };
  std::puts("\n| dtype | N | K | towers and matching | search() | search_async + copy + wait, host | the same on the "
            "stream | host enqueue of search_async | preparation (device) | matching, scoring, top-K (device) |");
  std::puts("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
  auto copy_answer = [&](int k) {  // ids and scores into pinned memory, as search() brings them back
    KEVO_GPU_ASSERT(cudaMemcpyAsync(answer, out.ids, 4 * static_cast<std::size_t>(k), cudaMemcpyDeviceToHost, stream));
    KEVO_GPU_ASSERT(cudaMemcpyAsync(answer + 1 + k, out.scores, 4 * static_cast<std::size_t>(k), cudaMemcpyDeviceToHost, stream));
  };
  const PipelinePolicy original = p.policy();
  for (int k : {1, 1000, 4096}) {
    for (int after_prior : MatchingPolicy::launch_after_prior_domain) {
      PipelinePolicy policy = original;
      policy.matching.launch_after_prior = after_prior;
      CHECK_OK(p.set_policy(policy));
      const Request request = workload.request(1, RequestKind::typical, k);
      const double api = median_search_seconds(pool, repeats, [&](int) { return request; });
      std::vector<double> host, stream_time, enqueue, prepare, rest;
      for (int r = 0; r < repeats + 2; ++r) {
        const auto a = std::chrono::steady_clock::now();
        KEVO_GPU_ASSERT(cudaEventRecord(events[0], stream));
        CHECK_OK(p.search_async(request, pool.temp, pool.temp_bytes, out, stream));
        const auto enqueued = std::chrono::steady_clock::now();
        copy_answer(k);
        KEVO_GPU_ASSERT(cudaEventRecord(events[1], stream));
        KEVO_GPU_ASSERT(cudaEventSynchronize(events[1]));
        const auto b = std::chrono::steady_clock::now();
        const double on_stream = elapsed(0, 1);  // (read before the events are recorded again below)
        // The same stages with an event after the preparation (which cuts its last launch's overlap).
        {
          auto lock = p.index().search_lock();
          auto view = p.index().before_search(stream);
          CHECK_OK(view);
          KEVO_GPU_ASSERT(cudaEventRecord(events[0], stream));
          CHECK_OK(p.enqueue_prepare(check_request(p.schema(), p.model(), request).value(), pool.temp, stream));
          KEVO_GPU_ASSERT(cudaEventRecord(events[2], stream));
          CHECK_OK(p.enqueue_matching(*view, pool.temp, stream));
          CHECK_OK(p.enqueue_scoring(*view, pool.temp, request.routing, stream));
          CHECK_OK(p.enqueue_topk(*view, pool.temp, request.k, out, stream));
          CHECK_OK(p.index().after_search(stream));
        }
        KEVO_GPU_ASSERT(cudaEventRecord(events[1], stream));
        KEVO_GPU_ASSERT(cudaEventSynchronize(events[1]));
        if (r < 2) continue;
        host.push_back(std::chrono::duration<double>(b - a).count());
        stream_time.push_back(on_stream);
        enqueue.push_back(std::chrono::duration<double>(enqueued - a).count());
        prepare.push_back(elapsed(0, 2));
        rest.push_back(elapsed(2, 1));
      }
      std::printf("| %s | %llu | %d | %s | %.3f ms | %.3f ms | %.3f ms | %.3f ms | %.3f ms | %.3f ms |\n",
                  to_string(p.schema().embedding_type), static_cast<unsigned long long>(pool.n), k,
                  after_prior ? "after prior" : "ordinary", api * 1e3, median(host) * 1e3, median(stream_time) * 1e3,
                  median(enqueue) * 1e3, median(prepare) * 1e3, median(rest) * 1e3);
    }
  }
  CHECK_OK(p.set_policy(original));
  for (cudaEvent_t& e : events) KEVO_GPU_ASSERT(cudaEventDestroy(e));
  KEVO_GPU_ASSERT(cudaFreeHost(answer));
}

/// "typical int8: scoring 1.74x fp16's ads/s".
std::string fmt_ratio(const char* request, const char* dtype, double ratio) {
  char line[128];
  std::snprintf(line, sizeof line, "%s %s: scoring %.2fx fp16's ads/s", request, dtype, ratio);
  return line;
}

int main(int argc, char** argv) {
  std::uint64_t n = 100'000'000;
  bool quick = false, stages_only = false, updates_only = false, matching_only = false, probes_only = false,
       batch_only = false, serving_only = false, sweep_only = false, topk_only = false, launches_only = false,
       int8_only = false, shapes_only = false, sharded_only = false, sharded_whole = true, regroup_only = false;
  double churn = 0.25;  // --regroup-only: the fraction of ads that take new targeting
  std::vector<int> shape_dims{64, 128, 256};
  std::vector<EmbeddingType> shape_types;  // --shapes-only's storages: every one unless --dtype names some
  SlotOrder slot_order = SlotOrder::by_id;
  bool all_policies = false;
  std::vector<int> gpus;  // --sharded-only: a shard on each (a GPU may repeat); default every GPU, or 0,0 where one
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--n") && i + 1 < argc) n = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--stages-only")) stages_only = true;
    else if (!std::strcmp(argv[i], "--updates-only")) updates_only = true;
    else if (!std::strcmp(argv[i], "--probes-only")) probes_only = true;
    else if (!std::strcmp(argv[i], "--batch-only")) batch_only = true;
    else if (!std::strcmp(argv[i], "--serving-only")) serving_only = true;
    else if (!std::strcmp(argv[i], "--sweep-only")) sweep_only = true;  // the scoring policy sweep alone
    else if (!std::strcmp(argv[i], "--topk-only")) topk_only = true;    // every top-K policy alone
    else if (!std::strcmp(argv[i], "--launches-only")) launches_only = true;  // launch costs at 1M and 10M ads
    else if (!std::strcmp(argv[i], "--matching-only")) stages_only = matching_only = true;  // stages, then the matching sweep
    else if (!std::strcmp(argv[i], "--int8-only")) int8_only = true;  // fp16 and both int8 storages: speed and recall
    else if (!std::strcmp(argv[i], "--shapes-only")) shapes_only = true;  // scoring against the gather probe, every d and dtype
    else if (!std::strcmp(argv[i], "--regroup-only")) regroup_only = true;  // updates scatter targeting order; regroup() restores it
    else if (!std::strcmp(argv[i], "--churn") && i + 1 < argc) churn = std::atof(argv[++i]);  // --regroup-only
    else if (!std::strcmp(argv[i], "--dim") && i + 1 < argc) shape_dims = {std::atoi(argv[++i])};  // --shapes-only at one d
    else if (!std::strcmp(argv[i], "--dtype") && i + 1 < argc) {  // --shapes-only: this storage (repeatable)
      const auto type = embedding_type_named(argv[++i]);
      if (!type) {
        std::fprintf(stderr, "--dtype: '%s' is not %s\n", argv[i], kEmbeddingTypeNames.data());
        return 2;
      }
      shape_types.push_back(*type);
    } else if (!std::strcmp(argv[i], "--slots-by-targeting")) slot_order = SlotOrder::by_targeting;  // --shapes-only, ads grouped
    else if (!std::strcmp(argv[i], "--all-policies")) all_policies = true;  // --shapes-only: every scoring policy, not five
    else if (!std::strcmp(argv[i], "--sharded-only")) sharded_only = true;  // --n ads a shard, checked against one GPU holding all
    else if (!std::strcmp(argv[i], "--no-whole")) sharded_whole = false;     // --sharded-only without that check (memory)
    else if (!std::strcmp(argv[i], "--gpus") && i + 1 < argc) {
      for (const char* p = argv[++i]; p; p = std::strchr(p, ',') ? std::strchr(p, ',') + 1 : nullptr) gpus.push_back(std::atoi(p));
    } else {
      std::fprintf(stderr, "usage: %s [--n ADS] [--quick] [--shapes-only [--dim D] [--slots-by-targeting] [--all-policies]] [--regroup-only [--dim D] [--dtype T] [--churn 0.25]] [--sharded-only [--gpus 0,1] [--no-whole]] [--stages-only | --matching-only | --sweep-only | --topk-only | --launches-only | --int8-only | --updates-only | --probes-only | --batch-only | --serving-only]\n", argv[0]);
      return 2;
    }
  }
  // No driver or device here: a named stop, exit 2, before any work (as kevo's other GPU programs).
  if (auto here = kevo::nvidia_device_present(); !here) {
    std::fprintf(stderr, "retrieval_benchmark: %s\n", here.error().message.c_str());
    return 2;
  }
#ifdef KEVO_DEVICE_CODE_CHECK_ONLY
  std::fputs("retrieval_benchmark: built with KEVO_CUDA_DEVICE_CODE=check (configured where no GPU was found): its device code is unoptimized PTX, built to be compiled, not timed; reconfigure with -DKEVO_CUDA_DEVICE_CODE=sass and build again\n", stderr);  // (CMakeLists.txt)
  return 2;
#endif
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  const int repeats = quick ? 5 : 15;
  const double roofline = measure_roofline(nullptr);  // (the default stream: nothing else runs yet)
  std::printf("# retrieval benchmark on %s, %d SMs; streaming-read roofline %.3f TB/s\n\n", prop.name,
              prop.multiProcessorCount, roofline * 1e-12);

  const Workload fp16_workload({.seed = 2026});
  WorkloadOptions int8_options{.seed = 2026, .embedding_type = EmbeddingType::int8};
  const Workload int8_workload(int8_options);
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  SearchOutput out;
  KEVO_GPU_ASSERT(cudaMalloc(&out.ids, kMaxK * 4));
  KEVO_GPU_ASSERT(cudaMalloc(&out.scores, kMaxK * 4));
  KEVO_GPU_ASSERT(cudaMalloc(&out.count, 4));
  if (launches_only) {
    std::puts("## Launch costs: matching + scoring + top-K on the stream, from a graph, and the host's enqueue time\n");
    std::puts("| dtype | N | K | top-K | graph nodes | on the stream | graph replay | host enqueue | results |");
    std::puts("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (const std::uint64_t m : {1ull << 20, 10ull << 20}) {
      for (const Workload* w : {&fp16_workload, &int8_workload}) {
        std::vector<PackedAds> cache;
        Pool pool = build_pool(*w, m, 99, &cache);
        const PipelinePolicy original = pool.pipeline->policy();
        for (int k : {1, 1000, 4096})
          for (int one_launch : TopKPolicy::one_launch_domain)
            for (int sort : TopKPolicy::sort_domain) {
              PipelinePolicy policy = original;
              policy.topk.sort = sort;
              policy.topk.one_launch = one_launch;
              CHECK_OK(pool.pipeline->set_policy(policy));
              run_launch_costs(pool, fp16_workload.request(1, RequestKind::typical, k), repeats, out, stream);
            }
        CHECK_OK(pool.pipeline->set_policy(original));
        run_search_latency(pool, fp16_workload, repeats);
        run_search_breakdown(pool, fp16_workload, repeats, out, stream);
      }
    }
    return 0;
  }
  if (shapes_only) {
    if (shape_types.empty()) shape_types = {EmbeddingType::fp16, EmbeddingType::int8, EmbeddingType::int8_group32};
    run_scoring_shapes(n, shape_dims, shape_types, slot_order, all_policies, repeats, roofline, out, stream);
    return 0;
  }
  if (regroup_only) {
    if (!(churn > 0 && churn <= 1)) {
      std::fprintf(stderr, "--churn: a fraction in (0, 1]\n");
      return 2;
    }
    for (const int dim : shape_dims)
      for (EmbeddingType type : shape_types.empty() ? std::vector<EmbeddingType>{EmbeddingType::int8} : shape_types)
        run_regroup(n, dim, type, churn, repeats, roofline, out, stream);
    return 0;
  }
  if (sharded_only) {
    if (gpus.empty())
      for (int g = 0; g < std::max(2, gpu_device_count()); ++g) gpus.push_back(g % gpu_device_count());
    for (int g : gpus)
      if (g < 0 || g >= gpu_device_count()) {
        std::fprintf(stderr, "--gpus: no GPU %d here (%d)\n", g, gpu_device_count());
        return 2;
      }
    auto pools = build_sharded_pools(fp16_workload, n * gpus.size(), gpus, sharded_whole);
    return bench::run_sharded(std::move(pools), fp16_workload, quick) ? 0 : 1;
  }
  std::vector<PackedAds> targeting;
  auto t0 = std::chrono::steady_clock::now();
  Pool fp16 = build_pool(fp16_workload, n, 99, &targeting);
  auto t1 = std::chrono::steady_clock::now();
  std::printf("loaded %llu fp16 ads in %.1f s\n", static_cast<unsigned long long>(n),
              std::chrono::duration<double>(t1 - t0).count());
  Pool int8 = updates_only || probes_only || topk_only ? Pool{} : build_pool(int8_workload, n, 99, &targeting);
  std::printf("loaded %llu int8 ads in %.1f s\n\n", static_cast<unsigned long long>(n),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count());

  auto report = [&](const char* label, Pool& pool, const Request& request, std::uint64_t slots) {
    const StageTimes st = time_stages(pool, request, slots, repeats, out, stream);
    const double row = static_cast<double>(pool.pipeline->index().row_bytes());
    const double side = 4.0 * pool.pipeline->index().side_width();  // the bias and any scales, one record
    const double el = st.eligible;
    // Matching reads a header byte per ad and the postings the user's values list, and writes the list.
    const double match_bytes = 1.0 * slots + 2.0 * matched_postings(pool, request, slots) + 4.0 * el;
    const double score_bytes = el * (row + side + 4 + 4);
    const double pipe_bytes = match_bytes - 4.0 * el + el * (row + side);
    std::printf("| %s | %s | %llu | %.1f%% | %d | %.1f G/s (%.0f%%) | %.1f G/s (%.0f%%) | %.3f ms (%.1f%% of scoring) | %.3f ms | %.2f G/s (%.0f%%) |\n",
                label, to_string(pool.pipeline->schema().embedding_type), static_cast<unsigned long long>(slots),
                100.0 * el / slots, request.k, slots / st.matching * 1e-9, 100 * match_bytes / st.matching / roofline,
                el / st.scoring * 1e-9, 100 * score_bytes / st.scoring / roofline, st.topk * 1e3,
                100 * st.topk / st.scoring, st.total * 1e3, slots / st.total * 1e-9,
                100 * pipe_bytes / st.total / roofline);
    return st;
  };
  // An array, not a braced list: nvcc rejects std::initializer_list<Pool*> because the index's id
  // map holds SSE2 vectors (it checks the element type as if for device code).
  const std::array<Pool*, 2> both_pools{&fp16, &int8};
  const Request typical = fp16_workload.request(1, RequestKind::typical, 1000);
  if (batch_only) {
    std::puts("## Batches: one pass per batch (search_batch_async) against one search after another\n");
    for (Pool* p : both_pools) run_batches(*p, fp16_workload, n, repeats, roofline, out, stream);
    return 0;
  }
  if (serving_only) {
    std::puts("## Concurrent searches: threads searching at once, in turn or batched (BatchingBackend)\n");
    for (Pool* p : both_pools) run_concurrent_searches(*p, fp16_workload, n, quick);
    return 0;
  }
  if (updates_only) {
    run_updates(fp16, fp16_workload, typical, n, quick);
    return 0;
  }
  if (topk_only) {
    run_topk_sweep(fp16, fp16_workload, n, repeats, out, stream);
    return 0;
  }
  if (sweep_only) {
    run_scoring_policy_sweep(both_pools, typical, n, repeats, roofline, out, stream);
    return 0;
  }
  if (probes_only) {
    std::puts("## Gather probes (fp16, typical request)\n");
    run_gather_probes(fp16, typical, n, repeats, roofline, out, stream);
    const std::uint32_t eligible = time_stages(fp16, typical, n, 1, out, stream).eligible;
    const double t = time_scoring_only(fp16, typical, n, repeats, stream);
    std::printf("scoring alone (default policy): %.2f G ads/s (%.1f%%)\n", eligible / t * 1e-9,
                100 * eligible * (fp16.pipeline->index().row_bytes() + 12.0) / t / roofline);
    return 0;
  }
  // recall@K of a quantised pool's answers against fp16's, over `requests` typical requests.
  auto recall_against_fp16 = [&](Pool& quantised, int k, int requests) {
    double recall = 0;
    for (int q = 0; q < requests; ++q) {
      const Request r = fp16_workload.request(100 + static_cast<std::uint64_t>(q), RequestKind::typical, k);
      const auto a = top_k(fp16, r), b = top_k(quantised, r);
      std::vector<std::uint32_t> ia, ib;
      for (auto& x : a) ia.push_back(x.id);
      for (auto& x : b) ib.push_back(x.id);
      std::sort(ia.begin(), ia.end());
      std::sort(ib.begin(), ib.end());
      std::vector<std::uint32_t> both;
      std::set_intersection(ia.begin(), ia.end(), ib.begin(), ib.end(), std::back_inserter(both));
      recall += static_cast<double>(both.size()) / std::max<std::size_t>(1, ia.size()) / requests;
    }
    return recall;
  };
  if (int8_only) {
    // int8's two storages beside fp16: one scale per ad, or one per group of 32 values (for recall).
    const Workload group_workload({.seed = 2026, .embedding_type = EmbeddingType::int8_group32});
    Pool group32 = build_pool(group_workload, n, 99, &targeting);
    const std::array<Pool*, 3> pools{&fp16, &int8, &group32};
    std::puts("## fp16, int8 and int8_group32 (median of repeats; % = fraction of the streaming roofline)\n");
    std::puts("| request | dtype | N | eligible | K | matching | scoring | top-K | pipeline (events) | pipeline |");
    std::puts("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    const Request broad = fp16_workload.request(1, RequestKind::broad, 1000);
    double fp16_scoring[2] = {};
    std::vector<std::string> ratios;
    for (int which = 0; which < 2; ++which)
      for (Pool* p : pools) {
        const StageTimes st = report(which ? "broad" : "typical", *p, which ? broad : typical, n);
        const double rate = st.eligible / st.scoring;
        if (p == &fp16) fp16_scoring[which] = rate;
        else ratios.push_back(fmt_ratio(which ? "broad" : "typical", to_string(p->pipeline->schema().embedding_type),
                                        rate / fp16_scoring[which]));
      }
    std::puts("");
    for (const std::string& line : ratios) std::puts(line.c_str());
    std::puts("\n## recall@K against fp16 (same ads, same typical requests)\n");
    std::puts("| K | int8 | int8_group32 |");
    std::puts("| --- | --- | --- |");
    for (int k : {100, 1000, 4096})
      std::printf("| %d | %.4f | %.4f |\n", k, recall_against_fp16(int8, k, quick ? 2 : 5),
                  recall_against_fp16(group32, k, quick ? 2 : 5));
    return 0;
  }
  std::puts("## Stages (median of repeats; G/s = ads per second, % = fraction of the streaming roofline)\n");
  std::puts("| request | dtype | N | eligible | K | matching | scoring | top-K | pipeline (events) | pipeline |");
  std::puts("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
  const Request broad = fp16_workload.request(1, RequestKind::broad, 1000);
  report("typical", fp16, typical, n);
  report("typical", int8, typical, n);
  report("broad", fp16, broad, n);
  report("broad", int8, broad, n);
  for (int k : {1, 100, 4096}) {
    Request r = typical;
    r.k = k;
    report("typical", fp16, r, n);
  }
  for (std::uint64_t m : {1ull << 20, 10ull << 20}) {
    if (m < n) {
      report("typical", fp16, typical, m);
      report("typical", int8, typical, m);
    }
  }

  if (!matching_only) run_scoring_policy_sweep(both_pools, typical, n, repeats, roofline, out, stream);

  std::puts("\n## Scoring alone vs scoring + top-K (typical, K = 1000)\n");
  for (Pool* p : both_pools) {
    const double scoring = time_scoring_only(*p, typical, n, repeats, stream);
    const StageTimes st = time_stages(*p, typical, n, repeats, out, stream);
    std::printf("%s: scoring alone %.3f ms; inside the pipeline scoring %.3f ms + top-K %.3f ms = %.1f%% added\n",
                to_string(p->pipeline->schema().embedding_type), scoring * 1e3, st.scoring * 1e3, st.topk * 1e3,
                100 * st.topk / scoring);
  }

  std::puts("\n## Matching policy sweep (typical, fp16)\n");
  {
    const PipelinePolicy original = fp16.pipeline->policy();
    for (const MatchingPolicy& matching : every_policy<MatchingPolicy>()) {
      if (matching.launch_after_prior != original.matching.launch_after_prior) continue;  // (stages are timed apart)
      PipelinePolicy policy = original;
      policy.matching = matching;
      CHECK_OK(fp16.pipeline->set_policy(policy));
      const StageTimes st = time_stages(fp16, typical, n, repeats, out, stream);
      std::printf("%s: matching %.1f G ads/s\n", to_string(policy.matching).c_str(), n / st.matching * 1e-9);
    }
    CHECK_OK(fp16.pipeline->set_policy(original));
  }
  if (matching_only || !stages_only) {
    std::puts("\n## Narrow extreme (pool restricting each category with p in 0.1..0.2, one rare value per category)\n");
    const Workload w({.seed = 2027, .restrict_min = 0.1, .restrict_max = 0.2});
    const std::uint64_t m = std::min<std::uint64_t>(n, 20u << 20);
    std::vector<PackedAds> narrow_targeting;
    Pool pool = build_pool(w, m, 98, &narrow_targeting, 24);
    report("narrow", pool, w.request(1, RequestKind::narrow, 1000), m);
  }
  if (stages_only) return 0;

  std::puts("\n## Routing width (typical, fp16, K = 1000)\n");
  for (int routing : {1, 8}) {
    Request r = typical;
    r.routing = routing;
    const StageTimes st = time_stages(fp16, r, n, repeats, out, stream);
    std::printf("k_e = %d: scoring %.1f G ads/s\n", routing, st.eligible / st.scoring * 1e-9);
  }

  std::puts("\n## int8 recall@K against fp16 (same ads, same requests)\n");
  for (int k : {100, 1000, 4096}) std::printf("recall@%d = %.4f\n", k, recall_against_fp16(int8, k, quick ? 2 : 5));

  std::puts("\n## Pipeline, request in to top-K out on the host (search(), synchronous), and back-to-back async\n");
  for (Pool* p : both_pools) {
    const double t = median_search_seconds(*p, repeats, [&](int r) {
      return fp16_workload.request(200 + static_cast<std::uint64_t>(r), RequestKind::typical, 1000);
    });
    std::printf("%s one request at a time: %.3f ms = %.2f G pool ads/s\n",
                to_string(p->pipeline->schema().embedding_type), t * 1e3, n / t * 1e-9);
    for (int batch : {8, 32}) {
      const auto a = std::chrono::steady_clock::now();
      for (int r = 0; r < batch; ++r)
        CHECK_OK(p->pipeline->search_async(fp16_workload.request(300 + r, RequestKind::typical, 1000), p->temp,
                                           p->temp_bytes, out, stream));
      KEVO_GPU_ASSERT(cudaStreamSynchronize(stream));
      const double bt = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
      std::printf("%s batch of %d (async, one stream): %.3f ms per request = %.2f G pool ads/s\n",
                  to_string(p->pipeline->schema().embedding_type), batch, bt / batch * 1e3, n * batch / bt * 1e-9);
    }
  }

  std::puts("\n## Batches: one pass per batch (search_batch_async) against one search after another\n");
  for (Pool* p : both_pools) run_batches(*p, fp16_workload, n, repeats, roofline, out, stream);

  std::puts("\n## Concurrent searches: threads searching at once, in turn or batched (BatchingBackend)\n");
  for (Pool* p : both_pools) run_concurrent_searches(*p, fp16_workload, n, quick);

  run_updates(fp16, fp16_workload, typical, n, quick);

  std::puts("\n## d sweep (typical, 20M ads, scoring only)\n");
  for (int dim : {64, 128, 256}) {
    for (EmbeddingType type : {EmbeddingType::fp16, EmbeddingType::int8}) {
      const Workload w({.seed = 2026, .dim = dim, .embedding_type = type});
      const std::uint64_t m = std::min<std::uint64_t>(n, 20u << 20);
      Pool pool = build_pool(w, m, 99, &targeting);
      const StageTimes st = time_stages(pool, w.request(1, RequestKind::typical, 1000), m, repeats, out, stream);
      const double bytes = st.eligible * (pool.pipeline->index().row_bytes() + 4.0 * pool.pipeline->index().side_width() + 8);
      std::printf("d = %d %s: scoring %.1f G ads/s (%.0f%% of roofline), top-K %.3f ms\n", dim, to_string(type),
                  st.eligible / st.scoring * 1e-9, 100 * bytes / st.scoring / roofline, st.topk * 1e3);
    }
  }

  std::puts("\n## Memory\n");
  const std::size_t per_request_per_slot = 8;  // eligible list + keys in the temp storage
  std::size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  for (Pool* p : both_pools) {
    const std::size_t per_ad = p->pipeline->index().bytes_per_slot() + per_request_per_slot;
    std::printf("%s: %zu bytes per ad on the device (index %zu + search temp %zu); about %.0f M ads fit in %.0f GB\n",
                to_string(p->pipeline->schema().embedding_type), per_ad, p->pipeline->index().bytes_per_slot(),
                per_request_per_slot, 0.97 * total_bytes / per_ad * 1e-6, total_bytes * 1e-9);
  }
  return 0;
}
