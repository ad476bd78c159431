// kevo/eval/torch_families_cuda.hpp: the CUDA side of the template families (torch_families.hpp holds the CPU
// side and `family_template`, which picks one by the problem's target), and what both sides share: the helper's
// description of a family, a family's template, the activations, the knob helper.
//
// A CUDA family template is a kevo CUDA candidate: `#include "kevo_problem.hpp"`, then
// `void kernel(const Shape&, <device pointers in manifest order, inputs const>)`, which launches on the default
// stream and returns (kevo synchronizes after each call). The sizes are the problem's, as constants; every
// template handles any of them (odd, tiny, a line of one element), falls back to scalar accesses where a vector
// would be misaligned, and writes every output element. Arithmetic stays fp32 (no TF32, no tensor cores): the
// results must match PyTorch's to 1e-4. The layout of a reduced tensor is the CPU templates' one: a tensor of
// (outer, reduce, inner) elements whose line (o, i) holds elements o * reduce * inner + r * inner + i.
//   elementwise   vector loads (1, 2, 4 floats), loads in flight per thread, an exact grid or a grid-stride loop
//   softmax       inner == 1: a block or a warp a row, vector loads, three passes or one online pass, the row kept
//                 in registers or shared memory; inner > 1: a block takes a tile of consecutive inner indices
//                 (coalesced), `split` threads share each line
//   norm          the same two layouts, and for a few long lines (the Frobenius norm) a grid of blocks a line:
//                 partial sums, then every block scales its chunk
//   reduction     a block or a warp a row (vector loads after an aligning head) or the coalesced column tiles
//   matmul        a shared-memory tiled SGEMM with register blocking (block tile, thread tile, k step, vector
//                 loads, register double buffering); matrix-vector products (n == 1 or m == 1) get a warp or a
//                 block a row, or column tiles where the matrix is stored along the output index
//
// Why one file of about 1420 lines: most of it is the families' CUDA source, as text, beside the knob
// domains and the launch arithmetic that fill it in; a knob's name, its domain and its use in the text
// must agree, and they are read together.
#pragma once

#include <kevo/eval/harness.hpp>
#include <kevo/expected.hpp>
#include <kevo/problem.hpp>

#include <fmt/format.h>

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kevo::eval {

/// What the helper learned of a problem's family (the JSON object "family" of `kevo_torch.py describe`).
struct FamilyDescription {
  std::string family;                     ///< "elementwise", "softmax", "norm", "reduction", "matmul"
  std::string op;                         ///< elementwise: "relu", ...; reduction: "sum", ...; norm: its kind
  std::map<std::string, double> numbers;  ///< sizes (n, outer, reduce, inner, batch, m, n, k) and parameters (eps, slopes)
  std::map<std::string, std::string> words;  ///< text parameters (gelu's "approximate")
  std::map<std::string, bool> flags;      ///< log, affine, keepdim, trans_a, trans_b, bias

  double number(const std::string& key, double fallback = 0) const {
    auto it = numbers.find(key);
    return it == numbers.end() ? fallback : it->second;
  }
  bool flag(const std::string& key) const {
    auto it = flags.find(key);
    return it != flags.end() && it->second;
  }
  long size(const std::string& key) const { return static_cast<long>(number(key, 1)); }
};

/// A family's template for one problem: C++ with ${knob} placeholders, its knobs, the useful FLOPs, and the
/// settings worth trying first (Problem::starting_points).
struct FamilyTemplate {
  std::string source;
  std::vector<KnobSpec> knobs;
  double flops = 0;
  std::vector<StartingPoint> starting_points;
};

namespace detail {

inline std::string float_literal(double v) { return fmt::format("{:#.9g}f", v); }  // "#": 0 is "0.00000000f", a float literal

/// Which math functions an activation calls: C++'s (std::exp) or CUDA's float ones (expf), in device code.
enum class MathDialect { cpp, cuda };

/// One activation as a C++ expression of `v` (a float), matching PyTorch's definition.
inline expected<std::string, Error> activation_expression(const FamilyDescription& d, MathDialect dialect = MathDialect::cpp) {
  const std::string& op = d.op;
  auto p = [&](const char* key, double fallback) { return float_literal(d.number(key, fallback)); };
  auto f = [&](const char* name) { return dialect == MathDialect::cpp ? std::string("std::") + name : std::string(name) + "f"; };
  if (op == "relu") return std::string("v > 0.0f ? v : 0.0f");
  if (op == "leaky_relu") return fmt::format("v > 0.0f ? v : {} * v", p("negative_slope", 0.01));
  if (op == "sigmoid") return fmt::format("1.0f / (1.0f + {}(-v))", f("exp"));
  if (op == "tanh") return fmt::format("{}(v)", f("tanh"));
  if (op == "gelu") {
    auto it = d.words.find("approximate");
    if (it != d.words.end() && it->second == "tanh")
      return fmt::format("0.5f * v * (1.0f + {}(0.7978845608f * (v + 0.044715f * v * v * v)))", f("tanh"));
    return fmt::format("0.5f * v * (1.0f + {}(v * 0.70710678118f))", f("erf"));
  }
  if (op == "elu") return fmt::format("v > 0.0f ? v : {} * {}(v)", p("alpha", 1.0), f("expm1"));
  if (op == "selu") return fmt::format("1.0507009873554805f * (v > 0.0f ? v : 1.6732632423543772f * {}(v))", f("expm1"));
  if (op == "softplus")
    return fmt::format("v * {0} > {1} ? v : {2}({3}(v * {0})) / {0}", p("beta", 1.0), p("threshold", 20.0), f("log1p"), f("exp"));
  if (op == "softsign") return fmt::format("v / (1.0f + {}(v))", f("fabs"));
  if (op == "hardtanh") return fmt::format("v < {0} ? {0} : (v > {1} ? {1} : v)", p("min_val", -1.0), p("max_val", 1.0));
  if (op == "hardsigmoid") return std::string("v <= -3.0f ? 0.0f : (v >= 3.0f ? 1.0f : v / 6.0f + 0.5f)");
  if (op == "silu") return fmt::format("v / (1.0f + {}(-v))", f("exp"));
  if (op == "mish") return fmt::format("v * {}(v > 20.0f ? v : {}({}(v)))", f("tanh"), f("log1p"), f("exp"));
  if (op == "hardswish") return std::string("v <= -3.0f ? 0.0f : (v >= 3.0f ? v : v * (v + 3.0f) / 6.0f)");
  return make_error(fmt::format("no elementwise template for the activation '{}'", op));
}

inline KnobSpec knob(std::string name, std::vector<std::string> domain, KnobSide side) {
  KnobSpec k{.name = std::move(name), .domain = std::move(domain), .side = side};
  k.default_value = k.domain.front();
  return k;
}

inline StartingPoint starting_point(std::string name, Knobs knobs) { return StartingPoint{.name = std::move(name), .knobs = std::move(knobs)}; }

// ---- CUDA templates ----

/// What every CUDA family template starts with: includes, packs of floats, and reductions across a warp or block.
inline constexpr std::string_view cuda_family_prelude = R"cuda(#include "kevo_problem.hpp"

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <type_traits>

// The template's code, helpers first: a named namespace, so that what a setting of the knobs leaves unused draws
// no warnings.
namespace kevo_family {

// W floats moved as one load or store.
template <int W>
struct alignas(4 * W) Pack {
  float v[W];
};

__host__ __device__ constexpr long ceil_div(long a, long b) { return (a + b - 1) / b; }

inline bool aligned(const void* p, int bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

// The device's multiprocessors, asked once.
inline int multiprocessors() {
  static const int count = [] {
    int device = 0, n = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0)
      return 132;
    return n;
  }();
  return count;
}

// Dynamic shared memory past 48 KiB needs the kernel's consent, asked once per kernel.
template <class Kernel>
void allow_shared(Kernel* k, long bytes) {
  static const bool asked = bytes > 48 * 1024 && cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)) == cudaSuccess;
  (void)asked;
}

// An argmax's or argmin's running best: the value and its index along the line.
struct Best {
  float v;
  int i;
};

__device__ __forceinline__ float shuffle_xor(float v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ float2 shuffle_xor(float2 v, int o) { return make_float2(shuffle_xor(v.x, o), shuffle_xor(v.y, o)); }
__device__ __forceinline__ Best shuffle_xor(Best v, int o) { return Best{shuffle_xor(v.v, o), __shfl_xor_sync(0xffffffffu, v.i, o)}; }

// `v` combined over a warp's lanes with `op` (symmetric, so every lane gets the same result).
template <class T, class Op>
__device__ __forceinline__ T warp_all(T v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = op(v, shuffle_xor(v, o));
  return v;
}

// `v` combined over a group of `Threads` threads: a warp, or (Threads > 32) the whole block. Every thread of the
// group gets the same result; `scratch` is 32 T of shared memory, used when the group is more than a warp.
template <int Threads, class T, class Op>
__device__ __forceinline__ T group_all(T v, Op op, T* scratch) {
  v = warp_all(v, op);
  if constexpr (Threads > 32) {
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    v = scratch[0];
#pragma unroll
    for (int w = 1; w < Threads / 32; ++w) v = op(v, scratch[w]);
    __syncthreads();  // scratch is reused by the next combination
  }
  return v;
}

struct Sum {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct Sum2 {
  __device__ __forceinline__ float2 operator()(float2 a, float2 b) const { return make_float2(a.x + b.x, a.y + b.y); }
};
struct Max {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

)cuda";

/// The row mapping of the families whose lines are rows (inner == 1): a block or a warp a row.
inline constexpr std::string_view cuda_row_mapping = R"cuda(
constexpr bool warp_per_row = std::string_view("${row_mapping}") == "warp";
constexpr int block_threads = ${block_threads};
constexpr int group_threads = warp_per_row ? 32 : block_threads;  // the threads that share one row
constexpr int rows_per_block = block_threads / group_threads;
)cuda";

/// A row kept between passes (softmax and norm rows): in registers, in shared memory or nowhere.
inline constexpr std::string_view cuda_row_cache = R"cuda(
constexpr int vector_width = ${vector_width};  // floats per load and store: 1, 2 or 4
constexpr int cache_none = 0, cache_shared = 1, cache_registers = 2;
constexpr int row_cache = std::string_view("${row_cache}") == "registers" ? cache_registers
                          : std::string_view("${row_cache}") == "shared"  ? cache_shared
                                                                          : cache_none;
constexpr int register_items = ${register_items};  // floats a thread may keep when row_cache is registers
constexpr int unroll = ${unroll};
constexpr long max_dynamic_shared = 200 * 1024;    // below the 227 KiB a block may opt into on sm_90

// Where a row of W-float packs is kept: registers if each thread's share fits register_items, else shared memory
// if the block's rows fit, else nowhere (each pass reads global memory).
template <int W>
constexpr int cache_for() {
  const long per_thread = ceil_div(reduce / W, group_threads) * W;
  if (row_cache == cache_registers && per_thread <= register_items) return cache_registers;
  if (row_cache != cache_none && rows_per_block * reduce * long(sizeof(float)) <= max_dynamic_shared) return cache_shared;
  return cache_none;
}

// One row of `reduce` floats (W divides it) as the thread at `lane` of its group sees it: packs lane,
// lane + group_threads, ... `first` reads them from global memory (keeping them where Cache says), `again` from
// where they are kept, `write` stores f(pack, index) to the output row.
template <int W, int Cache>
struct Row {
  using P = Pack<W>;
  static constexpr long packs = reduce / W;
  static constexpr int slots = Cache == cache_registers ? int(ceil_div(packs, group_threads)) : 1;
  const P* in;
  P* out;
  P* cache;  // (packs) in shared memory, Cache == cache_shared
  int lane;
  P held[slots];

  template <class F>
  __device__ __forceinline__ void first(F f) {
    if constexpr (Cache == cache_registers) {
#pragma unroll
      for (int s = 0; s < slots; ++s)
        if (lane + long(s) * group_threads < packs) held[s] = in[lane + long(s) * group_threads];
#pragma unroll
      for (int s = 0; s < slots; ++s)
        if (lane + long(s) * group_threads < packs) f(held[s], lane + long(s) * group_threads);
    } else {
#pragma unroll unroll
      for (long i = lane; i < packs; i += group_threads) {
        const P p = in[i];
        if constexpr (Cache == cache_shared) cache[i] = p;  // read back by this thread only
        f(p, i);
      }
    }
  }
  template <class F>
  __device__ __forceinline__ void again(F f) const {
    if constexpr (Cache == cache_registers) {
#pragma unroll
      for (int s = 0; s < slots; ++s)
        if (lane + long(s) * group_threads < packs) f(held[s], lane + long(s) * group_threads);
    } else {
#pragma unroll unroll
      for (long i = lane; i < packs; i += group_threads) f(Cache == cache_shared ? cache[i] : in[i], i);
    }
  }
  template <class F>
  __device__ __forceinline__ void write(F f) const {
    if constexpr (Cache == cache_registers) {
#pragma unroll
      for (int s = 0; s < slots; ++s)
        if (lane + long(s) * group_threads < packs) out[lane + long(s) * group_threads] = f(held[s], lane + long(s) * group_threads);
    } else {
#pragma unroll unroll
      for (long i = lane; i < packs; i += group_threads) out[i] = f(Cache == cache_shared ? cache[i] : in[i], i);
    }
  }
};
)cuda";

/// The column tiles of the families whose lines run across `inner` (inner > 1): a block takes inner_tile
/// consecutive packs of inner indices (consecutive threads, consecutive addresses), `split` threads per line.
inline constexpr std::string_view cuda_column_tiles = R"cuda(
constexpr int inner_tile = ${inner_tile};  // threads across consecutive inner indices (each a pack of them)
constexpr int split_wanted = ${split};     // threads down each line, taking every split-th element
constexpr int split = split_wanted * inner_tile <= 1024 ? split_wanted : 1024 / inner_tile;
constexpr int column_threads = inner_tile * split;
constexpr int vector_width = ${vector_width};  // consecutive inner indices a thread takes: 1, 2 or 4
)cuda";

