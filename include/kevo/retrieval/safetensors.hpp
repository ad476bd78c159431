// kevo/retrieval/safetensors.hpp: the model's weights in a safetensors file (F32 tensors named
// w1, c1, w2, c2, gate_projection). The header parser reads exactly what safetensors writes: one
// flat JSON object of {dtype, shape, data_offsets} entries and an optional __metadata__ of strings.
// It is hand-written because the pipeline's .cu files include this header and simdjson.h does not
// compile under nvcc 13 (its SSE types trip nvcc's front end); the server's JSON goes through simdjson.
//
//   if (auto saved = save_model(model, "model.safetensors"); !saved) fail(saved.error().message);
//   expected<Model, Error> loaded = load_model("model.safetensors");
#pragma once

#include <cctype>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "kevo/retrieval/types.hpp"

namespace kevo::retrieval {

namespace detail {

struct TensorEntry {
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;
};

/// A cursor over the header's JSON; every method returns false on text it does not expect.
class HeaderParser {
 public:
  explicit HeaderParser(const std::string& text) : text_(text) {}

  bool parse(std::map<std::string, TensorEntry>& out) {
    if (!expect('{')) return false;
    if (peek('}')) return expect('}') && at_end();
    do {
      std::string name;
      if (!string(name) || !expect(':')) return false;
      if (name == "__metadata__") {
        if (!skip_string_map()) return false;
        continue;
      }
      TensorEntry entry;
      if (!tensor(entry)) return false;
      out[name] = std::move(entry);
    } while (consume(','));
    return expect('}') && at_end();
  }

 private:
  bool tensor(TensorEntry& entry) {
    if (!expect('{')) return false;
    do {
      std::string key;
      if (!string(key) || !expect(':')) return false;
      if (key == "dtype") {
        if (!string(entry.dtype)) return false;
      } else if (key == "shape") {
        if (!integers(entry.shape)) return false;
      } else if (key == "data_offsets") {
        std::vector<std::int64_t> offsets;
        if (!integers(offsets) || offsets.size() != 2 || offsets[0] < 0 || offsets[1] < offsets[0]) return false;
        entry.begin = static_cast<std::uint64_t>(offsets[0]);
        entry.end = static_cast<std::uint64_t>(offsets[1]);
      } else {
        return false;
      }
    } while (consume(','));
    return expect('}');
  }
  bool skip_string_map() {
    if (!expect('{')) return false;
    if (consume('}')) return true;
    do {
      std::string key, value;
      if (!string(key) || !expect(':') || !string(value)) return false;
    } while (consume(','));
    return expect('}');
  }
  bool integers(std::vector<std::int64_t>& out) {
    if (!expect('[')) return false;
    if (consume(']')) return true;
    do {
      skip_space();
      std::int64_t value = 0;
      std::size_t digits = 0;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_])) && digits < 18) {
        value = value * 10 + (text_[pos_++] - '0');
        ++digits;
      }
      if (digits == 0) return false;
      out.push_back(value);
    } while (consume(','));
    return expect(']');
  }
  bool string(std::string& out) {
    if (!expect('"')) return false;
    while (pos_ < text_.size() && text_[pos_] != '"') {
      if (text_[pos_] == '\\') {
        if (++pos_ >= text_.size()) return false;
      }
      out += text_[pos_++];
    }
    return pos_ < text_.size() && text_[pos_++] == '"';
  }
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool peek(char c) {
    skip_space();
    return pos_ < text_.size() && text_[pos_] == c;
  }
  bool consume(char c) {
    if (!peek(c)) return false;
    ++pos_;
    return true;
  }
  bool expect(char c) { return consume(c); }
  bool at_end() {
    skip_space();
    return pos_ == text_.size();
  }

  const std::string& text_;
  std::size_t pos_ = 0;
};

struct NamedTensor {
  const char* name;
  std::vector<float>* values;
  std::vector<std::int64_t> shape;
};

inline std::vector<NamedTensor> model_tensors(Model& m) {
  const std::int64_t e = m.experts, h = m.hidden, f = m.features, d = m.dim;
  return {{"w1", &m.w1, {e, h, f}},
          {"c1", &m.c1, {e, h}},
          {"w2", &m.w2, {e, d, h}},
          {"c2", &m.c2, {e, d}},
          {"gate_projection", &m.gate_projection, {d, d}}};
}

}  // namespace detail

