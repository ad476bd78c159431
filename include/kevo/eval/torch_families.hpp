// kevo/eval/torch_families.hpp: the template families that let the offline search take a KernelBench-format
// problem. kevo's PyTorch helper traces the module (torch.fx) and confirms a family against the module's own
// output (kevo_torch.py, match_family); here each family becomes a C++ kernel template with knobs, written for
// that problem's tensors and sizes:
//   elementwise   a map of one activation over every element (relu, gelu, sigmoid, ...)
//   softmax       softmax or log-softmax over one dimension
//   norm          layer, RMS, L1, L2 and Frobenius norms over one dimension (or the whole tensor)
//   reduction     sum, mean, max, min, argmax or argmin over one dimension
//   matmul        plain, batched, transposed, matrix-vector, and a linear layer (x W^T + b)
// A tensor of (outer, reduce, inner) elements is reduced over its middle extent: line (o, i) holds elements
// o * reduce * inner + r * inner + i. The defaults are the plain loop, as the shipped problems' are.
//
// A CUDA problem gets the family's CUDA template (torch_families_cuda.hpp, which also holds what both sides share:
// FamilyDescription, FamilyTemplate, the activations).
//
//   auto t = kevo::eval::family_template(description, problem);   // description: the helper's JSON "family"
//   if (t) { problem.template_source = t->source; problem.knobs = t->knobs; problem.starting_points = t->starting_points; }
#pragma once

#include <kevo/eval/harness.hpp>
#include <kevo/eval/torch_families_cuda.hpp>
#include <kevo/expected.hpp>
#include <kevo/problem.hpp>

#include <fmt/format.h>

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kevo::eval {

namespace detail {

/// What every CPU family template shares: includes, the thread split, and small vector helpers.
inline constexpr std::string_view cpu_family_prelude = R"(#include "kevo_problem.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>
#include <thread>
#include <vector>

namespace {

// Calls work(begin, end) on `threads` slices of [0, count), one per thread (the last on this one).
template <class Work>
void split(long count, int threads, Work work) {
  const long workers = threads > 1 && count >= 2 * threads ? threads : 1;
  const long per = (count + workers - 1) / workers;
  std::vector<std::thread> pool;
  for (long w = 0; w + 1 < workers; ++w) pool.emplace_back(work, w * per, std::min(count, (w + 1) * per));
  work(std::min(count, (workers - 1) * per), count);
  for (auto& t : pool) t.join();
}
)";

inline std::string elementwise_cpu(const FamilyDescription& d, const std::string& expression, const Problem& p) {
  return std::string(cpu_family_prelude) + fmt::format(R"(
// {0}, elementwise over {1} elements (a KernelBench-format problem's forward, matched by kevo).
constexpr long n = {1};
constexpr int unroll = ${{unroll}};    // elements per step, a constant trip count the compiler vectorizes
constexpr int threads = ${{threads}};

inline float op(float v) {{ return {2}; }}

void map_range(const float* __restrict x, float* __restrict y, long begin, long end) {{
  long i = begin;
  for (; i + unroll <= end; i += unroll)
#pragma GCC unroll 16
    for (int k = 0; k < unroll; ++k) y[i + k] = op(x[i + k]);
  for (; i < end; ++i) y[i] = op(x[i]);
}}

}}  // namespace

void kernel(const Shape&{3}) {{
  split(n, threads, [&](long begin, long end) {{ map_range({4}, {5}, begin, end); }});
}}
)",
                                                         d.op, d.size("n"), expression, tensor_parameters(p), p.tensors.front().name,
                                                         p.tensors.back().name);
}

