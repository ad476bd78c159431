// Matching against the reference: the eligible lists and the request's towers for every way an
// ad reaches matching (walked, indexed, prefiltered), every clause shape, stale postings, and
// values repeated in a query.
// (One of the files of test_cuda_retrieval_pipeline; its main is main.cu.)
#include "../support/pipeline_fixtures.cuh"

using namespace kevo::retrieval;
using namespace kevo_tests::retrieval_pipeline;

TEST_CASE("matching and towers agree with the reference", "[cuda][matching]") {
  const int n = GENERATE(1000, 70001, 300000);
  const std::uint64_t seed = GENERATE(1, 2);
  const Indexing indexing = GENERATE(Indexing::automatic, Indexing::never, Indexing::after_load);
  Loaded pool(small_options(seed, EmbeddingType::fp16), n, std::nullopt, indexing);
  for (RequestKind kind : {RequestKind::typical, RequestKind::broad, RequestKind::narrow}) {
    const Request request = pool.workload.request(seed, kind);
    Stages s(*pool.pipeline);
    auto lock = pool.pipeline->index().search_lock();
    auto view = pool.pipeline->index().before_search(s.stream);
    REQUIRE(view);
    REQUIRE(pool.pipeline->enqueue_prepare(check_request(pool.pipeline->schema(), pool.pipeline->model(), request).value(), s.temp, s.stream));
    REQUIRE(pool.pipeline->enqueue_matching(*view, s.temp, s.stream));
    KEVO_GPU_ASSERT(cudaStreamSynchronize(s.stream));
    const TopKState state = s.state();
    const auto list = download<std::uint32_t>(s.at(s.layout.eligible), state.eligible_count);
    const QuerySets q(pool.host.schema().categories(), request.query);
    std::vector<std::uint32_t> expected;
    for (std::size_t slot = 0; slot < pool.host.slots(); ++slot)
      if (is_eligible(pool.host, slot, q)) expected.push_back(static_cast<std::uint32_t>(slot));
    std::vector<std::uint32_t> got(list.begin(), list.end());
    std::sort(got.begin(), got.end());
    INFO("n " << n << " seed " << seed << " indexing " << int(indexing) << " kind " << int(kind) << " eligible "
              << expected.size());
    REQUIRE(got == expected);  // every written entry a distinct eligible slot, none missing
    REQUIRE(!expected.empty());
    if (kind == RequestKind::typical) {
      // Every build and grid of matching the search may sweep lists the same ads ("a policy never
      // changes results"); the default above, the rest here.
      lock.unlock();
      const PipelinePolicy original = pool.pipeline->policy();
      for (int threads : MatchingPolicy::block_threads_domain)
        for (int blocks : MatchingPolicy::blocks_per_sm_domain)
          for (int after_prior : MatchingPolicy::launch_after_prior_domain) {
            PipelinePolicy policy = original;
            policy.matching = {.block_threads = threads, .blocks_per_sm = blocks, .launch_after_prior = after_prior};
            REQUIRE(pool.pipeline->set_policy(policy));
            const std::vector<std::uint32_t> ids = device_eligible_ids(*pool.pipeline, request);
            std::vector<std::uint32_t> expected_ids;
            for (std::uint32_t slot : expected) expected_ids.push_back(pool.host.id(slot));
            std::sort(expected_ids.begin(), expected_ids.end());
            INFO(to_string(policy.matching));
            REQUIRE(ids == expected_ids);
          }
      REQUIRE(pool.pipeline->set_policy(original));
      lock.lock();
    }

    // Towers: each fp16 value within one fp16 rounding step of the reference's (the two sum in
    // different orders in fp32, which may round a value to the neighbouring half; the 1e-6 covers
    // that order's own fp32 error where a sum cancels to almost nothing).
    const RequestVectors ref = compute_request_vectors(pool.workload.model(), request.features);
    const RequestVectors dev = device_vectors(s, pool.workload.model());
    auto within_one_step = [](float device, float reference) {
      return std::fabs(device - reference) <= fp16_step(reference) + 1e-6f;
    };
    for (std::size_t i = 0; i < ref.expert.size(); ++i) {
      INFO("value " << i << ": expert " << dev.expert[i] << " / " << ref.expert[i] << ", gate " << dev.gate[i] << " / "
                    << ref.gate[i]);
      REQUIRE(within_one_step(dev.expert[i], ref.expert[i]));
      REQUIRE(within_one_step(dev.gate[i], ref.gate[i]));
    }
  }
}

