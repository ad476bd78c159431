// kevo/retrieval/shard_placement.hpp: the shard of a pool an ad lives on, from its id alone, so that
// every update of an ad goes where the ad is. Apart from sharded_backend.hpp so that code nvcc
// compiles (a benchmark that fills shards on their GPUs) places ads as ShardedBackend routes them.
//
//   std::size_t s = shard_of(ad.id, 4);   // 0..3; consecutive ids spread evenly
#pragma once

#include <cstddef>
#include <cstdint>

namespace kevo::retrieval {

/// A 64-bit mix of the id (splitmix64's finalizer), so that consecutive ids spread evenly.
inline std::size_t shard_of(std::uint32_t id, std::size_t shard_count) {
  std::uint64_t x = id + 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return static_cast<std::size_t>((x ^ (x >> 31)) % shard_count);
}

}  // namespace kevo::retrieval
