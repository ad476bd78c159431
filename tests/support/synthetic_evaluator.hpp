// tests/support/synthetic_evaluator.hpp: an in-process Evaluator over a known landscape, for
// testing the loop's own logic (policies, resume, failures) without compiling anything. The real
// CPU evaluator has its own tests against the real compiler and sandbox.
#pragma once

#include <kevo/evaluator.hpp>
#include <kevo/problem.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <set>
#include <thread>

namespace kevo::testing {

/// A problem with knobs a..d over 0..7 and no files behind it.
inline Problem synthetic_problem() {
  Problem p;
  p.name = "synthetic";
  p.description = "a landscape with one peak";
  p.params = {"N"};
  p.template_source = "a=${a} b=${b} c=${c} d=${d}";
  for (const char* name : {"a", "b", "c", "d"}) {
    KnobSpec k{name, {"0", "1", "2", "3", "4", "5", "6", "7"}, "0", KnobSide::any};
    if (name[0] == 'a') k.side = KnobSide::memory;
    p.knobs.push_back(k);
  }
  return p;
}

/// Speedup peaks at a=6 b=5 c=7 d=2 (1 + 2 per step closer); knob c = 3 "fails to compile".
class SyntheticEvaluator {
 public:
  std::chrono::milliseconds delay{0};
  std::atomic<int> evaluations{0};

  Evaluation evaluate(const Candidate& c, std::uint64_t) {
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    ++evaluations;
    {
      std::lock_guard lock(mutex_);
      evaluated_.insert(c.hash());
    }
    Evaluation e;
    if (c.knobs.count("c") && c.knobs.at("c") == "3") {
      e.failure = FailureKind::compile_error;
      e.diagnostics.message = "error: c = 3 is not supported";
      return e;
    }
    e.speedup = speedup_of(c.knobs);
    e.seconds = 1.0 / e.speedup;
    e.reference_seconds = 1.0;
    e.diagnostics.bottleneck = knob(c.knobs, "a") < 6 ? Bottleneck::memory : Bottleneck::compute;
    return e;
  }

  expected<Comparison, Error> compare(const Candidate& challenger, const Candidate& incumbent, std::uint64_t) {
    return Comparison{1.0 / speedup_of(challenger.knobs), 1.0 / speedup_of(incumbent.knobs)};
  }

  static double speedup_of(const Knobs& k) {
    const int peak[4] = {6, 5, 7, 2};
    double distance = 0;
    int i = 0;
    for (const char* name : {"a", "b", "c", "d"}) distance += std::abs(knob(k, name) - peak[i++]);
    return 1.0 + 2.0 * (22.0 - distance) / 2.0;
  }
  static double best_possible() { return speedup_of({{"a", "6"}, {"b", "5"}, {"c", "7"}, {"d", "2"}}); }

  std::set<std::uint64_t> evaluated() const {
    std::lock_guard lock(mutex_);
    return evaluated_;
  }

 private:
  static int knob(const Knobs& k, const char* name) {
    auto it = k.find(name);
    return it == k.end() ? 0 : std::stoi(it->second);
  }
  mutable std::mutex mutex_;
  std::set<std::uint64_t> evaluated_;
};

static_assert(Evaluator<SyntheticEvaluator>);

}  // namespace kevo::testing
