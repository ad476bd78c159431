// kevo/evaluator.hpp: the Evaluator concept. An evaluator compiles a candidate, checks it against
// the reference on fresh random inputs, times it and names its bottleneck. Models: eval/cpu_evaluator.hpp.
//
//   kevo::eval::CpuEvaluator evaluator(problem, options);
//   kevo::Evaluation e = evaluator.evaluate(candidate, seed);
//   auto race = evaluator.compare(challenger, incumbent, seed);   // re-timed side by side
#pragma once

#include <kevo/candidate.hpp>
#include <kevo/expected.hpp>

#include <concepts>
#include <cstdint>

namespace kevo {

namespace detail {
template <class E>
concept evaluator_evaluates = requires(E& e, const Candidate& c, std::uint64_t seed) {
  { e.evaluate(c, seed) } -> std::same_as<Evaluation>;
};
template <class E>
concept evaluator_compares = requires(E& e, const Candidate& c, std::uint64_t seed) {
  { e.compare(c, c, seed) } -> std::same_as<expected<Comparison, Error>>;
};
}  // namespace detail

/// An evaluator. The loop calls it from several threads at once (`--jobs`), so a model must be
/// safe for that; it keeps timed runs one at a time itself.
/// - `evaluate(candidate, seed) -> Evaluation`: correctness on inputs drawn from `seed`, then timing;
/// - `compare(challenger, incumbent, seed) -> expected<Comparison, Error>`: both re-timed, interleaved.
template <class E>
concept Evaluator = detail::evaluator_evaluates<E> && detail::evaluator_compares<E>;

template <class E>
constexpr bool check_evaluator() {
  static_assert(detail::evaluator_evaluates<E>, "Evaluator: missing `Evaluation evaluate(const Candidate&, std::uint64_t seed)`");
  static_assert(detail::evaluator_compares<E>,
                "Evaluator: missing `expected<Comparison, Error> compare(const Candidate&, const Candidate&, std::uint64_t seed)`");
  return true;
}

}  // namespace kevo
