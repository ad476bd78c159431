// The bit layouts of matching's postings (agent/matching.cuh), checked on the host: they need no
// GPU, so they are [host] tests and run in CI too. Every field is packed at its limits and read back, and the limits
// the index enforces are shown to fit the fields.
// (One of the files of test_cuda_retrieval_pipeline; its main is main.cu.)
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "kevo/retrieval/agent/matching.cuh"
#include "kevo/retrieval/types.hpp"

using namespace kevo::retrieval;

TEST_CASE("a hash-table entry keeps every query bit, start and count at their limits", "[host][retrieval][postings]") {
  // The largest segment's postings and the largest schema's query bits must fit the fields.
  const std::uint64_t most_postings = std::uint64_t{kSegmentSlots} * kMaxIndexedClauses;
  const std::uint64_t most_bits = std::uint64_t{kMaxCategories} * kMaxCategoryValues;
  REQUIRE(most_postings <= (1u << 21));
  REQUIRE(most_bits <= (1u << 22));
  for (std::uint32_t bit : {0u, 1u, 12345u, static_cast<std::uint32_t>(most_bits - 1)})
    for (std::uint32_t start : {0u, 77u, static_cast<std::uint32_t>(most_postings - 1)})
      for (std::uint32_t count : {1u, 2u, static_cast<std::uint32_t>(most_postings)}) {
        const std::uint64_t e = table_entry::pack(bit, start, count);
        REQUIRE(e != 0);  // 0 marks an empty entry
        REQUIRE(table_entry::bit(e) == bit);
        REQUIRE(table_entry::start(e) == start);
        REQUIRE(table_entry::count(e) == count);
      }
}

TEST_CASE("a bit's home position lies in its table and spreads the bits of one category", "[host][retrieval][postings]") {
  for (std::uint32_t size : {1u, 2u, 3u, 97u, 1000u, 65537u}) {
    std::vector<std::uint32_t> load(size, 0);
    const std::uint32_t keys = size / 2 + 1;  // what a reindex puts in a table of this size
    for (std::uint32_t i = 0; i < keys; ++i) {
      const std::uint32_t at = table_entry::home(4096 + i, size);  // consecutive values, as one category's are
      REQUIRE(at < size);
      ++load[at];
    }
    INFO("size " << size);
    REQUIRE(*std::max_element(load.begin(), load.end()) <= 8u);  // no pile-up: probes stay short
  }
}

TEST_CASE("a posting holds a local slot and the mask bit it sets", "[host][retrieval][postings]") {
  for (std::uint32_t slot : {0u, 1u, 4097u, kSegmentSlots - 1})
    for (std::uint32_t rank : {0u, 3u, static_cast<std::uint32_t>(kMaxIndexedCategories - 1),
                               static_cast<std::uint32_t>(posting_bits::exclusion_rank)}) {
      const std::uint16_t p = posting_bits::pack(slot, rank);
      REQUIRE((p >> 3) == slot);
      REQUIRE((p & 7u) == rank);
    }
  // An ad's need mask (one bit per restricted category) never reaches the indexed flag or the
  // exclusion bit, so a mask with an exclusion in it can never equal a need mask.
  const std::uint32_t widest_need = (1u << kMaxIndexedCategories) - 1u;
  REQUIRE((widest_need & match_header::indexed) == 0);
  REQUIRE((widest_need & (1u << posting_bits::exclusion_rank)) == 0);
  REQUIRE(match_header::walk != 0);
  REQUIRE((match_header::walk & match_header::indexed) == 0);
  // A prefiltered ad's header is its (full) need mask without the indexed flag: distinct from a walk,
  // never taken for an indexed ad, and equal to the mask byte only when all 7 ranks are met.
  REQUIRE(match_header::prefiltered == widest_need);
  REQUIRE(match_header::prefiltered != match_header::walk);
  REQUIRE((match_header::prefiltered & match_header::indexed) == 0);
}

TEST_CASE("a clause's mask bit is its category's rank among the restricted ones", "[host][retrieval][postings]") {
  // Restricted categories 1, 4, 5, 9, 12, 20, 21, 30 (eight): the eighth, 30, has no bit.
  const std::uint32_t allowed = (1u << 1) | (1u << 4) | (1u << 5) | (1u << 9) | (1u << 12) | (1u << 20) |
                                (1u << 21) | (1u << 30);
  REQUIRE(posting_bits::rank_of(false, 1, allowed) == 0);
  REQUIRE(posting_bits::rank_of(false, 9, allowed) == 3);
  REQUIRE(posting_bits::rank_of(false, 21, allowed) == 6);
  REQUIRE(posting_bits::has_posting(false, 21, allowed));
  REQUIRE_FALSE(posting_bits::has_posting(false, 30, allowed));
  // Exclusions always have a posting, whatever their category.
  REQUIRE(posting_bits::rank_of(true, 30, allowed) == posting_bits::exclusion_rank);
  REQUIRE(posting_bits::has_posting(true, 30, allowed));
  REQUIRE(posting_bits::has_posting(true, 2, allowed));
}
