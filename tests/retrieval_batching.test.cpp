// Serving many threads: BatchingBackend (concurrent searches answered in batches, with the same
// answers as one by one) and FairMutex (the pipeline's own lock, taken in arrival order).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kevo/retrieval/retrieval.hpp"

namespace kevo_tests::retrieval_batching_test {

using namespace kevo;
using namespace kevo::retrieval;

namespace {

Workload small_workload() { return Workload({.seed = 3, .dim = 64, .features = 32, .hidden = 48}); }

void load(CpuRetrievalBackend& cpu, const Workload& w, int ads) {
  std::vector<AdRecord> records;
  for (int i = 0; i < ads; ++i) records.push_back(w.ad(static_cast<std::uint64_t>(i)));
  REQUIRE(cpu.upsert(records));
}

/// The CPU engine behind a gate: while closed, the engine's calls wait; every call's size is
/// recorded, and the next search_batch may be told to fail or throw.
class GatedEngine final : public RetrievalBackend {
 public:
  explicit GatedEngine(RetrievalBackend& engine) : engine_(engine) {}
  std::string name() const override { return engine_.name(); }
  const Schema& schema() const override { return engine_.schema(); }
  const Model& model() const override { return engine_.model(); }
  expected<std::vector<ScoredAd>, Error> search_checked(const CheckedRequest& request) override {
    enter(1);
    return engine_.search_checked(request);
  }
  expected<std::vector<std::vector<ScoredAd>>, Error> search_batch_checked(std::span<const CheckedRequest> requests) override {
    enter(requests.size());
    if (fail_next_.exchange(false)) return make_error("the device went away");
    if (throw_next_.exchange(false)) throw std::runtime_error("out of memory");
    auto answers = engine_.search_batch_checked(requests);
    if (answers && short_next_.exchange(false)) answers->pop_back();
    return answers;
  }
  expected<void, Error> upsert(std::span<const AdRecord> ads) override { return engine_.upsert(ads); }
  expected<std::size_t, Error> expire(std::span<const std::uint32_t> ids) override { return engine_.expire(ids); }

  void close() { std::lock_guard l(m_); open_ = false; }
  void open() {
    { std::lock_guard l(m_); open_ = true; }
    cv_.notify_all();
  }
  /// Waits until a call is inside the engine (held at the gate).
  void await_held() {
    std::unique_lock l(m_);
    cv_.wait(l, [&] { return held_ > 0; });
  }
  std::vector<std::size_t> calls() {
    std::lock_guard l(m_);
    return calls_;
  }
  std::atomic<bool> fail_next_{false}, throw_next_{false}, short_next_{false};

 private:
  void enter(std::size_t size) {
    std::unique_lock l(m_);
    calls_.push_back(size);
    ++held_;
    cv_.notify_all();
    cv_.wait(l, [&] { return open_; });
    --held_;
  }
  RetrievalBackend& engine_;
  std::mutex m_;
  std::condition_variable cv_;
  bool open_ = true;
  int held_ = 0;
  std::vector<std::size_t> calls_;
};

/// Runs `searches` in threads of their own once the first holds the gate; returns their answers.
std::vector<expected<std::vector<ScoredAd>, Error>> while_one_is_held(BatchingBackend& batched, GatedEngine& gate,
                                                                      const std::vector<Request>& requests,
                                                                      std::size_t expect_waiting) {
  std::vector<expected<std::vector<ScoredAd>, Error>> answers(requests.size(), make_error("not answered"));
  gate.close();
  std::vector<std::thread> threads;
  threads.emplace_back([&] { answers[0] = batched.search(requests[0]); });
  gate.await_held();
  for (std::size_t i = 1; i < requests.size(); ++i) threads.emplace_back([&, i] { answers[i] = batched.search(requests[i]); });
  while (batched.waiting() < expect_waiting) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  gate.open();
  for (std::thread& t : threads) t.join();
  return answers;
}

}  // namespace

TEST_CASE("searches that arrive while one runs are answered together, as one by one", "[retrieval][batching]") {
  const Workload w = small_workload();
  CpuRetrievalBackend cpu(w.schema(), w.model(), 2);
  load(cpu, w, 3000);
  GatedEngine gate(cpu);
  const std::size_t max_batch = GENERATE(8, 3);
  BatchingBackend batched(gate, {.max_batch = max_batch});
  std::vector<Request> requests;
  for (std::uint64_t r = 0; r < 8; ++r) requests.push_back(w.request(r, RequestKind::typical, 20 + static_cast<int>(r)));

  const auto answers = while_one_is_held(batched, gate, requests, requests.size() - 1);
  INFO("max_batch " << max_batch);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    REQUIRE(answers[i]);
    auto alone = cpu.search(requests[i]);
    REQUIRE(alone);
    CHECK(*answers[i] == *alone);
  }
  // The first ran alone; the seven that queued behind it went in batches of at most max_batch.
  const std::vector<std::size_t> calls = gate.calls();
  const std::vector<std::size_t> expected = max_batch == 8 ? std::vector<std::size_t>{1, 7} : std::vector<std::size_t>{1, 3, 3, 1};
  CHECK(calls == expected);
  CHECK(batched.counts().searches == 8);
  CHECK(batched.counts().batches == expected.size());
}

