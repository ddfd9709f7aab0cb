#include "common/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>
#include <nlohmann/json.hpp>

#include "common/errors.hpp"

namespace infer {

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;  // signed zero
    } else {     // subnormal: renormalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3FFu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | mant << 13;  // inf or nan
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  return std::bit_cast<float>(bits);
}

float bfloat16_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

namespace {

uint64_t read_le_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

uint16_t read_le_u16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

}  // namespace

/// One header entry, checked.
struct SafetensorsEntry {
  std::string name, dtype;
  std::vector<long> shape;
  uint64_t begin = 0, end = 0;
  size_t elem = 0;
};

namespace {

using Entry = SafetensorsEntry;

/// Reads and checks one header entry: its fields' types, its dtype, a shape whose byte count fits
/// 64 bits, and a byte range that matches the shape and lies in the data section.
Entry parse_entry(const std::string& name, const nlohmann::json& info, uint64_t data_size, const std::string& where) {
  Entry e;
  e.name = name;
  require(info.is_object() && info.contains("dtype") && info.contains("shape") && info.contains("data_offsets"), where,
          ": entry needs dtype, shape and data_offsets, got ", info.dump());
  const auto& dtype = info["dtype"];
  require(dtype.is_string(), where, ": dtype must be a string such as \"F32\", got ", dtype.dump());
  e.dtype = dtype.get<std::string>();
  if (e.dtype == "F32") e.elem = 4;
  else if (e.dtype == "F16" || e.dtype == "BF16") e.elem = 2;
  else throw Error(cat(where, ": dtype ", e.dtype, " is not supported (expected F32, F16 or BF16)"));
  const auto& shape = info["shape"];
  require(shape.is_array(), where, ": shape must be an array of non-negative integers, got ", shape.dump());
  // The byte count must fit 64 bits: checked before multiplying, never wrapped.
  const uint64_t most = std::numeric_limits<uint64_t>::max() / e.elem;
  uint64_t count = 1;
  for (const auto& d : shape) {
    require(d.is_number_unsigned(), where, ": shape entries must be non-negative integers, got ", shape.dump());
    const uint64_t v = d.get<uint64_t>();
    require(v == 0 || count <= most / v, where, ": shape ", shape.dump(), " has more elements than 64 bits can count in ",
            e.dtype, " bytes");
    count *= v;
    e.shape.push_back(static_cast<long>(v));
  }
  const auto& off = info["data_offsets"];
  require(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(), where,
          ": data_offsets must be two non-negative integers [begin, end], got ", off.dump());
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  const uint64_t expected = count * e.elem;
  require(e.begin <= e.end && e.end - e.begin == expected, where, ": byte range [", e.begin, ", ", e.end, ") holds ",
          e.begin <= e.end ? e.end - e.begin : 0, " bytes, expected ", expected, " for shape ", shape_string(e.shape),
          " of ", e.dtype);
  require(e.end <= data_size, where, ": data ends at byte ", e.end, " but the file holds only ", data_size,
          " data bytes: the file is truncated");
  return e;
}

}  // namespace

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  namespace fs = std::filesystem;
  const std::string& p = path_;
  require(fs::exists(p), "safetensors: cannot open '", p, "': no such file");
  require(fs::is_regular_file(p), "safetensors '", p, "': is a directory or a special file, expected a file");
  in_.open(p, std::ios::binary);
  require(in_.good(), "safetensors: cannot open '", p, "'");
  in_.seekg(0, std::ios::end);
  const auto file_size = static_cast<uint64_t>(in_.tellg());
  in_.seekg(0);
  require(file_size >= 8, "safetensors '", p, "': file is ", file_size, " bytes, expected at least 8 (the header length)");
  unsigned char len_bytes[8];
  in_.read(reinterpret_cast<char*>(len_bytes), 8);
  const uint64_t header_len = read_le_u64(len_bytes);
  require(header_len <= kMaxSafetensorsHeader, "safetensors '", p, "': header length ", header_len,
          " is above the format's limit of ", kMaxSafetensorsHeader, " bytes: corrupt or not safetensors");
  require(header_len <= file_size - 8, "safetensors '", p, "': header length ", header_len,
          " runs past the end of the file (", file_size, " bytes): truncated or not safetensors");
  std::string header_text(header_len, '\0');
  in_.read(header_text.data(), static_cast<std::streamsize>(header_len));

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("safetensors '", p, "': header is not valid JSON: ", e.what()));
  }
  require(header.is_object(), "safetensors '", p, "': header must be a JSON object");

  // Every entry checked, then the ranges: they must tile the data section exactly, with no
  // overlap (two tensors sharing bytes), no gap and nothing after the last tensor.
  data_start_ = 8 + header_len;
  const uint64_t data_size = file_size - data_start_;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    entries_.push_back(parse_entry(name, info, data_size, cat("safetensors '", p, "', tensor '", name, "'")));
  }
  std::vector<const Entry*> order;
  for (const Entry& e : entries_) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t at = 0;
  const Entry* previous = nullptr;
  for (const Entry* e : order) {
    if (e->begin < at)  // only after a first tensor: at starts at 0
      throw Error(cat("safetensors '", p, "': tensor '", e->name, "' [", e->begin, ", ", e->end,
                      ") overlaps tensor '", previous->name, "' [", previous->begin, ", ", previous->end,
                      "): each tensor must have bytes of its own"));
    require(e->begin == at, "safetensors '", p, "': ", e->begin - at, " bytes before tensor '", e->name,
            "' belong to no tensor: the byte ranges must tile the data section");
    at = e->end;
    previous = e;
  }
  require(at == data_size, "safetensors '", p, "': ", data_size - at,
          " bytes after the last tensor belong to no tensor: the byte ranges must tile the data section");
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const Entry& e : entries_) out.push_back(e.name);
  return out;
}

