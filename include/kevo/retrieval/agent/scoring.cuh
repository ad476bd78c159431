// kevo/retrieval/agent/scoring.cuh: the fused MoE-gated scoring of one warp's tile of 16 eligible
// ads. The per-request vectors (u_e and g_e, 2E x d, fp16) times the tile's embeddings (16 x d) is a
// small GEMM on tensor cores (mma.sync m16n8k16: n-tile 0 = the 8 experts' u, n-tile 1 = their g);
// routing, softmax, bias and the order key then run on the accumulators in registers. Nothing
// per-ad but the final key reaches device memory.
//
// The reduction dimension may be permuted freely as long as A and B agree, so each thread loads
// 16-byte chunks of its two rows (lane = 4 * group + quad): thread (group, quad) holds rows group
// and group + 8, chunks quad, quad + 4, quad + 8, ... of each, so that one load instruction covers
// 64 contiguous bytes of every row. k-step s takes values 4 (s % per) .. +3 of chunk s / per, where
// per = k-steps per chunk (fp16: 2, int8: 4; int8 words are widened to two half2).
//
//   AgentScoring<128, EmbeddingType::fp16> agent{index, b_fragments_in_shared, routing, experts};
//   auto tile = agent.load_tile(lane, slot_lo, slot_hi, valid_lo, valid_hi);
//   float score = agent.score_tile(lane, tile);   // quad 0: row group, quad 1: row group + 8
//
// Why one file of about 610 lines: the tile's loads, the tensor-core products and the epilogue share
// one register layout, which a split would have to restate in each part.
#pragma once

#include <cstdint>

#include "kevo/retrieval/agent/views.cuh"
#include "kevo/retrieval/types.hpp"

