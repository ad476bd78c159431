// kevo/evaluator.hpp: the Evaluator concept. An evaluator compiles a candidate, checks it against
// the reference on fresh random inputs, times it and names its bottleneck. Models: eval/cpu_evaluator.hpp.
//
//   kevo::eval::CpuEvaluator evaluator(problem, options);
//   kevo::Evaluation e = evaluator.evaluate(candidate, seed);
//   auto race = evaluator.compare(challenger, incumbent, seed);   // re-timed side by side
#pragma once

#include <kevo/candidate.hpp>
#include <kevo/detail/member_named.hpp>
#include <kevo/expected.hpp>

#include <concepts>
#include <cstdint>
#include <string>

KEVO_DETAIL_MEMBER_NAMED(reference_seconds)
KEVO_DETAIL_MEMBER_NAMED(target_identity)
KEVO_DETAIL_MEMBER_NAMED(compare_with_reference)

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
// The optional hooks, each as the loop calls it.
template <class E>
concept evaluator_times_reference = requires(E& e) {
  { e.reference_seconds() } -> std::convertible_to<double>;
};
template <class E>
concept evaluator_names_target = requires(E& e) {
  { e.target_identity() } -> std::convertible_to<std::string>;
};
template <class E>
concept evaluator_races_reference = requires(E& e, const Candidate& c, std::uint64_t seed) {
  { e.compare_with_reference(c, seed) } -> std::same_as<expected<Comparison, Error>>;
};
}  // namespace detail

/// An evaluator. The loop calls it from several threads at once (`--jobs`), so a model must be
/// safe for that; it keeps timed runs one at a time itself.
/// - `evaluate(candidate, seed) -> Evaluation`: correctness on inputs drawn from `seed`, then timing;
/// - `compare(challenger, incumbent, seed) -> expected<Comparison, Error>`: both re-timed, interleaved.
///
/// Optional hooks, which the loop uses where a model has them (a member of one of these names but
/// of another shape fails check_evaluator, naming the hook):
/// - `double reference_seconds()`: the reference's time that the speedups are over, stored with the
///   run, so that a resume measures nothing again;
/// - `std::string target_identity()`: what the figures are measured on (target, device, compiler);
///   a search warm-starts only from runs with the same identity;
/// - `expected<Comparison, Error> compare_with_reference(const Candidate&, std::uint64_t seed)`: the
///   challenger raced against the reference itself, so that a new best's figure is side by side.
template <class E>
concept Evaluator = detail::evaluator_evaluates<E> && detail::evaluator_compares<E>;

template <class E>
constexpr bool check_evaluator() {
  static_assert(detail::evaluator_evaluates<E>, "Evaluator: missing `Evaluation evaluate(const Candidate&, std::uint64_t seed)`");
  static_assert(detail::evaluator_compares<E>,
                "Evaluator: missing `expected<Comparison, Error> compare(const Candidate&, const Candidate&, std::uint64_t seed)`");
  static_assert(!detail::has_member_named_reference_seconds<E> || detail::evaluator_times_reference<E>,
                "Evaluator: the optional hook `reference_seconds` must be `double reference_seconds()`: this one has another "
                "shape, and the loop would never call it");
  static_assert(!detail::has_member_named_target_identity<E> || detail::evaluator_names_target<E>,
                "Evaluator: the optional hook `target_identity` must be `std::string target_identity()`: this one has another "
                "shape, and the loop would never call it");
  static_assert(!detail::has_member_named_compare_with_reference<E> || detail::evaluator_races_reference<E>,
                "Evaluator: the optional hook `compare_with_reference` must be `expected<Comparison, Error> "
                "compare_with_reference(const Candidate&, std::uint64_t seed)`: this one has another shape, and the loop "
                "would never call it");
  return true;
}

}  // namespace kevo
