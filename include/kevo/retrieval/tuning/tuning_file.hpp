// kevo/retrieval/tuning/tuning_file.hpp: the pipeline policies a search found, kept in a small JSON
// file keyed by the GPU, the CUDA version and the pool's shape class, and the choice the pipeline
// makes from it. A file for another GPU or CUDA version, or one whose fields are no longer legal, is
// refused with the reason, and the defaults are used. Host code only (fmt and simdjson, which nvcc
// cannot compile): a .cu program hands the pipeline `tuned_policies(file)` from a .cpp file.
//
//   TuningFile file{.gpu = "NVIDIA H200", .cuda = "13.0"};
//   file.entries.push_back({.shape = {128, EmbeddingType::fp16, pool_class(100'000'000)}, .policy = found});
//   write_tuning_file("pipeline-tuning.json", file);
//   PolicyChoice c = choose_policy("pipeline-tuning.json", {"NVIDIA H200", "13.0"}, shape, PipelinePolicy{});
//   log(c.origin);   // which policy each stage got, and why
//   options.choose_policy = tuned_policies("pipeline-tuning.json");   // FusedRetrievalPipeline::Options
#pragma once

#include <kevo/detail/json_writer.hpp>
#include <kevo/expected.hpp>
#include <kevo/retrieval/tuning/policies.hpp>
#include <kevo/retrieval/tuning/policy_choice.hpp>
#include <kevo/retrieval/types.hpp>

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace kevo::retrieval {


struct TuningEntry {
  ShapeClass shape;
  PipelinePolicy policy;
  double default_seconds = 0, tuned_seconds = 0;  // as measured by the search, for the record
  int evaluations = 0;
};

struct TuningFile {
  std::string gpu;   ///< the device name, as the runtime reports it
  std::string cuda;  ///< the runtime's version, "13.0"
  std::vector<TuningEntry> entries;
};

inline std::string tuning_file_json(const TuningFile& file) {
  std::string out = fmt::format("{{\n  \"format\": \"kevo-pipeline-tuning\",\n  \"version\": 1,\n  \"gpu\": {},\n  \"cuda\": {},\n  \"entries\": [",
                                kevo::detail::json_quote(file.gpu), kevo::detail::json_quote(file.cuda));
  for (std::size_t i = 0; i < file.entries.size(); ++i) {
    const TuningEntry& e = file.entries[i];
    out += fmt::format("{}\n    {{\"dim\": {}, \"dtype\": \"{}\", \"pool\": \"{}\", \"load_order\": \"{}\", \"default_seconds\": {:.9g}, "
                       "\"tuned_seconds\": {:.9g}, \"evaluations\": {},\n     \"policy\": {}}}",
                       i ? "," : "", e.shape.dim, to_string(e.shape.dtype), pool_class_name(e.shape.pool_decade),
                       to_string(e.shape.load_order), e.default_seconds, e.tuned_seconds, e.evaluations,
                       kevo::detail::knobs_to_json(to_knobs(e.policy)));
  }
  return out + "\n  ]\n}\n";
}

inline expected<void, Error> write_tuning_file(const std::filesystem::path& path, const TuningFile& file) {
  const std::filesystem::path temporary = path.string() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << tuning_file_json(file);
    if (!out) return make_error(fmt::format("{}: cannot be written", temporary.string()));
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);  // a reader never sees half a file
  if (ec) return make_error(fmt::format("{}: {}", path.string(), ec.message()));
  return {};
}

namespace tuning_detail {
inline expected<int, Error> pool_decade_from(std::string_view name) {
  for (int decade = 0; decade <= 12; ++decade)
    if (pool_class_name(decade) == name) return decade;
  return make_error(fmt::format("pool '{}' is not a decade such as 1M, 10M or 100M", name));
}
}  // namespace tuning_detail

