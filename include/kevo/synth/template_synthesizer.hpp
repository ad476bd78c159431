// kevo/synth/template_synthesizer.hpp: the offline synthesizer, kevo's default. It turns a kernel
// template's knobs, each over its declared domain, steered by what the tree has seen:
// - a memory-bound parent gets memory-side moves, a compute-bound one compute-side moves, a
//   latency-bound one parallelism;
// - a parent that failed backs off the knob change that broke it, and never proposes it again;
// - faster siblings lend the knob values they differ by; an improving trajectory keeps its direction;
// - a mate (from the policy) gives crossover; a fresh-start context samples the space anew;
// - the problem's starting points (knobs set together) are tried from the root first, and one
//   move in four sets two or three knobs at once: a kernel family that pays only with several
//   knobs changed (tensor cores with wide loads) is out of reach of single steps that each lose.
//
//   kevo::synth::TemplateSynthesizer synth(problem);
//   kevo::Candidate seed = synth.seed();                  // the template's default knobs
//   auto child = synth.generate(request);                 // a mutation of request.parent
#pragma once

#include <kevo/search_policy.hpp>  // Rng
#include <kevo/synthesizer.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>
#include <unordered_set>

namespace kevo::synth {

class TemplateSynthesizer {
 public:
  struct Arguments {
    double neighbour_move_rate = 0.7;  ///< step to an adjacent value, else jump anywhere in the domain
    double sibling_adoption_rate = 0.5;
    double trajectory_follow_rate = 0.3;
    double steering_weight = 3.0;      ///< how much more likely a knob on the diagnosed side is
    double compound_move_rate = 0.25;  ///< a random move sets 2..max_knobs_per_move knobs, else one
    int max_knobs_per_move = 3;
    int attempts = 64;                 ///< tries to find knobs not proposed before
  };

  explicit TemplateSynthesizer(const Problem& problem) : TemplateSynthesizer(problem, Arguments{}) {}
  TemplateSynthesizer(const Problem& problem, Arguments args) : problem_(&problem), args_(args) {}

  /// The root candidate: the template with every knob at its default.
  Candidate seed() const {
    Knobs knobs = problem_->default_knobs();
    return Candidate{problem_->render(knobs), knobs, "template defaults"};
  }

  expected<Candidate, Error> generate(const GenerationRequest& request) {
    if (problem_->knobs.empty()) return make_error("the template declares no knobs, so there is nothing to tune");
    Rng rng(request.seed);
    const Knobs parent = knobs_of(request.parent);
    learn_from_failures(request);

    if (!request.grandparent)  // the parent is the root
      if (auto start = next_starting_point(parent)) return std::move(*start);

    for (int attempt = 0; attempt < args_.attempts; ++attempt) {
      std::string why;
      Knobs child = propose(request, parent, rng, why);
      if (child == parent || is_banned(parent, child)) continue;
      std::string source = problem_->render(child);
      if (!proposed_.insert(content_hash(source)).second) continue;  // proposed before
      return Candidate{std::move(source), std::move(child), std::move(why)};
    }
    return make_error(fmt::format("no untried knob setting found near {} after {} attempts", kevo::to_string(parent),
                                  args_.attempts));
  }

  /// Marks a candidate as already known (a resumed search's tree), so it is not proposed again.
  void remember(const Candidate& c) { proposed_.insert(c.hash()); }

 private:
  /// The first of the problem's starting points not yet proposed, set over `parent`'s knobs.
  std::optional<Candidate> next_starting_point(const Knobs& parent) {
    for (const auto& point : problem_->starting_points) {
      Knobs k = parent;
      for (const auto& [name, value] : point.knobs) k[name] = value;
      if (k == parent || is_banned(parent, k)) continue;
      std::string source = problem_->render(k);
      if (!proposed_.insert(content_hash(source)).second) continue;
      return Candidate{std::move(source), std::move(k), fmt::format("starting point '{}' from the problem", point.name)};
    }
    return std::nullopt;
  }

