// kevo/problem_loader.hpp: load_problem, which reads and validates a problem directory (its
// problem.json with simdjson, its reference and template), naming the file and the field at fault.
//
//   auto problem = kevo::load_problem("problems/cpu_scoring");
//   if (!problem) { fmt::print(stderr, "{}\n", problem.error().message); return 2; }
#pragma once

#include <kevo/problem.hpp>

#include <fmt/format.h>
#include <simdjson.h>

#include <filesystem>
#include <optional>
#include <set>
#include <string>

namespace kevo {

namespace detail {

/// Reads a manifest value that may be a JSON number or string, as text.
inline std::optional<std::string> scalar_as_text(simdjson::dom::element e) {
  switch (e.type()) {
    case simdjson::dom::element_type::STRING: return std::string(std::string_view(e.get_string()));
    case simdjson::dom::element_type::INT64: return std::to_string(int64_t(e.get_int64()));
    case simdjson::dom::element_type::UINT64: return std::to_string(uint64_t(e.get_uint64()));
    case simdjson::dom::element_type::BOOL: return bool(e.get_bool()) ? "true" : "false";
    case simdjson::dom::element_type::DOUBLE: return fmt::format("{}", double(e.get_double()));
    default: return std::nullopt;
  }
}

}  // namespace detail

/// Loads and validates a problem directory. Errors name the file and the field at fault.
inline expected<Problem, Error> load_problem(const std::filesystem::path& directory) {
  namespace fs = std::filesystem;
  using simdjson::dom::element;
  const fs::path manifest_path = directory / "problem.json";
  const std::string where = manifest_path.string();
  if (!fs::exists(manifest_path)) return make_error(fmt::format("{}: no such file (a problem directory needs a manifest)", where));

  auto manifest_text = detail::read_text_file(manifest_path);
  if (!manifest_text) return unexpected(manifest_text.error());
  const simdjson::padded_string manifest_json(*manifest_text);
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (auto err = parser.parse(manifest_json).get(root))
    return make_error(fmt::format("{}: not valid JSON ({})", where, simdjson::error_message(err)));
  if (!root.is_object()) return make_error(fmt::format("{}: the manifest must be a JSON object", where));

  auto missing = [&](std::string_view key) { return make_error(fmt::format("{}: missing key '{}'", where, key)); };
  auto wrong = [&](std::string_view key, std::string_view want) {
    return make_error(fmt::format("{}: '{}' must be {}", where, key, want));
  };
  auto get_string = [&](std::string_view key, std::string& out) -> std::optional<Error> {
    element e;
    if (root[key].get(e)) return missing(key).error();
    std::string_view s;
    if (e.get_string().get(s)) return wrong(key, "a string").error();
    out = std::string(s);
    return std::nullopt;
  };

  Problem p;
  p.directory = directory;
  std::string target_text = "cpu";
  for (auto [key, out] : {std::pair<std::string_view, std::string*>{"name", &p.name},
                          {"reference", &p.reference_file},
                          {"template", &p.template_file},
                          {"bytes_model", &p.bytes_model},
                          {"flops_model", &p.flops_model}})
    if (auto e = get_string(key, *out)) return unexpected(*e);
  if (!is_safe_name(p.name))
    return make_error(fmt::format("{}: 'name' is \"{}\": it names kevo's files (the store, the best kernel, the report), so it must be "
                                  "a plain file name of letters, digits, '_', '.' and '-', not starting with '.'",
                                  where, p.name));
  p.manifest_source = std::move(*manifest_text);
  if (element e; !root["description"].get(e)) p.description = std::string(std::string_view(e.get_string().value_unsafe()));
  if (element e; !root["target"].get(e) && e.is_string()) target_text = std::string(std::string_view(e.get_string()));
  if (target_text == "cpu") p.target = Target::cpu;
  else if (target_text == "cuda") p.target = Target::cuda;
  else if (target_text == "hip") p.target = Target::hip;
  else return wrong("target", "one of \"cpu\", \"cuda\", \"hip\"");

  // params
  simdjson::dom::array params;
  if (root["params"].get(params)) return missing("params");
  for (element e : params) {
    std::string_view s;
    if (e.get_string().get(s) || !detail::is_identifier(s)) return wrong("params", "an array of identifiers");
    p.params.emplace_back(s);
  }
  if (p.params.empty()) return wrong("params", "a non-empty array");
  if (p.params.size() > 16) return wrong("params", "an array of at most 16 params");
  auto is_param = [&](std::string_view s) { return std::find(p.params.begin(), p.params.end(), s) != p.params.end(); };

  // tensors
  simdjson::dom::array tensors;
  if (root["tensors"].get(tensors)) return missing("tensors");
  std::size_t index = 0;
  for (element e : tensors) {
    const std::string field = fmt::format("tensors[{}]", index++);
    TensorSpec t;
    std::string_view s;
    if (e["name"].get_string().get(s) || !detail::is_identifier(s)) return wrong(field + ".name", "an identifier");
    t.name = std::string(s);
    if (e["role"].get_string().get(s) || (s != "input" && s != "output")) return wrong(field + ".role", "\"input\" or \"output\"");
    t.role = s == "input" ? TensorRole::input : TensorRole::output;
    if (e["type"].get_string().get(s) || (s != "float" && s != "int" && s != "half"))
      return wrong(field + ".type", "\"float\", \"int\" or \"half\"");
    t.type = s == "float" ? ElementType::f32 : s == "int" ? ElementType::i32 : ElementType::f16;
    if (e["size"].get_string().get(s) || s.empty()) return wrong(field + ".size", "a C++ expression over params, such as \"N * D\"");
    t.size = std::string(s);
    if (!e["init"].get_string().get(s)) {
      if (s != "normal" && s != "uniform") return wrong(field + ".init", "\"normal\" or \"uniform\"");
      t.init = std::string(s);
    }
    double d;
    if (!e["scale"].get_double().get(d)) t.scale = d;
    if (!e["low"].get_double().get(d)) t.low = d;
    if (!e["high"].get_double().get(d)) t.high = d;
    if (!e["step"].get_double().get(d)) {
      if (d < 0) return wrong(field + ".step", "a number >= 0");
      t.step = d;
    }
    if (t.init == "uniform" && !(t.low < t.high)) return wrong(field + ".low/high", "a range with low < high");
    p.tensors.push_back(std::move(t));
  }
  if (p.tensors.size() > 16) return wrong("tensors", "an array of at most 16 tensors");
  if (std::none_of(p.tensors.begin(), p.tensors.end(), [](auto& t) { return t.role == TensorRole::output; }))
    return wrong("tensors", "an array with at least one output");

  // shapes
  auto read_shape = [&](element e, const std::string& field) -> expected<Shape, Error> {
    Shape shape;
    for (const auto& param : p.params) {
      int64_t v;
      if (e[param].get_int64().get(v)) return make_error(fmt::format("{}: {} has no integer '{}'", where, field, param));
      if (v <= 0) return make_error(fmt::format("{}: {}.{} must be positive", where, field, param));
      shape[param] = static_cast<long>(v);
    }
    return shape;
  };
  simdjson::dom::array shapes;
  if (root["shapes"].get(shapes)) return missing("shapes");
  index = 0;
  for (element e : shapes) {
    auto shape = read_shape(e, fmt::format("shapes[{}]", index++));
    if (!shape) return unexpected(shape.error());
    p.check_shapes.push_back(*shape);
  }
  if (p.check_shapes.empty()) return wrong("shapes", "a non-empty array of shapes");
  element timing;
  if (root["timing_shape"].get(timing)) return missing("timing_shape");
  auto timing_shape = read_shape(timing, "timing_shape");
  if (!timing_shape) return unexpected(timing_shape.error());
  p.timing_shape = *timing_shape;

  // tolerance
  element tolerance;
  if (root["tolerance"].get(tolerance)) return missing("tolerance");
  if (tolerance["abs"].get_double().get(p.tolerance.absolute)) return wrong("tolerance.abs", "a number");
  if (tolerance["rel"].get_double().get(p.tolerance.relative)) return wrong("tolerance.rel", "a number");
  if (!(p.tolerance.absolute >= 0)) return wrong("tolerance.abs", "a number >= 0");
  if (!(p.tolerance.relative >= 0)) return wrong("tolerance.rel", "a number >= 0");

  // compile flags
  if (simdjson::dom::array flags; !root["compile_flags"].get(flags)) {
    for (element e : flags) {
      std::string_view s;
      if (e.get_string().get(s)) return wrong("compile_flags", "an array of strings");
      p.compile_flags.emplace_back(s);
    }
  }

  // allow_asm: whether the candidate screen lets asm statements through (inline PTX for ldmatrix, mma)
  if (auto allow = root["allow_asm"]; allow.error() != simdjson::NO_SUCH_FIELD) {
    if (allow.get_bool().get(p.allow_asm)) return wrong("allow_asm", "true or false");
  }

  // library_headers: kevo headers its candidates may include, copied beside the generated header
  if (auto headers = root["library_headers"]; headers.error() != simdjson::NO_SUCH_FIELD) {
    simdjson::dom::array names;
    if (headers.get(names)) return wrong("library_headers", "an array of kevo header paths, such as [\"kevo/retrieval/agent/scoring.cuh\"]");
    for (element e : names) {
      const std::string field = fmt::format("library_headers[{}]", p.library_headers.size());
      std::string_view name;
      if (e.get_string().get(name)) return wrong(field, "a string, such as \"kevo/retrieval/agent/scoring.cuh\"");
      if (auto fault = detail::library_header_fault(name))
        return make_error(fmt::format("{}: '{}' is \"{}\", which {}: it must be a relative path under kevo/ without '..' or '\\', "
                                      "such as \"kevo/retrieval/agent/scoring.cuh\"",
                                      where, field, name, *fault));
      p.library_headers.emplace_back(name);
    }
  }

  // knobs: {"name": {"domain": [...], "default": v, "side": "memory"}}
  simdjson::dom::object knobs;
  if (root["knobs"].get(knobs)) return missing("knobs");
  for (auto [key, value] : knobs) {
    KnobSpec k;
    k.name = std::string(key);
    const std::string field = "knobs." + k.name;
    if (!detail::is_identifier(k.name)) return wrong(field, "named by an identifier");
    if (is_param(k.name)) return wrong(field, "named differently from every param");
    simdjson::dom::array domain;
    if (value["domain"].get(domain)) return make_error(fmt::format("{}: missing key '{}.domain'", where, field));
    for (element d : domain) {
      auto text = detail::scalar_as_text(d);
      if (!text) return wrong(field + ".domain", "an array of numbers or strings");
      k.domain.push_back(*text);
    }
    if (k.domain.empty()) return make_error(fmt::format("{}: '{}.domain' is empty (a knob needs at least one legal value)", where, field));
    element def;
    if (!value["default"].get(def)) {
      auto text = detail::scalar_as_text(def);
      if (!text || !k.index_of(*text)) return wrong(field + ".default", "one of the values in its domain");
      k.default_value = *text;
    } else {
      k.default_value = k.domain.front();
    }
    if (std::string_view s; !value["side"].get_string().get(s)) {
      if (s == "memory") k.side = KnobSide::memory;
      else if (s == "compute") k.side = KnobSide::compute;
      else if (s == "parallel") k.side = KnobSide::parallel;
      else if (s == "any") k.side = KnobSide::any;
      else return wrong(field + ".side", "one of \"memory\", \"compute\", \"parallel\", \"any\"");
    }
    p.knobs.push_back(std::move(k));
  }

  // starting_points: [{"name": "tensor cores", "knobs": {"math": "tensor_core"}}, ...]
  if (simdjson::dom::array starts; !root["starting_points"].get(starts)) {
    for (element e : starts) {
      const std::string field = fmt::format("starting_points[{}]", p.starting_points.size());
      StartingPoint point;
      std::string_view name;
      simdjson::dom::object set;
      if (e["name"].get_string().get(name) || name.empty()) return wrong(field + ".name", "a non-empty string");
      if (e["knobs"].get(set)) return wrong(field + ".knobs", "an object of knob values");
      point.name = std::string(name);
      for (auto [key, value] : set) {
        const KnobSpec* spec = p.knob(key);
        if (!spec) return wrong(field + ".knobs." + std::string(key), "a knob declared under 'knobs'");
        auto text = detail::scalar_as_text(value);
        if (!text || !spec->index_of(*text)) return wrong(field + ".knobs." + std::string(key), "one of the values in its domain");
        point.knobs[spec->name] = *text;
      }
      if (point.knobs.empty()) return wrong(field + ".knobs", "an object that sets at least one knob");
      p.starting_points.push_back(std::move(point));
    }
  } else if (root["starting_points"].error() != simdjson::NO_SUCH_FIELD) {
    return wrong("starting_points", "an array of {\"name\", \"knobs\"} objects");
  }

  // the sources
  auto reference = detail::read_text_file(directory / p.reference_file);
  if (!reference) return make_error(fmt::format("{}: 'reference' names {}, which cannot be read", where, (directory / p.reference_file).string()));
  p.reference_source = std::move(*reference);
  auto tmpl = detail::read_text_file(directory / p.template_file);
  if (!tmpl) return make_error(fmt::format("{}: 'template' names {}, which cannot be read", where, (directory / p.template_file).string()));
  p.template_source = std::move(*tmpl);

  std::optional<Error> undeclared;
  detail::for_each_placeholder(p.template_source, [&](std::string_view knob_name, std::size_t line, std::size_t, std::size_t) {
    if (!undeclared && !p.knob(knob_name))
      undeclared = Error{fmt::format("{}:{}: the template uses knob '{}', which {} does not declare under 'knobs'",
                                     (directory / p.template_file).string(), line, knob_name, where)};
  });
  if (undeclared) return unexpected(*undeclared);
  return p;
}

}  // namespace kevo
