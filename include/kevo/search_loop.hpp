// kevo/search_loop.hpp: the search loop that composes kevo's components.
//
//   retrieve knowledge -> synthesize candidates -> evaluate (in parallel) -> update tree and policy
//      ^                                                                             |
//      +------------------ until target reached, budget spent, or stagnation --------+
//
// The loop runs on one Boost.Asio io_context; generations and evaluations run on a worker pool and
// post their results back, so it keeps `jobs` of them in flight and reacts as each one finishes.
// Policies, memory operators and retrievers are called only from the loop's thread. This header
// names only the components' concepts; kevo's own components, and make_search_loop that picks
// them, are in kevo/default_search_loop.hpp.
//
//   kevo::SearchLoop<MySynth, MyPolicy, MyMemory, MyEvaluator, kevo::knowledge::NullRetriever, MyStore>
//       loop(problem, synth, policy, memory, evaluator, {}, store, {.jobs = 2, .max_evaluations = 60});
//   auto result = loop.run(synth.seed());   // or loop.resume(run_id)
//
// Why one file of about 840 lines: the loop is one orchestrator, meant to be read in one sitting;
// resume, verification, repairs and skills all act on its tree and its work in flight.
#pragma once

#include <kevo/candidate.hpp>
#include <kevo/evaluator.hpp>
#include <kevo/knowledge/skill_distiller.hpp>
#include <kevo/knowledge_retriever.hpp>
#include <kevo/memory_operator.hpp>
#include <kevo/problem.hpp>
#include <kevo/search_policy.hpp>
#include <kevo/search_tree.hpp>
#include <kevo/store.hpp>
#include <kevo/synthesizer.hpp>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <fmt/format.h>

#include <chrono>
#include <csignal>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace kevo {

/// Why a search stopped. Exactly one reason is reported: the first that held.
enum class StopReason : std::uint8_t {
  target_reached,
  evaluation_budget,
  wall_time,
  stagnation,             ///< no improvement in `patience` evaluations
  synthesizer_exhausted,  ///< it failed to propose anything new many times in a row
  interrupted,            ///< SIGINT or SIGTERM; finished work is stored, resume continues it
};

inline constexpr std::string_view to_string(StopReason r) {
  switch (r) {
    case StopReason::target_reached: return "target_reached";
    case StopReason::evaluation_budget: return "evaluation_budget";
    case StopReason::wall_time: return "wall_time";
    case StopReason::stagnation: return "stagnation";
    case StopReason::synthesizer_exhausted: return "synthesizer_exhausted";
    case StopReason::interrupted: return "interrupted";
  }
  return "?";
}

using FailureCounts = std::map<FailureKind, std::size_t>;

/// What the loop reports after each finished evaluation.
struct Progress {
  std::size_t evaluations = 0;  ///< finished, the seed included
  std::size_t in_flight = 0;
  double best_speedup = 0;
  NodeId best_node = 0;
  FailureCounts failures;
  double elapsed_seconds = 0;
  double evaluations_per_second = 0;
  NodeId node = 0;  ///< the node that just finished
  NodeKey node_key = no_key;  ///< the same node as the store names it: what people are shown
  NodeKey best_key = no_key;  ///< the best node as the store names it
  const Candidate* candidate = nullptr;
  const Evaluation* evaluation = nullptr;
  bool new_best = false;
  bool repair = false;  ///< the node was a repair of its failed parent
};

/// What came of repair moves (only a synthesizer that repairs is asked for them): "repaired 7 of 9
/// failing candidates within 2 tries".
struct RepairCounts {
  std::size_t requested = 0;   ///< repair generations asked of the synthesizer
  std::size_t succeeded = 0;   ///< of them, ones whose candidate was correct
  std::size_t candidates = 0;  ///< failing candidates (the seed included) a repair was asked for
  std::size_t repaired = 0;    ///< of them, ones a repair made correct within `within` tries
  std::size_t within = 2;

  /// The fraction of failing candidates repaired within `within` tries (0 when none was tried).
  double fraction() const { return candidates == 0 ? 0.0 : static_cast<double>(repaired) / static_cast<double>(candidates); }
  std::string summary() const {
    if (requested == 0) return "no repairs";
    return fmt::format("repaired {} of {} failing candidate{} within {} tries ({} of {} repair{} correct)", repaired, candidates,
                       candidates == 1 ? "" : "s", within, succeeded, requested, requested == 1 ? "" : "s");
  }
};

struct SearchResult {
  StopReason stopped_because = StopReason::evaluation_budget;
  std::int64_t run_id = 0;
  std::size_t evaluations = 0;
  NodeId best_node = 0;           ///< the best node's id in the loop's tree (loop.candidate(best_node))
  NodeKey best_key = no_key;      ///< the same node as the store names it (runs.best_node): what people are shown
  std::shared_ptr<const Candidate> best_candidate;
  double best_speedup = 0;        ///< as the search measured it
  double verified_speedup = 0;    ///< re-checked on fresh inputs and re-timed against the reference
  bool verified = false;
  std::string verification_message;
  FailureCounts failures;
  double elapsed_seconds = 0;
  double reference_seconds = 0;   ///< the reference time the run's speedups are over (0: the evaluator's own)
  bool reference_from_store = false;  ///< a resume reused the time stored with the run rather than re-timing it
  RepairCounts repairs;           ///< repair moves asked and their outcome, over the whole run (a resume counts the earlier ones from the tree)
};

