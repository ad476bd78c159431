// kevo/candidate.hpp: the vocabulary every component shares: a candidate kernel, the knobs it was
// built from, and what evaluating it found.
//
//   kevo::Candidate c{.source = text, .knobs = {{"vector_width", "8"}}};
//   kevo::Evaluation e = evaluator.evaluate(c, seed);
//   if (e.ok()) fmt::print("{:.2f}x\n", e.speedup);
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace kevo {

/// What a kernel is for: where it runs.
enum class Target : std::uint8_t { cpu, cuda, hip };

/// The resource that limits a correct candidate, judged against the machine's roofline.
enum class Bottleneck : std::uint8_t { unknown, memory, compute, latency, occupancy };

/// Why a candidate produced no usable timing. `none` means it compiled, ran and was correct.
enum class FailureKind : std::uint8_t {
  none,
  generation_failed,  ///< the synthesizer could not produce a candidate
  compile_error,
  crash,              ///< killed by a signal or a non-zero exit
  timeout,            ///< ran past the wall-clock limit
  cpu_time_limit,
  memory_limit,
  output_limit,       ///< printed more than the capped output size
  wrong_answer,       ///< a value differs from the reference beyond tolerance
  unwritten_output,   ///< left poisoned output elements unwritten
  bad_report,         ///< the child's JSON report was missing or malformed
  sandbox_error,      ///< kevo could not set up the child (not the candidate's fault)
  screened_out,       ///< refused before compiling: a static initializer, a forbidden call or include
  mutated_input,      ///< changed an input tensor
  replayed_output,    ///< returned an earlier call's outputs for new inputs
  implausible,        ///< measured faster than this machine's roofline allows
};

inline constexpr std::string_view to_string(Target t) {
  switch (t) {
    case Target::cpu: return "cpu";
    case Target::cuda: return "cuda";
    case Target::hip: return "hip";
  }
  return "?";
}

inline constexpr std::string_view to_string(Bottleneck b) {
  switch (b) {
    case Bottleneck::unknown: return "unknown";
    case Bottleneck::memory: return "memory";
    case Bottleneck::compute: return "compute";
    case Bottleneck::latency: return "latency";
    case Bottleneck::occupancy: return "occupancy";
  }
  return "?";
}

inline constexpr std::string_view to_string(FailureKind f) {
  switch (f) {
    case FailureKind::none: return "ok";
    case FailureKind::generation_failed: return "generation_failed";
    case FailureKind::compile_error: return "compile_error";
    case FailureKind::crash: return "crash";
    case FailureKind::timeout: return "timeout";
    case FailureKind::cpu_time_limit: return "cpu_time_limit";
    case FailureKind::memory_limit: return "memory_limit";
    case FailureKind::output_limit: return "output_limit";
    case FailureKind::wrong_answer: return "wrong_answer";
    case FailureKind::unwritten_output: return "unwritten_output";
    case FailureKind::bad_report: return "bad_report";
    case FailureKind::sandbox_error: return "sandbox_error";
    case FailureKind::screened_out: return "screened_out";
    case FailureKind::mutated_input: return "mutated_input";
    case FailureKind::replayed_output: return "replayed_output";
    case FailureKind::implausible: return "implausible";
  }
  return "?";
}

inline constexpr FailureKind failure_kind_from_string(std::string_view s) {
  for (int i = 0; i <= static_cast<int>(FailureKind::implausible); ++i)
    if (to_string(static_cast<FailureKind>(i)) == s) return static_cast<FailureKind>(i);
  return FailureKind::bad_report;
}

inline constexpr Bottleneck bottleneck_from_string(std::string_view s) {
  for (int i = 0; i <= static_cast<int>(Bottleneck::occupancy); ++i)
    if (to_string(static_cast<Bottleneck>(i)) == s) return static_cast<Bottleneck>(i);
  return Bottleneck::unknown;
}

/// A kernel's knob settings, knob name -> value as text. Ordered, so its printable form is stable
/// and serves as a key.
using Knobs = std::map<std::string, std::string, std::less<>>;

/// The printable form of a set of knobs: "block=64 vector_width=8".
inline std::string to_string(const Knobs& knobs) {
  std::string out;
  for (const auto& [name, value] : knobs) {
    if (!out.empty()) out += ' ';
    out += name;
    out += '=';
    out += value;
  }
  return out;
}

/// 64-bit FNV-1a: the content hash that names builds and detects duplicate candidates.
inline std::uint64_t content_hash(std::string_view text, std::uint64_t seed = 1469598103934665603ull) {
  std::uint64_t h = seed;
  for (unsigned char ch : text) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

/// A proposed implementation of the problem's kernel: its whole source, and the knobs it came
/// from when a template produced it (empty for free-form code such as an LLM's).
struct Candidate {
  std::string source;
  Knobs knobs;
  std::string origin;  ///< how it was made, for people: "mutate vector_width 4->8", "llm rewrite"

  std::uint64_t hash() const { return content_hash(source); }
};

/// What an evaluation found out beyond the timing: enough for a synthesizer to react to.
struct Diagnostics {
  Bottleneck bottleneck = Bottleneck::unknown;
  double achieved_gbytes_per_s = 0;   ///< the bytes model over the measured time
  double achieved_gflops = 0;         ///< the FLOPs model over the measured time
  double roofline_fraction = 0;       ///< achieved performance over the roofline's bound here
  std::string message;                ///< one line a person can act on
  std::string detail;                 ///< trimmed compiler errors, a mismatch summary, stderr
};

/// The outcome of evaluating one candidate.
struct Evaluation {
  FailureKind failure = FailureKind::none;
  double seconds = 0;             ///< median time of the candidate on the timing shape
  double reference_seconds = 0;   ///< median time of the reference on the same shape
  double speedup = 0;             ///< reference_seconds / seconds, 0 when it failed
  Diagnostics diagnostics;

  bool ok() const { return failure == FailureKind::none; }
};

/// Two candidates timed side by side, interleaved, so noise cannot pick a winner.
struct Comparison {
  double challenger_seconds = 0;
  double incumbent_seconds = 0;
  /// Set where the challenger gave a wrong answer (or crashed) on the race's fresh inputs: it is
  /// then no candidate at all, whatever it measured before (the times are meaningless).
  FailureKind challenger_failure = FailureKind::none;
  std::string challenger_message = {};
};

}  // namespace kevo