namespace kevo::retrieval {

/// Up to 8 experts fit one n-tile of the mma; the vectors buffer is (16, d): u rows 0..7, g rows 8..15.
inline constexpr int kMaxGpuExperts = 8;

template <int Dim, EmbeddingType Type>
struct ScoringShape {
  static_assert(Dim == 64 || Dim == 128 || Dim == 256, "d must be 64, 128 or 256");
  static constexpr int k_steps = Dim / 16;
  static constexpr int bytes_per_value = Type == EmbeddingType::fp16 ? 2 : 1;
  static constexpr int row_bytes = Dim * bytes_per_value;
  static constexpr int slice_bytes = row_bytes / 4;  // one thread's quarter of a row
  static constexpr int slice_loads = slice_bytes / 16;
  static_assert(slice_loads >= 1, "a quarter row is at least one 16-byte load");
  /// What a row copy's miss asks L2 to fetch. A row of 128 bytes or more arrives in several
  /// requests (one copy instruction takes 64 bytes of each of 8 rows), so the first miss may fetch
  /// the rest of the row, up to 256 bytes. Never more than the row (rows are aligned to their size):
  /// the rest of a 256-byte block is other ads', mostly not eligible, and fetching it lost 3-9
  /// points (benchmarks/RESULTS.md, run 159). A 64-byte row is one request: nothing to add.
  static constexpr int l2_prefetch_bytes = row_bytes >= 256 ? 256 : row_bytes == 128 ? 128 : 0;
  static_assert(l2_prefetch_bytes <= row_bytes, "a row's prefetch must not reach a neighbour's row");
  static constexpr int values_per_chunk = 16 / bytes_per_value;
  static constexpr int steps_per_chunk = values_per_chunk / 4;
  static constexpr int side = side_width(Type, Dim);  // 32-bit words beside each row (views.cuh)
  static constexpr int scale_words = retrieval::scale_words(Type, Dim);  // at the side record's tail
  /// int8_group32: the A fragments are scaled per group of 32 values (a chunk's 16 values share
  /// one), since the reduction dimension mixes groups across lanes and a per-row scale of the
  /// accumulators cannot apply them.
  static constexpr bool group_scales = Type == EmbeddingType::int8_group32;
  /// The first d index that lane quarter `quad` feeds into k-step s (4 consecutive values from there).
  __host__ __device__ static constexpr int value_offset(int quad, int s) {
    return (quad + 4 * (s / steps_per_chunk)) * values_per_chunk + 4 * (s % steps_per_chunk);
  }
};

/// The B fragments in shared memory, pre-arranged so that lane L of k-step s reads one uint2
/// (conflict-free): b[n_tile][s][L] = {b0b1, b2b3} for expert (L / 4), d-range quarter (L % 4).
template <int Dim>
struct ScoringFragments {
  uint2 b[2][Dim / 16][gpu_logical_warp_size];
};

/// Fills the fragments from the (16, d) fp16 vectors in the order the A loads use; call from every
/// thread, then barrier.
template <int Dim, EmbeddingType Type>
__device__ __forceinline__ void load_scoring_fragments(ScoringFragments<Dim>& f, const __half* vectors, int thread_rank,
                                                       int threads);

/// One lane's view of a row quarter: raw 16-byte loads.
template <int Dim, EmbeddingType Type>
struct RowQuarter {
  uint4 v[ScoringShape<Dim, Type>::slice_loads];
};

template <int Dim, EmbeddingType Type>
__device__ __forceinline__ RowQuarter<Dim, Type> load_row_quarter(const void* embeddings, std::uint32_t slot, int quad,
                                                                  bool valid) {
  using Shape = ScoringShape<Dim, Type>;
  RowQuarter<Dim, Type> r;
  const char* base = static_cast<const char*>(embeddings) + static_cast<std::uint64_t>(slot) * Shape::row_bytes + 16 * quad;
#pragma unroll
  for (int i = 0; i < Shape::slice_loads; ++i)
    r.v[i] = valid ? gpu_load_streaming<Shape::l2_prefetch_bytes>(base + 64 * i) : make_uint4(0, 0, 0, 0);
  return r;
}

template <int Dim, EmbeddingType Type>
__device__ __forceinline__ void load_scoring_fragments(ScoringFragments<Dim>& f, const __half* vectors, int thread_rank,
                                                       int threads) {
  using Shape = ScoringShape<Dim, Type>;
  const std::uint32_t* words = reinterpret_cast<const std::uint32_t*>(vectors);  // (16, d/2)
  for (int i = thread_rank; i < 2 * (Dim / 16) * gpu_logical_warp_size; i += threads) {
    constexpr int lanes = gpu_logical_warp_size;
    const int lane = i % lanes, s = (i / lanes) % (Dim / 16), tile = i / (lanes * (Dim / 16));
    const int group = lane / 4, quad = lane % 4;
    const int row = tile * 8 + group;
    const int word = row * (Dim / 2) + Shape::value_offset(quad, s) / 2;
    f.b[tile][s][lane] = make_uint2(words[word], words[word + 1]);
  }
}

template <int Dim, EmbeddingType Type>
__device__ __forceinline__ std::uint32_t quarter_word(const RowQuarter<Dim, Type>& r, int w) {
  const uint4& v = r.v[w / 4];
  const int c = w % 4;
  return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}

/// A half2 word times another, as fp16 multiplies (each product rounded to fp16).
__device__ __forceinline__ std::uint32_t multiply_half2(std::uint32_t a, std::uint32_t b) {
  const __half2 product = __hmul2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
  return *reinterpret_cast<const std::uint32_t*>(&product);
}

/// Four int8 (one 32-bit word) to two half2 words, exactly: bias each byte by 128, place it in the
/// mantissa of 1024 (fp16 ulp 1 there), subtract 1152.
__device__ __forceinline__ void int8x4_to_half2x2(std::uint32_t q, std::uint32_t& lo, std::uint32_t& hi) {
  const std::uint32_t biased = q ^ 0x80808080u;
  const std::uint32_t lo_raw = gpu_byte_perm(biased, 0x64646464u, 0x4140u);
  const std::uint32_t hi_raw = gpu_byte_perm(biased, 0x64646464u, 0x4342u);
  const __half2 offset = __halves2half2(__ushort_as_half(0x6480u), __ushort_as_half(0x6480u));  // 1152
  const __half2 l = __hsub2(*reinterpret_cast<const __half2*>(&lo_raw), offset);
  const __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&hi_raw), offset);
  lo = *reinterpret_cast<const std::uint32_t*>(&l);
  hi = *reinterpret_cast<const std::uint32_t*>(&h);
}