inline std::string cuda_kernel_wrapper(const Problem& p, std::string_view call) {
  return fmt::format("\n}}  // namespace kevo_family\n\nvoid kernel(const Shape&{}) {{ kevo_family::{} }}\n", tensor_parameters(p), call);
}

inline std::string elementwise_cuda(const FamilyDescription& d, const std::string& expression, const Problem& p) {
  std::string source(cuda_family_prelude);
  source += fmt::format(R"(
// {0}, elementwise over {1} elements (a KernelBench-format problem's forward, matched by kevo).
constexpr long n = {1};
__device__ __forceinline__ float op(float v) {{ return {2}; }}
)",
                        d.op, d.size("n"), expression);
  source += R"cuda(
constexpr int block_threads = ${block_threads};
constexpr int vector_width = ${vector_width};    // floats per load and store: 1, 2 or 4
constexpr int items = ${items_per_thread};       // packs a thread loads before it computes (loads in flight)
constexpr int blocks_per_sm = ${blocks_per_sm};  // 0: a grid that covers the tensor once; else a grid-stride loop

template <int W>
__global__ void __launch_bounds__(block_threads) map_kernel(const float* __restrict__ x, float* __restrict__ y) {
  using P = Pack<W>;
  constexpr long packs = n / W;
  constexpr long step = long(block_threads) * items;
  const P* xp = reinterpret_cast<const P*>(x);
  P* yp = reinterpret_cast<P*>(y);
  for (long base = long(blockIdx.x) * step + threadIdx.x; base < packs; base += long(gridDim.x) * step) {
    P v[items];
#pragma unroll
    for (int u = 0; u < items; ++u)
      if (base + long(u) * block_threads < packs) v[u] = xp[base + long(u) * block_threads];
#pragma unroll
    for (int u = 0; u < items; ++u)
      if (base + long(u) * block_threads < packs) {
#pragma unroll
        for (int k = 0; k < W; ++k) v[u].v[k] = op(v[u].v[k]);
        yp[base + long(u) * block_threads] = v[u];
      }
  }
  if constexpr (n % W != 0)  // the last n % W elements
    if (blockIdx.x == 0 && threadIdx.x < n % W) y[packs * W + threadIdx.x] = op(x[packs * W + threadIdx.x]);
}

template <int W>
void launch(const float* x, float* y) {
  const long cover = ceil_div(n / W, long(block_threads) * items);
  long blocks = blocks_per_sm > 0 && long(blocks_per_sm) * multiprocessors() < cover ? long(blocks_per_sm) * multiprocessors() : cover;
  if (blocks < 1) blocks = 1;
  if (blocks > 0x7fffffffL) blocks = 0x7fffffffL;  // the loop strides over the rest
  map_kernel<W><<<unsigned(blocks), block_threads>>>(x, y);
}

void run(const float* x, float* y) {
  if constexpr (vector_width > 1) {
    if (aligned(x, 4 * vector_width) && aligned(y, 4 * vector_width)) return launch<vector_width>(x, y);
  }
  launch<1>(x, y);
}
)cuda";
  return source + cuda_kernel_wrapper(p, fmt::format("run({}, {});", p.tensors.front().name, p.tensors.back().name));
}

inline std::string softmax_cuda(const FamilyDescription& d, const Problem& p) {
  const bool rows = d.size("inner") == 1;
  std::string source(cuda_family_prelude);
  source += fmt::format(R"(
// {0} over the middle extent of ({1}, {2}, {3}) (a KernelBench-format problem's forward, matched by kevo).
inline constexpr long outer = {1}, reduce = {2}, inner = {3};  // inline: no warning where one goes unused
constexpr bool log_softmax = {4};
)",
                        d.flag("log") ? "log-softmax" : "softmax", d.size("outer"), d.size("reduce"), d.size("inner"),
                        d.flag("log") ? "true" : "false");
  source += R"cuda(
constexpr bool fast_exp = std::string_view("${exp_impl}") == "fast";

__device__ __forceinline__ float exp_of(float v) {
  if constexpr (fast_exp) return __expf(v);
  else return expf(v);
}

// (max, sum of exp(v - max)) of two parts of a line together.
struct Merge {
  __device__ __forceinline__ float2 operator()(float2 a, float2 b) const {
    const float m = fmaxf(a.x, b.x);
    if (m == -INFINITY) return make_float2(m, 0.0f);
    return make_float2(m, a.y * exp_of(a.x - m) + b.y * exp_of(b.x - m));
  }
};

