// kevo/eval/ncu_profile.hpp: Nsight Compute (ncu) feedback for a CUDA kernel: the metrics kevo asks
// ncu for, the command that collects them, a parser of ncu's --csv output, and the bottleneck class
// (memory-, compute-, latency-bound or occupancy-limited) built on them. Nothing here runs ncu or
// needs a GPU: the caller runs the command on the device and hands its stdout to the parser (the
// CUDA evaluator starts a new best's runner under ncu_launcher() in its jail: jailed_evaluator.hpp).
//
//   auto argv = kevo::eval::ncu_command(program, {"--shape", "4096"}, {.launch_count = 4});
//   // ... run argv on the device, capture stdout ...
//   auto launches = kevo::eval::parse_ncu_csv(stdout_text);
//   if (!launches) return launches.error();
//   kevo::Diagnostics d = kevo::eval::prefer_profile(roofline_diagnostics, *launches);
//   fmt::print("{}\n", d.message);  // "memory-bound: DRAM 88% of peak, SM 21%; top stalls long_scoreboard 61%, ..."
//
// Why one file of about 500 lines: the metric names, the parser and the classifier must agree on
// every name, and most of the file is those tables and the reasons behind each threshold.
#pragma once

#include <kevo/candidate.hpp>
#include <kevo/eval/sandbox.hpp>
#include <kevo/expected.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstddef>
#include <filesystem>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace kevo::eval {

// ---------------------------------------------------------------------------------------------
// The metrics

inline constexpr std::string_view ncu_duration_metric = "gpu__time_duration.sum";
inline constexpr std::string_view ncu_dram_metric = "dram__throughput.avg.pct_of_peak_sustained_elapsed";
inline constexpr std::string_view ncu_sm_metric = "sm__throughput.avg.pct_of_peak_sustained_elapsed";
/// Achieved occupancy: active warps over the SM's maximum (the Occupancy section's "Achieved Occupancy").
inline constexpr std::string_view ncu_achieved_occupancy_metric = "sm__warps_active.avg.pct_of_peak_sustained_active";
/// Theoretical occupancy: what registers, shared memory and block size allow ("Theoretical Occupancy").
inline constexpr std::string_view ncu_theoretical_occupancy_metric = "sm__maximum_warps_per_active_cycle_pct";

/// The stall-reason metrics are smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio:
/// the average number of warps stalled for <reason> per issued instruction, i.e. warp cycles per
/// issue spent on it. They are the "Warp State" breakdown of Nsight Compute's WarpStateStats section
/// (Warp State Statistics), whose rules (CPIStall*.py) divide each by the sum to get "about X% of the
/// cycles between issuing two instructions"; kevo does the same.
inline constexpr std::string_view ncu_stall_prefix = "smsp__average_warps_issue_stalled_";
inline constexpr std::string_view ncu_stall_suffix = "_per_issue_active.ratio";

/// "selected" is the cycle a warp issues, not a stall: it counts in the total but is never a top stall.
inline constexpr std::string_view ncu_not_a_stall = "selected";

/// Everything kevo asks ncu for, in --metrics order. Only reasons every architecture since Volta has
/// are listed: ncu refuses the whole run when one metric is unknown (Hopper's `gmma` would be one
/// elsewhere). The parser reads any smsp__average_warps_issue_stalled_*_per_issue_active.ratio row.
inline constexpr std::array<std::string_view, 24> ncu_metrics = {
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__maximum_warps_per_active_cycle_pct",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_drain_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_membar_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_misc_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_selected_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
    "smsp__average_warp_latency_per_inst_issued.ratio",  // warp cycles per issued instruction: the total
};

/// ncu_metrics joined with commas, as --metrics takes them.
inline std::string ncu_metric_list() {
  std::string list;
  for (std::string_view m : ncu_metrics) {
    if (!list.empty()) list += ',';
    list += m;
  }
  return list;
}

// ---------------------------------------------------------------------------------------------
// The command

