// kevo/problem.hpp: a kernel-optimization problem, as a user writes it: a directory holding
//   problem.json      the manifest: params, tensors, shapes, tolerance, bytes/FLOPs model, knobs
//   reference.cpp     the reference implementation: `void reference(const Shape&, tensors...)`
//   <template>        the kernel template: `void kernel(const Shape&, tensors...)`, with ${knob}
//                     placeholders that each candidate fills in from the knobs' declared domains
// See problems/README.md for the format, and problems/ for three complete examples.
//
//   auto problem = kevo::load_problem("problems/cpu_scoring");
//   if (!problem) { fmt::print(stderr, "{}\n", problem.error().message); return 2; }
//   std::string source = problem->render(problem->default_knobs());
#pragma once

#include <kevo/candidate.hpp>
#include <kevo/expected.hpp>

#include <fmt/format.h>
#include <simdjson.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace kevo {

/// Which side of the machine a knob works on, so a synthesizer can answer a diagnosis with the
/// knobs that address it (a memory-bound parent gets memory-side moves).
enum class KnobSide : std::uint8_t { memory, compute, parallel, any };

inline constexpr std::string_view to_string(KnobSide s) {
  switch (s) {
    case KnobSide::memory: return "memory";
    case KnobSide::compute: return "compute";
    case KnobSide::parallel: return "parallel";
    case KnobSide::any: return "any";
  }
  return "?";
}

/// One tuning knob: its legal values in a meaningful order (neighbours are small moves).
struct KnobSpec {
  std::string name;
  std::vector<std::string> domain;
  std::string default_value;
  KnobSide side = KnobSide::any;

  std::optional<std::size_t> index_of(std::string_view value) const {
    for (std::size_t i = 0; i < domain.size(); ++i)
      if (domain[i] == value) return i;
    return std::nullopt;
  }
};

enum class TensorRole : std::uint8_t { input, output };
enum class ElementType : std::uint8_t { f32, i32, f16 };  ///< "float", "int", "half" (CUDA problems)

/// A kernel argument: its element count is a C++ expression over the problem's params.
struct TensorSpec {
  std::string name;
  TensorRole role = TensorRole::input;
  ElementType type = ElementType::f32;
  std::string size;       ///< e.g. "N * D"
  std::string init = "normal";  ///< inputs: "normal" (mean 0, sd `scale`) or "uniform" [low, high)
  double scale = 1.0;
  double low = 0, high = 1;
  double step = 0;        ///< inputs: round drawn values to multiples of `step` (0: no rounding),
                          ///< so that sums are exact in any order when the kernel may reorder them
};

/// Values for the problem's params, one shape the kernel must handle.
using Shape = std::map<std::string, long, std::less<>>;

struct Tolerance {
  double absolute = 1e-5;
  double relative = 1e-5;
};

struct Problem {
  std::filesystem::path directory;
  std::string name;
  std::string description;
  Target target = Target::cpu;
  std::vector<std::string> params;
  std::vector<TensorSpec> tensors;
  std::vector<Shape> check_shapes;   ///< correctness is checked on every one of these
  Shape timing_shape;                ///< the shape that speedups are measured on
  Tolerance tolerance;
  std::string bytes_model;           ///< C++ expression over params: bytes the kernel must move
  std::string flops_model;           ///< C++ expression over params: useful FLOPs
  std::vector<std::string> compile_flags;
  std::string reference_file;
  std::string reference_source;
  std::string template_file;
  std::string template_source;
  std::vector<KnobSpec> knobs;
  std::string manifest_source;       ///< problem.json as read, for identity()

  const KnobSpec* knob(std::string_view knob_name) const {
    for (const auto& k : knobs)
      if (k.name == knob_name) return &k;
    return nullptr;
  }

  Knobs default_knobs() const {
    Knobs out;
    for (const auto& k : knobs) out[k.name] = k.default_value;
    return out;
  }

  /// The template with every ${knob} replaced by its value. Knobs must be complete.
  std::string render(const Knobs& values) const;

  /// What a stored run records of the problem, so that resume can refuse another problem (or this
  /// one changed): a hash of the manifest, the reference and the template, as 16 hex digits.
  std::string identity() const {
    std::uint64_t h = content_hash(manifest_source);
    h = content_hash(reference_source, h ^ 0x9e3779b97f4a7c15ull);
    h = content_hash(template_source, h ^ 0x9e3779b97f4a7c15ull);
    return fmt::format("{:016x}", h);
  }
};

/// Whether `name` can name files (the store, the best kernel, the report) inside kevo-runs/: a
/// plain file name of [A-Za-z0-9_.-], not starting with '.'.
inline bool is_safe_name(std::string_view name) {
  if (name.empty() || name.size() > 100 || name.front() == '.') return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-')) return false;
  return true;
}

namespace detail {

inline expected<std::string, Error> read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(fmt::format("{}: cannot be read", path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

/// Calls f(name, line, begin, end) for each ${name} placeholder in a template.
template <class F>
void for_each_placeholder(std::string_view text, F&& f) {
  std::size_t line = 1;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n') ++line;
    if (text[i] == '$' && i + 1 < text.size() && text[i + 1] == '{') {
      const std::size_t close = text.find('}', i + 2);
      if (close == std::string_view::npos) return;
      f(text.substr(i + 2, close - i - 2), line, i, close + 1);
      i = close;
    }
  }
}

inline bool is_identifier(std::string_view s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

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

inline std::string Problem::render(const Knobs& values) const {
  std::string out;
  std::size_t copied = 0;
  detail::for_each_placeholder(template_source, [&](std::string_view knob_name, std::size_t, std::size_t begin,
                                                    std::size_t end) {
    out.append(template_source, copied, begin - copied);
    auto it = values.find(knob_name);
    out += it != values.end() ? it->second : std::string(knob_name);
    copied = end;
  });
  out.append(template_source, copied);
  return out;
}

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
