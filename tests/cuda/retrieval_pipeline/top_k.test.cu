// Top-K: the sort's sizing, every build of top-K against the reference, and ties broken by lower id
// through every radix-select level.
// (One of the files of test_cuda_retrieval_pipeline; its main is main.cu.)
#include "../support/pipeline_fixtures.cuh"

using namespace kevo::retrieval;
using namespace kevo_tests::retrieval_pipeline;

// The keys a thread of the sort holds, which the kernel and the host's shared-memory sizing both take from here.
static_assert(kernels::topk_sort_items(0) == 1 && kernels::topk_sort_items(1) == 1 && kernels::topk_sort_items(1024) == 1);
static_assert(kernels::topk_sort_items(1025) == 2 && kernels::topk_sort_items(1000 + 2048) == 4);
static_assert(kernels::topk_sort_items(4096 + 2048) == 8 && kernels::topk_sort_items(4096 + 8192) == 16 &&
              kernels::topk_sort_items(16384) == 16 && kernels::topk_sort_items(16385) == 0);

TEST_CASE("ties are broken by lower id, through every radix-select level", "[cuda][topk]") {
  // 30000 ads with one embedding and bias: every score ties, so the K-th key is resolved in the id bits;
  // with each boundary cap, so that the sort takes from a little over K up to K + cap candidates.
  Workload w(small_options(3, EmbeddingType::fp16));
  PipelinePolicy policy;
  policy.topk.boundary_cap = GENERATE(2048, 4096, 8192);
  policy.topk.sort = GENERATE(0, 1);
  policy.topk.one_launch = GENERATE(0, 1);
  auto p = FusedRetrievalPipeline::create(w.schema(), w.model(), {.capacity = 40000, .policy = policy});
  REQUIRE(p);
  AdRecord same = w.ad(0);
  same.clauses.clear();
  same.live = true;
  std::vector<AdRecord> ads;
  for (std::uint32_t i = 0; i < 30000; ++i) {
    same.id = 1000000u - 7u * i;  // ids not in slot order
    ads.push_back(same);
  }
  REQUIRE((*p)->index().upsert(ads));
  for (int k : {1, 777, 4096}) {
    auto top = (*p)->search(w.request(1, RequestKind::typical, k));
    INFO(to_string(policy.topk) << " k " << k);
    REQUIRE(top);
    REQUIRE(top->size() == static_cast<std::size_t>(k));
    for (int i = 0; i < k; ++i) {
      REQUIRE((*top)[static_cast<std::size_t>(i)].id == 1000000u - 7u * 29999u + 7u * static_cast<std::uint32_t>(i));
      REQUIRE((*top)[static_cast<std::size_t>(i)].score == (*top)[0].score);
    }
  }
}

TEST_CASE("every build of top-K agrees with the reference, alone and in a batch", "[cuda][topk]") {
  // Both sorts and both ways of launching the select, at every cap: searches one by one and a
  // batch, whose keys mark the ads a request does not match with 0, over a pool of 2 levels' work;
  // and each with the request's kernels and matching launched ordinarily and after prior.
  const EmbeddingType type = GENERATE(EmbeddingType::fp16, EmbeddingType::int8);
  Loaded pool(small_options(11, type), 250000);
  FusedRetrievalPipeline& p = *pool.pipeline;
  std::vector<Request> requests;
  const RequestKind kinds[] = {RequestKind::typical, RequestKind::broad, RequestKind::narrow};
  const int ks[] = {1, 100, 1000, 4096};
  for (int i = 0; i < 12; ++i)
    requests.push_back(pool.workload.request(static_cast<std::uint64_t>(900 + i), kinds[i % 3], ks[i % 4], 1 + (i * 5) % 8));
  for (int after_prior : MatchingPolicy::launch_after_prior_domain) {
    for (const TopKPolicy& topk : every_policy<TopKPolicy>()) {
      PipelinePolicy policy = p.policy();
      policy.topk = topk;
      policy.matching.launch_after_prior = after_prior;
      policy.batch_scoring.one_pass_from = 2;  // the batch takes the one-pass path
      REQUIRE(p.set_policy(policy));
      auto agrees = [&](const Request& request, const std::vector<ScoredAd>& top, std::string_view how) {
        auto ok = compare_with_reference(pool.host, compute_request_vectors(pool.workload.model(), request.features), request, top);
        INFO(to_string(type) << " " << to_string(policy.matching) << " " << to_string(topk) << " " << how << " k "
                             << request.k << ": " << (ok ? "ok" : ok.error().message));
        REQUIRE(ok);
      };
      for (const Request& request : requests) {
        auto top = p.search(request);
        REQUIRE(top);
        agrees(request, *top, "search");
      }
      auto answers = p.search_batch(requests);
      REQUIRE(answers);
      REQUIRE(answers->size() == requests.size());
      for (std::size_t r = 0; r < requests.size(); ++r) agrees(requests[r], (*answers)[r], "search_batch");
    }
  }
}
