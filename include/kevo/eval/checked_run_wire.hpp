// kevo/eval/checked_run_wire.hpp: a CheckedRunRequest and its RunReport as one JSON line each, so
// that a checked run can happen on another machine (the Slurm executor's node runs
// kevo-run-checked, which reads the request and prints the report). Each carries the id of its
// evaluation; a report is read strictly: one line, every field of the right type, the same id,
// a known failure kind and finite figures, else an error (the node's word is taken for its own
// evaluation's verdict and nothing more).
//
//   std::string line = kevo::eval::report_to_json(run_checked(*request_from_json(text)), id);
//   auto report = kevo::eval::report_from_json(line, id);   // error: not this evaluation's verdict
#pragma once

#include <kevo/candidate.hpp>
#include <kevo/detail/json_writer.hpp>
#include <kevo/eval/checked_run.hpp>
#include <kevo/expected.hpp>

#include <fmt/format.h>
#include <simdjson.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace kevo::eval {

namespace detail {

inline std::string json_strings(const std::vector<std::string>& values) {
  std::string out = "[";
  for (const auto& v : values) out += (out.size() > 1 ? "," : "") + kevo::detail::json_quote(v);
  return out + "]";
}

inline std::string json_paths(const std::vector<std::filesystem::path>& values) {
  std::vector<std::string> strings;
  for (const auto& v : values) strings.push_back(v.string());
  return json_strings(strings);
}

inline std::string limits_to_json(const SandboxLimits& l) {
  return fmt::format(
      R"({{"wall_ms":{},"cpu_s":{},"memory":{},"file_size":{},"output":{},"processes":{},"open_files":{},"drop_privileges":{},)"
      R"("isolate":{},"uid":{},"uid_base":{},"cwd":{},"environment":{}}})",
      l.wall_time.count(), l.cpu_time.count(), l.memory_bytes, l.file_size_bytes, l.output_bytes, l.max_processes, l.max_open_files,
      l.drop_privileges, l.isolate, l.unprivileged_uid, l.per_run_uid_base, kevo::detail::json_quote(l.working_directory.string()),
      json_strings(l.environment));
}

/// Reads a JSON object's fields, remembering the first that is missing or of the wrong type.
class FieldReader {
 public:
  explicit FieldReader(simdjson::dom::object object) : object_(object) {}
  template <class T>
  T get(std::string_view key) {
    T value{};
    if constexpr (std::is_same_v<T, std::string>) {
      std::string_view v;
      if (object_[key].get_string().get(v)) return fail<T>(key);
      return std::string(v);
    } else if constexpr (std::is_same_v<T, bool>) {
      if (object_[key].get_bool().get(value)) return fail<T>(key);
    } else if constexpr (std::is_same_v<T, double>) {
      if (object_[key].get_double().get(value) || !std::isfinite(value)) return fail<T>(key);
    } else if constexpr (std::is_signed_v<T>) {
      std::int64_t v = 0;
      if (object_[key].get_int64().get(v)) return fail<T>(key);
      value = static_cast<T>(v);
    } else {
      std::uint64_t v = 0;
      if (object_[key].get_uint64().get(v)) return fail<T>(key);
      value = static_cast<T>(v);
    }
    return value;
  }
  std::vector<std::string> strings(std::string_view key) {
    std::vector<std::string> out;
    simdjson::dom::array array;
    if (object_[key].get_array().get(array)) return fail<std::vector<std::string>>(key);
    for (auto element : array) {
      std::string_view v;
      if (element.get_string().get(v)) return fail<std::vector<std::string>>(key);
      out.emplace_back(v);
    }
    return out;
  }
  simdjson::dom::object object(std::string_view key) {
    simdjson::dom::object o;
    if (object_[key].get_object().get(o)) bad_ = bad_.empty() ? std::string(key) : bad_;
    return o;
  }
  const std::string& bad_field() const { return bad_; }

