// kevo/eval/any_evaluator.hpp: an Evaluator chosen at run time (CPU or CUDA, its checked runs here or on
// Slurm), so that a program compiles the search loop once rather than once per evaluator type: kevo-search
// compiled four loops, one for each. It refers to an evaluator that outlives it and forwards what the loop
// calls, every optional hook included; so it stands only for evaluators that have all the hooks (the jailed
// ones do), since it could not say "this one has none" the way a missing member does.
//
//   kevo::eval::CpuEvaluator cpu(problem);
//   kevo::eval::AnyEvaluator evaluator(cpu);
//   kevo::SearchLoop<Synth, Policy, Memory, kevo::eval::AnyEvaluator, Retriever, Store> loop(..., evaluator, ...);
#pragma once

#include <kevo/candidate.hpp>
#include <kevo/evaluator.hpp>
#include <kevo/expected.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace kevo::eval {

/// An Evaluator with every optional hook the loop calls: what an AnyEvaluator can stand for.
template <class E>
concept EvaluatorWithAllHooks =
    Evaluator<E> && detail::evaluator_times_reference<E> && detail::evaluator_names_target<E> && detail::evaluator_races_reference<E>;

class AnyEvaluator {
 public:
  template <EvaluatorWithAllHooks E>
  explicit AnyEvaluator(E& evaluator) : self_(std::make_unique<Model<E>>(evaluator)) {}

  Evaluation evaluate(const Candidate& candidate, std::uint64_t seed) { return self_->evaluate(candidate, seed); }
  expected<Comparison, Error> compare(const Candidate& challenger, const Candidate& incumbent, std::uint64_t seed) {
    return self_->compare(challenger, incumbent, seed);
  }
  expected<Comparison, Error> compare_with_reference(const Candidate& challenger, std::uint64_t seed) {
    return self_->compare_with_reference(challenger, seed);
  }
  double reference_seconds() { return self_->reference_seconds(); }
  std::string target_identity() { return self_->target_identity(); }

 private:
  struct Interface {
    virtual ~Interface() = default;
    virtual Evaluation evaluate(const Candidate&, std::uint64_t) = 0;
    virtual expected<Comparison, Error> compare(const Candidate&, const Candidate&, std::uint64_t) = 0;
    virtual expected<Comparison, Error> compare_with_reference(const Candidate&, std::uint64_t) = 0;
    virtual double reference_seconds() = 0;
    virtual std::string target_identity() = 0;
  };
  template <class E>
  struct Model final : Interface {
    explicit Model(E& e) : evaluator(e) {}
    Evaluation evaluate(const Candidate& c, std::uint64_t seed) override { return evaluator.evaluate(c, seed); }
    expected<Comparison, Error> compare(const Candidate& a, const Candidate& b, std::uint64_t seed) override { return evaluator.compare(a, b, seed); }
    expected<Comparison, Error> compare_with_reference(const Candidate& c, std::uint64_t seed) override {
      return evaluator.compare_with_reference(c, seed);
    }
    double reference_seconds() override { return evaluator.reference_seconds(); }
    std::string target_identity() override { return evaluator.target_identity(); }
    E& evaluator;
  };
  std::unique_ptr<Interface> self_;
};

static_assert(check_evaluator<AnyEvaluator>());
static_assert(EvaluatorWithAllHooks<AnyEvaluator>);

}  // namespace kevo::eval
