// kevo/retrieval/dispatch/retrieval_dispatch.cuh: request in, top-K out, on one GPU, enqueued on
// the caller's stream in the caller's temp storage (CUB's two phases: ask search_temp_bytes(),
// then pass that much).
//
// Per request: upload the features and query bits, clear the top-K state and set the query bitmap
// (one kernel), run the user towers and gating keys, match, score (fused, fp16 or int8 with a
// scale per ad or per group of 32, with the level-0 top-K histogram), radix-select the K-th key,
// compact the survivors, sort them, and write (id, score) pairs to the caller's device buffers.
//
//   auto dispatch = RetrievalDispatch::create(schema, model, {.capacity = n});
//   (*dispatch)->index().upsert(ads);
//   (*dispatch)->search_async(request, d_temp, bytes, out, stream);  // the serving path
//
// FusedRetrievalPipeline (fused_retrieval_pipeline.cuh) is this plus what a synchronous search()
// owns: a stream, temp storage and pinned answers. This file is the dispatch: the policy each
// stage runs under, which prebuilt kernel that selects, and the order of the launches; the
// kernels are in one dispatch/*_kernels.cuh per algorithm and the per-thread work in agent/.
//
// Why one file of about 740 lines: each stage's launch, the temp layout it reads and the policy
// checks that size its kernels must agree, and they are kept together so that they do.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kevo/retrieval/dispatch/device_ad_index.cuh"
#include "kevo/retrieval/dispatch/matching_kernels.cuh"
#include "kevo/retrieval/dispatch/request_kernels.cuh"
#include "kevo/retrieval/dispatch/scoring_kernels.cuh"
#include "kevo/retrieval/dispatch/topk_kernels.cuh"
#include "kevo/retrieval/safetensors.hpp"
#include "kevo/retrieval/tuning/policies.hpp"
#include "kevo/retrieval/tuning/policy_choice.hpp"
#include "kevo/retrieval/types.hpp"

namespace kevo::retrieval {

/// Where search_async writes its answer: device buffers of K ids and scores, and the count:
/// min(K, eligible), or kCountVectorsOverflowed where the request's features were too large for
/// the model's fp16 vectors (no finite scores), or kCountCandidatesOverflowed (a bug). search()
/// turns both into errors.
struct SearchOutput {
  std::uint32_t* ids = nullptr;
  float* scores = nullptr;
  std::uint32_t* count = nullptr;
};

/// The layout of one request's temp storage (byte offsets, 256-aligned).
struct SearchTempLayout {
  std::size_t state, input, hidden, expert, vectors, bitmap, eligible, keys, chunk_max, candidates;
  std::size_t total;
  std::uint32_t candidate_capacity, chunk_size, input_words;
};

/// The layout of a batch's temp storage: the batch's shared eligible list (the union of its
/// requests', with a request-mask byte per entry), then one region per request laid out as
/// SearchTempLayout without its own eligible list (its keys are indexed like the shared list).
struct BatchTempLayout {
  std::size_t listed, eligible, request_masks, first_request;
  std::size_t request_stride;  // bytes per request region
  SearchTempLayout request;    // offsets within one request region
  std::size_t total;
};

class RetrievalDispatch {
 public:
  struct Options {
    std::size_t capacity = 1u << 20;
    std::size_t clause_capacity = 0;          // see DeviceAdIndex::Options: where the arena starts
    std::size_t max_clause_capacity = 0;      // and how far it may grow
    std::size_t reindex_after = 0;            // see DeviceAdIndex::Options
    std::uint32_t reindex_slice_segments = 512;  // see DeviceAdIndex::Options
    /// Empty: the tuned policy for this GPU, CUDA version and pool shape from `choose_policy`, or the
    /// defaults, except that a pool whose d and dtype make the default ring too big for shared
    /// memory (fp16 at d = 256) scores with register loads instead, and that an int8 pool's
    /// search_batch searches one by one (its one-pass batches were slower, run 32).
    std::optional<PipelinePolicy> policy{};
    /// Where tuned policies come from: `tuned_policies(file)` (tuning/tuning_file.hpp, from host
    /// code) reads the policies a search found; a file for another GPU or CUDA version, stale or
    /// malformed, is passed over, and policy_origin() says why. Empty: the defaults.
    PolicyChooser choose_policy{};
  };

  /// A dispatch alone: search_async and search_batch_async on the caller's streams and temp
  /// storage, and nothing owned for synchronous searches (FusedRetrievalPipeline adds those).
  static expected<std::unique_ptr<RetrievalDispatch>, Error> create(const Schema& schema, Model model, Options options) {
    auto index = make_index(schema, model, options);
    if (!index) return unexpected(index.error());
    std::unique_ptr<RetrievalDispatch> d(new RetrievalDispatch(std::move(*index), std::move(model), options));
    if (auto ok = d->initialize(); !ok) return unexpected(ok.error());
    return d;
  }
  virtual ~RetrievalDispatch() {  // (the device buffers are freed after this, as members)
    for (Upload& u : uploads_)
      if (u.done) (void)gpu_event_destroy(u.done);
  }
  RetrievalDispatch(const RetrievalDispatch&) = delete;
  RetrievalDispatch& operator=(const RetrievalDispatch&) = delete;

  DeviceAdIndex& index() { return *index_; }