inline std::string softmax_cpu(const FamilyDescription& d, const Problem& p) {
  return std::string(cpu_family_prelude) + fmt::format(R"(
// {0} over the middle extent of ({1}, {2}, {3}) (a KernelBench-format problem's forward, matched by kevo).
constexpr long outer = {1}, reduce = {2}, inner = {3};
constexpr bool log_softmax = {4};
constexpr bool online = std::string_view("${{passes}}") == "online";  // else max, then exp and sum, then scale
constexpr int threads = ${{threads}};

// Line (o, i): reduce elements `inner` apart.
void line(const float* x, float* y, long o, long i) {{
  const float* in = x + o * reduce * inner + i;
  float* out = y + o * reduce * inner + i;
  float max = in[0], sum = 0;
  if constexpr (online) {{
    for (long r = 0; r < reduce; ++r) {{
      const float v = in[r * inner];
      if (v > max) {{
        sum *= std::exp(max - v);
        max = v;
      }}
      sum += std::exp(v - max);
    }}
  }} else {{
    for (long r = 1; r < reduce; ++r) max = std::max(max, in[r * inner]);
    for (long r = 0; r < reduce; ++r) sum += std::exp(in[r * inner] - max);
  }}
  if constexpr (log_softmax) {{
    const float shift = max + std::log(sum);
    for (long r = 0; r < reduce; ++r) out[r * inner] = in[r * inner] - shift;
  }} else {{
    const float inverse = 1.0f / sum;
    for (long r = 0; r < reduce; ++r) out[r * inner] = std::exp(in[r * inner] - max) * inverse;
  }}
}}

}}  // namespace

void kernel(const Shape&{5}) {{
  split(outer * inner, threads, [&](long begin, long end) {{
    for (long l = begin; l < end; ++l) line({6}, {7}, l / inner, l % inner);
  }});
}}
)",
                                                         d.flag("log") ? "log-softmax" : "softmax", d.size("outer"), d.size("reduce"),
                                                         d.size("inner"), d.flag("log") ? "true" : "false", tensor_parameters(p),
                                                         p.tensors.front().name, p.tensors.back().name);
}

inline std::string norm_cpu(const FamilyDescription& d, const Problem& p) {
  // layer: (x - mean) / sqrt(var + eps) * w + b; rms: x / sqrt(mean(x^2) + eps); l1: x / sum|x|; l2 and fro: x / sqrt(sum x^2).
  const std::string& kind = d.op;
  const bool affine = d.flag("affine");
  const std::string weight = affine ? p.tensors.at(1).name : "nullptr";
  const std::string bias = affine ? p.tensors.at(2).name : "nullptr";
  return std::string(cpu_family_prelude) + fmt::format(R"(
// The {0} norm over the middle extent of ({1}, {2}, {3}) (a KernelBench-format problem's forward, matched by kevo).
constexpr long outer = {1}, reduce = {2}, inner = {3};
constexpr std::string_view kind = "{0}";
constexpr float eps = {4};
constexpr int accumulators = ${{accumulators}};  // independent partial sums, so the adds pipeline
constexpr int threads = ${{threads}};

struct Stats {{
  double a = 0, b = 0;  // layer: sum, sum of squares; rms, l2, fro: sum of squares; l1: sum of |x|
}};

Stats partial(const float* in, long begin, long end) {{
  float a[accumulators] = {{}}, b[accumulators] = {{}};
  long r = begin;
  for (; r + accumulators <= end; r += accumulators)
    for (int k = 0; k < accumulators; ++k) {{
      const float v = in[(r + k) * inner];
      if constexpr (kind == "l1") a[k] += std::fabs(v);
      else if constexpr (kind == "layer") {{
        a[k] += v;
        b[k] += v * v;
      }} else a[k] += v * v;
    }}
  Stats s;
  for (int k = 0; k < accumulators; ++k) {{
    s.a += a[k];
    s.b += b[k];
  }}
  for (; r < end; ++r) {{
    const float v = in[r * inner];
    if constexpr (kind == "l1") s.a += std::fabs(v);
    else if constexpr (kind == "layer") {{
      s.a += v;
      s.b += double(v) * v;
    }} else s.a += double(v) * v;
  }}
  return s;
}}

// y = (x - shift) * scale [* w + b] over [begin, end) of a line.
void apply(const float* in, float* out, const float* w, const float* b, float shift, float scale, long begin, long end) {{
  for (long r = begin; r < end; ++r) {{
    float v = (in[r * inner] - shift) * scale;
    if (w) v = v * w[r] + b[r];
    out[r * inner] = v;
  }}
}}

void finish(const Stats& s, float& shift, float& scale) {{
  shift = 0;
  if constexpr (kind == "layer") {{
    const double mean = s.a / reduce;
    const double var = std::max(0.0, s.b / reduce - mean * mean);
    shift = float(mean);
    scale = float(1.0 / std::sqrt(var + eps));
  }} else if constexpr (kind == "rms") {{
    scale = float(1.0 / std::sqrt(s.a / reduce + eps));
  }} else if constexpr (kind == "l1") {{
    scale = float(1.0 / s.a);
  }} else {{
    scale = float(1.0 / std::sqrt(s.a));
  }}
}}

}}  // namespace