struct NcuOptions {
  std::string ncu = "ncu";          ///< the ncu executable
  std::string kernel_name_regex;    ///< profile only kernels whose name matches; empty: all
  int launch_count = 0;             ///< stop after this many profiled launches; 0: no limit
};

/// ncu's own argv, to which the program to profile and its arguments are appended.
/// --clock-control none: ncu would otherwise lock the clocks to base, and the device's clock settings
/// are to be left alone (kevo's timings run at the clocks the device has).
inline std::vector<std::string> ncu_launcher(const NcuOptions& options = {}) {
  std::vector<std::string> argv = {options.ncu, "--clock-control", "none", "--csv", "--metrics", ncu_metric_list()};
  if (!options.kernel_name_regex.empty()) {
    argv.push_back("--kernel-name");
    argv.push_back("regex:" + options.kernel_name_regex);  // a bare name would have to match exactly
  }
  if (options.launch_count > 0) {
    argv.push_back("--launch-count");
    argv.push_back(std::to_string(options.launch_count));
  }
  return argv;
}

/// The argv that profiles `program args...` under ncu and prints one CSV row per (launch, metric).
inline std::vector<std::string> ncu_command(const std::filesystem::path& program, const std::vector<std::string>& args = {},
                                            const NcuOptions& options = {}) {
  std::vector<std::string> argv = ncu_launcher(options);
  argv.push_back(program.string());
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

/// What a candidate's jail must let through for ncu to start it there: ncu forks and executes the
/// program, talks to the process it injected over a socket, and signals and regroups its children.
/// Only a new best, which has passed its checked run under the whole filter, is run so.
inline std::vector<std::string> ncu_seccomp_exempt() {
  return {"fork", "vfork", "clone", "clone3", "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4", "kill", "setpgid", "setsid"};
}

/// ncu's path: $KEVO_NCU, else the toolkit's, else ncu on PATH; nullopt where there is none.
inline std::optional<std::filesystem::path> find_ncu() {
  if (const char* ncu = std::getenv("KEVO_NCU"); ncu && *ncu) return std::filesystem::path(ncu);
  std::error_code ec;
  if (std::filesystem::exists("/usr/local/cuda/bin/ncu", ec)) return std::filesystem::canonical("/usr/local/cuda/bin/ncu", ec);
  if (auto path = find_program("ncu")) return std::filesystem::canonical(*path, ec);
  return std::nullopt;
}

/// The directory to bind read-only into a profiled candidate's jail so that `ncu` can run there:
/// ncu's own directory (after links), none under /usr (the jail has /usr already). Refused, with
/// the reason, where that directory is the root or a top-level one, or holds any of `private_places`
/// (the home directory, kevo's cache, the problem's builds): an `ncu` at /ncu or in $HOME would
/// otherwise show the candidate the whole machine or the user's files.
inline expected<std::optional<std::filesystem::path>, Error> ncu_install_tree(
    const std::filesystem::path& ncu, const std::vector<std::filesystem::path>& private_places) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path program = fs::canonical(ncu, ec);
  if (ec) return make_error(fmt::format("ncu at {}: {}", ncu.string(), ec.message()));
  if (program.string().starts_with("/usr/")) return std::optional<fs::path>{};
  const fs::path tree = program.parent_path();
  if (std::distance(tree.begin(), tree.end()) < 3)  // "/", "/opt": a root and one name
    return make_error(fmt::format("ncu at {}: its directory {} is not an install tree of its own, and is not bound into a "
                                  "candidate's jail (install Nsight Compute in a directory of its own)",
                                  ncu.string(), tree.string()));
  for (const fs::path& place : private_places) {
    if (place.empty()) continue;
    const fs::path inside = fs::weakly_canonical(place, ec);
    if (!ec && std::mismatch(tree.begin(), tree.end(), inside.begin(), inside.end()).first == tree.end())  // tree is a prefix
      return make_error(fmt::format("ncu at {}: its directory {} holds {}, and is not bound into a candidate's jail (install "
                                    "Nsight Compute in a directory of its own)",
                                    ncu.string(), tree.string(), inside.string()));
  }
  return std::optional<fs::path>{tree};
}

