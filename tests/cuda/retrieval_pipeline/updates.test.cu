// Updates: clause runs reclaimed, PackedAds batches that would mislead refused whole, int8 ads
// handed in quantized kept as given, and updates during search never torn and seen once applied.
// (One of the files of test_cuda_retrieval_pipeline; its main is main.cu.)
#include <atomic>
#include <map>
#include <bit>
#include <thread>

#include "../../support/quantized_ads.hpp"
#include "../support/pipeline_fixtures.cuh"

using namespace kevo::retrieval;
using namespace kevo_tests::retrieval_pipeline;

TEST_CASE("replaced and expired ads' clause runs are reclaimed", "[cuda][updates]") {
  const Workload w(small_options(13, EmbeddingType::fp16));
  HostAdPool host(w.schema());
  constexpr std::uint32_t ads = 3000;
  constexpr std::size_t clause_capacity = 4096 * 8;
  auto p = FusedRetrievalPipeline::create(w.schema(), w.model(), {.capacity = 4096, .clause_capacity = clause_capacity});
  REQUIRE(p);
  DeviceAdIndex& index = (*p)->index();
  std::size_t written = 0;  // packed clauses every batch appended, padded as the arena stores them
  for (int round = 0; round < 10; ++round) {
    std::vector<AdRecord> batch;
    for (std::uint32_t i = 0; i < ads; ++i) {
      AdRecord ad = w.ad(static_cast<std::uint64_t>(round) * 100000 + i);  // new targeting each round
      ad.id = i;
      ad.live = ad.live && !(round % 3 == 2 && i % 3 == 0);  // now and then a third of them expire
      written += (ad.clauses.size() + 3) / 4 * 4;
      batch.push_back(ad);
      if (ad.live) REQUIRE(host.upsert(ad));
      else host.expire(ad.id);
    }
    auto ok = index.upsert(batch);
    INFO("round " << round << ": " << (ok ? "" : ok.error().message));
    REQUIRE(ok);
    REQUIRE(index.clause_arena_used() <= clause_capacity);
    REQUIRE(index.live_count() == host.live_count());
  }
  REQUIRE(written > 2 * clause_capacity);  // without reclaiming, the arena would have overflowed
  REQUIRE(index.clause_arena_capacity() == clause_capacity);  // packed, not grown: the live runs fit
  for (RequestKind kind : {RequestKind::typical, RequestKind::broad, RequestKind::narrow}) {
    const Request request = w.request(static_cast<std::uint64_t>(kind) + 40, kind, 500);
    auto top = (*p)->search(request);
    REQUIRE(top);
    auto ok = compare_with_reference(host, compute_request_vectors(w.model(), request.features), request, *top);
    INFO((ok ? "" : ok.error().message));
    REQUIRE(ok);
  }
  // An arena too small for the live runs grows (a pool created without thinking of clauses works),
  // and answers stay right across the growth.
  std::vector<AdRecord> many;
  for (std::uint32_t i = 0; many.size() < 400; ++i)
    if (AdRecord ad = w.ad(i); !ad.clauses.empty()) many.push_back(ad);
  auto grown = FusedRetrievalPipeline::create(w.schema(), w.model(), {.capacity = 4096, .clause_capacity = 64});
  REQUIRE(grown);
  HostAdPool grown_host(w.schema());
  for (std::size_t first = 0; first < many.size(); first += 40) {  // ten batches, several growths
    const std::span<const AdRecord> batch(many.data() + first, 40);
    REQUIRE((*grown)->index().upsert(batch));
    for (const AdRecord& ad : batch) REQUIRE(grown_host.upsert(ad));
  }
  const std::size_t grown_capacity = (*grown)->index().clause_arena_capacity();
  CHECK(grown_capacity > 64);
  CHECK((*grown)->index().clause_arena_used() <= grown_capacity);
  for (RequestKind kind : {RequestKind::typical, RequestKind::broad}) {
    const Request request = w.request(static_cast<std::uint64_t>(kind) + 50, kind, 100);
    auto top = (*grown)->search(request);
    REQUIRE(top);
    auto ok = compare_with_reference(grown_host, compute_request_vectors(w.model(), request.features), request, *top);
    INFO((ok ? "" : ok.error().message));
    REQUIRE(ok);
  }
  // Live clauses past the arena's limit: a clear error, and the index is unchanged.
  auto small = FusedRetrievalPipeline::create(w.schema(), w.model(),
                                              {.capacity = 4096, .clause_capacity = 64, .max_clause_capacity = 64});
  REQUIRE(small);
  auto full = (*small)->index().upsert(std::span<const AdRecord>(many.data(), 40));
  REQUIRE(!full);
  CHECK_THAT(full.error().message, Catch::Contains("clause arena is full"));
  CHECK_THAT(full.error().message, Catch::Contains("max_clause_capacity"));
  REQUIRE((*small)->index().live_count() == 0);
}

