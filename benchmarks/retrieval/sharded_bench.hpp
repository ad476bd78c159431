// benchmarks/retrieval/sharded_bench.hpp: retrieval_benchmark's sharded pool (--sharded-only), timed
// from a host translation unit (the host's half compiles in seconds with g++; the .cu takes minutes
// of nvcc). retrieval_benchmark.cu builds the shards on their GPUs and hands them over.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kevo/retrieval/backend.hpp"
#include "kevo/retrieval/workload.hpp"

namespace kevo::retrieval::bench {

/// The workload's first `total_ads` ads, shard s holding those whose id shard_of places on s (on GPU
/// gpus[s]), and `whole` every one of them on one GPU, for comparing answers (null where they would
/// not fit).
struct ShardedPools {
  std::vector<std::unique_ptr<RetrievalBackend>> shards;
  std::vector<std::uint64_t> shard_ads;
  std::vector<int> gpus;
  std::unique_ptr<RetrievalBackend> whole;
  std::uint64_t total_ads = 0;
};

/// Answers checked against `whole`; one request at a time and batches of 16, shard 0 alone (one GPU)
/// against every shard together; updates routed across the shards, alone and while searching.
/// Prints markdown; returns false where an answer disagrees.
bool run_sharded(ShardedPools pools, const Workload& workload, bool quick);

}  // namespace kevo::retrieval::bench