/// This host's architecture, in the knowledge base's words.
inline std::string host_architecture() {
#if defined(__x86_64__)
  return "x86-64";
#elif defined(__aarch64__)
  return "aarch64";
#else
  return {};
#endif
}

struct SearchArguments {
  std::size_t jobs = 2;                  ///< generations and evaluations in flight
  std::size_t max_evaluations = 64;      ///< children of the seed to evaluate (the budget)
  double max_wall_seconds = 0;           ///< 0: no limit
  double target_speedup = 0;             ///< 0: no target
  std::size_t patience = 0;              ///< stop after this many results without a new best; 0: never
  std::uint64_t seed = 1;
  std::size_t warm_start = 4;            ///< best candidates of earlier runs of this problem to start from
  bool warm_start_any_target = false;    ///< warm-start from runs measured on other devices or compilers too
  bool retime_new_best = true;           ///< re-time a new best against the old one before accepting it
  bool retime_reference = false;         ///< on resume, use the evaluator's new reference time rather than the run's stored one
  bool handle_signals = false;           ///< stop cleanly on SIGINT/SIGTERM
  std::size_t max_consecutive_generation_failures = 16;
  std::size_t seed_repairs = 2;          ///< with a synthesizer that repairs: repairs of a broken seed before it is an error
  std::string settings_json = "{}";      ///< recorded with the run, for resuming it the same way
  std::string architecture = host_architecture();  ///< what knowledge retrieval targets, e.g. "x86-64", "sm_90a"
  std::function<void(const Progress&)> on_progress;
};

/// Whether a stored run can be resumed with `problem`: the same name, and (where the store recorded
/// it) the same manifest, reference and template. The error names both problems.
inline expected<void, Error> check_resumable(const RunInfo& run, const Problem& problem) {
  if (run.problem != problem.name)
    return make_error(fmt::format("run {} was made on problem '{}' ({}), not on '{}' ({}): resume it with that problem, or start "
                                  "a new run (another store) for '{}'",
                                  run.id, run.problem, run.problem_dir, problem.name, problem.directory.string(), problem.name));
  if (!run.problem_identity.empty() && run.problem_identity != problem.identity())
    return make_error(fmt::format("run {} was made on problem '{}' as it was then ({}, identity {}); its manifest, reference or "
                                  "template has changed since (identity {} now), so its figures are not this problem's: start a new run",
                                  run.id, run.problem, run.problem_dir, run.problem_identity, problem.identity()));
  return {};
}

/// Whether a stored run's figures were measured where this evaluator measures (`target_identity`,
/// empty where unknown: an older store, or an evaluator not yet prepared). Figures from another
/// device or compiler do not compare with this one's, so such a run is not continued here.
inline expected<void, Error> check_same_target(const RunInfo& run, const std::string& here) {
  if (run.target_identity.empty() || here.empty() || run.target_identity == here) return {};
  return make_error(fmt::format("run {} was measured on another target ({}) than this one ({}): its figures do not compare with "
                                "this machine's. Start a new run here; --warm-start-any-target seeds it with that run's best kernels",
                                run.id, run.target_identity, here));
}

namespace detail {
inline std::uint64_t mix(std::uint64_t a, std::uint64_t b) {
  std::uint64_t x = a ^ (b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2));
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  return x ^ (x >> 29);
}
}  // namespace detail

// The head takes any types, so that a component missing a member meets the check_* below, whose
// message names the member, rather than a constrained head's generic "constraints not satisfied".
template <class Synth, class Policy, class Memory, class Eval, class Retriever, class Store>
class SearchLoop {
  static_assert(check_synthesizer<Synth>() && check_search_policy<Policy>() && check_memory_operator<Memory>() &&
                check_evaluator<Eval>() && check_knowledge_retriever<Retriever>() && check_search_store<Store>());

 public:
  using Arguments = SearchArguments;

  SearchLoop(const Problem& problem, Synth synth, Policy policy, Memory memory, Eval& evaluator, Retriever retriever,
             Store& store, Arguments args)
      : problem_(&problem),
        synth_(std::move(synth)),
        policy_(std::move(policy)),
        memory_(std::move(memory)),
        evaluator_(&evaluator),
        retriever_(std::move(retriever)),
        store_(&store),
        args_(std::move(args)),
        rng_(args_.seed) {
    if (args_.jobs == 0) args_.jobs = 1;
    kevo::enable_repairs(policy_, synthesizer_repairs<Synth>);
  }

