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

namespace {

/// One header entry, checked.
struct Entry {
  std::string name, dtype;
  std::vector<long> shape;
  uint64_t begin = 0, end = 0;
  size_t elem = 0;
};

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

std::map<std::string, Tensor> read_safetensors(const std::string& path) {
  namespace fs = std::filesystem;
  require(fs::exists(path), "safetensors: cannot open '", path, "': no such file");
  require(fs::is_regular_file(path), "safetensors '", path, "': is a directory or a special file, expected a file");
  std::ifstream in(path, std::ios::binary);
  require(in.good(), "safetensors: cannot open '", path, "'");
  in.seekg(0, std::ios::end);
  const auto file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  require(file_size >= 8, "safetensors '", path, "': file is ", file_size,
          " bytes, expected at least 8 (the header length)");
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  const uint64_t header_len = read_le_u64(len_bytes);
  require(header_len <= kMaxSafetensorsHeader, "safetensors '", path, "': header length ", header_len,
          " is above the format's limit of ", kMaxSafetensorsHeader, " bytes: corrupt or not safetensors");
  require(header_len <= file_size - 8, "safetensors '", path, "': header length ", header_len,
          " runs past the end of the file (", file_size, " bytes): truncated or not safetensors");
  std::string header_text(header_len, '\0');
  in.read(header_text.data(), static_cast<std::streamsize>(header_len));

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("safetensors '", path, "': header is not valid JSON: ", e.what()));
  }
  require(header.is_object(), "safetensors '", path, "': header must be a JSON object");

  // Every entry checked, then the ranges: they must tile the data section exactly, with no
  // overlap (two tensors sharing bytes), no gap and nothing after the last tensor.
  const uint64_t data_size = file_size - 8 - header_len;
  std::vector<Entry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    entries.push_back(parse_entry(name, info, data_size, cat("safetensors '", path, "', tensor '", name, "'")));
  }
  std::vector<const Entry*> order;
  for (const Entry& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t at = 0;
  const Entry* previous = nullptr;
  for (const Entry* e : order) {
    if (e->begin < at)  // only after a first tensor: at starts at 0
      throw Error(cat("safetensors '", path, "': tensor '", e->name, "' [", e->begin, ", ", e->end,
                      ") overlaps tensor '", previous->name, "' [", previous->begin, ", ", previous->end,
                      "): each tensor must have bytes of its own"));
    require(e->begin == at, "safetensors '", path, "': ", e->begin - at, " bytes before tensor '", e->name,
            "' belong to no tensor: the byte ranges must tile the data section");
    at = e->end;
    previous = e;
  }
  require(at == data_size, "safetensors '", path, "': ", data_size - at,
          " bytes after the last tensor belong to no tensor: the byte ranges must tile the data section");

  std::vector<unsigned char> data(data_size);
  in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(data_size));
  require(in.good() || in.eof(), "safetensors '", path, "': read error");

  std::map<std::string, Tensor> tensors;
  for (const Entry& e : entries) {
    Tensor t;
    t.shape = e.shape;
    t.data.resize((e.end - e.begin) / e.elem);
    const unsigned char* src = data.data() + e.begin;
    if (e.dtype == "F32") {
      std::memcpy(t.data.data(), src, e.end - e.begin);  // safetensors is little-endian, like x86 and ARM
    } else if (e.dtype == "F16") {
      for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = half_to_float(read_le_u16(src + 2 * i));
    } else {
      for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = bfloat16_to_float(read_le_u16(src + 2 * i));
    }
    for (size_t i = 0; i < t.data.size(); ++i)
      require(std::isfinite(t.data[i]), "safetensors '", path, "', tensor '", e.name, "': element ", i, " is ",
              t.data[i], ": weights must be finite");
    tensors.emplace(e.name, std::move(t));
  }
  return tensors;
}

}  // namespace infer