TEST_CASE("matching's postings take every clause shape, and stale postings never leak", "[cuda][matching]") {
  Workload w(small_options(21, EmbeddingType::fp16));
  const Request request = w.request(5, RequestKind::typical);
  // A value the user holds, and one they do not, in category c.
  auto held = [&](std::uint32_t c) {
    for (const CategoryQuery& q : request.query)
      if (q.category == c && !q.values.empty()) return q.values[0];
    return ~0u;
  };
  auto not_held = [&](std::uint32_t c, std::uint32_t skip = 0) {  // the skip-th value the user lacks
    for (std::uint32_t v = 0; v < w.schema().category_values[c]; ++v) {
      bool in = false;
      for (const CategoryQuery& q : request.query)
        if (q.category == c) in = in || std::find(q.values.begin(), q.values.end(), v) != q.values.end();
      if (!in && skip-- == 0) return v;
    }
    return ~0u;
  };
  std::vector<std::uint32_t> categories;  // categories where the user holds a value and lacks two
  for (std::uint32_t c = 0; c < static_cast<std::uint32_t>(w.schema().categories()); ++c)
    if (held(c) != ~0u && not_held(c, 1) != ~0u) categories.push_back(c);
  REQUIRE(categories.size() >= 10);
  // Each shape twice: once satisfied by the request (flip = false), once not.
  auto special = [&](int shape, bool flip, std::uint32_t id) {
    AdRecord ad = w.ad(id);
    ad.id = id;
    ad.live = true;
    ad.clauses.clear();
    const std::uint32_t c0 = categories[0];
    switch (shape) {
      case 0:  // 9 restricted categories: prefiltered by the first 7, the ninth unmet (found by the walk)
        for (int k = 0; k < 9; ++k) ad.clauses.push_back({categories[k], flip && k == 8 ? not_held(categories[k]) : held(categories[k])});
        break;
      case 6:  // 8 restricted categories, the third unmet (the prefilter stops it), and an exclusion
        for (int k = 0; k < 8; ++k) ad.clauses.push_back({categories[k], flip && k == 2 ? not_held(categories[k]) : held(categories[k])});
        ad.clauses.push_back({categories[9], not_held(categories[9]), true});
        break;
      case 7:  // 8 restricted categories, all met, but an excluded value held (the prefilter stops it)
        for (int k = 0; k < 8; ++k) ad.clauses.push_back({categories[k], held(categories[k])});
        ad.clauses.push_back({categories[9], flip ? held(categories[9]) : not_held(categories[9]), true});
        break;
      case 1:  // exactly 7 restricted categories: the most that are indexed
        for (int k = 0; k < 7; ++k) ad.clauses.push_back({categories[k], flip && k == 3 ? not_held(categories[k]) : held(categories[k])});
        break;
      case 2:  // 70 clauses in one category: too long to index
        for (std::uint32_t v = 0; v < 70; ++v) ad.clauses.push_back({c0, not_held(c0, v % 2)});
        if (!flip) ad.clauses.push_back({c0, held(c0)});
        break;
      case 3:  // the same value allowed and excluded: excluded wins
        ad.clauses.push_back({c0, held(c0)});
        ad.clauses.push_back({c0, flip ? held(c0) : not_held(c0), true});
        break;
      case 4:  // exclusions only
        ad.clauses.push_back({categories[1], flip ? held(categories[1]) : not_held(categories[1]), true});
        ad.clauses.push_back({categories[2], not_held(categories[2]), true});
        break;
      case 5:  // one clause three times, and a second value of the same category
        for (int k = 0; k < 3; ++k) ad.clauses.push_back({c0, flip ? not_held(c0) : held(c0)});
        ad.clauses.push_back({c0, not_held(c0)});
        break;
      default:  // 8: ANY everywhere
        break;
    }
    return ad;
  };
  constexpr int kShapes = 9;
  // One segment per reindex slice as well as all in one: the slices' tables must join up.
  const std::uint32_t slice_segments = GENERATE(1u, 512u);
  auto p = FusedRetrievalPipeline::create(
      w.schema(), w.model(), {.capacity = 40000, .reindex_after = SIZE_MAX, .reindex_slice_segments = slice_segments});
  REQUIRE(p);
  DeviceAdIndex& index = (*p)->index();
  HostAdPool host(w.schema());
  auto apply = [&](const std::vector<AdRecord>& batch) {
    for (const AdRecord& ad : batch)
      if (ad.live) REQUIRE(host.upsert(ad));
      else host.expire(ad.id);
    REQUIRE(index.upsert(batch));
  };
  auto check = [&](const char* step) {
    const auto expected = reference_eligible_ids(host, request);
    INFO(step << " (slices of " << slice_segments << " segments): " << expected.size() << " eligible of "
              << host.live_count());
    REQUIRE(device_eligible_ids(**p, request) == expected);
  };
  std::vector<AdRecord> batch;
  for (std::uint32_t i = 0; i < 20000; ++i) batch.push_back(w.ad(i));
  for (int shape = 0; shape < kShapes; ++shape)
    for (int copy = 0; copy < 40; ++copy) batch.push_back(special(shape, copy % 2 == 1, 100000 + shape * 100 + copy));
  apply(batch);
  check("all walked");
  REQUIRE(index.reindex());
  REQUIRE(index.unindexed_count() == too_long_to_index(host));
  REQUIRE(too_long_to_index(host) >= 40);  // shape 2's 40 copies
  check("indexed");
  // Flip every special ad (its postings now name the wrong values), expire a tenth of the rest,
  // then reuse their slots for new ads: stale postings must not decide anything.
  batch.clear();
  for (int shape = 0; shape < kShapes; ++shape)
    for (int copy = 0; copy < 40; ++copy) batch.push_back(special(shape, copy % 2 == 0, 100000 + shape * 100 + copy));
  apply(batch);
  check("special ads replaced");
  std::vector<std::uint32_t> gone;
  for (std::uint32_t i = 0; i < 20000; i += 10) gone.push_back(i);
  std::size_t were_live = 0;
  for (std::uint32_t id : gone) were_live += host.expire(id) ? 1 : 0;
  auto expired = index.expire(gone);
  REQUIRE(expired);
  REQUIRE(*expired == were_live);
  check("a tenth expired");
  batch.clear();
  for (std::uint32_t i = 0; i < 2000; ++i) {
    AdRecord ad = w.ad(50000 + i);
    ad.id = 200000 + i;
    ad.live = true;
    batch.push_back(ad);
  }
  apply(batch);
  check("freed slots reused");
  REQUIRE(index.reindex());
  check("indexed again");
}