  /// Starts a new run from `seed` (the tree's root), warm-started from earlier runs in the store
  /// that were measured on the evaluator's target (its `target_identity()`, where it has one).
  expected<SearchResult, Error> run(Candidate seed) {
    RunInfo info{.problem = problem_->name,
                 .problem_dir = problem_->directory.string(),
                 .settings_json = args_.settings_json,
                 .problem_identity = problem_->identity()};
    if constexpr (detail::evaluator_times_reference<Eval>) info.reference_seconds = evaluator_->reference_seconds();
    if constexpr (detail::evaluator_names_target<Eval>) info.target_identity = evaluator_->target_identity();
    reference_seconds_ = info.reference_seconds;
    auto run = store_->begin_run(info);
    if (!run) return unexpected(run.error());
    run_id_ = *run;
    if (auto ok = adopt_node(tree_.root(), no_key, std::move(seed), MemoryMode::fresh); !ok) return unexpected(ok.error());
    to_evaluate_.push_back(tree_.root());

    if (args_.warm_start > 0) {
      auto earlier = best_of_earlier_runs(info.target_identity);
      if (!earlier) return unexpected(earlier.error());
      for (auto& candidate : *earlier) {
        if (hash_to_node_.count(candidate.hash()) || started_ >= args_.max_evaluations) continue;
        const NodeId child = tree_.add_child(tree_.root());
        policy_.on_expand(tree_, child);
        if (auto ok = adopt_node(child, keys_[tree_.root()], std::move(candidate), MemoryMode::fresh); !ok)
          return unexpected(ok.error());
        to_evaluate_.push_back(child);
        ++started_;
      }
    }
    return drive();
  }

  /// Continues a stored run: finished evaluations are replayed into the tree and policy, and
  /// candidates whose evaluation had not finished are evaluated now. Nothing finished runs twice,
  /// except a new best whose side-by-side race had not settled its figure: it is evaluated (and
  /// raced) again. A run made on another problem, or on this one before it changed, is refused.
  /// Speedups stay over the reference time stored with the run, unless `retime_reference`.
  expected<SearchResult, Error> resume(std::int64_t run_id) {
    auto info = store_->find_run(run_id);
    if (!info) return unexpected(info.error());
    if (auto ok = check_resumable(*info, *problem_); !ok) return unexpected(ok.error());
    if constexpr (detail::evaluator_names_target<Eval>)
      if (auto ok = check_same_target(*info, evaluator_->target_identity()); !ok) return unexpected(ok.error());
    auto stored = store_->load_nodes(run_id);
    if (!stored) return unexpected(stored.error());
    if (stored->empty()) return make_error(fmt::format("run {} holds no nodes to resume", run_id));
    run_id_ = run_id;
    std::unordered_map<NodeKey, NodeId> node_of;
    std::vector<std::pair<std::int64_t, NodeId>> finish_order;
    double stored_reference = info->reference_seconds;
    for (auto& s : *stored) {
      NodeId id = tree_.root();
      if (s.parent != no_key) {
        auto parent = node_of.find(s.parent);
        if (parent == node_of.end()) return make_error(fmt::format("run {}: node {} has an unknown parent", run_id, s.key));
        id = tree_.add_child(parent->second);
        policy_.on_expand(tree_, id);
        ++started_;
      } else if (!node_of.empty()) {
        return make_error(fmt::format("run {}: more than one root", run_id));
      }
      node_of[s.key] = id;
      remember(id, s.key, std::make_shared<const Candidate>(std::move(s.candidate)));
      if (s.evaluation && s.evaluation->reference_seconds > 0 && stored_reference <= 0)
        stored_reference = s.evaluation->reference_seconds;  // a store older than runs.reference_seconds
      if (s.evaluation && s.settled) {
        evaluations_[id] = *s.evaluation;
        finish_order.emplace_back(s.finish_order, id);
      } else {
        to_evaluate_.push_back(id);
      }
    }
    std::sort(finish_order.begin(), finish_order.end());
    for (auto [order, id] : finish_order) {
      const Evaluation& e = evaluations_[id];
      tree_.record(id, e.failure, e.speedup, e.diagnostics.bottleneck);
      policy_.on_result(tree_, id);
      if (!e.ok()) ++failures_[e.failure];
    }
    rng_.seed(detail::mix(args_.seed, finish_order.size()));
    if constexpr (synthesizer_repairs<Synth>) restore_repair_counts();
    if (stored_reference > 0 && !args_.retime_reference) {
      reference_seconds_ = stored_reference;
      reference_from_store_ = true;
    } else {
      if constexpr (detail::evaluator_times_reference<Eval>) reference_seconds_ = evaluator_->reference_seconds();
      if constexpr (detail::store_keeps_reference_seconds<Store>)
        if (reference_seconds_ > 0)
          if (auto ok = store_->set_reference_seconds(run_id_, reference_seconds_); !ok) return unexpected(ok.error());
    }
    return drive();
  }

  const SearchTree& tree() const { return tree_; }
  Synth& synthesizer() { return synth_; }
  Policy& policy() { return policy_; }
  Retriever& retriever() { return retriever_; }
  const Candidate& candidate(NodeId id) const { return *candidates_.at(id); }
  const Evaluation& evaluation(NodeId id) const { return evaluations_.at(id); }