 private:
  template <class T>
  T fail(std::string_view key) {
    if (bad_.empty()) bad_ = key;
    return T{};
  }
  simdjson::dom::object object_;
  std::string bad_;
};

inline SandboxLimits limits_from_json(FieldReader& r) {
  SandboxLimits l;
  l.wall_time = std::chrono::milliseconds(r.get<std::int64_t>("wall_ms"));
  l.cpu_time = std::chrono::seconds(r.get<std::int64_t>("cpu_s"));
  l.memory_bytes = r.get<std::size_t>("memory");
  l.file_size_bytes = r.get<std::size_t>("file_size");
  l.output_bytes = r.get<std::size_t>("output");
  l.max_processes = r.get<int>("processes");
  l.max_open_files = r.get<int>("open_files");
  l.drop_privileges = r.get<bool>("drop_privileges");
  l.isolate = r.get<bool>("isolate");
  l.unprivileged_uid = r.get<unsigned>("uid");
  l.per_run_uid_base = r.get<unsigned>("uid_base");
  l.working_directory = r.get<std::string>("cwd");
  l.environment = r.strings("environment");
  return l;
}

}  // namespace detail

/// The request as one JSON line, tagged with the evaluation's `id`. The descriptors a run hands
/// over are made on the machine that runs it, so they are not part of it.
inline std::string request_to_json(const CheckedRunRequest& q, std::string_view id) {
  return fmt::format(
      R"({{"kevo_checked_run":1,"id":{},"checker":{},"runner":{},"seed":{},"warmup":{},"repetitions":{},"flush_caches":{},)"
      R"("call_timeout_s":{},"round_trip_seconds":{:.17g},"runner_limits":{},"checker_limits":{},)"
      R"("jail":{{"read_only":{},"writable":{},"cwd":{},"tmpfs":{},"seccomp":{},"gpu":{}}}}})",
      kevo::detail::json_quote(id), kevo::detail::json_quote(q.checker.string()), kevo::detail::json_quote(q.runner.string()), q.seed,
      q.warmup, q.repetitions, q.flush_caches, q.call_timeout.count(), q.round_trip_seconds, detail::limits_to_json(q.runner_limits),
      detail::limits_to_json(q.checker_limits), detail::json_paths(q.jail.read_only), detail::json_paths(q.jail.writable),
      kevo::detail::json_quote(q.jail.working_directory.string()), q.jail.tmpfs_bytes, q.jail.seccomp, q.jail.gpu);
}

/// A request read back, and the id of its evaluation.
struct WireRequest {
  CheckedRunRequest request;
  std::string id;
};

inline expected<WireRequest, Error> request_from_json(std::string_view text) {
  simdjson::dom::parser parser;
  simdjson::dom::object root;
  if (parser.parse(text.data(), text.size()).get(root)) return make_error("the checked-run request is not a JSON object");
  detail::FieldReader r(root);
  WireRequest w;
  if (r.get<std::int64_t>("kevo_checked_run") != 1) return make_error("the checked-run request is not version 1");
  w.id = r.get<std::string>("id");
  CheckedRunRequest& q = w.request;
  q.checker = r.get<std::string>("checker");
  q.runner = r.get<std::string>("runner");
  q.seed = r.get<std::uint64_t>("seed");
  q.warmup = r.get<int>("warmup");
  q.repetitions = r.get<int>("repetitions");
  q.flush_caches = r.get<bool>("flush_caches");
  q.call_timeout = std::chrono::seconds(r.get<std::int64_t>("call_timeout_s"));
  q.round_trip_seconds = r.get<double>("round_trip_seconds");
  for (auto [key, limits] : {std::pair{"runner_limits", &q.runner_limits}, {"checker_limits", &q.checker_limits}}) {
    detail::FieldReader lr(r.object(key));
    if (!r.bad_field().empty()) break;
    *limits = detail::limits_from_json(lr);
    if (!lr.bad_field().empty()) return make_error(fmt::format("the checked-run request's {}.{} is missing or malformed", key, lr.bad_field()));
  }
  if (r.bad_field().empty()) {
    detail::FieldReader jr(r.object("jail"));
    if (r.bad_field().empty()) {
      for (auto& p : jr.strings("read_only")) q.jail.read_only.emplace_back(p);
      for (auto& p : jr.strings("writable")) q.jail.writable.emplace_back(p);
      q.jail.working_directory = jr.get<std::string>("cwd");
      q.jail.tmpfs_bytes = jr.get<std::size_t>("tmpfs");
      q.jail.seccomp = jr.get<bool>("seccomp");
      q.jail.gpu = jr.get<bool>("gpu");
      if (!jr.bad_field().empty()) return make_error(fmt::format("the checked-run request's jail.{} is missing or malformed", jr.bad_field()));
    }
  }
  if (!r.bad_field().empty()) return make_error(fmt::format("the checked-run request's {} is missing or malformed", r.bad_field()));
  return w;
}