TEST_CASE("a PackedAds batch that would mislead matching or scoring is refused whole", "[cuda][updates]") {
  Loaded pool(small_options(6, EmbeddingType::fp16), 100);
  std::vector<AdRecord> three{pool.workload.ad(1000), pool.workload.ad(1001), pool.workload.ad(1002)};
  three[0].clauses = {{0, 0, false}, {1, 0, true}};
  three[1].clauses = {{2, 0, false}};
  auto packed = [&] { return PackedAds::from(three, pool.workload.schema(), 1); };
  REQUIRE(packed().clauses.size() >= 2);
  auto refused = [&](PackedAds ads, const char* why) {
    auto ok = pool.pipeline->index().upsert(ads);
    REQUIRE(!ok);
    CHECK_THAT(ok.error().message, Catch::Contains(why));
  };
  PackedAds unflagged = packed();
  unflagged.clauses[1] &= ~clause_bits::last;  // ad 0's run would run on into ad 1's
  refused(unflagged, "flag their last one");
  PackedAds early = packed();
  early.clauses[0] |= clause_bits::last;
  refused(early, "flag their last one");
  PackedAds backwards = packed();
  std::swap(backwards.clause_begin[1], backwards.clause_begin[2]);
  refused(backwards, "clause_begin");
  PackedAds short_end = packed();
  short_end.clause_begin.back() -= 1;
  refused(short_end, "clause_begin must run from 0");
  PackedAds nan_bias = packed();
  nan_bias.bias[2] = std::nanf("");
  refused(nan_bias, "bias must be finite");
  PackedAds wide = packed();
  wide.embeddings[5] = 1e5f;
  refused(wide, "beyond fp16's range");
  CHECK(pool.pipeline->index().live_count() == pool.host.live_count());  // nothing of them went in
  REQUIRE(pool.pipeline->index().upsert(packed()));
}