 private:
  /// The best candidates of earlier runs on `target_identity` (a store that cannot tell targets
  /// apart, or `warm_start_any_target`: on any target).
  expected<std::vector<Candidate>, Error> best_of_earlier_runs(const std::string& target_identity) {
    if constexpr (detail::store_warm_starts_by_target<Store>)
      return store_->best_of_earlier_runs(problem_->name, args_.warm_start_any_target ? std::string() : target_identity, run_id_,
                                          args_.warm_start);
    else
      return store_->best_of_earlier_runs(problem_->name, run_id_, args_.warm_start);
  }

  expected<void, Error> adopt_node(NodeId id, NodeKey parent_key, Candidate candidate, MemoryMode mode,
                                   NodeKey mate_key = no_key) {
    auto key = store_->add_node(run_id_, parent_key, mate_key, candidate, mode);
    if (!key) return unexpected(key.error());
    remember(id, *key, std::make_shared<const Candidate>(std::move(candidate)));
    return {};
  }

  void remember(NodeId id, NodeKey key, std::shared_ptr<const Candidate> candidate) {
    if (candidates_.size() <= id) {
      candidates_.resize(id + 1);
      keys_.resize(id + 1, no_key);
      evaluations_.resize(id + 1);
    }
    if (!candidate->source.empty()) hash_to_node_.emplace(candidate->hash(), id);
    candidates_[id] = std::move(candidate);
    keys_[id] = key;
  }

  expected<SearchResult, Error> drive() {
    boost::asio::io_context io;
    boost::asio::thread_pool workers(args_.jobs);
    auto synth_strand = boost::asio::make_strand(workers);
    auto guard = boost::asio::make_work_guard(io);
    std::optional<boost::asio::signal_set> signals;
    if (args_.handle_signals) {
      signals.emplace(io, SIGINT, SIGTERM);
      // The first signal stops the search cleanly; the set then lets go of the signals, so that a
      // second one ends the process at once (whatever finished is in the store either way).
      signals->async_wait([this, &signals](const boost::system::error_code& ec, int) {
        if (ec) return;
        stop(StopReason::interrupted);
        boost::system::error_code ignored;
        signals->clear(ignored);
      });
    }
    // The synthesizer learns what the tree already holds (a resumed run, warm starts) before any
    // generation starts: afterwards it is only ever called from its own strand.
    if constexpr (detail::synthesizer_remembers<Synth>)
      for (const auto& c : candidates_)
        if (c && !c->source.empty()) synth_.remember(*c);
    io_ = &io;
    workers_ = &workers;
    synth_strand_ = &synth_strand;
    start_time_ = std::chrono::steady_clock::now();

    boost::asio::post(io, [this] { launch(); });
    done_ = [&] {
      if (signals) {
        boost::system::error_code ignored;
        signals->cancel(ignored);  // the wait, which would keep io.run() going
        signals->clear(ignored);   // the signals: the final re-check can be interrupted outright
      }
      guard.reset();
    };
    io.run();
    workers.join();
    // A broken seed that no repair made good is the same clear error as without repairs.
    if constexpr (synthesizer_repairs<Synth>)
      if (!error_ && seed_broken() && stop_reason_ != StopReason::interrupted) error_ = seed_error();
    if (error_) return unexpected(*error_);
    return finish();
  }

  /// Fills the free slots: pending evaluations first, then new generations.
  void launch() {
    check_stop();
    while (!stopping_ && in_flight_ < args_.jobs) {
      if (!to_evaluate_.empty()) {
        const NodeId id = to_evaluate_.front();
        to_evaluate_.pop_front();
        ++in_flight_;
        start_evaluation(id);
        continue;
      }
      // Nothing can be generated before the seed's evaluation tells the policy where it stands.
      if (tree_[tree_.root()].state == NodeState::pending) break;
      // A failed seed ends the run, unless a synthesizer that repairs can fix it (or already did).
      if (synthesizer_repairs<Synth> ? seed_broken() : tree_[tree_.root()].state == NodeState::failed) {
        if constexpr (synthesizer_repairs<Synth>) {
          // A synthesizer that repairs is asked to fix the seed, one try at a time, before the
          // search gives up on it.
          if (seed_repair_in_flight_) break;
          if (seed_repairs() < args_.seed_repairs && started_ < args_.max_evaluations && repairable(evaluations_[0].failure)) {
            ++in_flight_;
            ++started_;
            seed_repair_in_flight_ = true;  // start_generation counts the try
            start_generation(Expansion{tree_.root(), no_node, true});
            continue;
          }
          if (in_flight_ > 0) break;  // a warm start still being evaluated may yet be correct
        }
        fail(seed_error());
        break;
      }
      if (started_ >= args_.max_evaluations) break;
      ++in_flight_;
      ++started_;
      start_generation();
    }
    if (in_flight_ == 0 && (stopping_ || started_ >= args_.max_evaluations || error_)) {
      if (!stop_reason_) stop_reason_ = StopReason::evaluation_budget;
      done_();
    }
  }