// ---------------------------------------------------------------------------------------------
// The profile of one launch

struct StallReason {
  std::string name;              ///< e.g. "long_scoreboard"
  double cycles_per_issue = 0;   ///< warp cycles stalled for this reason per issued instruction
  double percent = 0;            ///< share of all warp cycles between two issues
};

struct KernelProfile {
  std::string id;                ///< ncu's launch ID ("all" for an aggregate)
  std::string kernel_name;       ///< demangled, parameters included
  int launches = 1;              ///< launches summarized here (more than one for an aggregate)
  double seconds = 0;            ///< gpu__time_duration, summed over launches
  std::optional<double> dram_percent;                 ///< DRAM throughput, % of peak
  std::optional<double> sm_percent;                   ///< SM throughput, % of peak
  std::optional<double> achieved_occupancy_percent;
  std::optional<double> theoretical_occupancy_percent;
  std::vector<StallReason> stalls;  ///< heaviest first; "selected" left out
};

namespace detail {

/// One CSV record split into fields: RFC 4180 quoting (quoted fields, "" for a quote). No CSV library
/// is among kevo's Debian dependencies, and ncu's output needs no more than this splitter.
inline expected<std::vector<std::string>, Error> split_csv_record(std::string_view line) {
  std::vector<std::string> fields;
  std::string field;
  std::size_t i = 0;
  while (true) {
    field.clear();
    if (i < line.size() && line[i] == '"') {
      ++i;
      while (true) {
        if (i >= line.size()) return make_error("unterminated quoted field");
        if (line[i] == '"') {
          if (i + 1 < line.size() && line[i + 1] == '"') {
            field += '"';
            i += 2;
            continue;
          }
          ++i;
          break;
        }
        field += line[i++];
      }
      if (i < line.size() && line[i] != ',') return make_error(fmt::format("text after a closing quote at column {}", i + 1));
    } else {
      while (i < line.size() && line[i] != ',') {
        if (line[i] == '"') return make_error(fmt::format("quote inside an unquoted field at column {}", i + 1));
        field += line[i++];
      }
    }
    fields.push_back(field);
    if (i >= line.size()) break;
    ++i;  // the comma
  }
  return fields;
}

/// ncu's number: thousands separators ("172,192") dropped. nullopt when it is no number at all.
inline std::optional<double> parse_ncu_number(std::string_view text) {
  std::string digits;
  for (char c : text)
    if (c != ',' && c != ' ') digits += c;
  double value = 0;
  const char* end = digits.data() + digits.size();
  auto [ptr, ec] = std::from_chars(digits.data(), end, value);
  if (digits.empty() || ec != std::errc() || ptr != end || !std::isfinite(value)) return std::nullopt;
  return value;
}

/// Seconds per unit of gpu__time_duration: ncu prints "ns"/"us"/"ms" or, with some versions and
/// --print-units, "nsecond"/"usecond"/"msecond".
inline std::optional<double> seconds_per_unit(std::string_view unit) {
  static const std::map<std::string_view, double> units = {
      {"s", 1},       {"second", 1},     {"sec", 1},       {"seconds", 1},
      {"ms", 1e-3},   {"msecond", 1e-3}, {"msec", 1e-3},   {"milliseconds", 1e-3},
      {"us", 1e-6},   {"usecond", 1e-6}, {"usec", 1e-6},   {"microseconds", 1e-6},
      {"ns", 1e-9},   {"nsecond", 1e-9}, {"nsec", 1e-9},   {"nanoseconds", 1e-9},
  };
  auto it = units.find(unit);
  return it == units.end() ? std::nullopt : std::optional<double>(it->second);
}

/// Shares of the stall cycles and the heaviest-first order, once all of a launch's rows are in.
inline void finish_stalls(std::vector<StallReason>& all) {
  double total = 0;
  for (const StallReason& s : all) total += s.cycles_per_issue;
  for (StallReason& s : all) s.percent = total > 0 ? 100 * s.cycles_per_issue / total : 0;
  std::erase_if(all, [](const StallReason& s) { return s.name == ncu_not_a_stall; });
  std::stable_sort(all.begin(), all.end(),
                   [](const StallReason& a, const StallReason& b) { return a.cycles_per_issue > b.cycles_per_issue; });
}

}  // namespace detail