TEST_CASE("int8 ads handed in quantized are stored as given, through either upsert", "[cuda][updates][int8]") {
  const EmbeddingType type = GENERATE(EmbeddingType::int8, EmbeddingType::int8_group32);
  INFO(to_string(type));
  Loaded pool(small_options(17, type), 3000);
  const Workload& w = pool.workload;
  // Replacements (even i) and new ads: a third as AdRecords all quantized, a third with every
  // other ad given as values instead (that batch is packed quantized), a third as a PackedAds.
  std::vector<AdRecord> quantized, mixed;
  PackedAds packed;
  std::map<std::uint32_t, std::vector<std::int8_t>> packed_rows;  // id -> the q it was given
  for (std::uint32_t i = 0; i < 1500; ++i) {
    AdRecord ad = kevo_tests::handed_in_quantized(type, w.ad(10000 + i));
    ad.id = i % 2 == 0 ? i : 5000 + i;
    if (i % 3 == 1 && i % 4 == 1) {
      const std::uint32_t id = ad.id;
      ad = w.ad(10000 + i);
      ad.id = id;
    }
    ad.live = true;  // each id then holds exactly one slot
    REQUIRE(pool.host.upsert(ad));
    if (i % 3 == 0) quantized.push_back(ad);
    if (i % 3 == 1) mixed.push_back(ad);
    if (i % 3 == 2) packed.push_back(ad), packed_rows[ad.id] = ad.quantized.values;
  }
  DeviceAdIndex& index = pool.pipeline->index();
  REQUIRE(index.upsert(quantized));
  REQUIRE(index.upsert(mixed));
  REQUIRE(index.upsert(packed));
  REQUIRE(index.live_count() == pool.host.live_count());
  for (RequestKind kind : {RequestKind::typical, RequestKind::broad, RequestKind::narrow}) {
    const Request request = w.request(static_cast<std::uint64_t>(kind) + 60, kind, 1000);
    auto top = pool.pipeline->search(request);
    REQUIRE(top);
    auto ok = compare_with_reference(pool.host, compute_request_vectors(w.model(), request.features), request, *top);
    INFO((ok ? "" : ok.error().message));
    REQUIRE(ok);
  }
  // The PackedAds' rows on the device are the q they were given (an index that quantised them
  // again would hold values up to 127 where these stop at 90).
  cudaStream_t stream;
  KEVO_GPU_ASSERT(cudaStreamCreate(&stream));
  std::vector<std::uint32_t> ids;
  std::vector<std::int8_t> rows;
  {
    auto lock = index.search_lock();
    auto view = index.before_search(stream);
    REQUIRE(view);
    KEVO_GPU_ASSERT(cudaStreamSynchronize(stream));
    ids = download<std::uint32_t>(view->ids, view->slots);
    rows = download<std::int8_t>(index.embeddings(), view->slots * index.row_bytes());
    REQUIRE(index.after_search(stream));
  }
  KEVO_GPU_ASSERT(cudaStreamSynchronize(stream));
  KEVO_GPU_ASSERT(cudaStreamDestroy(stream));
  const std::size_t slots = ids.size();
  std::size_t compared = 0;
  for (std::size_t slot = 0; slot < slots; ++slot) {
    const auto it = packed_rows.find(ids[slot]);
    if (it == packed_rows.end()) continue;
    for (std::size_t k = 0; k < 128; ++k) REQUIRE(rows[slot * index.row_bytes() + k] == it->second[k]);
    ++compared;
  }
  CHECK(compared == packed_rows.size());
  // A PackedAds that mixes the two forms, or holds -128, is refused whole.
  PackedAds both = packed;
  both.embeddings.assign(both.size() * 128, 0.5f);
  auto refused = pool.pipeline->index().upsert(both);
  REQUIRE(!refused);
  CHECK_THAT(refused.error().message, Catch::Contains("not both"));
  PackedAds minus_128 = packed;
  minus_128.quantized_values[7] = -128;
  refused = pool.pipeline->index().upsert(minus_128);
  REQUIRE(!refused);
  CHECK_THAT(refused.error().message, Catch::Contains("not -128"));
}