// The online (max, sum) grown by one element: one exponential each.
__device__ __forceinline__ void fold(float v, float& max, float& sum) {
  if (v > max) {
    sum = sum * exp_of(max - v) + 1.0f;
    max = v;
  } else {
    sum += exp_of(v - max);
  }
}

__device__ __forceinline__ float result(float v, float max, float shift, float inverse) {
  if constexpr (log_softmax) return v - shift;
  else return exp_of(v - max) * inverse;
}
)cuda";
  if (rows) {
    source += cuda_row_mapping;
    source += cuda_row_cache;
    source += R"cuda(
constexpr bool online = std::string_view("${passes}") == "online";  // else max, then sum, then write

template <int W, int Cache>
__global__ void __launch_bounds__(block_threads) softmax_rows(const float* __restrict__ x, float* __restrict__ y) {
  extern __shared__ float4 dynamic_shared[];  // (rows_per_block, reduce) when Cache == cache_shared
  __shared__ float2 scratch2[32];
  __shared__ float scratch[32];
  using P = Pack<W>;
  const int group = threadIdx.x / group_threads, lane = threadIdx.x % group_threads;
  const long row = long(blockIdx.x) * rows_per_block + group;
  if (row >= outer) return;  // whole warps, in warp-per-row mode only
  Row<W, Cache> r{reinterpret_cast<const P*>(x + row * reduce), reinterpret_cast<P*>(y + row * reduce),
                  reinterpret_cast<P*>(reinterpret_cast<float*>(dynamic_shared) + group * reduce), lane};
  float max = -INFINITY, sum = 0.0f;
  if constexpr (online) {
    r.first([&](const P& p, long) {
      float pack_max = p.v[0];
#pragma unroll
      for (int k = 1; k < W; ++k) pack_max = fmaxf(pack_max, p.v[k]);
      if (pack_max > max) {
        sum *= exp_of(max - pack_max);  // 0 while the thread has seen nothing (max is -inf)
        max = pack_max;
      }
#pragma unroll
      for (int k = 0; k < W; ++k) sum += exp_of(p.v[k] - max);
    });
    const float2 t = group_all<group_threads>(make_float2(max, sum), Merge{}, scratch2);
    max = t.x;
    sum = t.y;
  } else {
    r.first([&](const P& p, long) {
#pragma unroll
      for (int k = 0; k < W; ++k) max = fmaxf(max, p.v[k]);
    });
    max = group_all<group_threads>(max, Max{}, scratch);
    r.again([&](const P& p, long) {
#pragma unroll
      for (int k = 0; k < W; ++k) sum += exp_of(p.v[k] - max);
    });
    sum = group_all<group_threads>(sum, Sum{}, scratch);
  }
  const float shift = max + logf(sum), inverse = 1.0f / sum;
  r.write([&](P p, long) {
#pragma unroll
    for (int k = 0; k < W; ++k) p.v[k] = result(p.v[k], max, shift, inverse);
    return p;
  });
}

template <int W>
void launch(const float* x, float* y) {
  constexpr int cache = cache_for<W>();
  const long shared = cache == cache_shared ? rows_per_block * reduce * long(sizeof(float)) : 0;
  allow_shared(softmax_rows<W, cache>, shared);
  softmax_rows<W, cache><<<unsigned(ceil_div(outer, rows_per_block)), block_threads, size_t(shared)>>>(x, y);
}

void run(const float* x, float* y) {
  if constexpr (vector_width > 1 && reduce % vector_width == 0) {
    if (aligned(x, 4 * vector_width) && aligned(y, 4 * vector_width)) return launch<vector_width>(x, y);
  }
  launch<1>(x, y);
}
)cuda";
  } else {
    source += cuda_column_tiles;
    source += R"cuda(
constexpr bool keep_column = std::string_view("${column_cache}") == "registers";  // the line's elements stay in registers

template <int W>
__global__ void __launch_bounds__(column_threads) softmax_columns(const float* __restrict__ x, float* __restrict__ y) {
  using P = Pack<W>;
  constexpr long per_thread = ceil_div(reduce, split);
  constexpr bool keep = keep_column && per_thread * W <= 64;
  constexpr int slots = keep ? int(per_thread) : 1;
  __shared__ float2 part[split][inner_tile * W];
  const int tx = threadIdx.x % inner_tile, ty = threadIdx.x / inner_tile;
  constexpr long tiles = ceil_div(inner, long(inner_tile) * W);
  const long o = blockIdx.x / tiles, i0 = (blockIdx.x % tiles) * inner_tile * W + long(tx) * W;
  const bool active = i0 < inner;  // W divides inner: the whole pack lies inside
  const float* in = x + o * reduce * inner + i0;
  float* out = y + o * reduce * inner + i0;
  float max[W], sum[W];
  P held[slots];
#pragma unroll
  for (int k = 0; k < W; ++k) max[k] = -INFINITY, sum[k] = 0.0f;
  if (active) {
    if constexpr (keep) {
#pragma unroll
      for (int s = 0; s < slots; ++s)
        if (ty + long(s) * split < reduce) held[s] = *reinterpret_cast<const P*>(in + (ty + long(s) * split) * inner);
#pragma unroll
      for (int s = 0; s < slots; ++s)
        if (ty + long(s) * split < reduce)
#pragma unroll
          for (int k = 0; k < W; ++k) fold(held[s].v[k], max[k], sum[k]);
    } else {
      for (long r = ty; r < reduce; r += split) {
        const P p = *reinterpret_cast<const P*>(in + r * inner);
#pragma unroll
        for (int k = 0; k < W; ++k) fold(p.v[k], max[k], sum[k]);
      }
    }
  }
  if constexpr (split > 1) {
#pragma unroll
    for (int k = 0; k < W; ++k) part[ty][tx * W + k] = make_float2(max[k], sum[k]);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < W; ++k) {
      float2 t = part[0][tx * W + k];
      for (int q = 1; q < split; ++q) t = Merge{}(t, part[q][tx * W + k]);
      max[k] = t.x;
      sum[k] = t.y;
    }
  }
  if (!active) return;
  float shift[W], inverse[W];
#pragma unroll
  for (int k = 0; k < W; ++k) shift[k] = max[k] + logf(sum[k]), inverse[k] = 1.0f / sum[k];
  if constexpr (keep) {
#pragma unroll
    for (int s = 0; s < slots; ++s)
      if (ty + long(s) * split < reduce) {
        P p = held[s];
#pragma unroll
        for (int k = 0; k < W; ++k) p.v[k] = result(p.v[k], max[k], shift[k], inverse[k]);
        *reinterpret_cast<P*>(out + (ty + long(s) * split) * inner) = p;
      }
  } else {
    for (long r = ty; r < reduce; r += split) {
      P p = *reinterpret_cast<const P*>(in + r * inner);
#pragma unroll
      for (int k = 0; k < W; ++k) p.v[k] = result(p.v[k], max[k], shift[k], inverse[k]);
      *reinterpret_cast<P*>(out + r * inner) = p;
    }
  }
}

template <int W>
void launch(const float* x, float* y) {
  softmax_columns<W><<<unsigned(outer * ceil_div(inner, long(inner_tile) * W)), column_threads>>>(x, y);
}

void run(const float* x, float* y) {
  if constexpr (vector_width > 1 && inner % vector_width == 0) {
    if (aligned(x, 4 * vector_width) && aligned(y, 4 * vector_width)) return launch<vector_width>(x, y);
  }
  launch<1>(x, y);
}
)cuda";
  }
  return source + cuda_kernel_wrapper(p, fmt::format("run({}, {});", p.tensors.front().name, p.tensors.back().name));
}

/// Whether a norm's lines are few and long enough to spread each over many blocks (the Frobenius norm: one line).
inline bool norm_few_lines(const FamilyDescription& d) { return d.size("outer") * d.size("inner") < 256 && d.size("reduce") >= 16384; }

inline std::string norm_cuda(const FamilyDescription& d, const Problem& p) {
  const std::string& kind = d.op;
  const bool affine = d.flag("affine");
  const bool rows = d.size("inner") == 1;
  const std::string weight = affine ? p.tensors.at(1).name : "nullptr";
  const std::string bias = affine ? p.tensors.at(2).name : "nullptr";
  const int kind_id = kind == "layer" ? 0 : kind == "rms" ? 1 : kind == "l1" ? 2 : 3;
  std::string source(cuda_family_prelude);
  source += fmt::format(R"(
// The {0} norm over the middle extent of ({1}, {2}, {3}) (a KernelBench-format problem's forward, matched by kevo).
inline constexpr long outer = {1}, reduce = {2}, inner = {3};  // inline: no warning where one goes unused
inline constexpr long lines = outer * inner;
constexpr int kind = {4};  // 0 layer: (x - mean) / sqrt(var + eps) [* w + b]; 1 rms: x / sqrt(mean(x^2) + eps); 2 l1: x / sum|x|; 3 l2, fro: x / sqrt(sum x^2)
constexpr bool affine = {5};
constexpr float eps = {6};
)",
                        kind, d.size("outer"), d.size("reduce"), d.size("inner"), kind_id, affine ? "true" : "false",
                        float_literal(d.number("eps")));
  source += R"cuda(