/// Parses ncu --csv stdout into one profile per launch ID, in launch order. Lines before the CSV
/// header (ncu's ==PROF== log, the program's own output) are skipped, as are later ==...== lines;
/// "n/a" values (a metric this GPU lacks) are left unset. A malformed row is an error naming its line.
inline expected<std::vector<KernelProfile>, Error> parse_ncu_csv(std::string_view text) {
  std::vector<std::string_view> lines;
  for (std::size_t start = 0; start <= text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    start = end + 1;
  }

  std::size_t header_line = lines.size();
  std::string ncu_complaint;  // ncu's first ==ERROR== or ==WARNING==, for the no-CSV error
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].starts_with("\"ID\",")) {
      header_line = i;
      break;
    }
    if (ncu_complaint.empty() && (lines[i].starts_with("==ERROR==") || lines[i].starts_with("==WARNING==")))
      ncu_complaint = std::string(lines[i]);
  }
  if (header_line == lines.size())
    return make_error(ncu_complaint.empty() ? std::string("ncu output has no CSV header (\"ID\",...)")
                                            : fmt::format("ncu output has no CSV header; ncu said: {}", ncu_complaint));

  auto header = detail::split_csv_record(lines[header_line]);
  if (!header) return make_error(fmt::format("ncu CSV line {}: {}", header_line + 1, header.error().message));
  auto column = [&](std::string_view name) -> std::optional<std::size_t> {
    auto it = std::find(header->begin(), header->end(), name);
    return it == header->end() ? std::nullopt : std::optional<std::size_t>(it - header->begin());
  };
  const auto id_col = column("ID"), name_col = column("Kernel Name"), metric_col = column("Metric Name"),
             unit_col = column("Metric Unit"), value_col = column("Metric Value");
  if (!id_col || !name_col || !metric_col || !unit_col || !value_col)
    return make_error(fmt::format("ncu CSV line {}: the header lacks ID, Kernel Name, Metric Name, Metric Unit or Metric Value",
                                  header_line + 1));

  std::vector<KernelProfile> profiles;
  std::vector<std::vector<StallReason>> stalls;  // per profile, before shares and order
  std::map<std::string, std::size_t> index_of_id;
  for (std::size_t i = header_line + 1; i < lines.size(); ++i) {
    const std::string_view line = lines[i];
    const std::size_t line_no = i + 1;
    if (line.empty() || line.starts_with("==")) continue;  // ncu's own log lines
    auto fields = detail::split_csv_record(line);
    if (!fields) return make_error(fmt::format("ncu CSV line {}: {}", line_no, fields.error().message));
    if (fields->size() != header->size())
      return make_error(fmt::format("ncu CSV line {}: {} fields where the header has {}", line_no, fields->size(), header->size()));
    const std::string& id = (*fields)[*id_col];
    const std::string& metric = (*fields)[*metric_col];
    const std::string& unit = (*fields)[*unit_col];
    const std::string& raw = (*fields)[*value_col];

    auto [it, inserted] = index_of_id.try_emplace(id, profiles.size());
    if (inserted) {
      KernelProfile& fresh = profiles.emplace_back();
      fresh.id = id;
      fresh.kernel_name = (*fields)[*name_col];
      stalls.emplace_back();
    }
    KernelProfile& p = profiles[it->second];

    if (raw == "n/a" || raw == "N/A") continue;
    const auto value = detail::parse_ncu_number(raw);
    if (!value) return make_error(fmt::format("ncu CSV line {}: {} = \"{}\" is not a number", line_no, metric, raw));

    if (metric == ncu_duration_metric) {
      const auto scale = detail::seconds_per_unit(unit);
      if (!scale) return make_error(fmt::format("ncu CSV line {}: {} has unknown time unit \"{}\"", line_no, metric, unit));
      p.seconds = *value * *scale;
    } else if (metric == ncu_dram_metric) {
      p.dram_percent = *value;
    } else if (metric == ncu_sm_metric) {
      p.sm_percent = *value;
    } else if (metric == ncu_achieved_occupancy_metric) {
      p.achieved_occupancy_percent = *value;
    } else if (metric == ncu_theoretical_occupancy_metric) {
      p.theoretical_occupancy_percent = *value;
    } else if (metric.starts_with(ncu_stall_prefix) && metric.ends_with(ncu_stall_suffix) &&
               metric.size() > ncu_stall_prefix.size() + ncu_stall_suffix.size()) {
      std::string reason = metric.substr(ncu_stall_prefix.size(), metric.size() - ncu_stall_prefix.size() - ncu_stall_suffix.size());
      stalls[it->second].push_back(StallReason{.name = std::move(reason), .cycles_per_issue = *value});
    }
    // Other metrics (the cycles-per-issue total, anything a caller added) are read but not kept.
  }
  for (std::size_t k = 0; k < profiles.size(); ++k) {
    detail::finish_stalls(stalls[k]);
    profiles[k].stalls = std::move(stalls[k]);
  }
  return profiles;
}