  /// Swaps the kernels' knobs; results do not change. Temp storage sizes may: ask again. Not while
  /// searches are being enqueued from other threads.
  virtual expected<void, Error> set_policy(const PipelinePolicy& policy) {
    if (!is_legal(policy)) return make_error("illegal policy: " + to_string(policy));
    if (auto ok = check_shared_memory(policy.scoring); !ok) return ok;
    if (auto ok = check_shared_memory(policy.topk); !ok) return ok;
    if (auto ok = check_shared_memory(policy.batch_scoring, policy.scoring); !ok) return ok;
    policy_ = policy;
    layout_ = compute_layout();
    batch_layout_ = compute_batch_layout();
    return {};
  }
  const Schema& schema() const { return index_->schema(); }
  const Model& model() const { return model_; }
  const PipelinePolicy& policy() const { return policy_; }
  /// Where each stage's policy came from: given, tuned (which file and entry) or the defaults, and why.
  const std::string& policy_origin() const { return policy_origin_; }
  int multiprocessors() const { return multiprocessors_; }
  /// The GPU this pipeline lives on (current when it was created). Its calls set no device: the
  /// caller makes this one current (CudaRetrievalBackend does so on every call).
  int device() const { return device_; }

  /// The temp storage layout for the current policy (computed when the policy is set).
  const SearchTempLayout& temp_layout() const { return layout_; }

  /// Phase one of two: the temp storage bytes that search_async needs.
  std::size_t search_temp_bytes() const { return layout_.total; }

  /// Enqueues one search on `stream`; the answer lands in `out` when the stream reaches it.
  /// `d_temp` must be aligned to kTempAlignment bytes (as cudaMalloc's pointers are) and the outputs
  /// to 4: a misaligned access would fault the kernel, and such a fault ends the process's context.
  /// Search from a fixed set of streams: the index keeps an event for each one that ever searched.
  expected<void, Error> search_async(const Request& request, void* d_temp, std::size_t temp_bytes, SearchOutput out,
                                     gpu_stream_t stream) {
    auto checked = check_request(schema(), model_, request);
    if (!checked) return unexpected(checked.error());
    return search_async(*checked, d_temp, temp_bytes, out, stream);
  }
  /// As above, for a request checked where it entered (check_request against this pipeline's
  /// schema and model): nothing below checks it again.
  expected<void, Error> search_async(const CheckedRequest& request, void* d_temp, std::size_t temp_bytes, SearchOutput out,
                                     gpu_stream_t stream) {
    const SearchTempLayout& l = layout_;
    if (d_temp == nullptr || temp_bytes < l.total) return make_error("search_async: temp storage too small");
    if (auto ok = check_alignment("search_async", d_temp, std::span(&out, 1)); !ok) return ok;
    auto lock = index_->search_lock();
    auto view = index_->before_search(stream);
    if (!view) return unexpected(view.error());
    if (auto ok = enqueue_prepare(request, d_temp, stream); !ok) return ok;
    if (auto ok = enqueue_matching(*view, d_temp, stream); !ok) return ok;
    if (auto ok = enqueue_scoring(*view, d_temp, request->routing, stream); !ok) return ok;
    if (auto ok = enqueue_topk(*view, d_temp, request->k, out, stream); !ok) return ok;
    return index_->after_search(stream);
  }

  /// Phase one of two for search_batch_async: the temp storage bytes a batch of up to
  /// kernels::kMaxBatchRequests requests needs.
  std::size_t search_batch_temp_bytes() const { return batch_layout_.total; }
  const BatchTempLayout& batch_temp_layout() const { return batch_layout_; }

  /// Enqueues a batch of 1 .. kernels::kMaxBatchRequests searches on `stream` as one pass: the
  /// requests are matched together (one list of the ads eligible for any of them, with a byte
  /// saying for which), every listed row is read once and scored against each request, and then
  /// each request's top-K lands in its own `outs[r]`. The answers are the same as search_async's.
  expected<void, Error> search_batch_async(std::span<const Request> requests, void* d_temp, std::size_t temp_bytes,
                                           std::span<const SearchOutput> outs, gpu_stream_t stream) {
    auto checked = check_requests(schema(), model_, requests);
    if (!checked) return unexpected(checked.error());
    return search_batch_async(std::span<const CheckedRequest>(*checked), d_temp, temp_bytes, outs, stream);
  }
  /// As above, for requests checked where they entered.
  expected<void, Error> search_batch_async(std::span<const CheckedRequest> requests, void* d_temp, std::size_t temp_bytes,
                                           std::span<const SearchOutput> outs, gpu_stream_t stream) {
    if (requests.empty() || requests.size() > static_cast<std::size_t>(kernels::kMaxBatchRequests))
      return make_error("search_batch_async takes 1 to " + std::to_string(kernels::kMaxBatchRequests) + " requests, not " +
                        std::to_string(requests.size()));
    if (outs.size() != requests.size()) return make_error("search_batch_async: one output per request");
    const BatchTempLayout& b = batch_layout_;
    if (d_temp == nullptr || temp_bytes < b.total) return make_error("search_batch_async: temp storage too small");
    if (auto ok = check_alignment("search_batch_async", d_temp, outs); !ok) return ok;
    auto* t = static_cast<unsigned char*>(d_temp);
    auto lock = index_->search_lock();
    auto view = index_->before_search(stream);
    if (!view) return unexpected(view.error());
    KEVO_GPU_TRY(gpu_memset_async(t + b.listed, 0, 4, stream));  // first: matching follows the last tower directly
    for (std::size_t r = 0; r < requests.size(); ++r)
      if (auto ok = prepare(*requests[r], b.request, batch_region(t, r), stream); !ok) return ok;
    if (auto ok = enqueue_batch_matching(*view, t, requests.size(), stream); !ok) return ok;
    if (auto ok = enqueue_batch_scoring(*view, t, requests, stream); !ok) return ok;
    const auto* listed = reinterpret_cast<const std::uint32_t*>(t + b.listed);
    const auto* list = reinterpret_cast<const std::uint32_t*>(t + b.eligible);
    for (std::size_t r = 0; r < requests.size(); ++r) {
      unsigned char* at = batch_region(t, r);
      kernels::topk_histogram<256><<<static_cast<unsigned>(multiprocessors_ * 2), 256, 0, stream>>>(
          reinterpret_cast<const std::uint32_t*>(at + b.request.keys), listed,
          reinterpret_cast<TopKState*>(at + b.request.state));
      KEVO_GPU_TRY(gpu_last_error());
      if (auto ok = topk(*view, b.request, at, list, listed, requests[r]->k, outs[r], stream); !ok) return ok;
    }
    return index_->after_search(stream);
  }

