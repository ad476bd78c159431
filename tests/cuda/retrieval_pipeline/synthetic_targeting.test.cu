// The synthetic pool's targeting (tuning/pipeline_bench.cuh's generate_targeting), checked on the
// host: it needs no GPU, so it is tagged [host] and runs in CI too (main.cu). In id order and
// grouped by targeting, a range of the workload's ads comes back each once, with its own clauses,
// bias and liveness; grouped, in targeting_order_key order with ties by id.
#include <catch2/catch.hpp>

#include <vector>

#include "kevo/retrieval/tuning/pipeline_bench.cuh"

using namespace kevo::retrieval;

TEST_CASE("a synthetic pool's targeting holds every ad of its range once, in id order or grouped by targeting",
          "[host][retrieval][slot_order]") {
  const Workload w({.seed = 2026, .dim = 64, .features = 32, .hidden = 48});
  constexpr std::uint64_t begin = 5000, end = 25000;
  for (SlotOrder order : {SlotOrder::by_id, SlotOrder::by_targeting}) {
    const PackedAds packed = generate_targeting(w, begin, end, order);
    REQUIRE(packed.size() == end - begin);
    REQUIRE(packed.clause_begin.size() == packed.size() + 1);
    std::vector<int> seen(end - begin, 0);
    std::uint64_t previous_key = 0;
    std::uint32_t previous_id = 0;
    for (std::size_t p = 0; p < packed.size(); ++p) {
      const std::uint32_t id = packed.ids[p];
      REQUIRE(id >= begin);
      REQUIRE(id < end);
      ++seen[id - begin];
      const std::vector<Clause> clauses = w.ad_targeting(id);
      REQUIRE(packed.clause_begin[p + 1] - packed.clause_begin[p] == clauses.size());
      for (std::size_t c = 0; c < clauses.size(); ++c)
        CHECK(packed.clauses[packed.clause_begin[p] + c] == clause_bits::pack(clauses[c], c + 1 == clauses.size()));
      CHECK(packed.bias[p] == w.ad_bias(id));
      CHECK(packed.live[p] == (w.ad_live(id) ? 1 : 0));
      const std::uint64_t key = targeting_order_key(clauses);
      if (p > 0) {
        if (order == SlotOrder::by_id) CHECK(id == previous_id + 1);
        else CHECK((key > previous_key || (key == previous_key && id > previous_id)));
      }
      previous_key = key;
      previous_id = id;
    }
    for (int count : seen) REQUIRE(count == 1);
  }
}
