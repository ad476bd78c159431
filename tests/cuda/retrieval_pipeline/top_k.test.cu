// Top-K: the sort's sizing, and ties broken by lower id through every radix-select level.
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
    REQUIRE(top);
    REQUIRE(top->size() == static_cast<std::size_t>(k));
    for (int i = 0; i < k; ++i) {
      REQUIRE((*top)[static_cast<std::size_t>(i)].id == 1000000u - 7u * 29999u + 7u * static_cast<std::uint32_t>(i));
      REQUIRE((*top)[static_cast<std::size_t>(i)].score == (*top)[0].score);
    }
  }
}