// A line's statistics grown by one element: layer (sum, sum of squares); rms, l2, fro (sum of squares); l1 (sum of |x|).
__device__ __forceinline__ void fold(float2& s, float v) {
  if constexpr (kind == 2) s.x += fabsf(v);
  else if constexpr (kind == 0) {
    s.x += v;
    s.y = fmaf(v, v, s.y);
  } else s.x = fmaf(v, v, s.x);
}

// (shift, scale) from a line's statistics: y = (x - shift) * scale [* w + b].
__device__ __forceinline__ float2 finish(float2 s) {
  if constexpr (kind == 0) {
    const float mean = s.x / float(reduce);
    const float var = fmaxf(0.0f, s.y / float(reduce) - mean * mean);
    return make_float2(mean, 1.0f / sqrtf(var + eps));
  } else if constexpr (kind == 1) {
    return make_float2(0.0f, 1.0f / sqrtf(s.x / float(reduce) + eps));
  } else if constexpr (kind == 2) {
    return make_float2(0.0f, 1.0f / s.x);
  } else {
    return make_float2(0.0f, 1.0f / sqrtf(s.x));
  }
}

// Element r of a line, normalized.
__device__ __forceinline__ float apply(float v, float2 f, const float* w, const float* b, long r) {
  v = (v - f.x) * f.y;
  if constexpr (affine) v = v * w[r] + b[r];
  return v;
}
)cuda";
  if (norm_few_lines(d)) {
    source += R"cuda(
// A few long lines: each spread over `chunks` blocks. One kernel writes every chunk's statistics, the next has each
// block combine its line's (every thread alike, in one order) and scale its chunk.
constexpr int block_threads = ${block_threads};
constexpr int vector_width = ${vector_width};
constexpr int chunks_per_sm = ${chunks_per_sm};  // blocks a multiprocessor, over all lines
constexpr int max_chunks = 1024;
__device__ float2 chunk_stats[lines * max_chunks];

// Calls f(v, r) on the thread's elements of [r0, r1) of the line at `base`; W > 1: inner == 1 and W divides r0.
template <int W, class F>
__device__ __forceinline__ void each(const float* x, long base, long r0, long r1, F f) {
  if constexpr (W > 1) {
    const Pack<W>* p = reinterpret_cast<const Pack<W>*>(x + base + r0);
    const long packs = (r1 - r0) / W;
    for (long i = threadIdx.x; i < packs; i += block_threads) {
      const Pack<W> v = p[i];
#pragma unroll
      for (int k = 0; k < W; ++k) f(v.v[k], r0 + i * W + k);
    }
    for (long r = r0 + packs * W + threadIdx.x; r < r1; r += block_threads) f(x[base + r], r);
  } else {
    for (long r = r0 + threadIdx.x; r < r1; r += block_threads) f(x[base + r * inner], r);
  }
}

template <int W>
__global__ void __launch_bounds__(block_threads) norm_chunks(const float* __restrict__ x, long per) {
  __shared__ float2 scratch[32];
  const long line = blockIdx.y, base = (line / inner) * reduce * inner + line % inner;
  const long r0 = blockIdx.x * per, r1 = r0 + per < reduce ? r0 + per : reduce;
  float2 s = make_float2(0.0f, 0.0f);
  each<W>(x, base, r0, r1, [&](float v, long) { fold(s, v); });
  s = group_all<block_threads>(s, Sum2{}, scratch);
  if (threadIdx.x == 0) chunk_stats[line * max_chunks + blockIdx.x] = s;
}

template <int W>
__global__ void __launch_bounds__(block_threads) norm_scale(const float* __restrict__ x, const float* __restrict__ w,
                                                            const float* __restrict__ b, float* __restrict__ y, long per, int chunks) {
  __shared__ float2 scratch[32];
  const long line = blockIdx.y, base = (line / inner) * reduce * inner + line % inner;
  float2 s = make_float2(0.0f, 0.0f);
  for (int c = threadIdx.x; c < chunks; c += block_threads) s = Sum2{}(s, chunk_stats[line * max_chunks + c]);
  const float2 f = finish(group_all<block_threads>(s, Sum2{}, scratch));
  const long r0 = blockIdx.x * per, r1 = r0 + per < reduce ? r0 + per : reduce;
  if constexpr (W > 1) {
    const Pack<W>* p = reinterpret_cast<const Pack<W>*>(x + base + r0);
    Pack<W>* q = reinterpret_cast<Pack<W>*>(y + base + r0);
    const long packs = (r1 - r0) / W;
    for (long i = threadIdx.x; i < packs; i += block_threads) {
      Pack<W> v = p[i];
#pragma unroll
      for (int k = 0; k < W; ++k) v.v[k] = apply(v.v[k], f, w, b, r0 + i * W + k);
      q[i] = v;
    }
    for (long r = r0 + packs * W + threadIdx.x; r < r1; r += block_threads) y[base + r] = apply(x[base + r], f, w, b, r);
  } else {
    for (long r = r0 + threadIdx.x; r < r1; r += block_threads) y[base + r * inner] = apply(x[base + r * inner], f, w, b, r);
  }
}

template <int W>
void launch(const float* x, const float* w, const float* b, float* y) {
  long chunks = ceil_div(long(chunks_per_sm) * multiprocessors(), lines);
  const long most = ceil_div(reduce, long(block_threads) * W);  // at least a pack a thread
  if (chunks > most) chunks = most;
  if (chunks > max_chunks) chunks = max_chunks;
  if (chunks < 1) chunks = 1;
  const long per = ceil_div(ceil_div(reduce, chunks), W) * W;  // a multiple of W: chunks start aligned
  chunks = ceil_div(reduce, per);
  const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(lines));
  norm_chunks<W><<<grid, block_threads>>>(x, per);
  norm_scale<W><<<grid, block_threads>>>(x, w, b, y, per, int(chunks));
}

void run(const float* x, const float* w, const float* b, float* y) {
  if constexpr (vector_width > 1 && inner == 1 && reduce % vector_width == 0) {
    if (aligned(x, 4 * vector_width) && aligned(y, 4 * vector_width)) return launch<vector_width>(x, w, b, y);
  }
  launch<1>(x, w, b, y);
}
)cuda";
  } else if (rows) {
    source += cuda_row_mapping;
    source += cuda_row_cache;
    source += R"cuda(
template <int W, int Cache>
__global__ void __launch_bounds__(block_threads) norm_rows(const float* __restrict__ x, const float* __restrict__ w,
                                                           const float* __restrict__ b, float* __restrict__ y) {
  extern __shared__ float4 dynamic_shared[];  // (rows_per_block, reduce) when Cache == cache_shared
  __shared__ float2 scratch[32];
  using P = Pack<W>;
  const int group = threadIdx.x / group_threads, lane = threadIdx.x % group_threads;
  const long row = long(blockIdx.x) * rows_per_block + group;
  if (row >= outer) return;  // whole warps, in warp-per-row mode only
  Row<W, Cache> r{reinterpret_cast<const P*>(x + row * reduce), reinterpret_cast<P*>(y + row * reduce),
                  reinterpret_cast<P*>(reinterpret_cast<float*>(dynamic_shared) + group * reduce), lane};
  float2 s = make_float2(0.0f, 0.0f);
  r.first([&](const P& p, long) {
#pragma unroll
    for (int k = 0; k < W; ++k) fold(s, p.v[k]);
  });
  const float2 f = finish(group_all<group_threads>(s, Sum2{}, scratch));
  r.write([&](P p, long i) {
    if constexpr (affine) {
      const P g = reinterpret_cast<const P*>(w)[i], o = reinterpret_cast<const P*>(b)[i];
#pragma unroll
      for (int k = 0; k < W; ++k) p.v[k] = (p.v[k] - f.x) * f.y * g.v[k] + o.v[k];
    } else {
#pragma unroll
      for (int k = 0; k < W; ++k) p.v[k] = (p.v[k] - f.x) * f.y;
    }
    return p;
  });
}

template <int W>
void launch(const float* x, const float* w, const float* b, float* y) {
  constexpr int cache = cache_for<W>();
  const long shared = cache == cache_shared ? rows_per_block * reduce * long(sizeof(float)) : 0;
  allow_shared(norm_rows<W, cache>, shared);
  norm_rows<W, cache><<<unsigned(ceil_div(outer, rows_per_block)), block_threads, size_t(shared)>>>(x, w, b, y);
}

void run(const float* x, const float* w, const float* b, float* y) {
  if constexpr (vector_width > 1 && reduce % vector_width == 0) {
    const int bytes = 4 * vector_width;
    if (aligned(x, bytes) && aligned(y, bytes) && (!affine || (aligned(w, bytes) && aligned(b, bytes)))) return launch<vector_width>(x, w, b, y);
  }
  launch<1>(x, w, b, y);
}
)cuda";
  } else {
    source += cuda_column_tiles;
    source += R"cuda(
constexpr bool keep_column = std::string_view("${column_cache}") == "registers";  // the line's elements stay in registers

template <int W>
__global__ void __launch_bounds__(column_threads) norm_columns(const float* __restrict__ x, const float* __restrict__ w,
                                                               const float* __restrict__ b, float* __restrict__ y) {
  using P = Pack<W>;
  constexpr long per_thread = ceil_div(reduce, split);
  constexpr bool keep = keep_column && per_thread * W <= 64;
  constexpr int slots = keep ? int(per_thread) : 1;
  __shared__ float2 part[split][inner_tile * W];
  const int tx = threadIdx.x % inner_tile, ty = threadIdx.x / inner_tile;
  constexpr long tiles = ceil_div(inner, long(inner_tile) * W);
  const long o = blockIdx.x / tiles, i0 = (blockIdx.x % tiles) * inner_tile * W + long(tx) * W;
  const bool active = i0 < inner;  // W divides inner: the whole pack lies inside
  const float* in = x + o * reduce * inner + i0;
  float* out = y + o * reduce * inner + i0;
  float2 s[W];
  P held[slots];
#pragma unroll
  for (int k = 0; k < W; ++k) s[k] = make_float2(0.0f, 0.0f);
  if (active) {
    if constexpr (keep) {
#pragma unroll
      for (int q = 0; q < slots; ++q)
        if (ty + long(q) * split < reduce) held[q] = *reinterpret_cast<const P*>(in + (ty + long(q) * split) * inner);
#pragma unroll
      for (int q = 0; q < slots; ++q)
        if (ty + long(q) * split < reduce)
#pragma unroll
          for (int k = 0; k < W; ++k) fold(s[k], held[q].v[k]);
    } else {
      for (long r = ty; r < reduce; r += split) {
        const P p = *reinterpret_cast<const P*>(in + r * inner);
#pragma unroll
        for (int k = 0; k < W; ++k) fold(s[k], p.v[k]);
      }
    }
  }
  if constexpr (split > 1) {
#pragma unroll
    for (int k = 0; k < W; ++k) part[ty][tx * W + k] = s[k];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < W; ++k) {
      float2 t = part[0][tx * W + k];
      for (int q = 1; q < split; ++q) t = Sum2{}(t, part[q][tx * W + k]);
      s[k] = t;
    }
  }
  if (!active) return;
  float2 f[W];
#pragma unroll
  for (int k = 0; k < W; ++k) f[k] = finish(s[k]);
  if constexpr (keep) {
#pragma unroll
    for (int q = 0; q < slots; ++q)
      if (ty + long(q) * split < reduce) {
        const long r = ty + long(q) * split;
        P p = held[q];
#pragma unroll
        for (int k = 0; k < W; ++k) p.v[k] = apply(p.v[k], f[k], w, b, r);
        *reinterpret_cast<P*>(out + r * inner) = p;
      }
  } else {
    for (long r = ty; r < reduce; r += split) {
      P p = *reinterpret_cast<const P*>(in + r * inner);
#pragma unroll
      for (int k = 0; k < W; ++k) p.v[k] = apply(p.v[k], f[k], w, b, r);
      *reinterpret_cast<P*>(out + r * inner) = p;
    }
  }
}