void kernel(const Shape&{5}) {{
  // Named apart from the tensors', which the signature above takes.
  const float* src = {6};
  float* dst = {7};
  const float* gain = {8};
  const float* offset = {9};
  if (outer * inner >= 2 * threads) {{
    split(outer * inner, threads, [&](long begin, long end) {{
      for (long l = begin; l < end; ++l) {{
        const long base = (l / inner) * reduce * inner + l % inner;
        float shift, scale;
        finish(partial(src + base, 0, reduce), shift, scale);
        apply(src + base, dst + base, gain, offset, shift, scale, 0, reduce);
      }}
    }});
    return;
  }}
  // Few lines (the Frobenius norm is one): the threads share each line.
  for (long l = 0; l < outer * inner; ++l) {{
    const long base = (l / inner) * reduce * inner + l % inner;
    std::vector<Stats> parts(threads);
    const long per = (reduce + threads - 1) / threads;
    split(threads, threads, [&](long t0, long t1) {{
      for (long t = t0; t < t1; ++t) parts[t] = partial(src + base, std::min(reduce, t * per), std::min(reduce, (t + 1) * per));
    }});
    Stats s;
    for (const Stats& q : parts) {{
      s.a += q.a;
      s.b += q.b;
    }}
    float shift, scale;
    finish(s, shift, scale);
    split(reduce, threads, [&](long r0, long r1) {{ apply(src + base, dst + base, gain, offset, shift, scale, r0, r1); }});
  }}
}}
)",
                                                         kind, d.size("outer"), d.size("reduce"), d.size("inner"), float_literal(d.number("eps")),
                                                         tensor_parameters(p), p.tensors.front().name, p.tensors.back().name, weight, bias);
}

inline std::string reduction_cpu(const FamilyDescription& d, const Problem& p) {
  const bool arg = d.op == "argmax" || d.op == "argmin";
  return std::string(cpu_family_prelude) + fmt::format(R"(
// {0} over the middle extent of ({1}, {2}, {3}) (a KernelBench-format problem's forward, matched by kevo).
constexpr long outer = {1}, reduce = {2}, inner = {3};
constexpr std::string_view op = "{0}";
constexpr bool sweep = std::string_view("${{order}}") == "sweep";  // else one line at a time, `inner` apart
constexpr int threads = ${{threads}};
using Out = {4};

// Whether v replaces best: the first of equal extremes wins, as in PyTorch.
inline bool better(float v, float best) {{
  if constexpr (op == "max" || op == "argmax") return v > best;
  else return v < best;
}}

void lines(const float* x, Out* y, long o, long i0, long i1) {{
  const float* in = x + o * reduce * inner;
  Out* out = y + o * inner;
  if constexpr (op == "sum" || op == "mean") {{
    if constexpr (sweep) {{
      std::vector<float> acc(in + i0, in + i1);
      for (long r = 1; r < reduce; ++r)
        for (long i = i0; i < i1; ++i) acc[i - i0] += in[r * inner + i];
      for (long i = i0; i < i1; ++i) out[i] = op == "mean" ? acc[i - i0] / reduce : acc[i - i0];
    }} else {{
      for (long i = i0; i < i1; ++i) {{
        float s = 0;
        for (long r = 0; r < reduce; ++r) s += in[r * inner + i];
        out[i] = op == "mean" ? s / reduce : s;
      }}
    }}
  }} else {{
    std::vector<float> best(in + i0, in + i1);
    std::vector<int> at(i1 - i0, 0);
    if constexpr (sweep) {{
      for (long r = 1; r < reduce; ++r)
        for (long i = i0; i < i1; ++i)
          if (better(in[r * inner + i], best[i - i0])) {{
            best[i - i0] = in[r * inner + i];
            at[i - i0] = int(r);
          }}
    }} else {{
      for (long i = i0; i < i1; ++i)
        for (long r = 1; r < reduce; ++r)
          if (better(in[r * inner + i], best[i - i0])) {{
            best[i - i0] = in[r * inner + i];
            at[i - i0] = int(r);
          }}
    }}
    for (long i = i0; i < i1; ++i) {{
      if constexpr (op == "argmax" || op == "argmin") out[i] = at[i - i0];
      else out[i] = best[i - i0];
    }}
  }}
}}

}}  // namespace