// ---------------------------------------------------------------------------------------------
// Several launches as one

/// One profile for a candidate that launches several kernels: durations add up; percentages and
/// stall cycles are averaged weighted by duration, since a launch matters as much as the time it takes.
inline KernelProfile aggregate(const std::vector<KernelProfile>& launches) {
  KernelProfile total;
  total.id = "all";
  total.launches = 0;
  if (launches.empty()) return total;
  double total_seconds = 0;
  for (const KernelProfile& p : launches) total_seconds += p.seconds;
  // Without durations every launch weighs the same.
  auto weight = [&](const KernelProfile& p) { return total_seconds > 0 ? p.seconds : 1.0; };

  auto average = [&](std::optional<double> KernelProfile::*field) -> std::optional<double> {
    double sum = 0, weights = 0;
    for (const KernelProfile& p : launches)
      if (p.*field) {
        sum += weight(p) * *(p.*field);
        weights += weight(p);
      }
    return weights > 0 ? std::optional<double>(sum / weights) : std::nullopt;
  };
  total.dram_percent = average(&KernelProfile::dram_percent);
  total.sm_percent = average(&KernelProfile::sm_percent);
  total.achieved_occupancy_percent = average(&KernelProfile::achieved_occupancy_percent);
  total.theoretical_occupancy_percent = average(&KernelProfile::theoretical_occupancy_percent);

  std::map<std::string, StallReason> reasons;
  double stall_weights = 0;
  std::vector<std::string> names;
  for (const KernelProfile& p : launches) {
    total.launches += p.launches;
    total.seconds += p.seconds;
    if (std::find(names.begin(), names.end(), p.kernel_name) == names.end()) names.push_back(p.kernel_name);
    if (p.stalls.empty()) continue;
    stall_weights += weight(p);
    for (const StallReason& s : p.stalls) {
      StallReason& r = reasons[s.name];
      r.name = s.name;
      r.cycles_per_issue += weight(p) * s.cycles_per_issue;
      r.percent += weight(p) * s.percent;
    }
  }
  for (auto& [name, r] : reasons) {
    r.cycles_per_issue /= stall_weights;
    r.percent /= stall_weights;
    total.stalls.push_back(r);
  }
  std::stable_sort(total.stalls.begin(), total.stalls.end(),
                   [](const StallReason& a, const StallReason& b) { return a.percent > b.percent; });
  for (const std::string& n : names) total.kernel_name += (total.kernel_name.empty() ? "" : "; ") + n;
  return total;
}

// ---------------------------------------------------------------------------------------------
// The bottleneck