/// Writes the model as F32 tensors; the header is padded with spaces to 8 bytes as safetensors does.
inline expected<void, Error> save_model(const Model& model, const std::string& path) {
  if (auto ok = validate_model(model); !ok) return ok;
  Model copy = model;
  std::string header = "{";
  std::uint64_t offset = 0;
  std::vector<detail::NamedTensor> tensors = detail::model_tensors(copy);
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const std::uint64_t bytes = tensors[t].values->size() * sizeof(float);
    std::string shape;
    for (std::size_t i = 0; i < tensors[t].shape.size(); ++i)
      shape += (i ? "," : "") + std::to_string(tensors[t].shape[i]);
    header += (t ? "," : "") + std::string("\"") + tensors[t].name + "\":{\"dtype\":\"F32\",\"shape\":[" + shape +
              "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + bytes) + "]}";
    offset += bytes;
  }
  header += "}";
  while (header.size() % 8) header += ' ';
  std::ofstream out(path, std::ios::binary);
  if (!out) return make_error("cannot write " + path);
  const std::uint64_t length = header.size();
  unsigned char length_bytes[8];
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<unsigned char>(length >> (8 * i));  // little-endian
  out.write(reinterpret_cast<const char*>(length_bytes), 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const detail::NamedTensor& t : tensors)
    out.write(reinterpret_cast<const char*>(t.values->data()), static_cast<std::streamsize>(t.values->size() * sizeof(float)));
  if (!out) return make_error("write failed: " + path);
  return {};
}

/// Reads a model written by save_model (or by Python's safetensors with the same names, F32).
inline expected<Model, Error> load_model(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("cannot open " + path);
  unsigned char length_bytes[8];
  if (!in.read(reinterpret_cast<char*>(length_bytes), 8)) return make_error(path + ": too short for safetensors");
  std::uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= static_cast<std::uint64_t>(length_bytes[i]) << (8 * i);
  if (length > (100u << 20)) return make_error(path + ": header length " + std::to_string(length) + " is implausible");
  std::string header(length, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(length))) return make_error(path + ": truncated header");
  std::map<std::string, detail::TensorEntry> entries;
  if (!detail::HeaderParser(header).parse(entries)) return make_error(path + ": malformed safetensors header");
  std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  auto shape_of = [&](const char* name) -> const std::vector<std::int64_t>* {
    auto it = entries.find(name);
    return it == entries.end() ? nullptr : &it->second.shape;
  };
  const auto* w1 = shape_of("w1");
  const auto* w2 = shape_of("w2");
  if (!w1 || w1->size() != 3 || !w2 || w2->size() != 3) return make_error(path + ": needs 3-d tensors w1 and w2");
  Model model;
  model.experts = static_cast<int>((*w1)[0]);
  model.hidden = static_cast<int>((*w1)[1]);
  model.features = static_cast<int>((*w1)[2]);
  model.dim = static_cast<int>((*w2)[1]);
  for (detail::NamedTensor& t : detail::model_tensors(model)) {
    auto it = entries.find(t.name);
    if (it == entries.end()) return make_error(path + ": missing tensor " + t.name);
    const detail::TensorEntry& e = it->second;
    if (e.dtype != "F32") return make_error(path + ": tensor " + t.name + " is " + e.dtype + ", expected F32");
    if (e.shape != t.shape) return make_error(path + ": tensor " + t.name + " has the wrong shape");
    std::uint64_t count = 1;
    for (std::int64_t s : t.shape) count *= static_cast<std::uint64_t>(s);
    if (e.end - e.begin != count * sizeof(float) || e.end > data.size())
      return make_error(path + ": tensor " + t.name + " has bad data offsets");
    t.values->resize(count);
    std::memcpy(t.values->data(), data.data() + e.begin, count * sizeof(float));
  }
  if (auto ok = validate_model(model); !ok) return unexpected(ok.error());
  return model;
}

}  // namespace kevo::retrieval
