/// @file safetensors.hpp
/// @brief Reading the safetensors format: an 8-byte little-endian header length, a JSON
/// header naming each tensor's dtype, shape and byte range, then the raw data.
#pragma once

#include <map>
#include <string>

#include "common/tensor.hpp"

namespace infer {

/// Reads every tensor of a .safetensors file, converting F32, F16 and BF16 to float32.
/// Throws infer::Error naming the file and the tensor for a missing or truncated file,
/// a malformed header, an unsupported dtype, or a byte range that does not match the shape.
std::map<std::string, Tensor> read_safetensors(const std::string& path);

/// IEEE half precision (binary16) bits to float.
float half_to_float(uint16_t bits);
/// bfloat16 bits (the top half of a float32) to float.
float bfloat16_to_float(uint16_t bits);

}  // namespace infer