/// A unit (DRAM or the SM's busiest pipe) at or above this share of its peak is the limit. The same
/// line as ncu's own SOLBottleneck rule (SpeedOfLight section): "compute throughput and/or memory
/// bandwidth below 60.0% of peak typically indicate latency issues".
inline constexpr double ncu_busy_percent = 60;
/// Achieved occupancy under this fraction of the theoretical one: warps are missing (tail waves,
/// too small a grid, imbalance), so there are too few to hide latency.
inline constexpr double ncu_achieved_occupancy_fraction = 0.5;
/// Theoretical occupancy under this: registers, shared memory or the block size cap the warps per SM
/// at fewer than 16 of 64, too few to hide memory latency on their own.
inline constexpr double ncu_theoretical_occupancy_floor = 25;

/// The class of one profile (or an aggregate). In order: DRAM busy and busier than the SM: memory;
/// the SM busy: compute; occupancy short of what it could or should be: occupancy; else neither unit
/// is near its peak while warps are there: latency (dependency chains, stalls the stall list names).
inline Bottleneck classify(const KernelProfile& p) {
  if (!p.dram_percent && !p.sm_percent) return Bottleneck::unknown;
  const double dram = p.dram_percent.value_or(0), sm = p.sm_percent.value_or(0);
  if (dram >= ncu_busy_percent && dram >= sm) return Bottleneck::memory;
  if (sm >= ncu_busy_percent) return Bottleneck::compute;
  if (p.theoretical_occupancy_percent) {
    const double theoretical = *p.theoretical_occupancy_percent;
    if (theoretical < ncu_theoretical_occupancy_floor) return Bottleneck::occupancy;
    if (p.achieved_occupancy_percent && *p.achieved_occupancy_percent < ncu_achieved_occupancy_fraction * theoretical)
      return Bottleneck::occupancy;
  }
  return Bottleneck::latency;
}

/// One line for the prompt and the steering, e.g.
/// "memory-bound: DRAM 88% of peak, SM 21%; top stalls long_scoreboard 61%, lg_throttle 12%".
inline std::string describe(const KernelProfile& p, std::size_t top_stalls = 3) {
  const Bottleneck b = classify(p);
  std::string line;
  switch (b) {
    case Bottleneck::memory: line = "memory-bound"; break;
    case Bottleneck::compute: line = "compute-bound"; break;
    case Bottleneck::latency: line = "latency-bound"; break;
    case Bottleneck::occupancy: line = "occupancy-limited"; break;
    case Bottleneck::unknown: line = "bottleneck unknown (no throughput metrics)"; break;
  }
  std::vector<std::string> parts;
  if (p.dram_percent) parts.push_back(fmt::format("DRAM {:.0f}% of peak", *p.dram_percent));
  if (p.sm_percent) parts.push_back(fmt::format("SM {:.0f}%", *p.sm_percent));
  if (p.achieved_occupancy_percent && p.theoretical_occupancy_percent)
    parts.push_back(fmt::format("occupancy {:.0f}% of {:.0f}% theoretical", *p.achieved_occupancy_percent,
                                *p.theoretical_occupancy_percent));
  else if (p.achieved_occupancy_percent)
    parts.push_back(fmt::format("occupancy {:.0f}%", *p.achieved_occupancy_percent));
  for (std::size_t i = 0; i < parts.size(); ++i) line += (i == 0 ? ": " : ", ") + parts[i];
  for (std::size_t i = 0; i < std::min(top_stalls, p.stalls.size()); ++i)
    line += fmt::format("{}{} {:.0f}%", i == 0 ? "; top stalls " : ", ", p.stalls[i].name, p.stalls[i].percent);
  if (p.launches > 1) line += fmt::format(" ({} launches)", p.launches);
  return line;
}

/// The profile's class and line in place of the roofline's, when there is a profile; without one
/// (no ncu, no kernel profiled, no throughput metric) the roofline diagnostics stand. The roofline's
/// achieved GB/s, GFLOP/s and fraction are kept either way: ncu does not replace the bytes model.
inline Diagnostics prefer_profile(Diagnostics roofline, const std::vector<KernelProfile>& launches) {
  if (launches.empty()) return roofline;
  const KernelProfile total = aggregate(launches);
  const Bottleneck b = classify(total);
  if (b == Bottleneck::unknown) return roofline;
  roofline.bottleneck = b;
  roofline.message = describe(total);
  return roofline;
}

}  // namespace kevo::eval
