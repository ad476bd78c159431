// kevo/retrieval/safetensors.hpp: the model's weights in a safetensors file (F32 tensors named
// w1, c1, w2, c2, gate_projection), and the reader and writer that ad_file.hpp shares. The header
// parser reads exactly what safetensors writes: one flat JSON object of {dtype, shape,
// data_offsets} entries and an optional __metadata__ of strings (a string-to-string map, which the
// writer writes and the reader returns; ad files keep their embedding type there). It is hand-written because the pipeline's .cu files include this header and simdjson.h does not
// compile under nvcc 13 (its SSE types trip nvcc's front end); the server's JSON goes through simdjson.
//
//   if (auto saved = save_model(model, "model.safetensors"); !saved) fail(saved.error().message);
//   expected<Model, Error> loaded = load_model("model.safetensors");
#pragma once

#include <cctype>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
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

  /// The tensors into `out`, and __metadata__'s strings into `metadata`.
  bool parse(std::map<std::string, TensorEntry>& out, std::map<std::string, std::string>& metadata) {
    if (!expect('{')) return false;
    if (peek('}')) return expect('}') && at_end();
    bool seen_metadata = false;
    do {
      std::string name;
      if (!string(name) || !expect(':')) return false;
      if (name == "__metadata__") {
        if (seen_metadata || !string_map(metadata)) return false;
        seen_metadata = true;
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
  bool string_map(std::map<std::string, std::string>& out) {
    if (!expect('{')) return false;
    if (consume('}')) return true;
    do {
      std::string key, value;
      if (!string(key) || !expect(':') || !string(value)) return false;
      out[key] = std::move(value);
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
  /// A JSON string, its escapes decoded (\uXXXX, surrogate pairs included, to UTF-8).
  bool string(std::string& out) {
    if (!expect('"')) return false;
    while (pos_ < text_.size() && text_[pos_] != '"') {
      const char c = text_[pos_++];
      if (static_cast<unsigned char>(c) < 0x20) return false;  // JSON escapes control characters
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) return false;
      switch (const char e = text_[pos_++]; e) {
        case '"': case '\\': case '/': out += e; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          std::uint32_t point = 0;
          if (!hex4(point)) return false;
          if (point >= 0xd800 && point < 0xdc00) {  // a high surrogate: its low one must follow
            std::uint32_t low = 0;
            if (text_.compare(pos_, 2, "\\u") != 0) return false;
            pos_ += 2;
            if (!hex4(low) || low < 0xdc00 || low >= 0xe000) return false;
            point = 0x10000 + ((point - 0xd800) << 10) + (low - 0xdc00);
          } else if (point >= 0xdc00 && point < 0xe000) {
            return false;
          }
          append_utf8(point, out);
          break;
        }
        default: return false;
      }
    }
    return pos_ < text_.size() && text_[pos_++] == '"';
  }
  bool hex4(std::uint32_t& out) {
    if (text_.size() - pos_ < 4) return false;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[pos_++];
      const int digit = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (digit < 0) return false;
      out = out * 16 + static_cast<std::uint32_t>(digit);
    }
    return true;
  }
  static void append_utf8(std::uint32_t point, std::string& out) {
    if (point < 0x80) {
      out += static_cast<char>(point);
    } else if (point < 0x800) {
      out += static_cast<char>(0xc0 | (point >> 6));
      out += static_cast<char>(0x80 | (point & 0x3f));
    } else if (point < 0x10000) {
      out += static_cast<char>(0xe0 | (point >> 12));
      out += static_cast<char>(0x80 | ((point >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (point & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (point >> 18));
      out += static_cast<char>(0x80 | ((point >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((point >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (point & 0x3f));
    }
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

/// One tensor to write: its name, safetensors dtype ("F32", "U32", ...), shape and byte count, and
/// a function that writes exactly that many bytes of it (little-endian) to the stream, so that a
/// large tensor is written straight from where it lives.
struct TensorWriter {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t bytes = 0;
  std::function<void(std::ostream&)> write;
};

/// `text` as a JSON string, quoted: '"', '\\' and control characters escaped, other bytes as they are.
inline std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\u00";
      out += hex[(c >> 4) & 0xf];
      out += hex[c & 0xf];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

/// Writes the tensors, in order, as one safetensors file: the 8-byte header length, the header
/// (with `metadata`, where given, as its __metadata__ string map) padded with spaces to 8 bytes as
/// safetensors does, then the data.
inline expected<void, Error> write_safetensors(const std::string& path, const std::vector<TensorWriter>& tensors,
                                               const std::map<std::string, std::string>& metadata = {}) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (auto it = metadata.begin(); it != metadata.end(); ++it)
      header += (it == metadata.begin() ? "" : ",") + json_string(it->first) + ":" + json_string(it->second);
    header += tensors.empty() ? "}" : "},";
  }
  std::uint64_t offset = 0;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    std::string shape;
    for (std::size_t i = 0; i < tensors[t].shape.size(); ++i)
      shape += (i ? "," : "") + std::to_string(tensors[t].shape[i]);
    header += (t ? "," : "") + json_string(tensors[t].name) + ":{\"dtype\":\"" + tensors[t].dtype +
              "\",\"shape\":[" + shape + "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + tensors[t].bytes) + "]}";
    offset += tensors[t].bytes;
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
  for (const TensorWriter& t : tensors) {
    const auto before = out.tellp();
    t.write(out);
    if (out && static_cast<std::uint64_t>(out.tellp() - before) != t.bytes)
      return make_error("write failed: " + path + ": tensor " + t.name + " wrote the wrong number of bytes");
  }
  if (!out.flush()) return make_error("write failed: " + path);
  return {};
}

/// An open safetensors file: the entries of its header, and reads of any byte range of a tensor,
/// so that a file larger than memory can be read a slice at a time.
class SafetensorsFile {
 public:
  static expected<SafetensorsFile, Error> open(const std::string& path) {
    SafetensorsFile f;
    f.path_ = path;
    f.in_ = std::make_unique<std::ifstream>(path, std::ios::binary);
    std::ifstream& in = *f.in_;
    if (!in) return make_error("cannot open " + path);
    unsigned char length_bytes[8];
    if (!in.read(reinterpret_cast<char*>(length_bytes), 8)) return make_error(path + ": too short for safetensors");
    std::uint64_t length = 0;
    for (int i = 0; i < 8; ++i) length |= static_cast<std::uint64_t>(length_bytes[i]) << (8 * i);
    if (length > (100u << 20)) return make_error(path + ": header length " + std::to_string(length) + " is implausible");
    std::string header(length, '\0');
    if (!in.read(header.data(), static_cast<std::streamsize>(length))) return make_error(path + ": truncated header");
    if (!HeaderParser(header).parse(f.entries_, f.metadata_)) return make_error(path + ": malformed safetensors header");
    f.data_start_ = 8 + length;
    in.seekg(0, std::ios::end);
    const auto size = static_cast<std::uint64_t>(in.tellg());
    f.data_bytes_ = size - f.data_start_;
    return f;
  }

  const std::string& path() const { return path_; }
  /// The header's __metadata__ (empty where it has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  /// "[8, 256, 128]"
  static std::string shape_text(const std::vector<std::int64_t>& shape) {
    std::string out = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
    return out + "]";
  }

  /// The tensor `name`, checked to hold `dtype` values (of `value_bytes` each) in `rank` dimensions
  /// and to lie wholly inside the file.
  expected<const TensorEntry*, Error> tensor(const std::string& name, const std::string& dtype, std::size_t value_bytes,
                                             std::size_t rank) const {
    auto it = entries_.find(name);
    if (it == entries_.end()) return make_error(path_ + ": missing tensor " + name);
    const TensorEntry& e = it->second;
    if (e.dtype != dtype) return make_error(path_ + ": tensor " + name + " is " + e.dtype + ", expected " + dtype);
    if (e.shape.size() != rank)
      return make_error(path_ + ": tensor " + name + " has shape " + shape_text(e.shape) + ", expected " + std::to_string(rank) + " dimensions");
    std::uint64_t count = 1;
    for (std::int64_t s : e.shape) count *= static_cast<std::uint64_t>(s);
    if (e.end - e.begin != count * value_bytes || e.end > data_bytes_)
      return make_error(path_ + ": tensor " + name + " has bad data offsets");
    return &e;
  }

  /// Reads `bytes` bytes from `offset` within the tensor's data (inside it: tensor() checked the extent).
  expected<void, Error> read(const TensorEntry& e, std::uint64_t offset, void* out, std::uint64_t bytes) {
    if (offset + bytes > e.end - e.begin) return make_error(path_ + ": read past a tensor's end");
    if (bytes == 0) return {};
    in_->clear();
    in_->seekg(static_cast<std::streamoff>(data_start_ + e.begin + offset));
    if (!in_->read(static_cast<char*>(out), static_cast<std::streamsize>(bytes))) return make_error(path_ + ": read failed");
    return {};
  }

 private:
  std::string path_;
  std::unique_ptr<std::ifstream> in_;  // a pointer, so that the file can be returned by value
  std::uint64_t data_start_ = 0, data_bytes_ = 0;
  std::map<std::string, TensorEntry> entries_;
  std::map<std::string, std::string> metadata_;
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

/// Writes the model as F32 tensors.
inline expected<void, Error> save_model(const Model& model, const std::string& path) {
  if (auto ok = validate_model(model); !ok) return ok;
  Model copy = model;
  std::vector<detail::TensorWriter> writers;
  for (const detail::NamedTensor& t : detail::model_tensors(copy)) {
    const std::vector<float>& values = *t.values;
    writers.push_back({t.name, "F32", t.shape, values.size() * sizeof(float), [&values](std::ostream& out) {
                         out.write(reinterpret_cast<const char*>(values.data()),
                                   static_cast<std::streamsize>(values.size() * sizeof(float)));
                       }});
  }
  return detail::write_safetensors(path, writers);
}

/// Reads a model written by save_model (or by Python's safetensors with the same names), all F32:
/// w1 [E, h, f], c1 [E, h], w2 [E, d, h], c2 [E, d], gate_projection [d, d]. A missing or
/// misshapen tensor is named, with the shape found and the one expected.
inline expected<Model, Error> load_model(const std::string& path) {
  auto file = detail::SafetensorsFile::open(path);
  if (!file) return unexpected(file.error());
  auto w1 = file->tensor("w1", "F32", 4, 3);  // w1 and w2 give E, h, f and d, from which the rest follow
  if (!w1) return unexpected(w1.error());
  auto w2 = file->tensor("w2", "F32", 4, 3);
  if (!w2) return unexpected(w2.error());
  Model model;
  model.experts = static_cast<int>((*w1)->shape[0]);
  model.hidden = static_cast<int>((*w1)->shape[1]);
  model.features = static_cast<int>((*w1)->shape[2]);
  model.dim = static_cast<int>((*w2)->shape[1]);
  for (detail::NamedTensor& t : detail::model_tensors(model)) {
    auto entry = file->tensor(t.name, "F32", 4, t.shape.size());
    if (!entry) return unexpected(entry.error());
    if ((*entry)->shape != t.shape)
      return make_error(path + ": tensor " + t.name + " has shape " + detail::SafetensorsFile::shape_text((*entry)->shape) + ", expected " +
                        detail::SafetensorsFile::shape_text(t.shape) + " (from w1 " + detail::SafetensorsFile::shape_text((*w1)->shape) +
                        " and w2 " + detail::SafetensorsFile::shape_text((*w2)->shape) + ")");
    const std::uint64_t count = ((*entry)->end - (*entry)->begin) / sizeof(float);  // tensor() checked it fits the shape
    t.values->resize(count);
    if (auto ok = file->read(**entry, 0, t.values->data(), count * sizeof(float)); !ok) return unexpected(ok.error());
  }
  if (auto ok = validate_model(model); !ok) return unexpected(ok.error());
  return model;
}

}  // namespace kevo::retrieval
