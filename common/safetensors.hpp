/// @file safetensors.hpp
/// @brief Reading the safetensors format: an 8-byte little-endian header length, a JSON
/// header naming each tensor's dtype, shape and byte range, then the raw data.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/tensor.hpp"

namespace infer {

/// The longest header the format allows (the safetensors specification's own limit).
inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

/// Reads every tensor of a .safetensors file, converting F32, F16 and BF16 to float32.
/// Throws infer::Error naming the file (and the tensor, where there is one) for: a path that is
/// missing or not a regular file; a file shorter than 8 bytes; a header longer than
/// kMaxSafetensorsHeader or than the file; a header that is not a JSON object; an entry whose
/// dtype, shape or data_offsets have the wrong type; an unsupported dtype; a shape with more
/// elements than the file holds; a byte range that does not match the shape or runs past the
/// file; byte ranges that overlap, leave gaps, or leave bytes after the last tensor (they must
/// tile the data section, as the format requires); and a weight that is NaN or infinite.
std::map<std::string, Tensor> read_safetensors(const std::string& path);

/// IEEE half precision (binary16) bits to float.
float half_to_float(uint16_t bits);
/// bfloat16 bits (the top half of a float32) to float.
float bfloat16_to_float(uint16_t bits);

}  // namespace infer