  // ---- the stages, for tests and benchmarks (search_async runs them in this order) ----

  /// Uploads features and query bits, resets top-K state and sets the bitmap, runs towers and gating keys.
  expected<void, Error> enqueue_prepare(const CheckedRequest& request, void* d_temp, gpu_stream_t stream) {
    return prepare(*request, layout_, static_cast<unsigned char*>(d_temp), stream);
  }

  /// Index matching: the eligible slots, and their count in the top-K state.
  expected<void, Error> enqueue_matching(const IndexView& view, void* d_temp, gpu_stream_t stream) {
    const SearchTempLayout& l = layout_;
    auto* t = static_cast<unsigned char*>(d_temp);
    auto* state = reinterpret_cast<TopKState*>(t + l.state);
    return match<1>(view, requests_of(l, {&t, 1}), reinterpret_cast<std::uint32_t*>(t + l.eligible), nullptr,
                    &state->eligible_count, stream);
  }

  /// Fused scoring of every eligible ad, with the level-0 top-K histogram.
  expected<void, Error> enqueue_scoring(const IndexView& view, void* d_temp, int routing, gpu_stream_t stream) {
    const SearchTempLayout& l = layout_;
    auto* t = static_cast<unsigned char*>(d_temp);
    const ScoringPolicy& p = policy_.scoring;
    const auto* vectors = reinterpret_cast<const __half*>(t + l.vectors);
    const auto* list = reinterpret_cast<const std::uint32_t*>(t + l.eligible);
    auto* state = reinterpret_cast<TopKState*>(t + l.state);
    auto* keys = reinterpret_cast<std::uint32_t*>(t + l.keys);
    auto* chunk_max = reinterpret_cast<std::uint32_t*>(t + l.chunk_max);
    gpu_error_t launch_error = gpu_success;
    const bool built = with_scoring_kernel(p, [&](auto* kernel, int threads, std::size_t dynamic_shared) {
      const int resident = resident_blocks(kernel, threads, dynamic_shared);
      if (resident == 0) {
        launch_error = gpu_error_out_of_memory;  // (check_shared_memory refuses such a policy first)
        return;
      }
      // No more blocks than are resident at once: a partial second wave would idle most SMs.
      const auto grid = static_cast<unsigned>(multiprocessors_ * std::min(p.blocks_per_sm, resident));
      launch_error = gpu_launch_after_prior(kernel, grid, threads, dynamic_shared, stream, view, vectors, list, state,
                                            keys, chunk_max, routing, model_.experts, p.tiles_per_chunk);
    });
    if (!built) return make_error("no prebuilt scoring variant for " + to_string(p), ErrorKind::bug);
    KEVO_GPU_TRY(launch_error);
    return {};
  }

  /// Top-K from the scored keys: select, refine while crowded, compact, sort, decode.
  expected<void, Error> enqueue_topk(const IndexView& view, void* d_temp, int k, SearchOutput out, gpu_stream_t stream) {
    auto* t = static_cast<unsigned char*>(d_temp);
    auto* state = reinterpret_cast<TopKState*>(t + layout_.state);
    return topk(view, layout_, t, reinterpret_cast<const std::uint32_t*>(t + layout_.eligible), &state->eligible_count, k,
                out, stream);
  }

  /// Calls use(kernel, threads, dynamic shared bytes) with the prebuilt scoring kernel that `p`
  /// selects for this pool's d and type; false where none is built. The one place that maps a
  /// policy to its kernel: enqueue_scoring launches it, check_shared_memory sizes it.
  template <class Use>
  bool with_scoring_kernel(const ScoringPolicy& p, Use&& use) const {
    bool built = false;
    const auto chunk_size = 16u * static_cast<std::uint32_t>(p.tiles_per_chunk);
    for_each_scoring_variant([&]<int Threads, int Dim, EmbeddingType Type>() {
      if (p.block_threads != Threads || model_.dim != Dim || schema().embedding_type != Type) return;
      dispatch_variant<ScoringPolicy, field_index<ScoringPolicy>("stages")>(p.stages, [&](auto stages) {
        if constexpr (stages() == 0) {  // tiles held in registers
          dispatch_variant<ScoringPolicy, field_index<ScoringPolicy>("tiles_in_flight")>(p.tiles_in_flight, [&](auto tiles) {
            use(kernels::scoring<Threads, Dim, Type, tiles()>, Threads, std::size_t{0});
            built = true;
          });
        } else {  // tiles streamed through a ring of `stages` in shared memory
          use(kernels::scoring_staged<Threads, Dim, Type, stages()>, Threads,
              kernels::scoring_staged_dynamic_bytes<Dim, Type>(Threads / gpu_logical_warp_size, stages(), chunk_size));
          built = true;
        }
      });
    });
    return built;
  }