  Knobs knobs_of(const Attempt& a) const {
    Knobs k = problem_->default_knobs();
    if (a.candidate)
      for (const auto& [name, value] : a.candidate->knobs)
        if (k.count(name)) k[name] = value;
    return k;
  }

  static std::vector<std::string> changed_knobs(const Knobs& from, const Knobs& to) {
    std::vector<std::string> out;
    for (const auto& [name, value] : to)
      if (auto it = from.find(name); it == from.end() || it->second != value) out.push_back(name);
    return out;
  }

  /// A parent or sibling that failed to build or run blames the knob values that its change set.
  void learn_from_failures(const GenerationRequest& r) {
    auto blame = [&](const Attempt& failed, const Knobs& base) {
      if (failed.evaluation.ok() || !failed.candidate) return;
      auto changed = changed_knobs(base, knobs_of(failed));
      if (changed.size() == 1) banned_.insert({changed[0], knobs_of(failed).at(changed[0])});
    };
    if (r.grandparent) blame(r.parent, knobs_of(*r.grandparent));
    for (const auto& s : r.siblings) blame(s, knobs_of(r.parent));
  }

  /// A child is banned when a knob it changes takes a value blamed for a failure.
  bool is_banned(const Knobs& parent, const Knobs& child) const {
    for (const auto& name : changed_knobs(parent, child))
      if (banned_.count({name, child.at(name)})) return true;
    return false;
  }

  Knobs propose(const GenerationRequest& r, const Knobs& parent, Rng& rng, std::string& why) {
    std::bernoulli_distribution coin_half(0.5);

    if (r.memory_mode == MemoryMode::fresh) {
      Knobs k;
      for (const auto& spec : problem_->knobs) k[spec.name] = spec.domain[uniform(rng, spec.domain.size())];
      why = "fresh start: sampled anew";
      return k;
    }

    // A failed parent: back off its change (return to the grandparent's value), then move elsewhere.
    if (!r.parent.evaluation.ok() && r.grandparent) {
      Knobs k = parent;
      const Knobs grand = knobs_of(*r.grandparent);
      auto changed = changed_knobs(grand, parent);
      for (const auto& name : changed) k[name] = grand.at(name);
      why = fmt::format("back off {} after {}", fmt::join(changed, ","), to_string(r.parent.evaluation.failure));
      mutate(k, r, rng, why, changed);
      return k;
    }

    Knobs k = parent;
    if (r.mate && r.mate->candidate) {
      const Knobs mate = knobs_of(*r.mate);
      for (auto& [name, value] : k)
        if (coin_half(rng)) value = mate.at(name);
      why = fmt::format("crossover with node {}", r.mate->node);
      if (k != parent && coin_half(rng)) return k;
    }

    // Compare siblings: adopt a value by which a faster sibling differs from the parent.
    if (!r.siblings.empty() && std::bernoulli_distribution(args_.sibling_adoption_rate)(rng)) {
      const Attempt& fastest = r.siblings.front();
      if (fastest.evaluation.ok() && fastest.evaluation.speedup > r.parent.evaluation.speedup) {
        const Knobs fast = knobs_of(fastest);
        auto diff = changed_knobs(k, fast);
        if (!diff.empty()) {
          const std::string& name = diff[uniform(rng, diff.size())];
          k[name] = fast.at(name);
          why = fmt::format("adopt {}={} from faster sibling {} ({:.2f}x)", name, k[name], fastest.node,
                            fastest.evaluation.speedup);
          if (coin_half(rng)) return k;
        }
      }
    }

    // Follow the trajectory: the last move that improved, one step further the same way.
    if (r.trajectory.size() >= 2 && std::bernoulli_distribution(args_.trajectory_follow_rate)(rng)) {
      for (std::size_t i = r.trajectory.size() - 1; i >= 1; --i) {
        const Attempt& after = r.trajectory[i];
        const Attempt& before = r.trajectory[i - 1];
        if (after.evaluation.speedup <= before.evaluation.speedup) continue;
        auto diff = changed_knobs(knobs_of(before), knobs_of(after));
        if (diff.size() != 1) break;
        const KnobSpec* spec = problem_->knob(diff[0]);
        auto from = spec->index_of(knobs_of(before).at(diff[0]));
        auto to = spec->index_of(knobs_of(after).at(diff[0]));
        if (!from || !to) break;
        const long next = static_cast<long>(*to) + (*to > *from ? 1 : -1);
        if (next >= 0 && next < static_cast<long>(spec->domain.size())) {
          k[diff[0]] = spec->domain[static_cast<std::size_t>(next)];
          why = fmt::format("continue {} {}->{} (it helped {:.2f}x->{:.2f}x)", diff[0], knobs_of(after).at(diff[0]),
                            k[diff[0]], before.evaluation.speedup, after.evaluation.speedup);
          return k;
        }
        break;
      }
    }

    why.clear();
    const int moves = std::bernoulli_distribution(args_.compound_move_rate)(rng)
                          ? std::uniform_int_distribution<int>(2, std::max(2, args_.max_knobs_per_move))(rng)
                          : 1;
    std::vector<std::string> moved;
    for (int m = 0; m < moves; ++m)
      if (auto name = mutate(k, r, rng, why, moved)) moved.push_back(*name);
      else break;
    return k;
  }

