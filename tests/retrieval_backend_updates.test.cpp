// Real-time updates against concurrent searches on the CPU backend (CI has no GPU): a request sees
// each ad wholly before or wholly after an update, never a torn mix, and once an update call returns
// every later request sees it (shared/spec/retrieval-model.md, "Ad pool").
#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kevo/retrieval/retrieval.hpp"

namespace kevo_tests::retrieval_backend_updates_test {

using namespace kevo::retrieval;

namespace {

// Hot ads cycle through these versions; each changes embedding, bias, targeting and live together.
// Request 0 asks category 0 = {1}, request 1 asks {2}:
//   v0: ANY, live               -> returned by both
//   v1: allows {1}, live        -> request 0 only
//   v2: excludes {1}, live      -> request 1 only
//   v3: ANY, paused (not live)  -> neither
// and state 4, expired, -> neither.
constexpr int kVersions = 4, kExpired = 4, kHot = 6, kRequests = 2;
constexpr std::uint32_t kHotBase = 1'000'000;

bool returned(int state, int request) {
  if (state == kExpired || state == 3) return false;
  return state == 0 || (state == 1 && request == 0) || (state == 2 && request == 1);
}

std::vector<Clause> targeting(int version) {
  if (version == 1) return {{0, 1, false}};
  if (version == 2) return {{0, 1, true}};
  return {};
}

// Biases 20 apart keep every (embedding of one version, bias of another) far from every genuine score.
float bias_of(int version) { return 20.0f * float(version + 1); }

struct Setup {
  Workload workload{{.seed = 61, .categories = 2, .dim = 64, .features = 32, .hidden = 48}};
  Model model = workload.model();
  std::array<std::vector<float>, kVersions> embedding;
  std::array<Request, kRequests> requests;
  double genuine[kVersions][kRequests] = {};  // version's score, where returned
  std::vector<AdRecord> background;
  std::array<std::vector<ScoredAd>, kRequests> background_answer;  // background ads never change

  Setup() {
    for (int r = 0; r < kRequests; ++r) {
      requests[r] = workload.request(std::uint64_t(r), RequestKind::typical, kMaxK, 2);
      requests[r].query = {{0, {std::uint32_t(r + 1)}}};
    }
    const RequestVectors vectors[kRequests] = {compute_request_vectors(model, requests[0].features),
                                               compute_request_vectors(model, requests[1].features)};
    // Each version's embedding alone (bias 0, ANY): f[v][r]. Pick embeddings whose f lie apart.
    double f[kVersions][kRequests] = {};
    std::uint64_t draw = 500000;
    for (int v = 0; v < kVersions; ++v) {
      for (bool apart = false; !apart; ++draw) {
        REQUIRE(draw < 500000 + 1000);
        AdRecord ad = workload.ad(draw);
        ad.bias = 0.0f, ad.clauses = {}, ad.live = true;
        for (float& a : ad.embedding) a *= 4.0f;  // spreads the versions' scores apart
        HostAdPool alone(workload.schema());
        REQUIRE(alone.upsert(ad));
        apart = true;
        for (int r = 0; r < kRequests; ++r) {
          const auto top = reference_search(alone, vectors[r], requests[r], 1);
          REQUIRE(top.size() == 1);
          f[v][r] = top[0].score;
          for (int u = 0; u < v; ++u) apart = apart && std::fabs(f[v][r] - f[u][r]) > 1.0;
        }
        embedding[v] = ad.embedding;
      }
      for (int r = 0; r < kRequests; ++r) genuine[v][r] = f[v][r] + bias_of(v);
    }
    // Every field-level tear (embedding of version i with bias of j, returned or not by any targeting
    // or live flag) scores more than 10x the spec's tolerance away from every genuine returned score.
    for (int r = 0; r < kRequests; ++r)
      for (int x = 0; x < kVersions; ++x) {
        if (!returned(x, r)) continue;
        for (int i = 0; i < kVersions; ++i)
          for (int j = 0; j < kVersions; ++j) {
            if (i == x && j == x) continue;
            INFO("request " << r << ": embedding " << i << " with bias " << j << " against version " << x);
            REQUIRE(std::fabs(f[i][r] + bias_of(j) - genuine[x][r]) > 10 * score_tolerance(genuine[x][r]));
          }
      }
    for (int i = 0; i < 1500; ++i) background.push_back(workload.ad(std::uint64_t(i)));
    HostAdPool pool(workload.schema());
    for (const AdRecord& ad : background) REQUIRE(pool.upsert(ad));
    for (int r = 0; r < kRequests; ++r) {
      background_answer[r] = reference_search(pool, compute_request_vectors(model, requests[r].features), requests[r], 1);
      REQUIRE(background_answer[r].size() > 100);
    }
  }

