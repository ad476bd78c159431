// kevo/synth/prompt_builder.hpp: the one adaptive prompt of the LLM synthesizer. The prompt is
// assembled from the generation request: the problem and its reference, the target's constraints,
// the parent and its last diagnostics (compile errors trimmed to what matters, the mismatch, the
// bottleneck), the memory context (trajectory, sibling comparisons, both or nothing) and the
// retrieved knowledge; the task it sets adapts to those signals (fix the build, fix correctness, or
// attack the bottleneck). The model's answer is parsed by synth/answer_parser.hpp.
//
//   kevo::synth::Prompt p = kevo::synth::build_prompt(request);
//   auto errors = kevo::synth::trim_compiler_errors(compiler_output);   // what a fix needs
#pragma once

#include <kevo/detail/text.hpp>
#include <kevo/knowledge/skill_distiller.hpp>
#include <kevo/synthesizer.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace kevo::synth {

struct Prompt {
  std::string system;
  std::string user;
};

struct PromptOptions {
  std::size_t max_source_chars = 24'000;     ///< the parent (and reference) quoted up to this
  std::size_t max_error_lines = 24;          ///< compiler output kept after trimming
  std::size_t max_trajectory_steps = 6;      ///< the most recent steps of the line
  std::size_t max_siblings = 4;              ///< per group: faster, slower, failed
  std::size_t max_changed_lines = 8;         ///< lines quoted from a sibling's or step's change
  bool offer_edits = true;                   ///< allow SEARCH/REPLACE answers
};

namespace detail {
using knowledge::detail::trim;
using kevo::detail::one_line;

inline std::vector<std::string_view> lines_of(std::string_view text) {
  std::vector<std::string_view> out;
  while (!text.empty()) {
    const std::size_t eol = text.find('\n');
    out.push_back(text.substr(0, eol));
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
  }
  return out;
}

inline std::string clip(std::string_view text, std::size_t max_chars) {
  if (text.size() <= max_chars) return std::string(text);
  return fmt::format("{}\n... ({} more characters cut)", text.substr(0, max_chars), text.size() - max_chars);
}


inline std::string_view language_of(Target t) {
  switch (t) {
    case Target::cpu: return "cpp";
    case Target::cuda: return "cuda";
    case Target::hip: return "cpp";
  }
  return "cpp";
}

/// The declaration of `name(...)` in a source: the entry point the harness links against.
inline std::string signature_of(std::string_view source, std::string_view name) {
  for (std::size_t at = source.find(name); at != std::string_view::npos; at = source.find(name, at + 1)) {
    const std::size_t open = at + name.size();
    if (open >= source.size() || source[open] != '(') continue;
    if (at > 0 && (std::isalnum(static_cast<unsigned char>(source[at - 1])) || source[at - 1] == '_')) continue;
    const std::size_t line_start = source.rfind('\n', at);
    const std::size_t close = source.find(')', open);
    if (close == std::string_view::npos) break;
    const std::size_t begin = line_start == std::string_view::npos ? 0 : line_start + 1;
    std::string sig;
    for (char c : source.substr(begin, close + 1 - begin)) {
      if (c == '\n') c = ' ';
      if (c == ' ' && !sig.empty() && sig.back() == ' ') continue;
      sig += c;
    }
    return sig;
  }
  return {};
}

}  // namespace detail

/// Compiler output cut to what a fix needs: the error lines with the source line and caret that
/// follow each, without notes, include chains and repeats.
inline std::string trim_compiler_errors(std::string_view output, std::size_t max_lines = 24) {
  const auto lines = detail::lines_of(output);
  std::vector<std::string> kept;
  std::set<std::string, std::less<>> seen;
  bool any_error = false;
  for (std::size_t i = 0; i < lines.size() && kept.size() < max_lines; ++i) {
    const std::string_view line = lines[i];
    const bool is_error = line.find("error") != std::string_view::npos || line.find("undefined reference") != std::string_view::npos;
    if (!is_error) continue;
    // The same message at the same place (template instantiations repeat them) counts once.
    const std::string key(line.substr(line.find("error") == std::string_view::npos ? 0 : line.find("error")));
    if (!seen.insert(key).second) continue;
    any_error = true;
    kept.emplace_back(line);
    // GCC and Clang echo the offending line and a caret under it; keep both.
    for (std::size_t j = i + 1; j < lines.size() && j <= i + 2 && kept.size() < max_lines; ++j) {
      const std::string_view next = lines[j];
      if (next.find("note:") != std::string_view::npos || next.find("error") != std::string_view::npos ||
          next.find("In file included") != std::string_view::npos || next.find("In function") != std::string_view::npos)
        break;
      kept.emplace_back(next);
    }
  }
  if (!any_error) {  // a crash report or mismatch summary: its head is what matters
    for (std::size_t i = 0; i < lines.size() && kept.size() < max_lines; ++i)
      if (!detail::trim(std::string(lines[i])).empty()) kept.emplace_back(lines[i]);
  }
  std::string out;
  for (const auto& l : kept) {
    out += detail::clip(l, 300);
    out += '\n';
  }
  return out;
}