template <int W>
void launch(const float* x, const float* w, const float* b, float* y) {
  norm_columns<W><<<unsigned(outer * ceil_div(inner, long(inner_tile) * W)), column_threads>>>(x, w, b, y);
}

void run(const float* x, const float* w, const float* b, float* y) {
  if constexpr (vector_width > 1 && inner % vector_width == 0) {
    if (aligned(x, 4 * vector_width) && aligned(y, 4 * vector_width)) return launch<vector_width>(x, w, b, y);
  }
  launch<1>(x, w, b, y);
}
)cuda";
  }
  return source + cuda_kernel_wrapper(p, fmt::format("run({}, {}, {}, {});", p.tensors.front().name, weight, bias, p.tensors.back().name));
}

inline std::string reduction_cuda(const FamilyDescription& d, const Problem& p) {
  const std::string& op = d.op;
  const bool arg = op == "argmax" || op == "argmin";
  const bool rows = d.size("inner") == 1;
  const int op_id = op == "sum" ? 0 : op == "mean" ? 1 : op == "max" ? 2 : op == "min" ? 3 : op == "argmax" ? 4 : 5;
  std::string source(cuda_family_prelude);
  source += fmt::format(R"(
// {0} over the middle extent of ({1}, {2}, {3}) (a KernelBench-format problem's forward, matched by kevo).
inline constexpr long outer = {1}, reduce = {2}, inner = {3};  // inline: no warning where one goes unused
constexpr int op = {4};  // 0 sum, 1 mean, 2 max, 3 min, 4 argmax, 5 argmin
using Out = {5};
)",
                        op, d.size("outer"), d.size("reduce"), d.size("inner"), op_id, arg ? "int" : "float");
  source += R"cuda(
constexpr bool arg = op >= 4;
constexpr bool largest = op == 2 || op == 4;
using Acc = std::conditional_t<arg, Best, float>;

// The helpers are templates on the accumulator, so that `if constexpr` discards the other ops' branches.
template <class A = Acc>
__device__ __forceinline__ A start() {
  if constexpr (arg) return A{largest ? -INFINITY : INFINITY, INT_MAX};
  else if constexpr (op == 2) return A(-INFINITY);
  else if constexpr (op == 3) return A(INFINITY);
  else return A(0.0f);
}

// Whether v replaces best: the first of equal extremes wins, as in PyTorch.
__device__ __forceinline__ bool better(float v, float best) { return largest ? v > best : v < best; }

// The running result grown by element r (a thread sees its elements in increasing r).
template <class A>
__device__ __forceinline__ A fold(A a, float v, long r) {
  if constexpr (arg) return better(v, a.v) || a.i == INT_MAX ? A{v, int(r)} : a;
  else if constexpr (op == 2) return fmaxf(a, v);
  else if constexpr (op == 3) return fminf(a, v);
  else return a + v;
}

struct Combine {
  template <class A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    if constexpr (arg) return better(b.v, a.v) || (b.v == a.v && b.i < a.i) ? b : a;
    else if constexpr (op == 2) return fmaxf(a, b);
    else if constexpr (op == 3) return fminf(a, b);
    else return a + b;
  }
};

template <class A>
__device__ __forceinline__ Out finish(A a) {
  if constexpr (arg) return a.i;
  else if constexpr (op == 1) return a / float(reduce);
  else return a;
}
)cuda";
  if (rows) {
    source += cuda_row_mapping;
    source += R"cuda(
constexpr int vector_width = ${vector_width};  // floats per load after the row's aligning head: 1, 2 or 4
constexpr int unroll = ${unroll};

template <int W>
__global__ void __launch_bounds__(block_threads) reduce_rows(const float* __restrict__ x, Out* __restrict__ y) {
  __shared__ Acc scratch[32];
  const int group = threadIdx.x / group_threads, lane = threadIdx.x % group_threads;
  const long row = long(blockIdx.x) * rows_per_block + group;
  if (row >= outer) return;  // whole warps, in warp-per-row mode only
  const float* in = x + row * reduce;
  Acc a = start();
  long head = 0;  // elements before the first W-aligned one
  if constexpr (W > 1) {
    head = long((W - reinterpret_cast<std::uintptr_t>(in) / sizeof(float) % W) % W);
    if (head > reduce) head = reduce;
  }
  if (lane < head) a = fold(a, in[lane], lane);
  const long packs = (reduce - head) / W;
  const Pack<W>* p = reinterpret_cast<const Pack<W>*>(in + head);
#pragma unroll unroll
  for (long i = lane; i < packs; i += group_threads) {
    const Pack<W> v = p[i];
#pragma unroll
    for (int k = 0; k < W; ++k) a = fold(a, v.v[k], head + i * W + k);
  }
  for (long r = head + packs * W + lane; r < reduce; r += group_threads) a = fold(a, in[r], r);
  a = group_all<group_threads>(a, Combine{}, scratch);
  if (lane == 0) y[row] = finish(a);
}

void run(const float* x, Out* y) {
  reduce_rows<vector_width><<<unsigned(ceil_div(outer, rows_per_block)), block_threads>>>(x, y);
}
)cuda";
  } else {
    source += cuda_column_tiles;
    source += R"cuda(
template <int W>
__global__ void __launch_bounds__(column_threads) reduce_columns(const float* __restrict__ x, Out* __restrict__ y) {
  using P = Pack<W>;
  __shared__ Acc part[split][inner_tile * W];
  const int tx = threadIdx.x % inner_tile, ty = threadIdx.x / inner_tile;
  constexpr long tiles = ceil_div(inner, long(inner_tile) * W);
  const long o = blockIdx.x / tiles, i0 = (blockIdx.x % tiles) * inner_tile * W + long(tx) * W;
  const bool active = i0 < inner;  // W divides inner: the whole pack lies inside
  const float* in = x + o * reduce * inner + i0;
  Acc a[W];
#pragma unroll
  for (int k = 0; k < W; ++k) a[k] = start();
  if (active)
    for (long r = ty; r < reduce; r += split) {
      const P v = *reinterpret_cast<const P*>(in + r * inner);
#pragma unroll
      for (int k = 0; k < W; ++k) a[k] = fold(a[k], v.v[k], r);
    }
  if constexpr (split > 1) {
#pragma unroll
    for (int k = 0; k < W; ++k) part[ty][tx * W + k] = a[k];
    __syncthreads();
    if (ty != 0) return;
#pragma unroll
    for (int k = 0; k < W; ++k)
      for (int q = 1; q < split; ++q) a[k] = Combine{}(a[k], part[q][tx * W + k]);
  }
  if (active)
#pragma unroll
    for (int k = 0; k < W; ++k) y[o * inner + i0 + k] = finish(a[k]);
}

template <int W>
void launch(const float* x, Out* y) {
  reduce_columns<W><<<unsigned(outer * ceil_div(inner, long(inner_tile) * W)), column_threads>>>(x, y);
}

void run(const float* x, Out* y) {
  if constexpr (vector_width > 1 && inner % vector_width == 0) {
    if (aligned(x, 4 * vector_width)) return launch<vector_width>(x, y);
  }
  launch<1>(x, y);
}
)cuda";
  }
  return source + cuda_kernel_wrapper(p, fmt::format("run({}, {});", p.tensors.front().name, p.tensors.back().name));
}