  GenerationRequest make_request(const Expansion& e, NodeId child) {
    GenerationRequest r;
    r.problem = problem_;
    r.target = problem_->target;
    r.parent = attempt(e.parent);
    if (const NodeId gp = tree_[e.parent].parent; gp != no_node) r.grandparent = attempt(gp);
    if (e.mate != no_node) r.mate = attempt(e.mate);
    const MemoryContext context = memory_.context(tree_, e.parent);
    r.memory_mode = context.mode;
    // (A memory operator may name nodes still in flight: they have nothing to show yet.)
    auto shown = [&](NodeId n) { return n < tree_.size() && tree_[n].state != NodeState::pending; };
    for (NodeId n : context.trajectory)
      if (shown(n)) r.trajectory.push_back(attempt(n));
    for (NodeId n : context.siblings)
      if (shown(n)) r.siblings.push_back(attempt(n));
    const Evaluation& pe = r.parent.evaluation;
    r.knowledge = retriever_.retrieve(KnowledgeQuery{.target = problem_->target,
                                                     .architecture = args_.architecture,
                                                     .bottleneck = pe.diagnostics.bottleneck,
                                                     .failure = pe.failure,
                                                     .error_text = pe.diagnostics.detail,
                                                     .operator_class = problem_->name,
                                                     .problem_words = problem_->description});
    r.seed = detail::mix(args_.seed, child);
    r.repair = e.repair;
    r.repair_try = e.repair ? repair_tries_[e.parent] : 0;
    return r;
  }

  /// A resumed run's repairs so far, rebuilt from its tree, so that the summary counts the whole run:
  /// a failed node is expanded only by repairs, so each of its children is one, the k-th its k-th try.
  /// Generations that gave no candidate left no node, and are not counted in `requested`.
  void restore_repair_counts() {
    for (NodeId id = 0; id < tree_.size(); ++id) {
      const NodeId parent = tree_[id].parent;
      if (parent == no_node || tree_[parent].state != NodeState::failed) continue;
      count_repair_try(parent, id);  // one still to evaluate counts when it finishes, as it would have
      if (tree_[id].state == NodeState::evaluated) count_repair_success(id);
    }
  }

  /// `child` as its failed parent's next repair try.
  void count_repair_try(NodeId parent, NodeId child) {
    std::uint32_t& tries = repair_tries_[parent];
    if (tries == 0) ++repairs_.candidates;
    ++tries;
    ++repairs_.requested;
    if (repair_try_.size() <= child) repair_try_.resize(child + 1, 0);
    repair_try_[child] = tries;
  }

  /// A repair that came out correct: its parent counts as repaired if this was a try within `within`.
  void count_repair_success(NodeId repair) {
    ++repairs_.succeeded;
    if (repair_try_[repair] <= repairs_.within && repaired_.insert(tree_[repair].parent).second) ++repairs_.repaired;
  }

  /// The seed failed and nothing correct has been found since (a repair, a warm start).
  bool seed_broken() const { return tree_[tree_.root()].state == NodeState::failed && tree_.best_speedup() <= 0; }

  Error seed_error() const {
    const Evaluation& seed = evaluations_[tree_.root()];
    return Error{fmt::format("the seed candidate failed ({}): {}{}", to_string(seed.failure), seed.diagnostics.message,
                             seed_repairs() == 0 ? std::string()
                                                 : fmt::format(" ({} repair{} of it failed too)", seed_repairs(), seed_repairs() == 1 ? "" : "s"))};
  }

  /// Repairs asked for the seed so far (on resume: the seed's children, every one of them a repair).
  std::size_t seed_repairs() const {
    const auto it = repair_tries_.find(tree_.root());
    return it == repair_tries_.end() ? 0 : it->second;
  }

  Attempt attempt(NodeId id) const { return Attempt{id, candidates_[id], evaluations_[id]}; }

  void start_generation(std::optional<Expansion> forced = std::nullopt) {
    Expansion e = forced ? *forced : policy_.select(tree_, rng_);
    // A user's policy may name any id: only a finished node has a candidate and a result to build on.
    auto finished = [&](NodeId n) { return n < tree_.size() && tree_[n].state != NodeState::pending; };
    if (!finished(e.parent) || (e.mate != no_node && !finished(e.mate))) {
      fail(Error{fmt::format("the search policy chose node {}{} to expand; select() must name finished nodes (evaluated or failed)",
                             e.parent, e.mate != no_node ? fmt::format(" with mate {}", e.mate) : std::string())});
      --in_flight_;
      --started_;
      return;
    }
    // A repair is of a failed node, and only for a synthesizer that repairs; otherwise it is a plain expansion.
    if (e.repair && (!synthesizer_repairs<Synth> || tree_[e.parent].state != NodeState::failed)) e.repair = false;
    const NodeId child = tree_.add_child(e.parent);
    policy_.on_expand(tree_, child);
    if (e.repair) count_repair_try(e.parent, child);
    generate(child, e, make_request(e, child), 0);
  }