TEST_CASE("a value listed twice in a query is one value, however often it repeats", "[cuda][matching]") {
  // Few values in all (sum of V_c = 8): repeating one value more often than that must not crowd the
  // others out of the request's bit list.
  Workload w(small_options(31, EmbeddingType::fp16));
  Schema schema = w.schema();
  schema.category_values = {2, 2, 2, 2};
  Model model = w.model();
  auto created = FusedRetrievalPipeline::create(schema, model, {.capacity = 1024});
  REQUIRE(created);
  FusedRetrievalPipeline& p = **created;
  HostAdPool host(schema);
  std::vector<AdRecord> ads;
  for (std::uint32_t i = 0; i < 40; ++i) {
    AdRecord ad = w.ad(i);
    ad.clauses = {{i % 4, (i / 4) % 2, false}};  // each ad needs one (category, value)
    ad.live = true;
    ads.push_back(ad);
    REQUIRE(host.upsert(ad));
  }
  REQUIRE(p.index().upsert(ads));
  Request request = w.request(3);
  request.k = 40;
  request.query = {{0, {0, 0, 0, 0, 0, 0, 0, 0, 0}}, {1, {1, 1}}, {3, {0, 1, 0}}};
  auto top = p.search(request);
  REQUIRE(top);
  auto ok = compare_with_reference(host, compute_request_vectors(model, request.features), request, *top);
  INFO((ok ? "" : ok.error().message));
  REQUIRE(ok);
  CHECK(top->size() == 20);  // category 0 value 0, category 1 value 1, category 3 both values: 5 + 5 + 10 ads
}

TEST_CASE("matching takes every segment once when segments outnumber blocks, by queue and by fixed shares", "[cuda][matching]") {
  // More segments than a grid of 2 blocks an SM holds, so that blocks go on to further segments,
  // which smaller pools never reach. In slot order as loaded, and after regroup() grouped the pool
  // by targeting, where a request's work sits in few segments.
  int multiprocessors = 0;
  KEVO_GPU_ASSERT(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, 0));
  const int blocks_per_sm = 2, segments = blocks_per_sm * multiprocessors + 20;
  Loaded pool(small_options(3, EmbeddingType::fp16, 64), segments * static_cast<int>(kSegmentSlots), std::nullopt,
              Indexing::after_load);
  const std::vector<Request> requests{pool.workload.request(3, RequestKind::typical), pool.workload.request(4, RequestKind::broad)};
  std::vector<std::vector<std::uint32_t>> expected;
  for (const Request& r : requests) expected.push_back(reference_eligible_ids(pool.host, r));
  for (const bool regrouped : {false, true}) {
    if (regrouped) REQUIRE(pool.pipeline->index().regroup());
    for (int queue : MatchingPolicy::segment_queue_domain) {
      PipelinePolicy policy = pool.pipeline->policy();
      policy.matching = {.block_threads = 128, .blocks_per_sm = blocks_per_sm, .segment_queue = queue};
      REQUIRE(pool.pipeline->set_policy(policy));
      INFO((regrouped ? "regrouped, " : "as loaded, ") << to_string(policy.matching) << ", " << segments << " segments");
      for (std::size_t r = 0; r < requests.size(); ++r) REQUIRE(device_eligible_ids(*pool.pipeline, requests[r]) == expected[r]);
      // A batch matches through request 0's queue.
      auto answers = pool.pipeline->search_batch(requests);
      REQUIRE(answers);
      for (std::size_t r = 0; r < requests.size(); ++r) {
        auto ok = compare_with_reference(pool.host, compute_request_vectors(pool.workload.model(), requests[r].features),
                                         requests[r], (*answers)[r]);
        INFO("request " << r << " of the batch: " << (ok ? "ok" : ok.error().message));
        REQUIRE(ok);
      }
    }
  }
}
