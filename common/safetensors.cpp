#include "common/safetensors.hpp"

#include <bit>
#include <cstring>
#include <fstream>
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

std::map<std::string, Tensor> read_safetensors(const std::string& path) {
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

  const uint64_t data_size = file_size - 8 - header_len;
  std::vector<unsigned char> data(data_size);
  in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(data_size));
  require(in.good() || in.eof(), "safetensors '", path, "': read error");

  std::map<std::string, Tensor> tensors;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = cat("safetensors '", path, "', tensor '", name, "'");
    require(info.is_object() && info.contains("dtype") && info.contains("shape") &&
                info.contains("data_offsets"),
            where, ": entry needs dtype, shape and data_offsets");
    Tensor t;
    for (const auto& d : info["shape"]) {
      require(d.is_number_integer() && d.get<long>() >= 0, where, ": shape entries must be non-negative integers");
      t.shape.push_back(d.get<long>());
    }
    const std::string dtype = info["dtype"].get<std::string>();
    size_t elem = 0;
    if (dtype == "F32") elem = 4;
    else if (dtype == "F16" || dtype == "BF16") elem = 2;
    else throw Error(cat(where, ": dtype ", dtype, " is not supported (expected F32, F16 or BF16)"));

    const auto begin = info["data_offsets"].at(0).get<uint64_t>();
    const auto end = info["data_offsets"].at(1).get<uint64_t>();
    const uint64_t expected = static_cast<uint64_t>(t.numel()) * elem;
    require(begin <= end && end - begin == expected, where, ": byte range [", begin, ", ", end,
            ") holds ", end - begin, " bytes, expected ", expected, " for shape ", shape_string(t.shape),
            " of ", dtype);
    require(end <= data_size, where, ": data ends at byte ", end, " but the file holds only ", data_size,
            " data bytes: the file is truncated");

    t.data.resize(static_cast<size_t>(t.numel()));
    const unsigned char* src = data.data() + begin;
    if (dtype == "F32") {
      std::memcpy(t.data.data(), src, expected);  // safetensors is little-endian, like x86 and ARM
    } else if (dtype == "F16") {
      for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = half_to_float(read_le_u16(src + 2 * i));
    } else {
      for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = bfloat16_to_float(read_le_u16(src + 2 * i));
    }
    tensors.emplace(name, std::move(t));
  }
  return tensors;
}

}  // namespace infer
