// kevo/retrieval/dispatch/fused_retrieval_pipeline.cuh: the retrieval pipeline with synchronous
// searches: a RetrievalDispatch (retrieval_dispatch.cuh) that also owns a stream, temp storage and
// pinned answers, so that search() and search_batch() take a request and return its top-K.
//
//   auto pipeline = FusedRetrievalPipeline::create(schema, model, {.capacity = n});
//   (*pipeline)->index().upsert(ads);
//   auto top = (*pipeline)->search(request);              // synchronous convenience
//   (*pipeline)->search_async(request, d_temp, bytes, out, stream);  // the serving path, as the dispatch's
#pragma once

#include <algorithm>
#include <bit>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "kevo/retrieval/dispatch/retrieval_dispatch.cuh"
#include "kevo/retrieval/fair_mutex.hpp"
#include "kevo/retrieval/safetensors.hpp"

namespace kevo::retrieval {

class FusedRetrievalPipeline final : public RetrievalDispatch {
 public:
  static expected<std::unique_ptr<FusedRetrievalPipeline>, Error> create(const Schema& schema, Model model,
                                                                         Options options) {
    auto index = make_index(schema, model, options);
    if (!index) return unexpected(index.error());
    std::unique_ptr<FusedRetrievalPipeline> p(new FusedRetrievalPipeline(std::move(*index), std::move(model), options));
    if (auto ok = p->initialize(); !ok) return unexpected(ok.error());
    if (auto ok = p->allocate_own(); !ok) return unexpected(ok.error());
    return p;
  }

  static expected<std::unique_ptr<FusedRetrievalPipeline>, Error> create(const Schema& schema,
                                                                         const std::string& safetensors_path,
                                                                         Options options) {
    auto model = load_model(safetensors_path);
    if (!model) return unexpected(model.error());
    return create(schema, std::move(*model), options);
  }

  ~FusedRetrievalPipeline() override {  // (the owned buffers are freed after this, as members)
    if (own_stream_) (void)gpu_stream_destroy(own_stream_);
  }

  /// set_policy, and the owned temp storage grown to match (waiting for the own stream first).
  expected<void, Error> set_policy(const PipelinePolicy& policy) override {
    std::lock_guard lock(own_mutex_);
    if (auto ok = RetrievalDispatch::set_policy(policy); !ok) return ok;
    if (own_batch_temp_ && search_batch_temp_bytes() > own_batch_temp_bytes_) {
      KEVO_GPU_TRY(gpu_stream_synchronize(own_stream_));
      own_batch_temp_.reset();  // allocated again by the next search_batch
    }
    if (search_temp_bytes() > own_temp_bytes_) {
      KEVO_GPU_TRY(gpu_stream_synchronize(own_stream_));
      own_temp_.reset();
      own_temp_bytes_ = search_temp_bytes();
      KEVO_GPU_TRY(gpu_allocate(own_temp_, own_temp_bytes_));
    }
    return {};
  }

  /// Searches one request and waits for the answer (the pipeline's own stream and temp storage),
  /// and, where `eligible` is given, how many ads matched the request (of which the answer is the
  /// top min(K, eligible)). Threads calling it at once take turns in arrival order; several request
  /// threads do better through a BatchingBackend (backend.hpp) over CudaRetrievalBackend, which
  /// answers the searches that queue as one batch.
  expected<std::vector<ScoredAd>, Error> search(const Request& request, std::uint32_t* eligible = nullptr) {
    auto checked = check_request(schema(), model(), request);
    if (!checked) return unexpected(checked.error());
    return search(*checked, eligible);
  }
  /// As above, for a request checked where it entered (a backend's search, a server).
  expected<std::vector<ScoredAd>, Error> search(const CheckedRequest& request, std::uint32_t* eligible = nullptr) {
    std::lock_guard lock(own_mutex_);
    if (auto ok = search_async(request, own_temp_.get(), own_temp_bytes_, answer_output(0, request), own_stream_); !ok)
      return unexpected(ok.error());
    KEVO_GPU_TRY(copy_answer_back(0, request));
    if (eligible) {  // matching's count, in the request's top-K state
      const auto* state = reinterpret_cast<const TopKState*>(static_cast<const unsigned char*>(own_temp_.get()) + temp_layout().state);
      KEVO_GPU_TRY(gpu_copy_async(eligible, &state->eligible_count, 4, own_stream_));
    }
    KEVO_GPU_TRY(gpu_stream_synchronize(own_stream_));
    return read_answer(0, request);
  }

