// An evaluator for the LLM loop's tests that judges candidates without compiling them: "Variant N"
// in the code runs at 1 + N/4 times the reference, and code that mentions scratch_total "does not
// compile" (a model's mistake, for repair and failure paths).
#pragma once

#include <kevo/candidate.hpp>
#include <kevo/evaluator.hpp>

#include <cstdlib>
#include <string>

namespace kevo::test {

struct VariantEvaluator {
  Evaluation evaluate(const Candidate& c, std::uint64_t) {
    Evaluation e;
    if (c.source.find("scratch_total") != std::string::npos) {
      e.failure = FailureKind::compile_error;
      e.diagnostics.message = "does not compile";
      e.diagnostics.detail = "candidate.cpp:9:3: error: 'scratch_total' was not declared in this scope\n";
      return e;
    }
    e.speedup = speedup_of(c);
    e.seconds = 1 / e.speedup;
    e.reference_seconds = 1;
    e.diagnostics.bottleneck = Bottleneck::memory;
    return e;
  }
  expected<Comparison, Error> compare(const Candidate& a, const Candidate& b, std::uint64_t) {
    return Comparison{1 / speedup_of(a), 1 / speedup_of(b)};
  }
  static double speedup_of(const Candidate& c) {
    const std::size_t at = c.source.find("Variant ");
    return at == std::string::npos ? 1.0 : 1.0 + std::atoi(c.source.c_str() + at + 8) / 4.0;
  }
};

}  // namespace kevo::test