/// One stage of a warp's shared-memory ring: a pair of 16-ad tiles as cp.async left them. Entry
/// [piece][lane] is the lane's piece-th 16-byte copy (tile 0 rows lo/hi, then tile 1 rows lo/hi), so
/// a lane reads back only what it copied itself (no waiting on other lanes) and a warp's reads of
/// one piece touch 32 consecutive 16-byte words (no bank conflicts).
template <int Dim, EmbeddingType Type>
struct StagedPair {
  static constexpr int pieces = 4 * ScoringShape<Dim, Type>::slice_loads;
  uint4 rows[pieces][gpu_logical_warp_size];
  float side[gpu_logical_warp_size][ScoringShape<Dim, Type>::side];  // of the row this lane scores: bias, then scale words
};

/// An expert as routing ranks it: its gate logit and its score.
struct RankedExpert {
  float logit, score;
};
/// The two experts routing picks first: larger logit first, ties to the lower expert index.
struct TopTwoExperts {
  RankedExpert first, second;
};

/// Whether expert a outranks expert b, when a's expert index is the lower iff `a_lower`.
__host__ __device__ __forceinline__ bool outranks(float a_logit, float b_logit, bool a_lower) {
  return a_logit > b_logit || (a_lower && a_logit == b_logit);
}

/// The top two of two top-two lists, where every expert of `a` has a lower index than every one of
/// `b` iff `a_lower`: the second is the better of the loser of the firsts and the winner's second.
__host__ __device__ __forceinline__ TopTwoExperts merge_top_two(const TopTwoExperts& a, const TopTwoExperts& b,
                                                                bool a_lower) {
  const bool a_first = outranks(a.first.logit, b.first.logit, a_lower);
  const RankedExpert from_a = a_first ? a.second : a.first;
  const RankedExpert from_b = a_first ? b.first : b.second;
  return {a_first ? a.first : b.first, outranks(from_a.logit, from_b.logit, a_lower) ? from_a : from_b};
}

/// The expert that position p (0 to 7) of a row holds in a lane after scoring's exchanges: the
/// lane's quad q holds the expert pairs q, q ^ 1, q ^ 2 and q ^ 3, in that order, two experts each.
__host__ __device__ __forceinline__ constexpr int expert_at_position(int quad, int p) {
  return 2 * (quad ^ (p / 2)) + (p & 1);
}