  /// The same for batched scoring under `p` (its chunks are `scoring`'s, whose maxima layout it shares).
  template <class Use>
  bool with_batch_scoring_kernel(const BatchScoringPolicy& p, const ScoringPolicy& scoring, Use&& use) const {
    bool built = false;
    const auto chunk_size = 16u * static_cast<std::uint32_t>(scoring.tiles_per_chunk);
    for_each_scoring_variant([&]<int Threads, int Dim, EmbeddingType Type>() {
      if constexpr (Threads == kBatchScoringThreads) {  // (only these are built)
        if (model_.dim != Dim || schema().embedding_type != Type) return;
        const std::size_t bytes = kernels::scoring_batch_dynamic_bytes<Dim, Type>(Threads / gpu_logical_warp_size, p.stages, chunk_size);
        dispatch_variant<BatchScoringPolicy, field_index<BatchScoringPolicy>("stages")>(p.stages, [&](auto stages) {
          dispatch_variant<BatchScoringPolicy, field_index<BatchScoringPolicy>("group")>(p.group, [&](auto group) {
            use(kernels::scoring_batch<Threads, Dim, Type, stages(), group()>, Threads, bytes);
            built = true;
          });
        });
      }
    });
    return built;
  }

  /// Shared memory one scoring block needs under `p`, for this pool's d and type: the kernel's own
  /// static shared memory, as compiled, and the dynamic bytes it is launched with.
  std::size_t scoring_shared_bytes(const ScoringPolicy& p) const {
    std::size_t bytes = 0;
    with_scoring_kernel(p, [&](auto* kernel, int, std::size_t dynamic_shared) {
      bytes = gpu_static_shared_bytes(kernel) + dynamic_shared;
    });
    return bytes;
  }

  /// What search_async and search_batch_async ask of the caller's temp storage's alignment.
  static constexpr std::size_t kTempAlignment = 256;

  /// A staged policy whose ring does not fit one block's shared memory is refused up front.
  expected<void, Error> check_shared_memory(const ScoringPolicy& p) const {
    const std::size_t need = scoring_shared_bytes(p);
    if (need > max_shared_per_block_)
      return make_error(to_string(p) + " needs " + std::to_string(need) + " bytes of shared memory per block; this GPU allows " +
                        std::to_string(max_shared_per_block_) + " (use fewer stages or threads)", ErrorKind::capacity);
    return {};
  }
  /// Batched scoring holds every request's fragments in one block, and with stages > 0 a ring per
  /// warp: at d = 256 a ring does not fit, so such a policy is refused here, not at its first batch.
  expected<void, Error> check_shared_memory(const BatchScoringPolicy& p, const ScoringPolicy& scoring) const {
    std::size_t need = 0;
    with_batch_scoring_kernel(p, scoring, [&](auto* kernel, int, std::size_t dynamic_shared) {
      need = gpu_static_shared_bytes(kernel) + dynamic_shared;
    });
    if (need > max_shared_per_block_)
      return make_error(to_string(p) + " needs " + std::to_string(need) + " bytes of shared memory per block; this GPU allows " +
                        std::to_string(max_shared_per_block_) + " (use stages = 0)", ErrorKind::capacity);
    return {};
  }
  /// Top-K's sort holds up to K + boundary_cap keys in one block's shared memory (either sort).
  expected<void, Error> check_shared_memory(const TopKPolicy& p) const {
    const auto capacity = static_cast<std::uint32_t>(kMaxK + p.boundary_cap);
    const std::size_t need = p.sort ? kernels::topk_rank_bytes(capacity) : kernels::topk_sort_bytes(capacity);
    if (need > max_shared_per_block_)
      return make_error(to_string(p) + " needs " + std::to_string(need) + " bytes of shared memory per block; this GPU allows " +
                        std::to_string(max_shared_per_block_) + " (use a smaller boundary cap)", ErrorKind::capacity);
    return {};
  }

 protected:
  RetrievalDispatch(std::unique_ptr<DeviceAdIndex> index, Model model, Options options)
      : index_(std::move(index)), model_(std::move(model)), options_(options) {}

  /// The index a dispatch over `schema` and `model` searches, once both are checked.
  static expected<std::unique_ptr<DeviceAdIndex>, Error> make_index(const Schema& schema, const Model& model,
                                                                    const Options& options) {
    if (auto ok = validate_model(model); !ok) return unexpected(ok.error());
    if (model.dim != schema.dim) return make_error("the model's d differs from the pool's");
    if (model.experts > kMaxGpuExperts) return make_error("the GPU pipeline takes at most 8 experts");
    if (options.policy && !is_legal(*options.policy)) return make_error("illegal policy: " + to_string(*options.policy));
    return DeviceAdIndex::create(schema, {options.capacity, options.clause_capacity, options.max_clause_capacity,
                                          options.reindex_after, options.reindex_slice_segments});
  }