namespace detail {

inline std::string describe_result(const Evaluation& e) {
  if (!e.ok()) return fmt::format("failed: {} ({})", to_string(e.failure), one_line(e.diagnostics.message, 160));
  std::string s = fmt::format("correct, {:.2f}x the reference", e.speedup);
  if (e.diagnostics.bottleneck != Bottleneck::unknown) s += fmt::format(", {}-bound", to_string(e.diagnostics.bottleneck));
  if (e.diagnostics.roofline_fraction > 0) s += fmt::format(" at {:.0f}% of the roofline", 100 * e.diagnostics.roofline_fraction);
  return s;
}

/// What `child` did differently from `base`: its knob changes, or a few of its new lines.
inline std::string describe_change(const Candidate* base, const Candidate& child, std::size_t max_lines) {
  std::string out;
  if (!child.origin.empty()) out += fmt::format("made by: {}", one_line(child.origin, 160));
  if (base) {
    // Knob diffs only mean something between two template renderings; free-form code has none.
    const bool both_templated = !base->knobs.empty() && !child.knobs.empty();
    if (const std::string knobs = both_templated ? knowledge::knob_diff(base->knobs, child.knobs) : ""; !knobs.empty()) {
      out += fmt::format("{}knobs: {}", out.empty() ? "" : "; ", knobs);
      return out;
    }
    const auto changes = knowledge::changed_lines(base->source, child.source);
    if (changes.added.empty() && changes.removed.empty()) return out;
    out += fmt::format("{}changed lines (+{} -{}):", out.empty() ? "" : "; ", changes.added.size(), changes.removed.size());
    std::size_t shown = 0;
    for (const auto& l : changes.added) {
      if (shown++ == max_lines) break;
      out += fmt::format("\n    + {}", clip(l, 160));
    }
    for (const auto& l : changes.removed) {
      if (shown++ >= max_lines) break;
      out += fmt::format("\n    - {}", clip(l, 160));
    }
  }
  return out;
}

/// "C++17" for flags that end with -std=c++17: the last -std wins, after the evaluator's own
/// (`standard`: -std=c++20 for the host compiler, -std=c++17 for nvcc).
inline std::string language_standard(const std::vector<std::string>& flags, std::string standard) {
  for (const std::string& flag : flags)
    if (flag.starts_with("-std=")) standard = flag.substr(5);
  for (char& c : standard) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return standard;  // "C++17", "GNU++20"
}

inline std::string target_constraints(const Problem& p, Target target) {
  std::string out;
  const std::string entry = signature_of(p.template_source, "kernel");
  if (!entry.empty()) out += fmt::format("- Keep the entry point exactly as declared: `{}`.\n", entry);
  out += "- Keep every #include of the current implementation that declares the problem's types (e.g. \"kevo_problem.hpp\"); do not define `main` or `reference`.\n";
  out += "- Handle every shape listed, including sizes that are not multiples of your vector width or block size; write every output element.\n";
  out += fmt::format("- Results must match the reference within absolute {:g} and relative {:g} on fresh random inputs.\n",
                     p.tolerance.absolute, p.tolerance.relative);
  out += "- Be deterministic and self-contained: no files, network, environment, global state carried between calls, or libraries beyond the standard library and intrinsics.\n";
  switch (target) {
    case Target::cpu:
      out += fmt::format("- Host {}, compiled with: {}. Use only instruction sets those flags enable.\n", language_standard(p.compile_flags, "c++20"),
                         p.compile_flags.empty() ? std::string("the defaults") : fmt::format("{}", fmt::join(p.compile_flags, " ")));
      break;
    case Target::cuda:
      out += fmt::format("- CUDA {} for NVIDIA Hopper (sm_90a), compiled by nvcc with: {}. `kernel()` runs on the host with device "
                         "pointers and may launch on any stream: the whole device is waited for before the outputs are checked and "
                         "the time is taken, so every stream's work counts.\n",
                         language_standard(p.compile_flags, "c++17"),
                         p.compile_flags.empty() ? std::string("the defaults") : fmt::format("{}", fmt::join(p.compile_flags, " ")));
      break;
    case Target::hip:
      out += "- HIP C++ for AMD CDNA (gfx90a/gfx942): wavefronts are 64 lanes wide, so do not assume 32-lane warps.\n";
      break;
  }
  return out;
}

/// The task, adapted to what the parent's evaluation says and what the memory context holds.
inline std::string task_for(const GenerationRequest& r) {
  const Evaluation& e = r.parent.evaluation;
  std::string task;
  switch (e.failure) {
    case FailureKind::none: {
      const auto& d = e.diagnostics;
      task = fmt::format("The current implementation is correct and runs at {:.2f}x the reference. Write a faster version.", e.speedup);
      switch (d.bottleneck) {
        case Bottleneck::memory:
          task += fmt::format(" It is memory-bound{}: reduce the bytes moved (fuse passes, reuse data while it is in cache or "
                              "shared memory), access memory contiguously with wide loads, and keep more requests in flight.",
                              d.roofline_fraction > 0 ? fmt::format(" at {:.0f}% of the bandwidth roofline", 100 * d.roofline_fraction) : "");
          break;
        case Bottleneck::compute:
          task += " It is compute-bound: vectorize the inner loops, use fused multiply-add, break dependency chains with several "
                  "accumulators, and take work out of the inner loop.";
          break;
        case Bottleneck::latency:
          task += " It is latency-bound: expose more independent work per iteration and shorten serial chains.";
          break;
        case Bottleneck::occupancy:
          task += " It is occupancy-bound: cut registers or shared memory per block so more warps are resident, or give each "
                  "thread more independent work.";
          break;
        case Bottleneck::unknown: break;
      }
      break;
    }
    case FailureKind::compile_error:
      task = "The current implementation does not compile. Fix the compiler errors below with the smallest change that "
             "compiles and stays correct; do not add new optimizations in this step.";
      break;
    case FailureKind::wrong_answer:
    case FailureKind::unwritten_output:
      task = "The current implementation compiles but its results are wrong. Find the correctness bug from the mismatch "
             "summary below and fix it, keeping its optimizations where they are not at fault.";
      break;
    case FailureKind::crash:
    case FailureKind::memory_limit:
      task = "The current implementation crashes. Look for out-of-bounds accesses, misaligned aligned loads and oversized stack "
             "arrays, and fix the cause.";
      break;
    case FailureKind::timeout:
    case FailureKind::cpu_time_limit:
      task = "The current implementation runs past the time limit. Look for loops that never end or accidentally quadratic "
             "work, and fix them.";
      break;
    case FailureKind::screened_out:
      task = "The current implementation was refused before compiling, for the reason below. A kernel only computes: no code "
             "at start-up (namespace-scope objects with constructors), no I/O, files, processes, network or environment, only "
             "the allowed headers. Remove what was refused and keep the computation.";
      break;
    case FailureKind::mutated_input:
    case FailureKind::replayed_output:
      task = "The current implementation changed its inputs or returned outputs from an earlier call. Inputs are read-only, and "
             "every call gets new inputs (sometimes at the same addresses): compute the outputs from this call's inputs.";
      break;
    case FailureKind::implausible:
      task = "The current implementation was timed faster than this machine's roofline allows, so its timing is not credited. "
             "Compute every output on every call, within the call.";
      break;
    default:
      task = fmt::format("The last evaluation failed ({}). Produce a correct implementation.", to_string(e.failure));
  }
  if (r.repair && !e.ok()) {
    task = "Repair the current implementation: it failed its evaluation. " + task;
    if (r.repair_try > 1)
      task += fmt::format(" This is repair attempt {}: an earlier repair of it failed too, so try a different fix.", r.repair_try);
  }
  if (e.ok()) {
    const bool faster_sibling = std::any_of(r.siblings.begin(), r.siblings.end(), [&](const Attempt& s) {
      return s.evaluation.ok() && s.evaluation.speedup > e.speedup;
    });
    if (faster_sibling) task += " Some siblings below beat the current implementation: build on what they changed and go further.";
    if (r.memory_mode == MemoryMode::fresh)
      task += " Progress along this line has stalled: try a substantially different approach rather than a small tweak.";
    if (r.mate && r.mate->candidate) task += " A second parent is shown: combine the strengths of both.";
  }
  return task;
}

}  // namespace detail