  AdRecord hot(int ad, int version) const {
    return {kHotBase + std::uint32_t(ad), embedding[version], bias_of(version), targeting(version), version != 3};
  }
};

// Whether an answer's entry for one hot ad (its score, or nullopt when absent) is that ad in `state`.
bool matches(const Setup& s, int state, int request, std::optional<float> score) {
  if (!returned(state, request)) return !score;
  return score && std::fabs(*score - s.genuine[state][request]) <= score_tolerance(s.genuine[state][request]);
}

// Checks an answer's shape (ordered; the unchanging background exactly as when quiet) and returns
// each hot ad's score (nullopt where absent); nullopt, with `why`, on a problem.
std::optional<std::array<std::optional<float>, kHot>> hot_scores(const Setup& s, int request,
                                                                 const std::vector<ScoredAd>& answer, std::string& why) {
  std::array<std::optional<float>, kHot> hot{};
  std::vector<ScoredAd> background;
  for (std::size_t i = 1; i < answer.size(); ++i)
    if (!(answer[i - 1].score > answer[i].score ||
          (answer[i - 1].score == answer[i].score && answer[i - 1].id < answer[i].id)))
      return why = "out of order at " + std::to_string(i), std::nullopt;
  for (const ScoredAd& a : answer) {
    if (a.id >= kHotBase && a.id < kHotBase + kHot) {
      if (hot[a.id - kHotBase]) return why = "a hot ad twice", std::nullopt;
      hot[a.id - kHotBase] = a.score;
    } else {
      background.push_back(a);
    }
  }
  if (background != s.background_answer[request]) return why = "the background ads changed", std::nullopt;
  return hot;
}

}  // namespace

TEST_CASE("CPU backend: searches racing updates see whole versions, and every completed update",
          "[retrieval][backend][concurrency]") {
  const Setup s;
  CpuRetrievalBackend cpu(s.workload.schema(), s.model, 1);
  BatchingBackend batching(cpu, {.max_batch = 4});
  REQUIRE(cpu.upsert(s.background));

  // Each hot ad's states, written in advance so readers can look them up while the writer works:
  // update n of ad h puts it in state(h, n); begun[h] / done[h] count its updates started / returned.
  std::mt19937 gen(11);
  std::array<std::array<std::uint8_t, 4096>, kHot> history;
  for (auto& h : history)
    for (auto& state : h) state = std::uint8_t(gen() % 5);
  auto state_of = [&](int h, int n) -> int { return history[h][std::size_t(n) % history[h].size()]; };
  std::array<std::atomic<int>, kHot> begun{}, done{};
  for (int h = 0; h < kHot; ++h) {
    const int state = state_of(h, 0);
    if (state == kExpired) continue;  // never inserted
    const AdRecord ad = s.hot(h, state);
    REQUIRE(cpu.upsert(std::span<const AdRecord>(&ad, 1)));
  }

  std::atomic<bool> writing{true};
  std::atomic<int> overlapped[3] = {}, searches[3] = {};
  std::mutex failure_mutex;
  std::string failure;
  auto fail = [&](std::string why) {
    std::lock_guard lock(failure_mutex);
    if (failure.empty()) failure = std::move(why);
  };

  // Some state in [done before, begun after] of each hot ad must explain every answer at once.
  auto check = [&](const std::array<int, kHot>& lo, const std::array<int, kHot>& hi, const int* request_ids,
                   const std::vector<ScoredAd>* answers, int count) {
    std::array<std::optional<float>, kHot> scores[kRequests];
    for (int a = 0; a < count; ++a) {
      std::string why;
      auto hot = hot_scores(s, request_ids[a], answers[a], why);
      if (!hot) return fail(why);
      scores[a] = *hot;
    }
    for (int h = 0; h < kHot; ++h) {
      bool explained = false;
      for (int n = lo[h]; n <= hi[h] && !explained; ++n) {
        explained = true;
        for (int a = 0; a < count; ++a) explained = explained && matches(s, state_of(h, n), request_ids[a], scores[a][h]);
      }
      if (!explained)
        return fail("hot ad " + std::to_string(h) + ": no state between update " + std::to_string(lo[h]) + " and " +
                    std::to_string(hi[h]) + " explains the answer (score " +
                    (scores[0][h] ? std::to_string(*scores[0][h]) : std::string("absent")) + ")");
    }
  };

  auto reader = [&](int seed) {
    for (int n = seed; writing.load(); ++n) {
      // 0: CpuRetrievalBackend::search, 1: BatchingBackend::search, 2: CpuRetrievalBackend::search_batch of both
      const int mode = n % 3;
      std::array<int, kHot> lo{}, hi{};
      for (int h = 0; h < kHot; ++h) lo[h] = done[h].load();
      const bool during = writing.load();
      std::vector<ScoredAd> answers[kRequests];
      int request_ids[kRequests] = {n % kRequests, (n + 1) % kRequests};
      int count = 1;
      if (mode == 2) {
        auto all = cpu.search_batch(std::span<const Request>(s.requests.data(), kRequests));
        if (!all || all->size() != kRequests) return fail("search_batch failed");
        answers[0] = (*all)[0], answers[1] = (*all)[1];
        request_ids[0] = 0, request_ids[1] = 1, count = 2;
      } else {
        auto top = (mode == 0 ? static_cast<RetrievalBackend&>(cpu) : batching).search(s.requests[request_ids[0]]);
        if (!top) return fail("search failed: " + top.error().message);
        answers[0] = std::move(*top);
      }
      bool moved = false;
      for (int h = 0; h < kHot; ++h) {
        hi[h] = begun[h].load();
        moved = moved || done[h].load() != lo[h];
      }
      check(lo, hi, request_ids, answers, count);
      ++searches[mode];
      if (during && moved) ++overlapped[mode];  // an update returned while this search was in flight
    }
  };

  std::thread readers[] = {std::thread(reader, 0), std::thread(reader, 1)};
  int updates = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(6);
  auto enough = [&] {
    for (auto& o : overlapped)
      if (o.load() < 100) return false;
    return true;
  };
  for (int step = 0; !enough() && std::chrono::steady_clock::now() < deadline; ++step) {
    // One hot ad at a time, or several in one call.
    const int first = int(gen() % kHot), count = step % 4 == 0 ? 3 : 1;
    std::vector<AdRecord> upserts;
    std::vector<std::uint32_t> expiries;
    std::vector<int> touched;
    for (int c = 0; c < count; ++c) {
      const int h = (first + c) % kHot, next = begun[h].load() + 1;
      touched.push_back(h);
      begun[h].store(next);
      const int state = state_of(h, next);
      if (state == kExpired) expiries.push_back(kHotBase + std::uint32_t(h));
      else upserts.push_back(s.hot(h, state));
    }
    // No REQUIRE while the readers run: a throw here would leave them joinable.
    if (!upserts.empty() && !cpu.upsert(upserts)) fail("upsert failed");
    if (!expiries.empty() && !batching.expire(expiries)) fail("expire failed");  // passes through to the engine
    for (int h : touched) done[h].store(begun[h].load());
    updates += int(touched.size());
  }
  writing.store(false);
  for (std::thread& t : readers) t.join();

  INFO("updates " << updates << "; searches direct " << searches[0] << ", batching " << searches[1] << ", batches "
                  << searches[2] << "; overlapped " << overlapped[0] << ", " << overlapped[1] << ", " << overlapped[2]
                  << "; BatchingBackend batches " << batching.counts().batches << " for " << batching.counts().searches);
  INFO("first failure: " << failure);
  REQUIRE(failure.empty());
  // The searches really raced the updates, on every path.
  for (auto& o : overlapped) REQUIRE(o.load() >= 20);

  // Quiet now: every search sees exactly the last state of every hot ad.
  std::array<int, kHot> last{};
  for (int h = 0; h < kHot; ++h) last[h] = done[h].load();
  for (int r = 0; r < kRequests; ++r) {
    auto top = batching.search(s.requests[r]);
    REQUIRE(top);
    check(last, last, &r, &*top, 1);
    REQUIRE(failure.empty());
  }
}

TEST_CASE("CPU backend: an update is seen by the very next search", "[retrieval][backend]") {
  const Setup s;
  CpuRetrievalBackend cpu(s.workload.schema(), s.model, 1);
  BatchingBackend batching(cpu);
  REQUIRE(cpu.upsert(s.background));
  // Walk one hot ad through every transition between states, searching after each call returns.
  const std::vector<int> states = {0, 1, 2, 3, 0, 4, 1, 3, 2, 4, 3, 1, 0, 2, 0, 4, 2, 1, 4, 0, 3, 4};
  for (std::size_t n = 0; n < states.size(); ++n) {
    const int state = states[n];
    if (state == kExpired) {
      const std::uint32_t id = kHotBase;
      REQUIRE(cpu.expire(std::span<const std::uint32_t>(&id, 1)));
    } else {
      const AdRecord ad = s.hot(0, state);
      REQUIRE(batching.upsert(std::span<const AdRecord>(&ad, 1)));
    }
    for (int r = 0; r < kRequests; ++r)
      for (RetrievalBackend* backend : {static_cast<RetrievalBackend*>(&cpu), static_cast<RetrievalBackend*>(&batching)}) {
        auto top = backend->search(s.requests[r]);
        REQUIRE(top);
        std::string why;
        auto hot = hot_scores(s, r, *top, why);
        INFO("step " << n << " state " << state << " request " << r << " " << why);
        REQUIRE(hot);
        REQUIRE(matches(s, state, r, (*hot)[0]));
        for (int h = 1; h < kHot; ++h) REQUIRE(!(*hot)[h]);
      }
  }
}

}  // namespace kevo_tests::retrieval_backend_updates_test