  /// After a constructor, what create does: the policy chosen and checked, the weights uploaded,
  /// the layouts computed.
  expected<void, Error> initialize() {
    KEVO_GPU_TRY(gpu_current_device(&device_));
    const int device = device_;
    KEVO_GPU_TRY(gpu_multiprocessor_count(&multiprocessors_, device));
    int max_shared = 0;
    KEVO_GPU_TRY(gpu_max_shared_memory_optin(&max_shared, device));
    max_shared_per_block_ = static_cast<std::size_t>(max_shared);
    if (options_.policy) {
      policy_ = *options_.policy;
      policy_origin_ = "given: " + to_string(policy_);
    } else if (auto tuned = tuned_policy(device)) {
      policy_ = *tuned;
    } else {
      policy_ = PipelinePolicy{};
      if (!check_shared_memory(policy_.scoring)) policy_.scoring = kRegisterScoringPolicy;
      if (is_int8(schema().embedding_type)) policy_.batch_scoring.one_pass_from = 16;
      policy_origin_ = "defaults (" + tuned.error().message + "): " + to_string(policy_);
    }
    if (auto ok = check_shared_memory(policy_.scoring); !ok) return ok;
    // The default cap's sort (K + 2048 keys, 64 KB) fits every GPU since Volta; a larger explicit cap may not.
    if (auto ok = check_shared_memory(policy_.topk); !ok) return ok;
    if (auto ok = check_shared_memory(policy_.batch_scoring, policy_.scoring); !ok) return ok;
    auto upload = [](DeviceBuffer<float>& d, const std::vector<float>& h) -> expected<void, Error> {
      KEVO_GPU_TRY(gpu_allocate(d, h.size() * 4));
      KEVO_GPU_TRY(gpu_copy(d.get(), h.data(), h.size() * 4));
      return {};
    };
    for (auto [d, h] : {std::pair{&w1_, &model_.w1}, std::pair{&c1_, &model_.c1}, std::pair{&w2_, &model_.w2},
                        std::pair{&c2_, &model_.c2}, std::pair{&projection_, &model_.gate_projection}})
      if (auto ok = upload(*d, *h); !ok) return ok;
    layout_ = compute_layout();
    batch_layout_ = compute_batch_layout();
    const std::size_t upload_bytes = layout_.input_words * 4ull;
    for (Upload& u : uploads_) {
      KEVO_GPU_TRY(gpu_allocate(u.host, upload_bytes));
      KEVO_GPU_TRY(gpu_event_create(&u.done));
      KEVO_GPU_TRY(gpu_event_record(u.done, 0));
    }
    KEVO_GPU_TRY(gpu_device_synchronize());
    return {};
  }

 private:
  static expected<void, Error> check_alignment(const char* who, const void* d_temp, std::span<const SearchOutput> outs) {
    auto misaligned = [](const void* p, std::size_t to) { return reinterpret_cast<std::uintptr_t>(p) % to != 0; };
    if (misaligned(d_temp, kTempAlignment))
      return make_error(std::string(who) + ": temp storage must be aligned to " + std::to_string(kTempAlignment) + " bytes");
    for (const SearchOutput& out : outs)
      if (misaligned(out.ids, 4) || misaligned(out.scores, 4) || misaligned(out.count, 4))
        return make_error(std::string(who) + ": outputs must be aligned to 4 bytes");
    return {};
  }

  expected<void, Error> prepare(const Request& request, const SearchTempLayout& l, unsigned char* t,
                                gpu_stream_t stream) {
    Upload& up = uploads_[next_upload_++ % uploads_.size()];
    KEVO_GPU_TRY(gpu_event_synchronize(up.done));  // its previous copy has left
    auto* words = static_cast<std::uint32_t*>(up.host.get());
    std::memcpy(words, request.features.data(), request.features.size() * 4);
    std::uint32_t bits = 0;
    std::uint32_t* bit_list = words + model_.features + 1;
    const std::vector<std::uint32_t>& offsets = index_->host_category_offsets();
    // Each category's distinct values: a value listed twice is one bit (and the distinct values of
    // all categories, at most total_query_bits, always fit the list).
    thread_local std::vector<std::uint32_t> values;
    for (const CategoryQuery& q : request.query) {
      values.assign(q.values.begin(), q.values.end());
      std::sort(values.begin(), values.end());
      values.erase(std::unique(values.begin(), values.end()), values.end());
      for (std::uint32_t v : values) bit_list[bits++] = offsets[q.category] + v;
    }
    words[model_.features] = bits;
    KEVO_GPU_TRY(gpu_copy_async(t + l.input, up.host.get(), (model_.features + 1 + bits) * 4ull, stream));
    KEVO_GPU_TRY(gpu_event_record(up.done, stream));
    const auto* input_words = reinterpret_cast<const std::uint32_t*>(t + l.input);
    const auto* x = reinterpret_cast<const float*>(t + l.input);
    auto* hidden = reinterpret_cast<float*>(t + l.hidden);
    auto* u = reinterpret_cast<float*>(t + l.expert);
    auto* vectors = reinterpret_cast<__half*>(t + l.vectors);
    auto* state = reinterpret_cast<TopKState*>(t + l.state);
    const int e = model_.experts, h = model_.hidden, d = model_.dim;
    const bool after_prior = policy_.matching.launch_after_prior;  // (prepare_request's prior is the copy)
    KEVO_GPU_TRY(gpu_launch_after_prior_if(
        after_prior, kernels::prepare_request<>, kernels::prepare_request_blocks(e * h), kernels::kTowerThreads,
        0, stream, w1_.get(), c1_.get(), x, model_.features, e * h, hidden, input_words + model_.features + 1,
        input_words + model_.features, reinterpret_cast<std::uint32_t*>(t + l.bitmap),
        static_cast<std::uint32_t>((index_->total_query_bits() + 31) / 32), state));
    KEVO_GPU_TRY(gpu_launch_after_prior_if(after_prior, kernels::tower_expert<>, kernels::tower_blocks(e * d),
                                           kernels::kTowerThreads, 0, stream, w2_.get(), c2_.get(), hidden, h, d, e * d, u));
    KEVO_GPU_TRY(gpu_launch_after_prior_if(after_prior, kernels::tower_gate<>, kernels::tower_blocks(kMaxGpuExperts * d),
                                           kernels::kTowerThreads, 0, stream, projection_.get(), u, d, e, vectors, state));
    return {};
  }