/// Builds the prompt for one generation. Needs request.problem; every other part is optional.
inline Prompt build_prompt(const GenerationRequest& r, const PromptOptions& options = {}) {
  using namespace detail;
  const Problem& p = *r.problem;
  const std::string_view lang = language_of(r.target);
  Prompt prompt;

  const std::string_view who = r.target == Target::cpu    ? "C++ kernels for x86-64 CPUs"
                               : r.target == Target::cuda ? "CUDA C++ kernels for NVIDIA GPUs"
                                                          : "HIP C++ kernels for AMD GPUs";
  prompt.system = fmt::format(
      "You are an expert performance engineer who writes {}. Every answer must compile, match the reference "
      "implementation within the stated tolerance on every shape, and be faster than what it replaces. "
      "Answer with code in the format the user asks for; keep prose to at most three sentences before the code.",
      who);

  std::string& u = prompt.user;
  u += fmt::format("# Task\n{}\n\n", task_for(r));

  u += fmt::format("# Problem: {}\n{}\n", p.name, p.description);
  u += fmt::format("Target: {}. Parameters: {}.\n", to_string(r.target), fmt::join(p.params, ", "));
  if (!p.tensors.empty()) {
    u += "Arguments:";
    for (const auto& t : p.tensors)
      u += fmt::format(" {} {} [{}] ({});", t.role == TensorRole::input ? "in" : "out", t.name, t.size,
                       t.type == ElementType::f32 ? "float" : t.type == ElementType::f16 ? "half" : "int32");
    u += '\n';
  }
  if (!p.check_shapes.empty()) {
    u += "Checked on shapes:";
    for (const auto& shape : p.check_shapes) {
      Knobs k;
      for (const auto& [n, v] : shape) k[n] = std::to_string(v);
      u += fmt::format(" {{{}}}", kevo::to_string(k));
    }
    u += '\n';
  }
  if (!p.timing_shape.empty()) {
    Knobs k;
    for (const auto& [n, v] : p.timing_shape) k[n] = std::to_string(v);
    u += fmt::format("Timed on: {{{}}}.", kevo::to_string(k));
    if (!p.bytes_model.empty()) u += fmt::format(" Bytes moved (model): {}.", p.bytes_model);
    if (!p.flops_model.empty()) u += fmt::format(" FLOPs (model): {}.", p.flops_model);
    u += '\n';
  }
  if (p.torch)  // a KernelBench-format problem: the PyTorch module is the reference, as in KernelBench's own prompts
    u += fmt::format("\n## Reference implementation (PyTorch)\nThe kernel computes what `Model.forward` does here. Its arguments are "
                     "forward's inputs, then the module's parameters and buffers (as `Model(*get_init_inputs())` holds them, named "
                     "with '.' as '_'), then the outputs; each `Shape` field `name_i` is dim i of that tensor. int64 tensors are "
                     "`int` (32-bit) in the kernel.\n```python\n{}\n```\n",
                     clip(trim(p.reference_source), options.max_source_chars));
  else if (!p.reference_source.empty())
    u += fmt::format("\n## Reference implementation\n```{}\n{}\n```\n", lang, clip(trim(p.reference_source), options.max_source_chars));

  u += fmt::format("\n## Constraints for the {} target\n{}", to_string(r.target), target_constraints(p, r.target));

  if (r.parent.candidate) {
    const Candidate& parent = *r.parent.candidate;
    u += fmt::format("\n## Current implementation (node {})\nResult: {}.\n", r.parent.node, describe_result(r.parent.evaluation));
    if (!parent.knobs.empty()) u += fmt::format("Its template knobs: {}.\n", kevo::to_string(parent.knobs));
    u += fmt::format("```{}\n{}\n```\n", lang, clip(trim(parent.source), options.max_source_chars));
  }

  // The last evaluation's diagnostics.
  const Evaluation& pe = r.parent.evaluation;
  const Diagnostics& d = pe.diagnostics;
  std::string diag;
  if (!pe.ok()) {
    diag += fmt::format("- Failure: {}{}\n", to_string(pe.failure), d.message.empty() ? "" : ": " + one_line(d.message, 300));
    if (!d.detail.empty()) {
      const std::string_view label = pe.failure == FailureKind::compile_error ? "Compiler errors (trimmed)" : "Details";
      diag += fmt::format("- {}:\n```text\n{}```\n", label, trim_compiler_errors(d.detail, options.max_error_lines));
    }
  } else if (d.bottleneck != Bottleneck::unknown || !d.message.empty()) {
    diag += fmt::format("- Bottleneck: {}", to_string(d.bottleneck));
    if (d.achieved_gbytes_per_s > 0) diag += fmt::format("; {:.1f} GB/s", d.achieved_gbytes_per_s);
    if (d.achieved_gflops > 0) diag += fmt::format("; {:.2f} GFLOP/s", d.achieved_gflops);
    if (d.roofline_fraction > 0) diag += fmt::format("; {:.0f}% of the roofline", 100 * d.roofline_fraction);
    diag += '\n';
    if (!d.message.empty()) diag += fmt::format("- Profile: {}\n", one_line(d.message, 300));
  }
  if (r.grandparent && r.grandparent->candidate && !pe.ok() && r.parent.candidate)
    diag += fmt::format("- The change that led here from the last working version: {}\n",
                        describe_change(r.grandparent->candidate.get(), *r.parent.candidate, options.max_changed_lines));
  if (!diag.empty())
    u += (r.repair && !pe.ok() ? "\n## Repair: what broke the current implementation\n" : "\n## What the last evaluation found\n") + diag;

  // The memory context the node's memory operator chose.
  const bool show_trajectory = r.memory_mode == MemoryMode::trajectory || r.memory_mode == MemoryMode::combined;
  const bool show_siblings = r.memory_mode == MemoryMode::siblings || r.memory_mode == MemoryMode::combined;
  if (show_trajectory && r.trajectory.size() > 1) {
    u += "\n## How this line developed (oldest first)\n";
    const std::size_t first = r.trajectory.size() > options.max_trajectory_steps ? r.trajectory.size() - options.max_trajectory_steps : 0;
    for (std::size_t i = first; i < r.trajectory.size(); ++i) {
      const Attempt& a = r.trajectory[i];
      if (!a.candidate) continue;
      const Candidate* before = i > 0 ? r.trajectory[i - 1].candidate.get() : nullptr;
      u += fmt::format("{}. node {}: {}", i + 1, a.node, describe_result(a.evaluation));
      if (const std::string change = describe_change(before, *a.candidate, options.max_changed_lines); !change.empty() && before)
        u += fmt::format("; {}", change);
      u += '\n';
    }
  }
  if (show_siblings && !r.siblings.empty()) {
    const double parent_speed = pe.ok() ? pe.speedup : 0;
    std::string faster, slower, failed;
    std::size_t n_faster = 0, n_slower = 0, n_failed = 0;
    for (const Attempt& s : r.siblings) {
      // A generation that failed left no code: a diff against it would quote the parent's lines as
      // removed, as if that had been tried.
      if (!s.candidate || s.evaluation.failure == FailureKind::generation_failed || s.candidate->source.empty()) continue;
      const std::string change = describe_change(r.parent.candidate.get(), *s.candidate, options.max_changed_lines);
      const std::string line = fmt::format("- node {}: {}{}\n", s.node, describe_result(s.evaluation), change.empty() ? "" : "; " + change);
      if (!s.evaluation.ok()) {
        if (n_failed++ < options.max_siblings) failed += line;
      } else if (s.evaluation.speedup > parent_speed) {
        if (n_faster++ < options.max_siblings) faster += line;
      } else if (n_slower++ < options.max_siblings) {
        slower += line;
      }
    }
    u += "\n## Other children of the current implementation\n";
    if (!faster.empty()) u += "Faster than the current implementation (what they did differently):\n" + faster;
    if (!slower.empty()) u += "Not faster (avoid repeating these):\n" + slower;
    if (!failed.empty()) u += "Failed (avoid these mistakes):\n" + failed;
  }
  if (r.mate && r.mate->candidate) {
    u += fmt::format("\n## Second parent (node {}): {}\n```{}\n{}\n```\n", r.mate->node, describe_result(r.mate->evaluation), lang,
                     clip(trim(r.mate->candidate->source), options.max_source_chars / 2));
  }

  if (!r.knowledge.empty()) {
    u += "\n## Retrieved knowledge (selected for this problem, target and diagnosis)\n";
    for (const auto& k : r.knowledge) u += fmt::format("### [{}] {}\n{}\n", k.category, k.title, trim(k.text));
  }

  u += "\n## Answer format\n";
  if (options.offer_edits && r.parent.candidate)
    u += fmt::format(
        "Either give the complete new source file in one ```{0} block, or give SEARCH/REPLACE edits against the current "
        "implementation, each in this form (SEARCH text copied exactly, enough lines to be unique):\n"
        "<<<<<<< SEARCH\n(lines of the current implementation)\n=======\n(their replacement)\n>>>>>>> REPLACE\n",
        lang);
  else
    u += fmt::format("Give the complete new source file in one ```{} block.\n", lang);
  u += "Start with at most three sentences on what you change and why.\n";
  return prompt;
}

}  // namespace kevo::synth