TEST_CASE("updates during search are never torn and are seen once applied", "[cuda][updates]") {
  const EmbeddingType type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8, EmbeddingType::int8_group32);
  Loaded pool(small_options(11, type), 20000);
  constexpr int hot = 300, versions = 40;
  const Workload& w = pool.workload;
  const Request request = w.request(2, RequestKind::typical, hot);
  // Versions v % 5 == 2 restrict the hot ads to a value the request lacks (targeting changes), and
  // versions v % 5 == 4 pause them and then expire them (the next version inserts them again): the
  // request then sees none of them. The rest are ANY-targeted and live with bias 20 + v, so that
  // all of them are in its top-K.
  auto hidden = [](int v) { return v % 5 == 2 || v % 5 == 4; };
  const std::uint32_t restricted_category = static_cast<std::uint32_t>(w.schema().categories() - 1);
  std::uint32_t unqueried_value = 0;
  for (const CategoryQuery& q : request.query)
    if (q.category == restricted_category)
      while (std::find(q.values.begin(), q.values.end(), unqueried_value) != q.values.end()) ++unqueried_value;
  REQUIRE(unqueried_value < w.schema().category_values[restricted_category]);
  auto hot_ad = [&](int j, int v) {
    AdRecord ad = w.ad(static_cast<std::uint64_t>(100000 + j * versions + v));
    ad.id = 5000000u + static_cast<std::uint32_t>(j);
    ad.bias = 20.0f + static_cast<float>(v);
    ad.clauses.clear();
    if (v % 5 == 2) ad.clauses.push_back({restricted_category, unqueried_value, false});
    ad.live = v % 5 != 4;
    return ad;
  };
  const RequestVectors vectors = compute_request_vectors(w.model(), request.features);
  std::vector<std::vector<ReferenceScore>> expected(hot, std::vector<ReferenceScore>(versions));
  for (int v = 0; v < versions; ++v) {
    if (hidden(v)) continue;  // (never served: no score to expect)
    HostAdPool version_pool(w.schema());
    for (int j = 0; j < hot; ++j) REQUIRE(version_pool.upsert(hot_ad(j, v)));
    for (int j = 0; j < hot; ++j) expected[j][v] = reference_score(version_pool, static_cast<std::size_t>(j), vectors, 2);
  }
  std::vector<std::uint32_t> hot_ids;
  for (int j = 0; j < hot; ++j) hot_ids.push_back(5000000u + static_cast<std::uint32_t>(j));
  std::atomic<int> committed{-1};
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int v = 0; v < versions; ++v) {
      std::vector<AdRecord> batch;
      for (int j = 0; j < hot; ++j) batch.push_back(hot_ad(j, v));
      if (!pool.pipeline->index().upsert(batch)) break;
      if (v % 5 == 4 && !pool.pipeline->index().expire(hot_ids)) break;  // (the upsert first: v's row, then gone)
      if (v % 8 == 7 && !pool.pipeline->index().reindex()) break;  // a reindex is an update too
      committed = v;
    }
    stop = true;
  });
  // Each search sees every hot ad at one version (an update is ordered whole against a search), no
  // older than the last committed before it began, and no newer than the one after the last
  // committed when it returned: all 300 at a visible version, or none where that version hides them.
  int searches = 0, overlapped = 0, torn = 0, stale = 0, early = 0, mixed = 0, partial = 0, wrongly_hidden = 0;
  while (!stop || searches < 5) {
    const bool writer_active = !stop;
    const int before = committed.load();
    auto top = pool.pipeline->search(request);
    const int after = committed.load();
    REQUIRE(top);
    ++searches;
    if (before < 0) continue;
    overlapped += writer_active && before < versions - 1;
    std::uint64_t common = (1ull << versions) - 1;  // the versions every hot result so far could be
    int hot_results = 0;
    for (const ScoredAd& r : *top) {
      if (r.id < 5000000u || r.id >= 5000000u + hot) continue;
      ++hot_results;
      const int j = static_cast<int>(r.id - 5000000u);
      std::uint64_t could_be = 0;
      for (int v = 0; v < versions; ++v) {
        const ReferenceScore& e = expected[j][v];  // (a near-tie in routing may be scored either way)
        if (!hidden(v) && (std::fabs(r.score - e.score) <= score_tolerance(e.score) ||
                           (e.ambiguous && std::fabs(r.score - e.alternative) <= score_tolerance(e.alternative))))
          could_be |= 1ull << v;
      }
      if (could_be == 0) ++torn;  // no visible version scores this: fields of two versions, or a hidden one served
      else if (std::bit_width(could_be) - 1 < before) ++stale;
      else if (std::countr_zero(could_be) > after + 1) ++early;
      common &= could_be;
    }
    if (hot_results != 0 && hot_results != hot) ++partial;
    if (hot_results == hot && common == 0) ++mixed;
    if (hot_results == 0) {  // then the version seen was a hidden one in [before, after + 1]
      bool possible = false;
      for (int v = before; v <= std::min(after + 1, versions - 1); ++v) possible = possible || hidden(v);
      wrongly_hidden += !possible;
    }
  }
  writer.join();
  INFO("searches " << searches << ", overlapping the writer " << overlapped);
  REQUIRE(committed.load() == versions - 1);
  CHECK(overlapped >= 5);  // the checks below saw searches race the updates
  CHECK(torn == 0);
  CHECK(stale == 0);
  CHECK(early == 0);
  CHECK(mixed == 0);
  CHECK(partial == 0);
  CHECK(wrongly_hidden == 0);
}