TEST_CASE("a bad request fails alone, and a batch the engine fails is retried one search at a time", "[retrieval][batching]") {
  const Workload w = small_workload();
  CpuRetrievalBackend cpu(w.schema(), w.model(), 2);
  load(cpu, w, 2000);
  GatedEngine gate(cpu);
  BatchingBackend batched(gate);
  std::vector<Request> requests;
  for (std::uint64_t r = 0; r < 4; ++r) requests.push_back(w.request(r, RequestKind::typical, 10));

  SECTION("a request with K out of range is refused before it waits") {
    Request bad = requests[1];
    bad.k = 0;
    requests.push_back(bad);
    const auto answers = while_one_is_held(batched, gate, requests, 3);
    for (std::size_t i = 0; i < 4; ++i) CHECK(answers[i]);
    REQUIRE_FALSE(answers[4]);
    CHECK(answers[4].error().message.find("K") != std::string::npos);
    CHECK(gate.calls() == std::vector<std::size_t>{1, 3});
  }
  // With `fault` set for the next batch: the first search ran alone before it; the batch of the
  // three queued behind it fails, and each of them is answered alone, right.
  auto retried_alone = [&](std::atomic<bool>& fault) {
    fault = true;
    const auto answers = while_one_is_held(batched, gate, requests, 3);
    for (std::size_t i = 0; i < 4; ++i) {
      REQUIRE(answers[i]);
      CHECK(*answers[i] == *cpu.search(requests[i]));
    }
    CHECK(gate.calls() == std::vector<std::size_t>{1, 3, 1, 1, 1});
    CHECK(batched.counts().batches_retried == 1);
  };
  SECTION("an engine error on a batch") { retried_alone(gate.fail_next_); }
  SECTION("an engine that answers fewer searches than it was given") { retried_alone(gate.short_next_); }
  SECTION("an engine that throws") { retried_alone(gate.throw_next_); }
  SECTION("a request whose vectors overflow fp16, found only by the engine, fails alone in a full batch") {
    Request huge = requests[2];
    huge.features.assign(huge.features.size(), 1e6f);
    requests[2] = huge;
    const auto answers = while_one_is_held(batched, gate, requests, 3);
    REQUIRE_FALSE(answers[2]);
    CHECK(answers[2].error().message.find(kVectorsOverflowMessage) != std::string::npos);
    CHECK(answers[2].error().message.find("batch") == std::string::npos);  // no place in a batch it never sent
    for (std::size_t i : {0, 1, 3}) {
      INFO("search " << i);
      REQUIRE(answers[i]);
      CHECK(*answers[i] == *cpu.search(requests[i]));
    }
    CHECK(batched.counts().batches_retried == 1);
  }
}

TEST_CASE("many threads searching through one BatchingBackend all get their own answers", "[retrieval][batching]") {
  const Workload w = small_workload();
  CpuRetrievalBackend cpu(w.schema(), w.model(), 2);
  load(cpu, w, 3000);
  BatchingBackend batched(cpu, {.max_batch = 4});
  constexpr int threads = 8, each = 5;
  std::vector<Request> requests;
  for (int r = 0; r < threads * each; ++r)
    requests.push_back(w.request(static_cast<std::uint64_t>(r), r % 3 ? RequestKind::typical : RequestKind::broad, 1 + r % 50));
  std::vector<std::vector<ScoredAd>> answers(requests.size());
  std::atomic<int> failed{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int i = 0; i < each; ++i) {
        auto top = batched.search(requests[static_cast<std::size_t>(t * each + i)]);
        if (top) answers[static_cast<std::size_t>(t * each + i)] = std::move(*top);
        else ++failed;
      }
    });
  for (std::thread& t : pool) t.join();
  REQUIRE(failed == 0);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    auto alone = cpu.search(requests[i]);
    REQUIRE(alone);
    CHECK(answers[i] == *alone);
  }
  CHECK(batched.counts().searches == requests.size());
  CHECK(batched.counts().batches <= requests.size());
}

TEST_CASE("FairMutex goes to its waiters in the order they asked for it", "[retrieval][fair]") {
  FairMutex mutex;
  std::vector<int> order;
  mutex.lock();  // held while the waiters line up one at a time
  std::vector<std::thread> waiters;
  for (int w = 0; w < 6; ++w) {
    waiters.emplace_back([&, w] {
      std::lock_guard lock(mutex);
      order.push_back(w);
    });
    while (mutex.waiting() < static_cast<std::uint64_t>(w + 1)) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  // The holder unlocks and at once asks again: it goes to the back of the line, behind all six.
  mutex.unlock();
  {
    std::lock_guard lock(mutex);
    order.push_back(-1);
  }
  for (std::thread& t : waiters) t.join();
  CHECK(order == std::vector<int>{0, 1, 2, 3, 4, 5, -1});
  CHECK(mutex.waiting() == 0);
}

}  // namespace kevo_tests::retrieval_batching_test