/// Reads a tuning file, refusing what is not one, or an entry whose policy is not legal (the
/// message names the entry and the field).
inline expected<TuningFile, Error> read_tuning_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return make_error(fmt::format("{}: cannot be read", path.string()));
  std::stringstream text;
  text << in.rdbuf();
  const std::string where = path.string();
  // The DOM parser reads the whole text, so trailing content after the object is an error too.
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (auto error = parser.parse(text.str()).get(doc))
    return make_error(fmt::format("{}: malformed tuning file: {}", where, simdjson::error_message(error)));
  try {
    TuningFile file;
    std::string_view format;
    if (doc["format"].get(format) || format != "kevo-pipeline-tuning") return make_error(fmt::format("{}: not a kevo pipeline tuning file", where));
    if (std::int64_t(doc["version"]) != 1) return make_error(fmt::format("{}: a tuning file of another version", where));
    file.gpu = std::string(std::string_view(doc["gpu"]));
    file.cuda = std::string(std::string_view(doc["cuda"]));
    std::size_t index = 0;
    for (simdjson::dom::element entry : simdjson::dom::array(doc["entries"])) {
      TuningEntry e;
      e.shape.dim = static_cast<int>(std::int64_t(entry["dim"]));
      const std::string_view dtype(entry["dtype"]);
      const std::optional<EmbeddingType> type = embedding_type_named(dtype);
      if (!type) return make_error(fmt::format("{}: entry {}: dtype '{}' is not {}", where, index, dtype, kEmbeddingTypeNames));
      e.shape.dtype = *type;
      auto decade = tuning_detail::pool_decade_from(std::string_view(entry["pool"]));
      if (!decade) return make_error(fmt::format("{}: entry {}: {}", where, index, decade.error().message));
      e.shape.pool_decade = *decade;
      // Files written before the load order was recorded were all tuned on pools loaded by id.
      std::string_view order = "id";
      if (auto field = entry["load_order"]; field.error() != simdjson::NO_SUCH_FIELD) order = std::string_view(field);
      const std::optional<SlotOrder> load_order = slot_order_named(order);
      if (!load_order) return make_error(fmt::format("{}: entry {}: load_order '{}' is not id or targeting", where, index, order));
      e.shape.load_order = *load_order;
      e.default_seconds = double(entry["default_seconds"]);
      e.tuned_seconds = double(entry["tuned_seconds"]);
      e.evaluations = static_cast<int>(std::int64_t(entry["evaluations"]));
      Knobs knobs;
      for (auto [name, value] : simdjson::dom::object(entry["policy"])) knobs[std::string(name)] = std::string(std::string_view(value));
      auto policy = policy_from_knobs(knobs);
      if (!policy) return make_error(fmt::format("{}: entry {} ({}): {}", where, index, to_string(e.shape), policy.error().message));
      e.policy = *policy;
      file.entries.push_back(std::move(e));
      ++index;
    }
    return file;
  } catch (const simdjson::simdjson_error& e) {  // a field missing or of the wrong type
    return make_error(fmt::format("{}: malformed tuning file: {}", where, e.what()));
  }
}

/// The tuned policy for `shape` on `device` from `file`, or `defaults` with the reason: no file,
/// a file that cannot be read, one made on another GPU or CUDA version, or no entry for the shape.
/// Of the entries for the same d and dtype, one tuned in the same load order wins over one tuned in
/// the other (still a legal policy for the pool, and said so in the origin line), then the nearest
/// size class.
inline PolicyChoice choose_policy(const std::filesystem::path& path, const DeviceIdentity& device, const ShapeClass& shape,
                                  const PipelinePolicy& defaults) {
  auto fallback = [&](std::string why) {
    return PolicyChoice{defaults, false, why, fmt::format("defaults ({}): {}", why, to_string(defaults))};
  };
  if (path.empty()) return fallback("no tuning file");
  auto file = read_tuning_file(path);
  if (!file) return fallback(file.error().message);
  if (file->gpu != device.gpu || file->cuda != device.cuda)
    return fallback(fmt::format("{} was tuned on {} with CUDA {}, and this is {} with CUDA {}", path.string(), file->gpu, file->cuda,
                                device.gpu, device.cuda));
  auto distance = [&](const TuningEntry& e) {  // (another order, decades apart): smaller is nearer
    return std::pair{e.shape.load_order != shape.load_order, std::abs(e.shape.pool_decade - shape.pool_decade)};
  };
  const TuningEntry* best = nullptr;
  for (const TuningEntry& e : file->entries)
    if (e.shape.dim == shape.dim && e.shape.dtype == shape.dtype && (!best || distance(e) < distance(*best))) best = &e;
  if (!best) return fallback(fmt::format("{} has no entry for d = {}, {}", path.string(), shape.dim, to_string(shape.dtype)));
  const std::string other_order =
      best->shape.load_order == shape.load_order ? std::string()
                                                 : fmt::format(" (this pool is loaded by {}; the file has no entry tuned so)", to_string(shape.load_order));
  return PolicyChoice{best->policy, true, {},
                      fmt::format("tuned for {}{} on {} (CUDA {}, {}): {}", to_string(best->shape), other_order, file->gpu, file->cuda,
                                  path.string(), to_string(best->policy))};
}

/// The pipeline's chooser (FusedRetrievalPipeline::Options::choose_policy) over a tuning file, read
/// when the pipeline is created. The pipeline cannot see the order its caller loads ads in, so the
/// caller says it here (retrieval_server passes its --load-order).
inline PolicyChooser tuned_policies(std::filesystem::path path, SlotOrder load_order = SlotOrder::by_id) {
  return [path = std::move(path), load_order](const DeviceIdentity& device, ShapeClass shape) {
    shape.load_order = load_order;
    return choose_policy(path, device, shape, PipelinePolicy{});
  };
}

}  // namespace kevo::retrieval