/// The top two of one row's 8 experts as a lane holds them after the exchanges (position p holds
/// expert_at_position(quad, p)). A tournament over the positions: each match's sides are
/// whole runs of expert pairs, so which side holds the lower indices is one bit of `quad` per
/// level, and no expert index is compared. (About half the instructions of a max, then scans for
/// the lowest expert holding it, twice: routing was a quarter of d = 64 int8 scoring, run 138.)
__host__ __device__ __forceinline__ TopTwoExperts top_two_experts(const float (&logit)[8], const float (&score)[8],
                                                                  int quad) {
  TopTwoExperts pair[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {  // positions 2k, 2k + 1: experts 2j and 2j + 1 (j = quad ^ k)
    const RankedExpert even{logit[2 * k], score[2 * k]}, odd{logit[2 * k + 1], score[2 * k + 1]};
    const bool even_first = even.logit >= odd.logit;
    pair[k] = {even_first ? even : odd, even_first ? odd : even};
  }
  // Expert pair quad ^ k against quad ^ (k ^ 1): the first is lower iff quad is even; runs
  // {quad, quad ^ 1} against {quad ^ 2, quad ^ 3}: the first is lower iff quad < 2.
  const bool even_quad = (quad & 1) == 0, low_quad = (quad & 2) == 0;
  return merge_top_two(merge_top_two(pair[0], pair[1], even_quad), merge_top_two(pair[2], pair[3], even_quad), low_quad);
}

template <int Dim, EmbeddingType Type>
struct AgentScoring {
  using Shape = ScoringShape<Dim, Type>;

  IndexView index;
  const ScoringFragments<Dim>* fragments;  // shared memory
  int routing;                             // k_e
  int experts;                             // E <= 8

  /// A loaded tile: this lane's quarters of rows `group` and `group + 8`, and the bias and scale
  /// of the row whose score this lane computes (quad 0: row group, quad 1: row group + 8). With
  /// group scales, also those of the groups of this lane's chunks of both rows, as half2 {s, s}
  /// (chunk j of the quarter is chunk quad + 4 j of the row, in group (quad + 4 j) / 2).
  static constexpr int group_registers = Shape::group_scales ? Shape::slice_loads : 1;
  struct Tile {
    RowQuarter<Dim, Type> lo, hi;
    float bias, scale;
    std::uint32_t group_lo[group_registers], group_hi[group_registers];
  };

  /// The half2 {s, s} of each of this lane's chunks, from a row's scale words (two fp16 a word).
  __device__ __forceinline__ static void pick_group_scales(int quad, const std::uint32_t* words,
                                                           std::uint32_t (&out)[group_registers]) {
#pragma unroll
    for (int j = 0; j < group_registers; ++j) {
      const int group = (quad + 4 * j) / 2;
      out[j] = gpu_byte_perm(words[group / 2], 0u, (group & 1) ? 0x3232u : 0x1010u);
    }
  }
  /// A row's scale words from its side record in device memory (one vector load; zeros if invalid).
  __device__ __forceinline__ void load_scale_words(std::uint32_t slot, bool valid,
                                                   std::uint32_t (&words)[Shape::scale_words]) const {
    const float* tail = index.side + static_cast<std::uint64_t>(slot) * Shape::side + (Shape::side - Shape::scale_words);
    if constexpr (Shape::scale_words == 4) {
      const uint4 w = valid ? __ldg(reinterpret_cast<const uint4*>(tail)) : make_uint4(0, 0, 0, 0);
      words[0] = w.x, words[1] = w.y, words[2] = w.z, words[3] = w.w;
    } else if constexpr (Shape::scale_words == 2) {
      const uint2 w = valid ? __ldg(reinterpret_cast<const uint2*>(tail)) : make_uint2(0, 0);
      words[0] = w.x, words[1] = w.y;
    } else {
      words[0] = valid ? __ldg(reinterpret_cast<const unsigned*>(tail)) : 0u;
    }
  }

  /// Issues the tile's loads; a separate step so that several tiles' loads can be in flight.
  __device__ __forceinline__ Tile load_tile(int lane, std::uint32_t slot_lo, std::uint32_t slot_hi, bool valid_lo,
                                            bool valid_hi) const {
    const int quad = lane & 3;
    Tile t;
    t.lo = load_row_quarter<Dim, Type>(index.embeddings, slot_lo, quad, valid_lo);
    t.hi = load_row_quarter<Dim, Type>(index.embeddings, slot_hi, quad, valid_hi);
    const bool odd = quad & 1;
    const std::uint32_t my_slot = odd ? slot_hi : slot_lo;
    const bool my_valid = odd ? valid_hi : valid_lo;
    if constexpr (Type == EmbeddingType::int8) {
      const float2 side = my_valid ? __ldg(reinterpret_cast<const float2*>(index.side) + my_slot) : make_float2(0.0f, 0.0f);
      t.bias = side.x;
      t.scale = side.y;
    } else {
      t.bias = my_valid ? __ldg(index.side + static_cast<std::uint64_t>(my_slot) * Shape::side) : 0.0f;
      t.scale = 1.0f;
    }
    if constexpr (Shape::group_scales) {
      std::uint32_t words[Shape::scale_words];
      load_scale_words(slot_lo, valid_lo, words);
      pick_group_scales(quad, words, t.group_lo);
      load_scale_words(slot_hi, valid_hi, words);
      pick_group_scales(quad, words, t.group_hi);
    }
    return t;
  }

  /// Issues the cp.async copies of a pair of tiles into `stage`: rows first .. first + 31 of a chunk
  /// whose `length` slots are staged in `slots` (shared memory). Rows past the end read nothing and
  /// come out as zeros. Commit and wait are the caller's.
  __device__ __forceinline__ void stage_pair(int lane, StagedPair<Dim, Type>& stage, const std::uint32_t* slots,
                                             std::uint32_t first, std::uint32_t length) const {
    const int group = lane >> 2, quad = lane & 3;
#pragma unroll
    for (int h = 0; h < 4; ++h) {  // h = 2 * tile + (row group + 8 ? 1 : 0)
      const std::uint32_t row = first + 16u * (h >> 1) + group + 8u * (h & 1);
      const bool valid = row < length;
      const char* base = static_cast<const char*>(index.embeddings) +
                         static_cast<std::uint64_t>(valid ? slots[row] : 0u) * Shape::row_bytes + 16 * quad;
#pragma unroll
      for (int i = 0; i < Shape::slice_loads; ++i)
        gpu_copy_async_16<Shape::l2_prefetch_bytes>(&stage.rows[h * Shape::slice_loads + i][lane], base + 64 * i,
                                                   valid ? 16u : 0u);
    }
    // The row this lane scores in score_tile_pair: tile quad / 2, row group (+ 8 on odd quads).
    const std::uint32_t mine = first + 16u * (quad >> 1) + group + 8u * (quad & 1);
    const bool valid = mine < length;
    const std::uint32_t slot = valid ? slots[mine] : 0u;
    const float* record = index.side + Shape::side * static_cast<std::uint64_t>(slot);
    if constexpr (Shape::side <= 2) {
      gpu_copy_async_small<4 * Shape::side>(stage.side[lane], record, valid);
    } else {
#pragma unroll
      for (int i = 0; i < Shape::side / 4; ++i) gpu_copy_async_16(&stage.side[lane][4 * i], record + 4 * i, valid ? 16u : 0u);
    }
  }

  /// Tile 0 or 1 of a stage whose copies have landed, as load_tile would have returned it (bias and
  /// scale are those of the row this lane scores, which is what score_tile_pair reads).
  __device__ __forceinline__ Tile staged_tile(int lane, const StagedPair<Dim, Type>& stage, int tile) const {
    Tile t;
#pragma unroll
    for (int i = 0; i < Shape::slice_loads; ++i) {
      t.lo.v[i] = stage.rows[(2 * tile) * Shape::slice_loads + i][lane];
      t.hi.v[i] = stage.rows[(2 * tile + 1) * Shape::slice_loads + i][lane];
    }
    t.bias = stage.side[lane][0];
    t.scale = Type == EmbeddingType::int8 ? stage.side[lane][Shape::side - 1] : 1.0f;
    if constexpr (Shape::group_scales) {
      // Rows group and group + 8 of this tile are scored, and their records copied, by lanes
      // 4 group + 2 tile and + 1: the ring's wait and gpu_sync_lanes come before any consumer reads.
      const int group = lane >> 2, quad = lane & 3;
      const int tail = Shape::side - Shape::scale_words;
      pick_group_scales(quad, reinterpret_cast<const std::uint32_t*>(&stage.side[4 * group + 2 * tile][tail]), t.group_lo);
      pick_group_scales(quad, reinterpret_cast<const std::uint32_t*>(&stage.side[4 * group + 2 * tile + 1][tail]), t.group_hi);
    }
    return t;
  }

  /// The A fragment of k-step s from a loaded tile (int8 widened to fp16 exactly; with group
  /// scales, then times its group's scale, each product rounded to fp16).
  __device__ __forceinline__ static void a_fragment(const Tile& tile, int s, std::uint32_t& a0, std::uint32_t& a1,
                                                    std::uint32_t& a2, std::uint32_t& a3) {
    if constexpr (Type == EmbeddingType::fp16) {
      a0 = quarter_word(tile.lo, 2 * s);
      a2 = quarter_word(tile.lo, 2 * s + 1);
      a1 = quarter_word(tile.hi, 2 * s);
      a3 = quarter_word(tile.hi, 2 * s + 1);
    } else {
      int8x4_to_half2x2(quarter_word(tile.lo, s), a0, a2);
      int8x4_to_half2x2(quarter_word(tile.hi, s), a1, a3);
      if constexpr (Shape::group_scales) {  // k-step s reads chunk s / steps_per_chunk of the quarter
        const int j = s / Shape::steps_per_chunk;
        a0 = multiply_half2(a0, tile.group_lo[j]);
        a2 = multiply_half2(a2, tile.group_lo[j]);
        a1 = multiply_half2(a1, tile.group_hi[j]);
        a3 = multiply_half2(a3, tile.group_hi[j]);
      }
    }
  }

  /// The tile's expert scores and gate logits on tensor cores: acc[0..1] hold row `group`, experts
  /// 2 quad and 2 quad + 1; acc[2..3] the same experts of row `group + 8`.
  /// Even and odd k-steps accumulate separately and are summed at the end: two independent mma
  /// chains of half the length, so the tensor-core latency of one hides behind the other.
  __device__ __forceinline__ void accumulate(int lane, const Tile& tile, float (&acc_u)[4], float (&acc_g)[4]) const {
    float u2[2][4], g2[2][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) u2[0][i] = u2[1][i] = g2[0][i] = g2[1][i] = 0.0f;
#pragma unroll
    for (int s = 0; s < Shape::k_steps; ++s) {
      std::uint32_t a0, a1, a2, a3;
      a_fragment(tile, s, a0, a1, a2, a3);
      const uint2 bu = fragments->b[0][s][lane];
      const uint2 bg = fragments->b[1][s][lane];
      gpu_mma_m16n8k16(u2[s & 1], a0, a1, a2, a3, bu.x, bu.y);
      gpu_mma_m16n8k16(g2[s & 1], a0, a1, a2, a3, bg.x, bg.y);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc_u[i] = u2[0][i] + u2[1][i];
      acc_g[i] = g2[0][i] + g2[1][i];
    }
  }

  /// Four experts of one row after the first exchange (with lane ^ 1): this lane's own two
  /// experts and its partner's, for row `group` on even quads and row `group + 8` on odd ones.
  struct HalfRow {
    float score[4], logit[4];
  };
  __device__ __forceinline__ static HalfRow exchange_pairs(bool odd, const float (&acc_u)[4], const float (&acc_g)[4]) {
    HalfRow h;
    h.score[0] = odd ? acc_u[2] : acc_u[0];
    h.score[1] = odd ? acc_u[3] : acc_u[1];
    h.logit[0] = odd ? acc_g[2] : acc_g[0];
    h.logit[1] = odd ? acc_g[3] : acc_g[1];
    h.score[2] = gpu_shfl_xor(gpu_all_lanes, odd ? acc_u[0] : acc_u[2], 1);
    h.score[3] = gpu_shfl_xor(gpu_all_lanes, odd ? acc_u[1] : acc_u[3], 1);
    h.logit[2] = gpu_shfl_xor(gpu_all_lanes, odd ? acc_g[0] : acc_g[2], 1);
    h.logit[3] = gpu_shfl_xor(gpu_all_lanes, odd ? acc_g[1] : acc_g[3], 1);
    return h;
  }

  /// One row's 8 experts as routing sees them: scaled scores and logits (experts >= E at -inf),
  /// from `mine` (experts 2q, 2q+1, 2(q^1), 2(q^1)+1) and `other` (the rest, as lane q ^ 2 held them).
  struct RowExperts {
    float score[8], logit[8];
    int expert[8];
  };
  __device__ __forceinline__ RowExperts row_experts(int quad, const HalfRow& mine, const HalfRow& other,
                                                    float scale) const {
    RowExperts row;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      row.score[p] = mine.score[p] * scale;
      row.logit[p] = mine.logit[p];
      row.score[p + 4] = other.score[p] * scale;
      row.logit[p + 4] = other.logit[p];
      row.expert[p] = expert_at_position(quad, p);
      row.expert[p + 4] = expert_at_position(quad, p + 4);
    }
#pragma unroll
    for (int p = 0; p < 8; ++p) row.logit[p] = row.expert[p] < experts ? row.logit[p] * scale : -INFINITY;
    return row;
  }

  /// Routing on one row's 8 experts: top-k_e by logit (ties: lower expert index), softmax over the
  /// chosen logits, weighted expert scores, plus the bias. `mine` holds experts 2q, 2q+1, 2(q^1),
  /// 2(q^1)+1 and `other` the rest, as lane q ^ 2 held them.
  __device__ __forceinline__ float route(int quad, const HalfRow& mine, const HalfRow& other, float bias,
                                         float scale) const {
    return route_for(routing, quad, mine, other, bias, scale);
  }

  /// Whether route_for takes the top-two path for this width (no branches on the data: requests
  /// that all take it can be routed side by side).
  __device__ __forceinline__ bool routes_top_two(int width) const { return width < experts && width <= 2; }

  __device__ __forceinline__ float route_for(int width, int quad, const HalfRow& mine, const HalfRow& other, float bias,
                                             float scale) const {
    if (width < experts && width <= 2) return route_top_two(width, quad, mine, other, bias, scale);
    const RowExperts row = row_experts(quad, mine, other, scale);
    const float(&score)[8] = row.score;
    const float(&logit)[8] = row.logit;
    const int(&expert)[8] = row.expert;
    // Order: larger logit first, then lower expert index (experts >= E sit at -inf, last).
    if (width >= experts) {  // dense softmax gating: every expert, no selection
      float top_logit = logit[0];
#pragma unroll
      for (int p = 1; p < 8; ++p) top_logit = fmaxf(top_logit, logit[p]);
      float weighted = 0.0f, total = 0.0f;
#pragma unroll
      for (int p = 0; p < 8; ++p) {
        if (expert[p] < experts) {
          const float w = __expf(logit[p] - top_logit);
          weighted += w * score[p];
          total += w;
        }
      }
      return weighted / total + bias;
    }
    std::uint32_t chosen = 0;
    float top_logit = 0.0f;
    for (int r = 0; r < width; ++r) {
      int best = 0;
      float best_logit = -INFINITY;
      int best_expert = kMaxGpuExperts;
#pragma unroll
      for (int p = 0; p < 8; ++p) {
        const bool better = logit[p] > best_logit || (logit[p] == best_logit && expert[p] < best_expert);
        if (!((chosen >> p) & 1u) && better) {
          best = p;
          best_logit = logit[p];
          best_expert = expert[p];
        }
      }
      chosen |= 1u << best;
      if (r == 0) top_logit = best_logit;
    }
    float weighted = 0.0f, total = 0.0f;
#pragma unroll
    for (int p = 0; p < 8; ++p) {
      if ((chosen >> p) & 1u) {
        const float w = __expf(logit[p] - top_logit);
        weighted += w * score[p];
        total += w;
      }
    }
    return weighted / total + bias;
  }

  /// route_for's usual widths (1 or 2 of more experts), with the least arithmetic: the top two are
  /// chosen on the unscaled logits (a per-ad scale > 0 keeps their order; a zero scale makes every
  /// score the bias either way), by top_two_experts' tournament, and only the chosen four values are
  /// scaled. The same values as scaling first (to the spec's tie rule).
  __device__ __forceinline__ float route_top_two(int width, int quad, const HalfRow& mine, const HalfRow& other,
                                                 float bias, float scale) const {
    float score[8], logit[8];
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      score[p] = mine.score[p];
      logit[p] = mine.logit[p];
      score[p + 4] = other.score[p];
      logit[p + 4] = other.logit[p];
    }
    if (experts < kMaxGpuExperts)
#pragma unroll
      for (int p = 0; p < 8; ++p)
        if (expert_at_position(quad, p) >= experts) logit[p] = -INFINITY;
    const TopTwoExperts top = top_two_experts(logit, score, quad);
    const float l1 = top.first.logit, s1 = top.first.score;
    // (Products rounded on their own, as scaling first rounds them: no contraction into the sums.)
    if (width == 1) return __fmul_rn(s1, scale) + bias;
    const float l2 = top.second.logit, s2 = top.second.score;
    const float w = __expf(__fmul_rn(l2, scale) - __fmul_rn(l1, scale));
    return (__fmul_rn(s1, scale) + w * __fmul_rn(s2, scale)) / (1.0f + w) + bias;
  }

  /// Scores one loaded tile of 16 ads. Lanes with quad 0 return the score of row `group`, quad 1 of
  /// row `group + 8`; quads 2 and 3 duplicate them (the caller drops their results).
  __device__ __forceinline__ float score_tile(int lane, const Tile& tile) const {
    const int quad = lane & 3;
    float acc_u[4], acc_g[4];
    accumulate(lane, tile, acc_u, acc_g);
    const HalfRow mine = exchange_pairs(quad & 1, acc_u, acc_g);
    HalfRow other;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      other.score[p] = gpu_shfl_xor(gpu_all_lanes, mine.score[p], 2);
      other.logit[p] = gpu_shfl_xor(gpu_all_lanes, mine.logit[p], 2);
    }
    return route(quad, mine, other, tile.bias, tile.scale);
  }

  /// Scores two loaded tiles with no lane doing duplicate work: quads 0 and 1 return rows `group`
  /// and `group + 8` of the first tile, quads 2 and 3 the same rows of the second.
  __device__ __forceinline__ float score_tile_pair(int lane, const Tile& first, const Tile& second) const {
    const int quad = lane & 3;
    const bool odd = quad & 1, upper = quad & 2;
    float acc_u[4], acc_g[4];
    accumulate(lane, first, acc_u, acc_g);
    const HalfRow first_half = exchange_pairs(odd, acc_u, acc_g);
    accumulate(lane, second, acc_u, acc_g);
    const HalfRow second_half = exchange_pairs(odd, acc_u, acc_g);
    // Lane q keeps its half of tile (q >> 1) and hands lane q ^ 2 its half of the other tile.
    // (Selected value by value: a run-time choice between whole structs would put them in local memory.)
    HalfRow mine, other;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      mine.score[p] = upper ? second_half.score[p] : first_half.score[p];
      mine.logit[p] = upper ? second_half.logit[p] : first_half.logit[p];
      other.score[p] = gpu_shfl_xor(gpu_all_lanes, upper ? first_half.score[p] : second_half.score[p], 2);
      other.logit[p] = gpu_shfl_xor(gpu_all_lanes, upper ? first_half.logit[p] : second_half.logit[p], 2);
    }
    return route(quad, mine, other, upper ? second.bias : first.bias, upper ? second.scale : first.scale);
  }

  /// A batch's scoring: one tile against R requests at once (fragments f[0..R-1]). The A fragments
  /// are taken from the tile once per k-step, and the R requests' mma chains are independent, so
  /// they overlap one another's latency.
  template <int R>
  __device__ __forceinline__ void accumulate_group(int lane, const Tile& tile, const ScoringFragments<Dim>* f,
                                                   HalfRow (&half)[R]) const {
    float u2[R][2][4], g2[R][2][4];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int i = 0; i < 4; ++i) u2[r][0][i] = u2[r][1][i] = g2[r][0][i] = g2[r][1][i] = 0.0f;