/// The report as one JSON line (no newline), tagged with the evaluation's `id`.
inline std::string report_to_json(const RunReport& r, std::string_view id) {
  return fmt::format(
      R"({{"kevo_run_report":1,"id":{},"failure":"{}","message":{},"detail":{},"seconds":{:.17g},"min_seconds":{:.17g},)"
      R"("bytes":{:.17g},"flops":{:.17g},"wall_seconds":{:.17g},"cpu_seconds":{:.17g},"roofline_gbytes_per_s":{:.17g},)"
      R"("roofline_gflops":{:.17g},"round_trip_seconds":{:.17g},"reference_in_process_seconds":{:.17g},"samples":{}}})",
      kevo::detail::json_quote(id), to_string(r.failure), kevo::detail::json_quote(r.message), kevo::detail::json_quote(r.detail), r.seconds,
      r.min_seconds, r.bytes, r.flops, r.wall_seconds, r.cpu_seconds, r.roofline_gbytes_per_s, r.roofline_gflops, r.round_trip_seconds,
      r.reference_in_process_seconds, r.samples);
}

/// `line` read strictly as the report of evaluation `id`: any doubt is an error, never a verdict.
inline expected<RunReport, Error> report_from_json(std::string_view line, std::string_view id) {
  simdjson::dom::parser parser;
  simdjson::dom::object root;
  if (line.empty()) return make_error("no report");
  if (line.find('\n') != std::string_view::npos) return make_error("more than one line");
  if (parser.parse(line.data(), line.size()).get(root)) return make_error("not a JSON object");
  detail::FieldReader r(root);
  if (r.get<std::int64_t>("kevo_run_report") != 1) return make_error("not a version 1 run report");
  if (r.get<std::string>("id") != id) return make_error(fmt::format("the report of another evaluation (expected id {})", id));
  const std::string failure = r.get<std::string>("failure");
  RunReport report;
  report.failure = failure_kind_from_string(failure);
  if (to_string(report.failure) != failure) return make_error(fmt::format("an unknown failure kind '{}'", kevo::eval::detail::tail(failure, 40)));
  report.message = r.get<std::string>("message");
  report.detail = r.get<std::string>("detail");
  for (auto [key, field] : {std::pair{"seconds", &report.seconds}, {"min_seconds", &report.min_seconds}, {"bytes", &report.bytes},
                            {"flops", &report.flops}, {"wall_seconds", &report.wall_seconds}, {"cpu_seconds", &report.cpu_seconds},
                            {"roofline_gbytes_per_s", &report.roofline_gbytes_per_s}, {"roofline_gflops", &report.roofline_gflops},
                            {"round_trip_seconds", &report.round_trip_seconds},
                            {"reference_in_process_seconds", &report.reference_in_process_seconds}}) {
    *field = r.get<double>(key);
    if (*field < 0 && std::string_view(key) != "round_trip_seconds") return make_error(fmt::format("a negative {}", key));
  }
  report.samples = r.get<int>("samples");
  if (!r.bad_field().empty()) return make_error(fmt::format("its field '{}' is missing or malformed", r.bad_field()));
  if (report.failure == FailureKind::none && !(report.seconds > 0)) return make_error("a success without a time");
  return report;
}

}  // namespace kevo::eval