  /// What matching sees of the requests whose temp regions (laid out as `l`) are `regions`.
  kernels::MatchingRequests requests_of(const SearchTempLayout& l, std::span<unsigned char* const> regions) const {
    kernels::MatchingRequests m{};
    for (std::size_t r = 0; r < regions.size(); ++r) {
      unsigned char* t = regions[r];
      m.bitmap[r] = reinterpret_cast<const std::uint32_t*>(t + l.bitmap);
      m.bit_count[r] = reinterpret_cast<const std::uint32_t*>(t + l.input) + model_.features;
      m.bits[r] = m.bit_count[r] + 1;
      m.state[r] = reinterpret_cast<TopKState*>(t + l.state);
    }
    m.category_offsets = index_->category_offsets();
    m.count = static_cast<int>(regions.size());
    return m;
  }

  /// Launches matching for a batch of up to MaxRequests (1: a single search).
  template <int MaxRequests>
  expected<void, Error> match(const IndexView& view, const kernels::MatchingRequests& requests, std::uint32_t* list,
                              std::uint8_t* request_masks, std::uint32_t* listed, gpu_stream_t stream) {
    const MatchingPolicy& p = policy_.matching;
    const std::uint64_t segments = (view.slots + kSegmentSlots - 1) / kSegmentSlots;
    if (segments == 0) return {};
    bool launched = false;
    gpu_error_t launch_error = gpu_success;
    for_each_matching_variant([&](auto block_threads) {
      if (block_threads() != p.block_threads) return;
      auto* kernel = kernels::matching<decltype(block_threads)::value, MaxRequests>;
      const int resident = resident_blocks(kernel, p.block_threads, 0);
      if (resident == 0) return;
      const auto grid = static_cast<unsigned>(std::max<std::uint64_t>(
          1, std::min<std::uint64_t>(segments, static_cast<std::uint64_t>(std::min(resident, p.blocks_per_sm)) * multiprocessors_)));
      launch_error = gpu_launch_after_prior_if(p.launch_after_prior, kernel, grid, p.block_threads, 0, stream, view,
                                               requests, list, request_masks, listed, p.segment_queue);
      launched = true;
    });
    if (!launched) return make_error("no prebuilt matching variant for " + to_string(p), ErrorKind::bug);
    KEVO_GPU_TRY(launch_error);
    return {};
  }

  /// Request r's region of a batch's temp storage `t`.
  unsigned char* batch_region(unsigned char* t, std::size_t r) const {
    return t + batch_layout_.first_request + r * batch_layout_.request_stride;
  }

  expected<void, Error> enqueue_batch_matching(const IndexView& view, unsigned char* t, std::size_t requests,
                                               gpu_stream_t stream) {
    const BatchTempLayout& b = batch_layout_;
    std::vector<unsigned char*> regions(requests);
    for (std::size_t r = 0; r < requests; ++r) regions[r] = batch_region(t, r);
    return match<kernels::kMaxBatchRequests>(view, requests_of(b.request, regions),
                                             reinterpret_cast<std::uint32_t*>(t + b.eligible), t + b.request_masks,
                                             reinterpret_cast<std::uint32_t*>(t + b.listed), stream);
  }

  /// Batched scoring over the batch's union list (128-thread blocks: every request's fragments and,
  /// with a ring, each warp's stages share one block's shared memory).
  expected<void, Error> enqueue_batch_scoring(const IndexView& view, unsigned char* t, std::span<const CheckedRequest> requests,
                                              gpu_stream_t stream) {
    const BatchTempLayout& b = batch_layout_;
    kernels::ScoringRequests s{};
    for (std::size_t r = 0; r < requests.size(); ++r) {
      unsigned char* at = batch_region(t, r);
      s.vectors[r] = reinterpret_cast<const __half*>(at + b.request.vectors);
      s.keys[r] = reinterpret_cast<std::uint32_t*>(at + b.request.keys);
      s.chunk_max[r] = reinterpret_cast<std::uint32_t*>(at + b.request.chunk_max);
      s.routing[r] = requests[r]->routing;
    }
    s.count = static_cast<int>(requests.size());
    const BatchScoringPolicy& p = policy_.batch_scoring;
    const int tiles_per_chunk = policy_.scoring.tiles_per_chunk;  // the chunk maxima's layout is shared
    bool launched = false;
    with_batch_scoring_kernel(p, policy_.scoring, [&](auto* kernel, int threads, std::size_t dynamic_shared) {
      const int resident = resident_blocks(kernel, threads, dynamic_shared);
      if (resident == 0) return;
      const auto grid = static_cast<unsigned>(multiprocessors_ * std::min(resident, p.blocks_per_sm));
      kernel<<<grid, threads, dynamic_shared, stream>>>(view, s, reinterpret_cast<const std::uint32_t*>(t + b.eligible),
                                                        t + b.request_masks, reinterpret_cast<const std::uint32_t*>(t + b.listed),
                                                        model_.experts, tiles_per_chunk);
      launched = true;
    });
    if (!launched) return make_error("no batched scoring variant fits this GPU for " + to_string(policy_.batch_scoring), ErrorKind::capacity);
    KEVO_GPU_TRY(gpu_last_error());
    return {};
  }