void kernel(const Shape&{5}) {{
  if (outer >= 2 * threads || inner == 1) {{
    split(outer, threads, [&](long o0, long o1) {{
      for (long o = o0; o < o1; ++o) lines({6}, {7}, o, 0, inner);
    }});
  }} else {{
    for (long o = 0; o < outer; ++o) split(inner, threads, [&](long i0, long i1) {{ lines({6}, {7}, o, i0, i1); }});
  }}
}}
)",
                                                         d.op, d.size("outer"), d.size("reduce"), d.size("inner"), arg ? "int" : "float",
                                                         tensor_parameters(p), p.tensors.front().name, p.tensors.back().name);
}

inline std::string matmul_cpu(const FamilyDescription& d, const Problem& p) {
  const std::string a = p.tensors.at(0).name, b = p.tensors.at(1).name, c = p.tensors.back().name;
  const std::string bias = d.flag("bias") ? p.tensors.at(2).name : "nullptr";
  return std::string(cpu_family_prelude) + fmt::format(R"(
// C = op(A) op(B){0} for a batch of {1}: ({2} x {4}) times ({4} x {3}) (a KernelBench-format problem's forward,
// matched by kevo). The defaults are dot products; "packed" copies B into rows of {3} (transposed where it is
// stored (n, k)) and streams them into rows of C, blocked over k so a panel of B stays in cache.
constexpr long batch = {1}, m = {2}, n = {3}, k = {4};
constexpr bool trans_a = {5}, trans_b = {6};
constexpr bool packed = std::string_view("${{loop_order}}") == "packed";
constexpr long block_k = ${{block_k}};
constexpr int rows_per_step = ${{rows_per_step}};
constexpr int threads = ${{threads}};

inline float a_at(const float* A, long i, long kk) {{ return trans_a ? A[kk * m + i] : A[i * k + kk]; }}
inline float b_at(const float* B, long kk, long j) {{ return trans_b ? B[j * k + kk] : B[kk * n + j]; }}

void dot_rows(const float* A, const float* B, const float* bias, float* C, long i0, long i1) {{
  for (long i = i0; i < i1; ++i)
    for (long j = 0; j < n; ++j) {{
      float s = 0;
      for (long kk = 0; kk < k; ++kk) s += a_at(A, i, kk) * b_at(B, kk, j);
      C[i * n + j] = bias ? s + bias[j] : s;
    }}
}}

// Rows [i0, i1) of C from a packed B (k rows of n): rows_per_step rows of C share each row of B.
void packed_rows(const float* A, const float* Bp, const float* bias, float* C, long i0, long i1) {{
  for (long i = i0; i < i1; ++i)
    for (long j = 0; j < n; ++j) C[i * n + j] = bias ? bias[j] : 0.0f;
  for (long k0 = 0; k0 < k; k0 += block_k) {{
    const long k1 = std::min(k, k0 + block_k);
    long i = i0;
    for (; i + rows_per_step <= i1; i += rows_per_step)
      for (long kk = k0; kk < k1; ++kk) {{
        const float* brow = Bp + kk * n;
        for (int r = 0; r < rows_per_step; ++r) {{
          const float av = a_at(A, i + r, kk);
          float* crow = C + (i + r) * n;
          for (long j = 0; j < n; ++j) crow[j] += av * brow[j];
        }}
      }}
    for (; i < i1; ++i)
      for (long kk = k0; kk < k1; ++kk) {{
        const float av = a_at(A, i, kk);
        const float* brow = Bp + kk * n;
        float* crow = C + i * n;
        for (long j = 0; j < n; ++j) crow[j] += av * brow[j];
      }}
  }}
}}

}}  // namespace