/// Whether a matmul is a matrix-vector product (or a batch of them): one of m and n is 1.
inline bool matmul_is_gemv(const FamilyDescription& d) { return d.size("m") == 1 || d.size("n") == 1; }

/// Whether a matrix-vector product's matrix lies along k (a row of it a line of the product): else along the output.
inline bool gemv_rows(const FamilyDescription& d) { return d.size("n") == 1 ? !d.flag("trans_a") : d.flag("trans_b"); }

inline std::string matmul_cuda(const FamilyDescription& d, const Problem& p) {
  const std::string a = p.tensors.at(0).name, b = p.tensors.at(1).name, c = p.tensors.back().name;
  const std::string bias = d.flag("bias") ? p.tensors.at(2).name : "nullptr";
  std::string source(cuda_family_prelude);
  source += fmt::format(R"(
// C = op(A) op(B){0} for a batch of {1}: ({2} x {4}) times ({4} x {3}) (a KernelBench-format problem's forward, matched
// by kevo). Element (i, kk) of op(A) is A[kk * m + i] when trans_a, else A[i * k + kk]; (kk, j) of op(B) is
// B[j * k + kk] when trans_b, else B[kk * n + j]; batch bi's matrices start bi * m * k, bi * k * n, bi * m * n in.
inline constexpr long batch = {1}, m = {2}, n = {3}, k = {4};  // inline: no warning where one goes unused
inline constexpr bool trans_a = {5}, trans_b = {6}, has_bias = {7};
)",
                        d.flag("bias") ? " + bias" : "", d.size("batch"), d.size("m"), d.size("n"), d.size("k"),
                        d.flag("trans_a") ? "true" : "false", d.flag("trans_b") ? "true" : "false", d.flag("bias") ? "true" : "false");
  if (matmul_is_gemv(d)) {
    source += R"cuda(
// A matrix-vector product: out[x] = sum_kk vec[kk] * mat(x, kk) (+ bias) for x < X. n == 1: the matrix is A, the
// vector B; else (m == 1) the matrix is B, the vector A (either way the vector's kk-th element is at kk).
constexpr bool on_a = n == 1;
constexpr long X = on_a ? m : n;
inline constexpr bool along_k = on_a ? !trans_a : trans_b;  // mat(x, kk) at M[x * k + kk], else at M[kk * X + x]
)cuda";
    if (gemv_rows(d)) {
      source += cuda_row_mapping;
      source += R"cuda(
constexpr int vector_width = ${vector_width};  // floats per load: 1, 2 or 4 (where they divide k)
constexpr int unroll = ${unroll};

template <int W>
__global__ void __launch_bounds__(block_threads) gemv_rows(const float* __restrict__ M, const float* __restrict__ v,
                                                           const float* __restrict__ bias, float* __restrict__ out) {
  __shared__ float scratch[32];
  using P = Pack<W>;
  const int group = threadIdx.x / group_threads, lane = threadIdx.x % group_threads;
  const long x = long(blockIdx.x) * rows_per_block + group, bi = blockIdx.y;
  if (x >= X) return;  // whole warps, in warp-per-row mode only
  const P* row = reinterpret_cast<const P*>(M + bi * X * k + x * k);
  const P* vec = reinterpret_cast<const P*>(v + bi * k);
  float s = 0.0f;
#pragma unroll unroll
  for (long i = lane; i < k / W; i += group_threads) {
    const P a = row[i], b = vec[i];
#pragma unroll
    for (int e = 0; e < W; ++e) s = fmaf(a.v[e], b.v[e], s);
  }
  s = group_all<group_threads>(s, Sum{}, scratch);
  if (lane == 0) {
    if constexpr (has_bias) s += bias[on_a ? 0 : x];
    out[bi * X + x] = s;
  }
}

template <int W>
void launch(const float* M, const float* v, const float* bias, float* out) {
  gemv_rows<W><<<dim3(unsigned(ceil_div(X, rows_per_block)), unsigned(batch)), block_threads>>>(M, v, bias, out);
}

void run(const float* A, const float* B, const float* bias, float* C) {
  const float* M = on_a ? A : B;
  const float* v = on_a ? B : A;
  if constexpr (vector_width > 1 && k % vector_width == 0) {
    if (aligned(M, 4 * vector_width) && aligned(v, 4 * vector_width)) return launch<vector_width>(M, v, bias, C);
  }
  launch<1>(M, v, bias, C);
}
)cuda";
    } else {
      source += cuda_column_tiles;
      source += R"cuda(
template <int W>
__global__ void __launch_bounds__(column_threads) gemv_columns(const float* __restrict__ M, const float* __restrict__ v,
                                                               const float* __restrict__ bias, float* __restrict__ out) {
  using P = Pack<W>;
  __shared__ float part[split][inner_tile * W];
  const int tx = threadIdx.x % inner_tile, ty = threadIdx.x / inner_tile;
  const long bi = blockIdx.y, x0 = long(blockIdx.x) * inner_tile * W + long(tx) * W;
  const bool active = x0 < X;  // W divides X: the whole pack lies inside
  float s[W];
#pragma unroll
  for (int e = 0; e < W; ++e) s[e] = 0.0f;
  if (active)
    for (long kk = ty; kk < k; kk += split) {
      const float c = v[bi * k + kk];
      const P a = *reinterpret_cast<const P*>(M + bi * X * k + kk * X + x0);
#pragma unroll
      for (int e = 0; e < W; ++e) s[e] = fmaf(a.v[e], c, s[e]);
    }
  if constexpr (split > 1) {
#pragma unroll
    for (int e = 0; e < W; ++e) part[ty][tx * W + e] = s[e];
    __syncthreads();
    if (ty != 0) return;
#pragma unroll
    for (int e = 0; e < W; ++e)
      for (int q = 1; q < split; ++q) s[e] += part[q][tx * W + e];
  }
  if (active)
#pragma unroll
    for (int e = 0; e < W; ++e) out[bi * X + x0 + e] = has_bias ? s[e] + bias[on_a ? 0 : x0 + e] : s[e];
}

template <int W>
void launch(const float* M, const float* v, const float* bias, float* out) {
  gemv_columns<W><<<dim3(unsigned(ceil_div(X, long(inner_tile) * W)), unsigned(batch)), column_threads>>>(M, v, bias, out);
}

void run(const float* A, const float* B, const float* bias, float* C) {
  const float* M = on_a ? A : B;
  const float* v = on_a ? B : A;
  if constexpr (vector_width > 1 && X % vector_width == 0) {
    if (aligned(M, 4 * vector_width)) return launch<vector_width>(M, v, bias, C);
  }
  launch<1>(M, v, bias, C);
}
)cuda";
    }
  } else {
    source += R"cuda(
// A block computes a block_m x block_n tile of C through shared memory, block_k at a time; each of its threads a
// thread_m x thread_n tile of it in registers, as 4 x 4 pieces spread over the block tile (conflict-free float4
// reads of shared memory, float4 writes of C). The tiles of A and B pass through registers into shared memory
// (transposed where the operand lies along k); double buffering loads the next tile while this one is multiplied.
constexpr int block_m = ${block_m}, block_n = ${block_n}, block_k = ${block_k};
constexpr int thread_m = ${thread_m}, thread_n = ${thread_n};
constexpr int vector_width = ${vector_width};  // floats per global load of A and B: 1, 2 or 4 (where they divide the row)
constexpr bool double_buffer = std::string_view("${buffering}") == "double";
constexpr int min_blocks = ${min_blocks};  // blocks a multiprocessor must hold (__launch_bounds__): caps registers a thread
constexpr int threads_m = block_m / thread_m, threads_n = block_n / thread_n, threads = threads_m * threads_n;
static_assert(thread_m % 4 == 0 && thread_n % 4 == 0 && block_m % thread_m == 0 && block_n % thread_n == 0, "4 x 4 pieces");
static_assert(block_k % 4 == 0 && threads <= 1024, "a block's shape");
constexpr int pad = 4;  // floats after each k row of a stage: keeps float4 alignment, spreads transposed stores
constexpr int a_stride = block_m + pad, b_stride = block_n + pad;
constexpr int stage_floats = block_k * (a_stride + b_stride);
constexpr int stages = double_buffer ? 2 : 1;
constexpr long shared_bytes = long(stages) * stage_floats * long(sizeof(float));

// The (BX, block_k) tile of an operand at (x0, k0) into shared memory S[kk][x] (rows of BX + pad), zeros outside it.
// KContig: element (x, kk) at src[x * k + kk]; else at src[kk * Extent + x]. W floats move together along the
// contiguous dimension (W divides its extent).
template <int BX, long Extent, bool KContig, int W>
struct TileLoader {
  static constexpr int row_vectors = KContig ? block_k / W : BX / W;
  static constexpr int vectors = BX * block_k / W;
  static constexpr int per_thread = (vectors + threads - 1) / threads;
  Pack<W> held[per_thread];

  __device__ __forceinline__ void fetch(const float* src, long x0, long k0) {
#pragma unroll
    for (int q = 0; q < per_thread; ++q) {
      const int v = int(threadIdx.x) + q * threads;
      const int line = v / row_vectors, c = v % row_vectors * W;
      const long x = x0 + (KContig ? line : c), kk = k0 + (KContig ? c : line);
      const bool inside = (vectors % threads == 0 || v < vectors) && x < Extent && kk < k;
      held[q] = inside ? *reinterpret_cast<const Pack<W>*>(src + (KContig ? x * k + kk : kk * Extent + x)) : Pack<W>{};
    }
  }
  __device__ __forceinline__ void store(float* S) const {
#pragma unroll
    for (int q = 0; q < per_thread; ++q) {
      const int v = int(threadIdx.x) + q * threads;
      if (vectors % threads != 0 && v >= vectors) continue;
      const int line = v / row_vectors, c = v % row_vectors * W;
      if constexpr (KContig) {
#pragma unroll
        for (int e = 0; e < W; ++e) S[(c + e) * (BX + pad) + line] = held[q].v[e];
      } else {
        *reinterpret_cast<Pack<W>*>(S + line * (BX + pad) + c) = held[q];
      }
    }
  }
};

__device__ __forceinline__ void multiply(const float* As, const float* Bs, float (&acc)[thread_m][thread_n], int ty, int tx) {
#pragma unroll
  for (int kk = 0; kk < block_k; ++kk) {
    float a[thread_m], b[thread_n];
#pragma unroll
    for (int c = 0; c < thread_m / 4; ++c) {
      const float4 q = *reinterpret_cast<const float4*>(As + kk * a_stride + c * threads_m * 4 + ty * 4);
      a[4 * c] = q.x, a[4 * c + 1] = q.y, a[4 * c + 2] = q.z, a[4 * c + 3] = q.w;
    }
#pragma unroll
    for (int c = 0; c < thread_n / 4; ++c) {
      const float4 q = *reinterpret_cast<const float4*>(Bs + kk * b_stride + c * threads_n * 4 + tx * 4);
      b[4 * c] = q.x, b[4 * c + 1] = q.y, b[4 * c + 2] = q.z, b[4 * c + 3] = q.w;
    }
#pragma unroll
    for (int i = 0; i < thread_m; ++i)
#pragma unroll
      for (int j = 0; j < thread_n; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
  }
}

template <int AW, int BW>
__global__ void __launch_bounds__(threads, min_blocks) gemm_kernel(const float* __restrict__ A, const float* __restrict__ B,
                                                       const float* __restrict__ bias, float* __restrict__ C, bool wide_c) {
  extern __shared__ float4 dynamic_shared[];  // stages of (A tile [block_k][a_stride], B tile [block_k][b_stride])
  float* smem = reinterpret_cast<float*>(dynamic_shared);
  const long bi = blockIdx.z;
  A += bi * m * k;
  B += bi * k * n;
  C += bi * m * n;
  const long m0 = long(blockIdx.y) * block_m, n0 = long(blockIdx.x) * block_n;
  const int tx = int(threadIdx.x) % threads_n, ty = int(threadIdx.x) / threads_n;
  TileLoader<block_m, m, !trans_a, AW> la;
  TileLoader<block_n, n, trans_b, BW> lb;
  float acc[thread_m][thread_n];
#pragma unroll
  for (int i = 0; i < thread_m; ++i)
#pragma unroll
    for (int j = 0; j < thread_n; ++j) acc[i][j] = 0.0f;
  auto As = [&](int s) { return smem + s * stage_floats; };
  auto Bs = [&](int s) { return smem + s * stage_floats + block_k * a_stride; };
  const long tiles = ceil_div(k, block_k);
  if constexpr (double_buffer) {
    la.fetch(A, m0, 0);
    lb.fetch(B, n0, 0);
    la.store(As(0));
    lb.store(Bs(0));
    __syncthreads();
    for (long t = 0; t < tiles; ++t) {
      const int s = int(t & 1);
      if (t + 1 < tiles) {
        la.fetch(A, m0, (t + 1) * block_k);
        lb.fetch(B, n0, (t + 1) * block_k);
      }
      multiply(As(s), Bs(s), acc, ty, tx);
      if (t + 1 < tiles) {  // the other stage was last read before the previous barrier
        la.store(As(s ^ 1));
        lb.store(Bs(s ^ 1));
      }
      __syncthreads();
    }
  } else {
    for (long t = 0; t < tiles; ++t) {
      la.fetch(A, m0, t * block_k);
      lb.fetch(B, n0, t * block_k);
      la.store(As(0));
      lb.store(Bs(0));
      __syncthreads();
      multiply(As(0), Bs(0), acc, ty, tx);
      __syncthreads();
    }
  }
#pragma unroll
  for (int c = 0; c < thread_m / 4; ++c)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const long row = m0 + c * threads_m * 4 + ty * 4 + e;
      if (row >= m) continue;
#pragma unroll
      for (int g = 0; g < thread_n / 4; ++g) {
        const long col = n0 + g * threads_n * 4 + tx * 4;
        float v[4];
#pragma unroll
        for (int f = 0; f < 4; ++f) {
          v[f] = acc[4 * c + e][4 * g + f];
          if constexpr (has_bias) v[f] += col + f < n ? bias[col + f] : 0.0f;
        }
        if (wide_c && col + 3 < n) {
          *reinterpret_cast<float4*>(C + row * n + col) = make_float4(v[0], v[1], v[2], v[3]);
        } else {
#pragma unroll
          for (int f = 0; f < 4; ++f)
            if (col + f < n) C[row * n + col + f] = v[f];
        }
      }
    }
}

template <int AW, int BW>
void launch(const float* A, const float* B, const float* bias, float* C) {
  allow_shared(gemm_kernel<AW, BW>, shared_bytes);
  const dim3 grid(unsigned(ceil_div(n, block_n)), unsigned(ceil_div(m, block_m)), unsigned(batch));
  gemm_kernel<AW, BW><<<grid, threads, size_t(shared_bytes)>>>(A, B, bias, C, n % 4 == 0 && aligned(C, 16));
}

void run(const float* A, const float* B, const float* bias, float* C) {
  constexpr int aw = vector_width > 1 && (trans_a ? m : k) % vector_width == 0 ? vector_width : 1;
  constexpr int bw = vector_width > 1 && (trans_b ? k : n) % vector_width == 0 ? vector_width : 1;
  if constexpr (aw > 1 || bw > 1) {
    if (aligned(A, 4 * aw) && aligned(B, 4 * bw)) return launch<aw, bw>(A, B, bias, C);
  }
  launch<1, 1>(A, B, bias, C);
}
)cuda";
  }
  return source + cuda_kernel_wrapper(p, fmt::format("run({}, {}, {}, {});", a, b, bias, c));
}