  /// Top-K over `*listed` keys at l.keys, position i scoring ad list[i] (a batch's key 0: not eligible).
  expected<void, Error> topk(const IndexView& view, const SearchTempLayout& l, unsigned char* t,
                             const std::uint32_t* list, const std::uint32_t* listed, int k, SearchOutput out,
                             gpu_stream_t stream) {
    const TopKPolicy& p = policy_.topk;
    constexpr int threads = 256;
    auto* state = reinterpret_cast<TopKState*>(t + l.state);
    const auto* keys = reinterpret_cast<const std::uint32_t*>(t + l.keys);
    const auto* chunk_max = reinterpret_cast<const std::uint32_t*>(t + l.chunk_max);
    auto* candidates = reinterpret_cast<unsigned long long*>(t + l.candidates);
    const auto kk = static_cast<std::uint32_t>(k);
    const auto cap = static_cast<std::uint32_t>(p.boundary_cap);
    constexpr int blocks_per_sm = 4;  // of the select, refine and compaction kernels
    if (p.one_launch) {
      // Select, the levels it needs and the compaction in one launch, levels apart by grid barriers.
      const int resident = resident_blocks(kernels::topk_select_and_compact<threads>, threads, 0);
      if (resident == 0) return make_error("top-K's one-launch select does not fit this GPU", ErrorKind::capacity);
      const auto cooperative_grid = static_cast<unsigned>(multiprocessors_ * std::min(resident, blocks_per_sm));
      KEVO_GPU_TRY(gpu_launch_cooperative_after_prior(kernels::topk_select_and_compact<threads>, cooperative_grid, threads, 0,
                                                      stream, view, list, keys, chunk_max, listed, state, l.chunk_size, kk,
                                                      cap, candidates, l.candidate_capacity));
    } else {
      // Seven launches: level 0's select, each later level's refine (its last block selects; once
      // the threshold is known they return at once), the compaction. Each is a programmatic
      // dependent of the one before, so that the small ones do not each pay a launch gap.
      const auto grid = static_cast<unsigned>(multiprocessors_ * blocks_per_sm);
      KEVO_GPU_TRY(gpu_launch_after_prior(kernels::topk_select<threads>, 1, threads, 0, stream, state, 0, kk, cap));
      for (int level = 1; level < kTopKLevels; ++level)
        KEVO_GPU_TRY(gpu_launch_after_prior(kernels::topk_refine<threads>, grid, threads, 0, stream, view, list, keys,
                                            chunk_max, listed, state, level, l.chunk_size, kk, cap));
      KEVO_GPU_TRY(gpu_launch_after_prior(kernels::topk_compact<threads>, grid, threads, 0, stream, view, list, keys,
                                          chunk_max, listed, state, l.chunk_size, candidates, l.candidate_capacity));
    }
    if (p.sort) {
      const std::size_t rank_bytes = kernels::topk_rank_bytes(l.candidate_capacity);
      if (resident_blocks(kernels::topk_rank<>, kernels::kTopKRankThreads, rank_bytes) == 0)
        return make_error("top-K's ranking needs " + std::to_string(rank_bytes) + " bytes of shared memory per block", ErrorKind::capacity);
      KEVO_GPU_TRY(gpu_launch_after_prior(kernels::topk_rank<>, kernels::topk_rank_blocks(l.candidate_capacity),
                                          kernels::kTopKRankThreads, rank_bytes, stream, candidates, state, kk,
                                          l.candidate_capacity, out.ids, out.scores, out.count));
      return {};
    }
    const std::size_t sort_bytes = kernels::topk_sort_bytes(l.candidate_capacity);
    if (resident_blocks(kernels::topk_sort<>, kernels::kTopKSortThreads, sort_bytes) == 0)
      return make_error("top-K's sort needs " + std::to_string(sort_bytes) + " bytes of shared memory per block", ErrorKind::capacity);
    KEVO_GPU_TRY(gpu_launch_after_prior(kernels::topk_sort<>, 1, kernels::kTopKSortThreads, sort_bytes, stream,
                                        candidates, state, kk, l.candidate_capacity, out.ids, out.scores, out.count));
    return {};
  }

  /// One request's layout; a request of a batch has no eligible list of its own.
  SearchTempLayout compute_layout(bool own_eligible_list = true) const {
    auto round = [](std::size_t b) { return (b + 255) & ~std::size_t{255}; };
    SearchTempLayout l{};
    const std::size_t n = index_->capacity();
    const int d = model_.dim;
    l.chunk_size = 16u * static_cast<std::uint32_t>(policy_.scoring.tiles_per_chunk);
    l.candidate_capacity = static_cast<std::uint32_t>(kMaxK + policy_.topk.boundary_cap);
    l.input_words = static_cast<std::uint32_t>(model_.features + 1 + index_->total_query_bits());
    std::size_t at = 0;
    auto take = [&](std::size_t& field, std::size_t bytes) { field = at; at += round(bytes); };
    take(l.state, sizeof(TopKState));
    take(l.input, l.input_words * 4ull);
    take(l.hidden, static_cast<std::size_t>(model_.experts) * model_.hidden * 4);
    take(l.expert, static_cast<std::size_t>(model_.experts) * d * 4);
    take(l.vectors, 2ull * kMaxGpuExperts * d * 2);
    take(l.bitmap, (index_->total_query_bits() + 31) / 32 * 4ull);
    take(l.eligible, own_eligible_list ? n * 4 : 0);
    take(l.keys, n * 4);
    take(l.chunk_max, (n / l.chunk_size + 1) * 4);
    take(l.candidates, l.candidate_capacity * 8ull);
    l.total = at;
    return l;
  }

