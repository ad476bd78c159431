// The retrieval pipeline's kernels to AMD device code (issue 52): every kernel of dispatch/, one shape of
// each (256 threads, d = 64; scoring in each embedding type, registers and the cp.async ring; matching
// alone and batched), compiled with hipcc for gfx90a and gfx940 by tests/hip/CMakeLists.txt, never run (no
// AMD GPU is lent). What it proves: the kernels' logical warps, shared memory (64 KiB of LDS on CDNA) and
// rocPRIM's block algorithms compile for a 64-lane wave. The whole dispatch instantiates every shape of
// every policy (about 200 kernels); one of each is the CI-sized share.
#include <cstdint>

#include "kevo/retrieval/dispatch/index_kernels.cuh"
#include "kevo/retrieval/dispatch/matching_kernels.cuh"
#include "kevo/retrieval/dispatch/request_kernels.cuh"
#include "kevo/retrieval/dispatch/scoring_kernels.cuh"
#include "kevo/retrieval/dispatch/topk_kernels.cuh"

static_assert(KEVO_GPU_AMD, "this unit is compiled for AMD");

namespace k = kevo::retrieval::kernels;
using kevo::retrieval::EmbeddingType;

constexpr int kThreads = 256, kDim = 64;

// A kernel named in host code that the object keeps is emitted for the device: this table, with external
// linkage (in an unnamed namespace the compiler drops the table, and with it every kernel's device code).
extern const void* const kevo_kernels_for_amd[];
const void* const kevo_kernels_for_amd[] = {
    reinterpret_cast<const void*>(&k::scatter_ads<>),
    reinterpret_cast<const void*>(&k::drop_clause_runs<>),
    reinterpret_cast<const void*>(&k::arena_run_quads<>),
    reinterpret_cast<const void*>(&k::arena_move_runs<>),
    reinterpret_cast<const void*>(&k::postings_count<>),
    reinterpret_cast<const void*>(&k::postings_emit<>),
    reinterpret_cast<const void*>(&k::postings_count_bits<>),
    reinterpret_cast<const void*>(&k::postings_fill_tables<>),
    reinterpret_cast<const void*>(&k::postings_segment_starts<>),
    reinterpret_cast<const void*>(&k::regroup_keys<>),
    reinterpret_cast<const void*>(&k::regroup_gather<>),
    reinterpret_cast<const void*>(&k::prepare_request<>),
    reinterpret_cast<const void*>(&k::tower_expert<>),
    reinterpret_cast<const void*>(&k::tower_gate<>),
    reinterpret_cast<const void*>(&k::matching<kThreads>),
    reinterpret_cast<const void*>(&k::matching<kThreads, k::kMaxBatchRequests>),
    reinterpret_cast<const void*>(&k::scoring<kThreads, kDim, EmbeddingType::fp16, 2>),
    reinterpret_cast<const void*>(&k::scoring_staged<kThreads, kDim, EmbeddingType::fp16, 2>),
    reinterpret_cast<const void*>(&k::scoring_staged<kThreads, kDim, EmbeddingType::int8, 2>),
    reinterpret_cast<const void*>(&k::scoring_staged<kThreads, kDim, EmbeddingType::int8_group32, 2>),
    reinterpret_cast<const void*>(&k::scoring_batch<kThreads, kDim, EmbeddingType::fp16, 2, 1>),
    reinterpret_cast<const void*>(&k::topk_select<kThreads>),
    reinterpret_cast<const void*>(&k::topk_histogram<kThreads>),
    reinterpret_cast<const void*>(&k::topk_refine<kThreads>),
    reinterpret_cast<const void*>(&k::topk_compact<kThreads>),
    reinterpret_cast<const void*>(&k::topk_select_and_compact<kThreads>),
    reinterpret_cast<const void*>(&k::topk_sort<>),
    reinterpret_cast<const void*>(&k::topk_rank<>),
};