  /// One knob moved, chosen with the diagnosed side weighted up; `avoid` knobs are left alone.
  /// Returns the knob moved, if any could be.
  std::optional<std::string> mutate(Knobs& k, const GenerationRequest& r, Rng& rng, std::string& why,
                                    const std::vector<std::string>& avoid) {
    const KnobSide wanted = side_for(r.parent.evaluation.diagnostics.bottleneck);
    std::vector<double> weights;
    for (const auto& spec : problem_->knobs) {
      const bool skip = spec.domain.size() < 2 || std::find(avoid.begin(), avoid.end(), spec.name) != avoid.end();
      weights.push_back(skip ? 0.0 : (spec.side == wanted ? args_.steering_weight : 1.0));
    }
    if (std::all_of(weights.begin(), weights.end(), [](double w) { return w == 0; })) return std::nullopt;
    const KnobSpec& spec = problem_->knobs[std::discrete_distribution<std::size_t>(weights.begin(), weights.end())(rng)];
    const std::string old = k[spec.name];
    const std::size_t at = spec.index_of(old).value_or(0);
    std::size_t to = at;
    if (std::bernoulli_distribution(args_.neighbour_move_rate)(rng)) {
      if (at == 0) to = 1;
      else if (at + 1 == spec.domain.size()) to = at - 1;
      else to = std::bernoulli_distribution(0.5)(rng) ? at + 1 : at - 1;
    } else {
      while (to == at) to = uniform(rng, spec.domain.size());
    }
    k[spec.name] = spec.domain[to];
    const auto reason = wanted != KnobSide::any && spec.side == wanted
                            ? fmt::format(" ({}-bound parent)", to_string(r.parent.evaluation.diagnostics.bottleneck))
                            : std::string();
    why += fmt::format("{}mutate {} {}->{}{}", why.empty() ? "" : "; ", spec.name, old, k[spec.name], reason);
    return spec.name;
  }

  static KnobSide side_for(Bottleneck b) {
    switch (b) {
      case Bottleneck::memory: return KnobSide::memory;
      case Bottleneck::compute: return KnobSide::compute;
      case Bottleneck::latency:
      case Bottleneck::occupancy: return KnobSide::parallel;
      default: return KnobSide::any;
    }
  }

  static std::size_t uniform(Rng& rng, std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng); }

  const Problem* problem_;
  Arguments args_;
  std::unordered_set<std::uint64_t> proposed_;             // hashes of every source proposed
  std::set<std::pair<std::string, std::string>> banned_;   // knob values blamed for failures
};

static_assert(Synthesizer<TemplateSynthesizer>);
static_assert(!synthesizer_repairs<TemplateSynthesizer>);  // it backs off broken knobs itself

}  // namespace kevo::synth