bool SafetensorsFile::has(const std::string& name) const {
  return std::any_of(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.name == name; });
}

SafetensorsFile::~SafetensorsFile() = default;

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  for (const Entry& e : entries_)
    if (e.name == name) return e;
  throw Error(cat("safetensors '", path_, "': no tensor '", name, "'"));
}

const std::vector<long>& SafetensorsFile::shape(const std::string& name) const { return entry(name).shape; }

Tensor SafetensorsFile::read(const std::string& name) {
  const Entry& e = entry(name);
  const long n = static_cast<long>((e.end - e.begin) / e.elem);
  if (e.shape.size() == 2) return read(name, 0, e.shape[0], 0, e.shape[1]);
  Tensor t = read(name, 0, 1, 0, n);  // any other rank: one row of every element
  t.shape = e.shape;
  return t;
}

Tensor SafetensorsFile::read(const std::string& name, long row, long rows, long col, long cols) {
  const Entry& e = entry(name);
  const long n = static_cast<long>((e.end - e.begin) / e.elem);
  // A tensor of any other rank is read whole, as one row (the overload above).
  const long shape_rows = e.shape.size() == 2 ? e.shape[0] : 1, shape_cols = e.shape.size() == 2 ? e.shape[1] : n;
  require(e.shape.size() == 2 || (row == 0 && rows == 1 && col == 0 && cols == n), "safetensors '", path_,
          "', tensor '", name, "': a part of a tensor of shape ", shape_string(e.shape), " (parts are of 2-D tensors)");
  require(row >= 0 && rows >= 0 && row + rows <= shape_rows && col >= 0 && cols >= 0 && col + cols <= shape_cols,
          "safetensors '", path_, "', tensor '", name, "': rows [", row, ", ", row + rows, ") and columns [", col, ", ",
          col + cols, ") of a tensor of shape ", shape_string(e.shape));
  Tensor t;
  t.shape = {rows, cols};
  t.data.resize(static_cast<size_t>(rows * cols));
  std::vector<unsigned char> run;
  // Whole rows are one run of the file; otherwise one run per row.
  const bool whole = cols == shape_cols;
  const long runs = whole ? (rows > 0 ? 1 : 0) : rows, per_run = whole ? rows * cols : cols;
  for (long r = 0; r < runs; ++r) {
    const uint64_t first = e.begin + static_cast<uint64_t>(((row + r) * shape_cols + col)) * e.elem;
    run.resize(static_cast<size_t>(per_run) * e.elem);
    in_.clear();
    in_.seekg(static_cast<std::streamoff>(data_start_ + first));
    in_.read(reinterpret_cast<char*>(run.data()), static_cast<std::streamsize>(run.size()));
    require(in_.good(), "safetensors '", path_, "', tensor '", name, "': read error");
    bytes_read_ += run.size();
    float* dst = t.data.data() + r * per_run;
    const unsigned char* src = run.data();
    if (e.dtype == "F32") {
      std::memcpy(dst, src, run.size());  // safetensors is little-endian, like x86 and ARM
    } else if (e.dtype == "F16") {
      for (long i = 0; i < per_run; ++i) dst[i] = half_to_float(read_le_u16(src + 2 * i));
    } else {
      for (long i = 0; i < per_run; ++i) dst[i] = bfloat16_to_float(read_le_u16(src + 2 * i));
    }
  }
  for (size_t i = 0; i < t.data.size(); ++i)
    require(std::isfinite(t.data[i]), "safetensors '", path_, "', tensor '", name, "': element ",
            whole ? static_cast<long>(i) + row * shape_cols : (row + static_cast<long>(i) / cols) * shape_cols + col +
                                                                  static_cast<long>(i) % cols,
            " is ", t.data[i], ": weights must be finite");
  return t;
}

std::map<std::string, Tensor> read_safetensors(const std::string& path) {
  SafetensorsFile file(path);
  std::map<std::string, Tensor> tensors;
  for (const std::string& name : file.names()) tensors.emplace(name, file.read(name));
  return tensors;
}

}  // namespace infer