  /// Searches several requests and waits for the answers, on the pipeline's own stream: groups of
  /// up to kMaxBatchRequests go through search_batch_async (each row read once per group) when they
  /// hold at least policy().batch_scoring.one_pass_from requests, the others one by one. Every
  /// request is checked before any runs. Each search sees every update wholly or not at all, but an
  /// update may land between two groups (or two one-by-one searches) of one batch.
  expected<std::vector<std::vector<ScoredAd>>, Error> search_batch(std::span<const Request> requests) {
    auto checked = check_requests(schema(), model(), requests);
    if (!checked) return unexpected(checked.error());
    return search_batch(std::span<const CheckedRequest>(*checked));
  }
  /// As above, for requests checked where they entered.
  expected<std::vector<std::vector<ScoredAd>>, Error> search_batch(std::span<const CheckedRequest> requests) {
    constexpr std::size_t group = kernels::kMaxBatchRequests;
    std::lock_guard lock(own_mutex_);
    std::vector<std::vector<ScoredAd>> all;
    for (std::size_t first = 0; first < requests.size(); first += group) {
      const std::size_t n = std::min(group, requests.size() - first);
      const auto some = requests.subspan(first, n);
      std::vector<SearchOutput> outs(n);
      for (std::size_t r = 0; r < n; ++r) outs[r] = answer_output(r, some[r]);
      if (n >= static_cast<std::size_t>(policy().batch_scoring.one_pass_from)) {
        if (!own_batch_temp_) {  // the first one-pass batch pays for its temp storage (~37 B per ad of capacity)
          own_batch_temp_bytes_ = search_batch_temp_bytes();
          KEVO_GPU_TRY(gpu_allocate(own_batch_temp_, own_batch_temp_bytes_));
        }
        if (auto ok = search_batch_async(some, own_batch_temp_.get(), own_batch_temp_bytes_, outs, own_stream_); !ok)
          return unexpected(ok.error());
      } else {
        for (std::size_t r = 0; r < n; ++r)  // stream-ordered: they share the temp storage
          if (auto ok = search_async(some[r], own_temp_.get(), own_temp_bytes_, outs[r], own_stream_); !ok)
            return batch_error(first + r, ok.error());
      }
      for (std::size_t r = 0; r < n; ++r) KEVO_GPU_TRY(copy_answer_back(r, some[r]));
      KEVO_GPU_TRY(gpu_stream_synchronize(own_stream_));
      for (std::size_t r = 0; r < n; ++r) {
        auto top = read_answer(r, some[r]);
        if (!top) return unexpected(top.error());
        all.push_back(std::move(*top));
      }
    }
    return all;
  }

 private:
  FusedRetrievalPipeline(std::unique_ptr<DeviceAdIndex> index, Model model, Options options)
      : RetrievalDispatch(std::move(index), std::move(model), options) {}

  /// What search() and search_batch() own: temp storage for one search, room for a batch's
  /// answers on the device and on the host, and a stream.
  expected<void, Error> allocate_own() {
    own_temp_bytes_ = search_temp_bytes();
    KEVO_GPU_TRY(gpu_allocate(own_temp_, own_temp_bytes_));
    KEVO_GPU_TRY(gpu_allocate(own_answers_, kernels::kMaxBatchRequests * kAnswerWords * 4));
    KEVO_GPU_TRY(gpu_allocate(own_answers_host_, kernels::kMaxBatchRequests * kAnswerWords * 4));
    KEVO_GPU_TRY(gpu_stream_create(&own_stream_));
    return {};
  }

  // search() and search_batch() have answer r written to slot r of own_answers_: its count, then K
  // ids, then K scores, contiguous, so that one copy into pinned memory brings it back.
  static constexpr std::size_t kAnswerWords = 1 + 2 * static_cast<std::size_t>(kMaxK);
  // They take the checked request: its K is in 1..kMaxK, so the slot holds its answer.
  SearchOutput answer_output(std::size_t r, const CheckedRequest& request) const {
    std::uint32_t* slot = own_answers_.get() + r * kAnswerWords;
    return {slot + 1, reinterpret_cast<float*>(slot + 1 + request->k), slot};
  }
  gpu_error_t copy_answer_back(std::size_t r, const CheckedRequest& request) {
    return gpu_copy_async(own_answers_host_.get() + r * kAnswerWords, own_answers_.get() + r * kAnswerWords,
                          (1 + 2 * static_cast<std::size_t>(request->k)) * 4, own_stream_);
  }
  /// Answer r, once its copy has landed.
  expected<std::vector<ScoredAd>, Error> read_answer(std::size_t r, const CheckedRequest& request) const {
    const int k = request->k;
    const std::uint32_t* slot = own_answers_host_.get() + r * kAnswerWords;
    const std::uint32_t count = slot[0];
    if (count == kCountVectorsOverflowed) return make_error(kVectorsOverflowMessage);
    if (count == kCountCandidatesOverflowed) return make_error("top-K candidate buffer overflowed (a bug)", ErrorKind::bug);
    if (count > static_cast<std::uint32_t>(k)) return make_error("top-K wrote a count past K (a bug)", ErrorKind::bug);
    std::vector<ScoredAd> top(count);
    for (std::uint32_t i = 0; i < count; ++i) top[i] = {slot[1 + i], std::bit_cast<float>(slot[1 + k + i])};
    return top;
  }

  FairMutex own_mutex_;  // callers of search() from several threads take turns in arrival order
  DeviceBuffer<void> own_temp_;
  std::size_t own_temp_bytes_ = 0;
  DeviceBuffer<void> own_batch_temp_;  // search_batch's, allocated by its first call
  std::size_t own_batch_temp_bytes_ = 0;
  DeviceBuffer<std::uint32_t> own_answers_;       // kMaxBatchRequests answers of kAnswerWords (device)
  PinnedBuffer<std::uint32_t> own_answers_host_;  // their pinned copies on the host
  gpu_stream_t own_stream_ = nullptr;
};

}  // namespace kevo::retrieval