  BatchTempLayout compute_batch_layout() const {
    auto round = [](std::size_t b) { return (b + 255) & ~std::size_t{255}; };
    const std::size_t n = index_->capacity();
    BatchTempLayout b{};
    b.listed = 0;
    b.eligible = 256;
    b.request_masks = b.eligible + round(n * 4);
    b.first_request = b.request_masks + round(n);
    b.request = compute_layout(false);
    b.request_stride = b.request.total;
    b.total = b.first_request + kernels::kMaxBatchRequests * b.request_stride;
    return b;
  }


  /// Calls f.template operator()<Threads, Dim, Type>() for every prebuilt scoring shape.
  template <class F>
  static void for_each_scoring_variant(F&& f) {
    auto per_dim = [&]<int Threads, int Dim>() {
      f.template operator()<Threads, Dim, EmbeddingType::fp16>();
      f.template operator()<Threads, Dim, EmbeddingType::int8>();
      f.template operator()<Threads, Dim, EmbeddingType::int8_group32>();
    };
    for_each_variant_value<ScoringPolicy, field_index<ScoringPolicy>("block_threads")>([&](auto threads) {
      per_dim.template operator()<threads(), 64>();
      per_dim.template operator()<threads(), 128>();
      per_dim.template operator()<threads(), 256>();
    });
  }

  /// Blocks of `kernel` resident on one SM at `threads` and `dynamic_shared` bytes (0 where it
  /// cannot launch), its shared-memory limit raised to match. Asked of the runtime once per kernel
  /// and size: the queries cost host time that would otherwise stall every request's launches.
  template <class Kernel>
  int resident_blocks(Kernel* kernel, int threads, std::size_t dynamic_shared) {
    std::lock_guard lock(resident_mutex_);
    const ResidentKey key{reinterpret_cast<const void*>(kernel), threads, dynamic_shared};
    for (const auto& [k, blocks] : resident_)
      if (k == key) return blocks;
    int blocks = 0;
    if (!allow_dynamic_shared(key.kernel, dynamic_shared) ||
        gpu_resident_blocks(&blocks, kernel, threads, dynamic_shared) != gpu_success) {
      (void)gpu_last_error();
      blocks = 0;
    }
    resident_.emplace_back(key, blocks);
    return blocks;
  }
  /// Raises a kernel's dynamic shared-memory allowance to at least `bytes` and never lowers it: the
  /// attribute belongs to the kernel on this device, for every pipeline in the process, so a ring
  /// smaller than one launched before (by this pipeline or another) must leave it as it is.
  static bool allow_dynamic_shared(const void* kernel, std::size_t bytes) {
    static std::mutex mutex;
    static std::map<std::pair<int, const void*>, std::size_t> allowed;  // (device, kernel) -> bytes
    int device = 0;
    if (gpu_current_device(&device) != gpu_success) return false;
    std::lock_guard lock(mutex);
    std::size_t& current = allowed[{device, kernel}];
    if (bytes <= current) return true;
    if (gpu_allow_dynamic_shared(kernel, static_cast<int>(bytes)) != gpu_success)
      return false;
    current = bytes;
    return true;
  }
  struct ResidentKey {
    const void* kernel;
    int threads;
    std::size_t dynamic_shared;
    friend bool operator==(const ResidentKey&, const ResidentKey&) = default;
  };
  std::mutex resident_mutex_;
  std::vector<std::pair<ResidentKey, int>> resident_;
  /// The prebuilt matching variants: every block_threads in the policy's domain.
  template <class F>
  static void for_each_matching_variant(F&& f) {
    for_each_variant_value<MatchingPolicy, field_index<MatchingPolicy>("block_threads")>(f);
  }

  /// The tuning file's policy for this device and pool, if it has one that fits this GPU's shared
  /// memory; else why not (the defaults are then used).
  expected<PipelinePolicy, Error> tuned_policy(int device) {
    if (!options_.choose_policy) return make_error("no tuning file");
    DeviceIdentity identity;
    KEVO_GPU_TRY(gpu_device_name(&identity.gpu, device));
    KEVO_GPU_TRY(gpu_runtime_version(&identity.cuda));
    const ShapeClass shape{model_.dim, schema().embedding_type, pool_class(options_.capacity)};
    PolicyChoice choice = options_.choose_policy(identity, shape);
    if (!choice.tuned) return make_error(choice.reason);
    for (auto ok : {check_shared_memory(choice.policy.scoring), check_shared_memory(choice.policy.topk),
                    check_shared_memory(choice.policy.batch_scoring, choice.policy.scoring)})
      if (!ok) return make_error("the tuned policy does not fit this GPU: " + ok.error().message);
    policy_origin_ = choice.origin;
    return choice.policy;
  }

  struct Upload {
    PinnedBuffer<void> host;
    gpu_event_t done = nullptr;
  };

  std::unique_ptr<DeviceAdIndex> index_;
  Model model_;
  Options options_;
  SearchTempLayout layout_{};
  BatchTempLayout batch_layout_{};
  /// Batched scoring's block: every request's fragments and a 4-warp ring fit one block's shared memory.
  static constexpr int kBatchScoringThreads = 128;
  /// The fallback scoring policy where the default ring does not fit (measured best of the register path).
  static constexpr ScoringPolicy kRegisterScoringPolicy{128, 16, 4, 2, 0};
  PipelinePolicy policy_{};
  std::string policy_origin_;
  int device_ = 0;
  int multiprocessors_ = 0;
  std::size_t max_shared_per_block_ = 0;
  DeviceBuffer<float> w1_, c1_, w2_, c2_, projection_;
  std::vector<Upload> uploads_ = std::vector<Upload>(2 * kernels::kMaxBatchRequests);  // a batch's uploads in flight at once
  std::size_t next_upload_ = 0;
};

}  // namespace kevo::retrieval