  void generate(NodeId child, Expansion e, GenerationRequest request, int tries) {
    auto work = [this, child, e, request = std::move(request), tries]() mutable {
      expected<Candidate, Error> result = make_error("the synthesizer threw");
      try {
        result = synth_.generate(request);
      } catch (const std::exception& ex) {
        result = make_error(fmt::format("the synthesizer threw: {}", ex.what()));
      }
      boost::asio::post(*io_, [this, child, e, request = std::move(request), tries, result = std::move(result)]() mutable {
        on_generated(child, e, std::move(request), tries, std::move(result));
      });
    };
    if constexpr (detail::synthesizer_says_concurrent<Synth>) {
      if (Synth::concurrent_generation) return boost::asio::post(*workers_, std::move(work));
    }
    boost::asio::post(*synth_strand_, std::move(work));
  }

  void on_generated(NodeId child, Expansion e, GenerationRequest request, int tries, expected<Candidate, Error> result) {
    if (result && hash_to_node_.count(result->hash())) {
      if (tries < 4) {  // a repeat: ask again with another seed rather than evaluate it twice
        request.seed = detail::mix(request.seed, tries + 1);
        return generate(child, e, std::move(request), tries + 1);
      }
      result = make_error(fmt::format("the synthesizer repeated node {} five times", hash_to_node_[result->hash()]));
    }
    if (!result) {
      Candidate placeholder{{}, {}, result.error().message};
      if (auto ok = adopt_node(child, keys_[e.parent], std::move(placeholder), request.memory_mode); !ok) return abandon(ok.error());
      Evaluation failed;
      failed.failure = FailureKind::generation_failed;
      failed.diagnostics.message = result.error().message;
      ++consecutive_generation_failures_;
      return finish_node(child, std::move(failed));
    }
    consecutive_generation_failures_ = 0;
    const NodeKey mate_key = e.mate != no_node ? keys_[e.mate] : no_key;
    if (auto ok = adopt_node(child, keys_[e.parent], std::move(*result), request.memory_mode, mate_key); !ok) return abandon(ok.error());
    start_evaluation(child);
  }

  void start_evaluation(NodeId id) {
    boost::asio::post(*workers_, [this, id, candidate = candidates_[id], seed = detail::mix(args_.seed ^ 0x5eed, keys_[id])] {
      Evaluation e;
      try {
        e = evaluator_->evaluate(*candidate, seed);
      } catch (const std::exception& ex) {
        e.failure = FailureKind::sandbox_error;
        e.diagnostics.message = fmt::format("the evaluator threw: {}", ex.what());
      }
      boost::asio::post(*io_, [this, id, e = std::move(e)]() mutable { on_evaluated(id, std::move(e)); });
    });
  }

  /// On a resumed run, a figure over the reference time stored with the run rather than the one
  /// the evaluator measured now (a loaded machine would make this segment's speedups another scale).
  void over_stored_reference(Evaluation& e) const {
    if (!reference_from_store_ || !e.ok() || e.seconds <= 0 || e.reference_seconds <= 0 || e.reference_seconds == reference_seconds_)
      return;
    e.diagnostics.detail += fmt::format("{}speedup over the run's stored reference time, {:.4g} ms (re-timed now: {:.4g} ms)",
                                        e.diagnostics.detail.empty() ? "" : "; ", reference_seconds_ * 1e3, e.reference_seconds * 1e3);
    e.reference_seconds = reference_seconds_;
    e.speedup = reference_seconds_ / e.seconds;
  }

  /// Stores a node's evaluation; `settled` is false for a first figure that its race has yet to settle.
  expected<void, Error> store_evaluation(NodeId id, const Evaluation& e, bool settled) {
    if constexpr (detail::store_marks_unsettled<Store>)
      return store_->add_evaluation(run_id_, keys_[id], e, settled);
    else
      return store_->add_evaluation(run_id_, keys_[id], e);
  }

  void on_evaluated(NodeId id, Evaluation e) {
    over_stored_reference(e);
    const NodeId incumbent = tree_.best();
    const bool challenges = args_.retime_new_best && e.ok() && id != tree_.root() && incumbent != id &&
                            tree_[incumbent].state == NodeState::evaluated && e.speedup > tree_.best_speedup();
    if (!challenges) return finish_node(id, std::move(e));
    // The race takes several runs: the first measurement is stored now, marked unsettled, so that
    // a kill during it loses nothing finished (resume then races the node again rather than trust
    // that figure); settling it replaces the row.
    if (auto ok = store_evaluation(id, e, false); !ok) return abandon(ok.error());
    // A new best is only accepted once it wins side by side: noise must not pick it. Where the
    // evaluator can race a candidate against the reference itself, that one race (half the runs of
    // two) settles it: the reference is the yardstick that every best was raced against, so drift
    // between races cancels, and the figure recorded is a side-by-side one, not chained through the
    // incumbent's. Else the challenger races the incumbent.
    // The worker gets its own references to both candidates: candidates_ may grow meanwhile.
    boost::asio::post(*workers_, [this, id, incumbent, e = std::move(e), challenger = candidates_[id],
                                  holder = candidates_[incumbent], seed = detail::mix(args_.seed, ~keys_[id])]() mutable {
      expected<Comparison, Error> race = make_error("the evaluator threw");
      bool against_reference = false;
      try {
        if constexpr (detail::evaluator_races_reference<Eval>) {
          race = evaluator_->compare_with_reference(*challenger, seed);
          against_reference = true;
        } else {
          race = evaluator_->compare(*challenger, *holder, seed);
        }
      } catch (const std::exception& ex) {
        race = make_error(ex.what());
      }
      boost::asio::post(*io_, [this, id, incumbent, e = std::move(e), race = std::move(race), against_reference]() mutable {
        settle_challenge(id, incumbent, std::move(e), race, against_reference);
      });
    });
  }