void kernel(const Shape&{7}) {{
  std::vector<float> panel(packed ? k * n : 0);
  for (long bi = 0; bi < batch; ++bi) {{
    // Named apart from the tensors, which the signature above takes.
    const float* a_batch = {8} + bi * m * k;
    const float* b_batch = {9} + bi * k * n;
    float* c_batch = {10} + bi * m * n;
    if constexpr (packed) {{
      for (long kk = 0; kk < k; ++kk)
        for (long j = 0; j < n; ++j) panel[kk * n + j] = b_at(b_batch, kk, j);
      split(m, threads, [&](long i0, long i1) {{ packed_rows(a_batch, panel.data(), {11}, c_batch, i0, i1); }});
    }} else {{
      split(m, threads, [&](long i0, long i1) {{ dot_rows(a_batch, b_batch, {11}, c_batch, i0, i1); }});
    }}
  }}
}}
)",
                                                         d.flag("bias") ? " + bias" : "", d.size("batch"), d.size("m"), d.size("n"), d.size("k"),
                                                         d.flag("trans_a") ? "true" : "false", d.flag("trans_b") ? "true" : "false",
                                                         tensor_parameters(p), a, b, c, bias);
}

}  // namespace detail

/// The family's kernel template for `p` (its tensors named and typed already), with knobs and FLOPs.
inline expected<FamilyTemplate, Error> family_template(const FamilyDescription& d, const Problem& p) {
  using detail::knob;
  if (p.target == Target::cuda) return detail::cuda_family_template(d, p);
  if (p.target != Target::cpu)
    return make_error(fmt::format("the {} family has no {} template: search it with --llm", d.family, to_string(p.target)));
  const KnobSpec threads = knob("threads", {"1", "2", "3", "4"}, KnobSide::parallel);
  FamilyTemplate t;
  const double elements = d.number("n", d.number("outer", 1) * d.number("reduce", 1) * d.number("inner", 1));
  if (d.family == "elementwise") {
    auto expression = detail::activation_expression(d);
    if (!expression) return unexpected(expression.error());
    t.source = detail::elementwise_cpu(d, *expression, p);
    t.knobs = {knob("unroll", {"1", "4", "8", "16"}, KnobSide::compute), threads};
    t.flops = 4 * elements;
  } else if (d.family == "softmax") {
    t.source = detail::softmax_cpu(d, p);
    t.knobs = {knob("passes", {"three", "online"}, KnobSide::memory), threads};
    t.flops = 5 * elements;
  } else if (d.family == "norm") {
    t.source = detail::norm_cpu(d, p);
    t.knobs = {knob("accumulators", {"1", "4", "8", "16"}, KnobSide::compute), threads};
    t.flops = 4 * elements;
  } else if (d.family == "reduction") {
    t.source = detail::reduction_cpu(d, p);
    t.knobs = {knob("order", {"strided", "sweep"}, KnobSide::memory), threads};
    t.flops = elements;
  } else if (d.family == "matmul") {
    t.source = detail::matmul_cpu(d, p);
    t.knobs = {knob("loop_order", {"dot", "packed"}, KnobSide::memory), knob("block_k", {"256", "128", "64", "512"}, KnobSide::memory),
               knob("rows_per_step", {"1", "2", "4"}, KnobSide::compute), threads};
    t.flops = 2 * d.number("batch", 1) * d.number("m") * d.number("n") * d.number("k");
  } else {
    return make_error(fmt::format("no template for the family '{}'", d.family));
  }
  return t;
}

}  // namespace kevo::eval