#pragma unroll
    for (int s = 0; s < Shape::k_steps; ++s) {
      std::uint32_t a0, a1, a2, a3;
      a_fragment(tile, s, a0, a1, a2, a3);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint2 bu = f[r].b[0][s][lane];
        const uint2 bg = f[r].b[1][s][lane];
        gpu_mma_m16n8k16(u2[r][s & 1], a0, a1, a2, a3, bu.x, bu.y);
        gpu_mma_m16n8k16(g2[r][s & 1], a0, a1, a2, a3, bg.x, bg.y);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float acc_u[4], acc_g[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        acc_u[i] = u2[r][0][i] + u2[r][1][i];
        acc_g[i] = g2[r][0][i] + g2[r][1][i];
      }
      half[r] = exchange_pairs(lane & 1, acc_u, acc_g);
    }
  }

  /// score_tile_pair for R requests at once: score[r] is request r's score of the row this lane
  /// owns. Where every width takes the top-two path, the R routings are straight-line code side by
  /// side (independent chains the scheduler interleaves); otherwise each branches on its own.
  template <int R>
  __device__ __forceinline__ void score_tile_pair_group(int lane, const Tile& first, const Tile& second,
                                                        const ScoringFragments<Dim>* f, const int (&widths)[R],
                                                        float (&score)[R]) const {
    const int quad = lane & 3;
    const bool upper = quad & 2;
    HalfRow first_half[R], second_half[R];
    accumulate_group<R>(lane, first, f, first_half);
    accumulate_group<R>(lane, second, f, second_half);
    HalfRow mine[R], other[R];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        mine[r].score[p] = upper ? second_half[r].score[p] : first_half[r].score[p];
        mine[r].logit[p] = upper ? second_half[r].logit[p] : first_half[r].logit[p];
        other[r].score[p] = gpu_shfl_xor(gpu_all_lanes, upper ? first_half[r].score[p] : second_half[r].score[p], 2);
        other[r].logit[p] = gpu_shfl_xor(gpu_all_lanes, upper ? first_half[r].logit[p] : second_half[r].logit[p], 2);
      }
    const float bias = upper ? second.bias : first.bias, scale = upper ? second.scale : first.scale;
    bool top_two = true;
#pragma unroll
    for (int r = 0; r < R; ++r) top_two = top_two && routes_top_two(widths[r]);
    if (top_two) {
#pragma unroll
      for (int r = 0; r < R; ++r) score[r] = route_top_two(widths[r], quad, mine[r], other[r], bias, scale);
    } else {
#pragma unroll
      for (int r = 0; r < R; ++r) score[r] = route_for(widths[r], quad, mine[r], other[r], bias, scale);
    }
  }
};

}  // namespace kevo::retrieval