/// The CUDA template of a family for `p` (its tensors named and typed already), with knobs, FLOPs and starting points.
/// The knobs offered are those of the layout the problem's sizes give (rows or columns, a matrix product or a
/// matrix-vector one).
inline expected<FamilyTemplate, Error> cuda_family_template(const FamilyDescription& d, const Problem& p) {
  for (const auto& t : p.tensors)
    if (t.type == ElementType::f16)
      return make_error(fmt::format("the {} family's CUDA template takes float32 tensors, and {} is float16: search it with --llm", d.family, t.name));
  const std::size_t needed = d.family == "matmul" ? (d.flag("bias") ? 4 : 3) : d.family == "norm" && d.flag("affine") ? 4 : 2;
  if (p.tensors.size() < needed)
    return make_error(fmt::format("the {} family's CUDA template wants {} tensors, and the problem has {}", d.family, needed, p.tensors.size()));
  FamilyTemplate t;
  const double elements = d.number("n", d.number("outer", 1) * d.number("reduce", 1) * d.number("inner", 1));
  // Knobs shared by the families.
  const KnobSpec row_mapping = knob("row_mapping", {"block", "warp"}, KnobSide::parallel);
  const KnobSpec block_threads = knob("block_threads", {"256", "128", "512", "1024", "64"}, KnobSide::parallel);
  const KnobSpec vector_width = knob("vector_width", {"1", "2", "4"}, KnobSide::memory);
  const KnobSpec row_cache = knob("row_cache", {"none", "shared", "registers"}, KnobSide::memory);
  const KnobSpec register_items = knob("register_items", {"16", "8", "32", "64"}, KnobSide::memory);
  const KnobSpec unroll = knob("unroll", {"1", "2", "4", "8"}, KnobSide::compute);
  const KnobSpec inner_tile = knob("inner_tile", {"32", "64", "128"}, KnobSide::memory);
  const KnobSpec split = knob("split", {"8", "1", "2", "4", "16", "32"}, KnobSide::parallel);
  const KnobSpec column_cache = knob("column_cache", {"none", "registers"}, KnobSide::memory);
  const bool rows = d.size("inner") == 1;
  if (d.family == "elementwise") {
    auto expression = activation_expression(d, MathDialect::cuda);
    if (!expression) return unexpected(expression.error());
    t.source = elementwise_cuda(d, *expression, p);
    t.knobs = {block_threads, vector_width, knob("items_per_thread", {"1", "2", "4", "8"}, KnobSide::memory),
               knob("blocks_per_sm", {"0", "4", "8", "16", "32"}, KnobSide::parallel)};
    t.flops = 4 * elements;
    t.starting_points = {
        starting_point("float4 loads, 256 threads", {{"vector_width", "4"}}),
        starting_point("float4 loads, 2 in flight a thread, 512 threads", {{"vector_width", "4"}, {"items_per_thread", "2"}, {"block_threads", "512"}}),
        starting_point("float4 loads, 4 in flight a thread, a grid-stride loop of 16 blocks a multiprocessor",
                       {{"vector_width", "4"}, {"items_per_thread", "4"}, {"blocks_per_sm", "16"}}),
    };
  } else if (d.family == "softmax") {
    t.source = softmax_cuda(d, p);
    const KnobSpec exp_impl = knob("exp_impl", {"expf", "fast"}, KnobSide::compute);
    if (rows) {
      t.knobs = {row_mapping, block_threads, vector_width, knob("passes", {"three", "online"}, KnobSide::memory), row_cache, register_items, exp_impl, unroll};
      t.starting_points = {
          starting_point("one online pass, the row in registers, float4, 256 threads",
                         {{"passes", "online"}, {"row_cache", "registers"}, {"register_items", "16"}, {"vector_width", "4"}}),
          starting_point("one online pass, the row in registers, float4, 512 threads",
                         {{"passes", "online"}, {"row_cache", "registers"}, {"register_items", "16"}, {"vector_width", "4"}, {"block_threads", "512"}}),
          starting_point("one online pass, the row in shared memory, float4, 256 threads",
                         {{"passes", "online"}, {"row_cache", "shared"}, {"vector_width", "4"}, {"unroll", "2"}}),
          starting_point("a warp a row, one online pass, float4", {{"row_mapping", "warp"}, {"passes", "online"}, {"vector_width", "4"}, {"unroll", "2"}}),
      };
    } else {
      t.knobs = {inner_tile, split, vector_width, column_cache, exp_impl};
      t.starting_points = {
          starting_point("float4 across inner, 8 threads a line, kept in registers", {{"vector_width", "4"}, {"column_cache", "registers"}}),
          starting_point("32 x 4 threads, kept in registers", {{"split", "4"}, {"column_cache", "registers"}}),
      };
    }
    t.flops = 5 * elements;
  } else if (d.family == "norm") {
    t.source = norm_cuda(d, p);
    if (norm_few_lines(d)) {
      t.knobs = {block_threads, vector_width, knob("chunks_per_sm", {"4", "2", "8", "16"}, KnobSide::parallel)};
      t.starting_points = {
          starting_point("float4, 4 chunks a multiprocessor", {{"vector_width", "4"}}),
          starting_point("float4, 512 threads, 8 chunks a multiprocessor", {{"vector_width", "4"}, {"block_threads", "512"}, {"chunks_per_sm", "8"}}),
      };
    } else if (rows) {
      t.knobs = {row_mapping, block_threads, vector_width, row_cache, register_items, unroll};
      t.starting_points = {
          starting_point("the row in registers, float4, 256 threads", {{"row_cache", "registers"}, {"register_items", "32"}, {"vector_width", "4"}}),
          starting_point("the row in registers, float4, 512 threads",
                         {{"row_cache", "registers"}, {"register_items", "16"}, {"vector_width", "4"}, {"block_threads", "512"}}),
          starting_point("the row in shared memory, float4", {{"row_cache", "shared"}, {"vector_width", "4"}, {"unroll", "2"}}),
          starting_point("a warp a row, float4", {{"row_mapping", "warp"}, {"vector_width", "4"}, {"unroll", "2"}}),
      };
    } else {
      t.knobs = {inner_tile, split, vector_width, column_cache};
      t.starting_points = {
          starting_point("float4 across inner, 8 threads a line, kept in registers", {{"vector_width", "4"}, {"column_cache", "registers"}}),
          starting_point("float4 across inner, 4 threads a line, kept in registers", {{"vector_width", "4"}, {"split", "4"}, {"column_cache", "registers"}}),
          starting_point("32 x 16 threads, kept in registers", {{"split", "16"}, {"column_cache", "registers"}}),
      };
    }
    t.flops = 4 * elements;
  } else if (d.family == "reduction") {
    t.source = reduction_cuda(d, p);
    if (rows) {
      t.knobs = {row_mapping, block_threads, vector_width, unroll};
      t.starting_points = {
          starting_point("a warp a row, float4 after an aligning head", {{"row_mapping", "warp"}, {"vector_width", "4"}, {"unroll", "2"}}),
          starting_point("a warp a row, float4, 8 rows a block", {{"row_mapping", "warp"}, {"vector_width", "4"}, {"block_threads", "256"}}),
          starting_point("a block of 128 a row, float4", {{"block_threads", "128"}, {"vector_width", "4"}, {"unroll", "2"}}),
      };
    } else {
      t.knobs = {inner_tile, split, vector_width};
      t.starting_points = {
          starting_point("32 inner indices x 16 threads a line", {{"split", "16"}}),
          starting_point("64 inner indices x 4 threads a line", {{"inner_tile", "64"}, {"split", "4"}}),
          starting_point("float4 across inner, 8 threads a line", {{"vector_width", "4"}}),
      };
    }
    t.flops = elements;
  } else if (d.family == "matmul") {
    t.source = matmul_cuda(d, p);
    if (matmul_is_gemv(d)) {
      if (gemv_rows(d)) {
        t.knobs = {row_mapping, block_threads, vector_width, unroll};
        t.starting_points = {
            starting_point("a block of 256 a row, float4", {{"vector_width", "4"}, {"unroll", "4"}}),
            starting_point("a warp a row, float4", {{"row_mapping", "warp"}, {"vector_width", "4"}, {"unroll", "4"}}),
            starting_point("a block of 512 a row, float4", {{"vector_width", "4"}, {"block_threads", "512"}, {"unroll", "2"}}),
        };
      } else {
        t.knobs = {inner_tile, split, vector_width};
        t.starting_points = {
            starting_point("float4 across the output, 8 threads down k", {{"vector_width", "4"}}),
            starting_point("32 outputs x 32 threads down k", {{"split", "32"}}),
        };
      }
    } else {
      t.knobs = {knob("block_m", {"64", "128", "32"}, KnobSide::compute), knob("block_n", {"64", "128", "32"}, KnobSide::compute),
                 knob("block_k", {"8", "16", "32"}, KnobSide::memory),  knob("thread_m", {"4", "8"}, KnobSide::compute),
                 knob("thread_n", {"4", "8"}, KnobSide::compute),        vector_width,
                 knob("buffering", {"single", "double"}, KnobSide::memory),  knob("min_blocks", {"1", "2"}, KnobSide::parallel)};
      t.starting_points = {
          starting_point("128 x 128 tiles, 8 x 8 a thread, k steps of 8, float4 loads, double-buffered",
                         {{"block_m", "128"}, {"block_n", "128"}, {"block_k", "8"}, {"thread_m", "8"}, {"thread_n", "8"}, {"vector_width", "4"}, {"buffering", "double"}}),
          starting_point("128 x 128 tiles, 8 x 8 a thread, k steps of 16, float4 loads, double-buffered",
                         {{"block_m", "128"}, {"block_n", "128"}, {"block_k", "16"}, {"thread_m", "8"}, {"thread_n", "8"}, {"vector_width", "4"}, {"buffering", "double"}}),
          starting_point("128 x 64 tiles, 8 x 8 a thread, k steps of 16, float4 loads, double-buffered",
                         {{"block_m", "128"}, {"block_n", "64"}, {"block_k", "16"}, {"thread_m", "8"}, {"thread_n", "8"}, {"vector_width", "4"}, {"buffering", "double"}}),
          starting_point("128 x 128 tiles, 8 x 8 a thread, k steps of 8, float4 loads, double-buffered, 2 blocks a multiprocessor",
                         {{"block_m", "128"}, {"block_n", "128"}, {"block_k", "8"}, {"thread_m", "8"}, {"thread_n", "8"}, {"vector_width", "4"}, {"buffering", "double"}, {"min_blocks", "2"}}),
          starting_point("64 x 64 tiles, 4 x 4 a thread, k steps of 16, float4 loads",
                         {{"block_k", "16"}, {"vector_width", "4"}}),
      };
    }
    t.flops = 2 * d.number("batch", 1) * d.number("m") * d.number("n") * d.number("k");
  } else {
    return make_error(fmt::format("no template for the family '{}'", d.family));
  }
  return t;
}

}  // namespace detail
}  // namespace kevo::eval