  void settle_challenge(NodeId id, NodeId incumbent, Evaluation e, const expected<Comparison, Error>& race, bool against_reference) {
    auto note = [&](const std::string& text) { e.diagnostics.message += (e.diagnostics.message.empty() ? "" : "; ") + text; };
    const std::string rival = against_reference ? "the reference" : fmt::format("node {}", incumbent);
    if (race && race->challenger_failure != FailureKind::none) {  // correct once, wrong on other inputs: not correct
      e.failure = race->challenger_failure;
      e.speedup = 0;
      note(fmt::format("failed when re-checked beside {}: {}", rival, race->challenger_message));
      return finish_node(id, std::move(e));
    }
    if (!race || race->challenger_seconds <= 0) {
      note(fmt::format("re-timing failed ({}); kept its first measurement", race ? "no time" : race.error().message));
      return finish_node(id, std::move(e));
    }
    const double measured = e.speedup;
    const double incumbent_speedup = tree_[incumbent].speedup;
    const double ratio = race->incumbent_seconds / race->challenger_seconds;
    e.speedup = against_reference ? ratio : incumbent_speedup * ratio;
    if (against_reference)
      note(fmt::format("re-timed: {:.2f}x over the reference side by side (first measured {:.2f}x; node {} holds {:.2f}x)", e.speedup,
                       measured, incumbent, incumbent_speedup));
    else
      note(fmt::format("re-timed: {:.3f}x of node {} side by side, {:.2f}x over the reference (first measured {:.2f}x)", ratio, incumbent,
                       e.speedup, measured));
    finish_node(id, std::move(e));
  }

  void finish_node(NodeId id, Evaluation e) {
    const NodeId previous_best = tree_.best();
    tree_.record(id, e.failure, e.speedup, e.diagnostics.bottleneck);
    evaluations_[id] = std::move(e);
    const Evaluation& done = evaluations_[id];
    if (auto ok = store_evaluation(id, done, true); !ok) return abandon(ok.error());
    policy_.on_result(tree_, id);
    if (!done.ok()) ++failures_[done.failure];
    const bool repair = id < repair_try_.size() && repair_try_[id] > 0;
    if (repair) {
      if (tree_[id].parent == tree_.root()) seed_repair_in_flight_ = false;
      if (done.ok()) count_repair_success(id);
    }
    --in_flight_;
    ++finished_here_;
    learn_skill(id);

    if (args_.on_progress) {
      Progress p;
      p.evaluations = tree_.finished();
      p.in_flight = in_flight_;
      p.best_speedup = tree_.best_speedup();
      p.best_node = tree_.best();
      p.failures = failures_;
      p.elapsed_seconds = elapsed();
      p.evaluations_per_second = p.elapsed_seconds > 0 ? finished_here_ / p.elapsed_seconds : 0;
      p.node = id;
      p.node_key = keys_[id];
      p.best_key = keys_[p.best_node];
      p.candidate = candidates_[id].get();
      p.evaluation = &done;
      p.new_best = tree_.best() != previous_best;
      p.repair = repair;
      args_.on_progress(p);
    }
    launch();
  }

  /// A child that clearly beat its parent (by 5% or more, beyond timing noise) is distilled into a
  /// skill for the knowledge base.
  void learn_skill(NodeId id) {
    const NodeId parent = tree_[id].parent;
    if (parent == no_node || tree_[id].state != NodeState::evaluated || tree_[parent].state != NodeState::evaluated) return;
    if (tree_[id].speedup < 1.05f * tree_[parent].speedup) return;
    if (auto skill = knowledge::distill_skill(*problem_, *candidates_[parent], evaluations_[parent], *candidates_[id],
                                              evaluations_[id])) {
      skill->node_key = keys_[id];  // provenance, and the handle to withdraw it by
      retriever_.learn(*skill);
    }
  }

  void check_stop() {
    if (stopping_) return;
    if (args_.target_speedup > 0 && tree_.best_speedup() >= args_.target_speedup) return stop(StopReason::target_reached);
    if (args_.max_wall_seconds > 0 && elapsed() >= args_.max_wall_seconds) return stop(StopReason::wall_time);
    if (args_.patience > 0 && tree_.finished_since_improvement() >= args_.patience) return stop(StopReason::stagnation);
    if (consecutive_generation_failures_ >= args_.max_consecutive_generation_failures)
      return stop(StopReason::synthesizer_exhausted);
    if constexpr (detail::synthesizer_spends_budget<Synth>) {
      if (synth_.budget_exhausted()) return stop(StopReason::synthesizer_exhausted);
    }
  }