TEST_CASE("regroup puts the live ads in targeting order, drops free slots, and changes no answer", "[cuda][updates][regroup]") {
  const EmbeddingType type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8, EmbeddingType::int8_group32);
  const Workload w(small_options(17, type));
  HostAdPool host(w.schema());
  auto p = FusedRetrievalPipeline::create(w.schema(), w.model(), {.capacity = 8192});
  REQUIRE(p);
  DeviceAdIndex& index = (*p)->index();
  auto empty = index.regroup();  // nothing to move
  REQUIRE(empty);
  CHECK(empty->ads == 0);
  CHECK(empty->dropped_slots == 0);

  auto apply = [&](std::vector<AdRecord> batch) {
    for (const AdRecord& ad : batch)
      if (ad.live) REQUIRE(host.upsert(ad));
      else host.expire(ad.id);
    auto ok = index.upsert(batch);
    INFO((ok ? "" : ok.error().message));
    REQUIRE(ok);
  };
  // A load in id order, then churn: a third replaced with new targeting (in place), new ads that
  // take the slots replacements freed (a replacement may expire) and the high-water ones, and then
  // every 7th ad expired (its slot left free).
  std::vector<AdRecord> load;
  for (std::uint32_t i = 0; i < 6000; ++i) load.push_back(w.ad(i));
  apply(load);
  REQUIRE(index.reindex());
  std::vector<AdRecord> replaced;
  for (std::uint32_t i = 1; i < 6000; i += 3) {
    AdRecord ad = w.ad(100000 + i);
    ad.id = i;
    replaced.push_back(ad);
  }
  apply(replaced);
  std::vector<AdRecord> fresh;
  for (std::uint32_t i = 0; i < 1200; ++i) fresh.push_back(w.ad(200000 + i));
  apply(fresh);
  std::vector<AdRecord> expired;
  for (const std::vector<AdRecord>* batch : {&load, &fresh})
    for (std::size_t i = 0; i < batch->size(); i += 7) {
      AdRecord gone = (*batch)[i];
      gone.live = false;
      expired.push_back(gone);
    }
  apply(expired);
  REQUIRE(index.live_count() == host.live_count());

  std::vector<Request> requests;
  for (RequestKind kind : {RequestKind::typical, RequestKind::broad, RequestKind::narrow})
    requests.push_back(w.request(static_cast<std::uint64_t>(kind) + 60, kind, 400));
  auto answers = [&](const char* when) {
    std::vector<std::vector<ScoredAd>> all;
    for (const Request& request : requests) {
      auto top = (*p)->search(request);
      REQUIRE(top);
      auto ok = compare_with_reference(host, compute_request_vectors(w.model(), request.features), request, *top);
      INFO(when << ": " << (ok ? "" : ok.error().message));
      REQUIRE(ok);
      all.push_back(*top);
    }
    return all;
  };
  const auto before = answers("before the regroup");

  const std::size_t slots_before = index.slot_count(), live = index.live_count();
  REQUIRE(slots_before > live);  // expired ads left slots behind
  auto regrouped = index.regroup();
  INFO((regrouped ? "" : regrouped.error().message));
  REQUIRE(regrouped);
  CHECK(regrouped->ads == live);
  CHECK(regrouped->dropped_slots == slots_before - live);
  CHECK(index.slot_count() == live);
  CHECK(index.live_count() == live);
  CHECK(index.unindexed_count() == too_long_to_index(host));  // the postings were rebuilt for the new slots

  // Slot j holds a live ad, each once, in targeting order.
  REQUIRE(index.synchronize());
  const std::vector<std::uint32_t> ids = download<std::uint32_t>(index.slot_ids(), live);
  auto key_of = [&](std::uint32_t id) {
    const std::optional<std::size_t> slot = host.slot_of(id);
    REQUIRE(slot);
    std::vector<Clause> clauses;
    for (std::uint32_t c : host.clauses(*slot))
      clauses.push_back({clause_bits::category(c), clause_bits::value(c), (c & clause_bits::exclude) != 0});
    return targeting_order_key(clauses);
  };
  std::vector<std::uint32_t> seen = ids;
  std::sort(seen.begin(), seen.end());
  CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
  std::size_t out_of_order = 0;
  for (std::size_t j = 1; j < ids.size(); ++j) out_of_order += key_of(ids[j - 1]) > key_of(ids[j]);
  CHECK(out_of_order == 0);
  CHECK(key_of(ids.front()) < key_of(ids.back()));  // a real spread of keys, not one

  const auto after = answers("after the regroup");
  CHECK(after == before);  // ties go to the lower id, not the lower slot: the same answers, bit for bit

  // Updates go on against the new slots: replacements find their ads, expiries free them, new ads
  // fill the slots past the live ones, and a second regroup keeps every answer right.
  std::vector<AdRecord> later;
  for (std::uint32_t i = 0; i < 6000; i += 5) {
    AdRecord ad = w.ad(300000 + i);
    ad.id = i;
    ad.live = ad.live && i % 2 == 0;
    later.push_back(ad);
  }
  for (std::uint32_t i = 0; i < 800; ++i) later.push_back(w.ad(400000 + i));
  apply(later);
  REQUIRE(index.live_count() == host.live_count());
  answers("updates after the regroup");
  REQUIRE(index.regroup());
  CHECK(index.slot_count() == host.live_count());
  answers("a second regroup");
}