  void stop(StopReason reason) {
    if (stopping_) return;
    stopping_ = true;
    stop_reason_ = reason;
    if (in_flight_ == 0 && done_) boost::asio::post(*io_, [this] { launch(); });
  }

  /// Records the first error and stops launching; the caller still owns its slot, if any.
  void fail(Error error) {
    if (!error_) error_ = std::move(error);
    stopping_ = true;
  }

  /// An error in work that held a slot: give the slot back, let in-flight work finish, then stop.
  void abandon(Error error) {
    fail(std::move(error));
    --in_flight_;
    launch();
  }

  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time_).count();
  }

  /// Re-checks the best on fresh inputs and re-times it against the reference, then closes the run.
  /// An interrupted run is left open (no re-check, no finish recorded), so that resume continues it.
  expected<SearchResult, Error> finish() {
    SearchResult r;
    r.stopped_because = stop_reason_.value_or(StopReason::evaluation_budget);
    r.run_id = run_id_;
    r.evaluations = tree_.finished();
    r.best_node = tree_.best();
    r.best_key = keys_[r.best_node];
    r.best_candidate = candidates_[r.best_node];
    r.reference_seconds = reference_seconds_;
    r.reference_from_store = reference_from_store_;
    r.best_speedup = tree_.best_speedup();
    r.failures = failures_;
    r.repairs = repairs_;
    r.elapsed_seconds = elapsed();
    if (r.stopped_because == StopReason::interrupted) {
      r.verification_message = "interrupted: the finished evaluations are stored, and resume continues the run";
      return r;
    }

    const std::uint64_t fresh = detail::mix(args_.seed, 0xF1AA1ull + r.evaluations);
    Evaluation check = evaluator_->evaluate(*r.best_candidate, fresh);
    over_stored_reference(check);
    // A best refused now teaches nothing: the skill its improvement wrote is withdrawn.
    if (!check.ok()) {
      r.verification_message = fmt::format("the best failed its re-check on fresh inputs: {}", check.diagnostics.message);
      withdraw_skill(retriever_, problem_->name, r.best_key);
    } else if constexpr (detail::evaluator_races_reference<Eval>) {
      auto race = evaluator_->compare_with_reference(*r.best_candidate, fresh);
      if (race && race->challenger_failure != FailureKind::none) {
        r.verification_message = fmt::format("the best failed its re-check beside the reference: {}", race->challenger_message);
        withdraw_skill(retriever_, problem_->name, r.best_key);
      } else if (race && race->challenger_seconds > 0) {
        r.verified_speedup = race->incumbent_seconds / race->challenger_seconds;
        r.verified = true;
        r.verification_message = "correct on fresh inputs; re-timed side by side with the reference";
      } else {
        r.verification_message = race ? "re-timing gave no time" : race.error().message;
      }
    } else {
      r.verified_speedup = check.speedup;
      r.verified = true;
      r.verification_message = "correct on fresh inputs; re-timed";
    }
    if (auto ok = store_->finish_run(run_id_, std::string(to_string(r.stopped_because)), r.best_key, r.verified_speedup); !ok)
      return unexpected(ok.error());
    return r;
  }

  const Problem* problem_;
  Synth synth_;
  Policy policy_;
  Memory memory_;
  Eval* evaluator_;
  Retriever retriever_;
  Store* store_;
  Arguments args_;
  Rng rng_;

  SearchTree tree_;
  std::vector<std::shared_ptr<const Candidate>> candidates_;  // by node id
  std::vector<Evaluation> evaluations_;                       // by node id
  std::vector<NodeKey> keys_;                                 // by node id: the store's key
  std::unordered_map<std::uint64_t, NodeId> hash_to_node_;    // so nothing is evaluated twice
  std::deque<NodeId> to_evaluate_;
  FailureCounts failures_;
  std::int64_t run_id_ = 0;
  double reference_seconds_ = 0;      // the reference time the run's speedups are over (0: the evaluator's own)
  bool reference_from_store_ = false;  // a resume reuses the run's stored reference time
  std::size_t started_ = 0;        // children of the seed created or being generated: the budget
  std::size_t in_flight_ = 0;
  std::size_t finished_here_ = 0;  // finished in this process (the rate excludes resumed work)
  std::size_t consecutive_generation_failures_ = 0;
  RepairCounts repairs_;
  std::unordered_map<NodeId, std::uint32_t> repair_tries_;  // failed node -> repairs asked for it
  std::vector<std::uint32_t> repair_try_;                    // by node id: which try of its parent it is (0: not a repair)
  std::unordered_set<NodeId> repaired_;                      // failed nodes a repair made correct in time
  bool seed_repair_in_flight_ = false;
  bool stopping_ = false;
  std::optional<StopReason> stop_reason_;
  std::optional<Error> error_;
  std::chrono::steady_clock::time_point start_time_;
  boost::asio::io_context* io_ = nullptr;
  boost::asio::thread_pool* workers_ = nullptr;
  boost::asio::strand<boost::asio::thread_pool::executor_type>* synth_strand_ = nullptr;
  std::function<void()> done_;
};

}  // namespace kevo
