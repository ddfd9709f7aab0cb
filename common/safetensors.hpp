/// @file safetensors.hpp
/// @brief Reading the safetensors format: an 8-byte little-endian header length, a JSON
/// header naming each tensor's dtype, shape and byte range, then the raw data.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

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

/// @cond DETAIL
struct SafetensorsEntry;
/// @endcond

/// A .safetensors file opened for reading parts of its tensors: the header is read and checked
/// when it opens (every check read_safetensors() makes, which reads through it), the data only
/// when asked for, and only the bytes asked for. Lesson 12's ranks read their own rows or columns
/// of each matrix this way, not the whole file.
class SafetensorsFile {
 public:
  /// Opens `path` and checks its header. Throws infer::Error as read_safetensors() does.
  explicit SafetensorsFile(std::string path);
  ~SafetensorsFile();
  /// Every tensor's name, in the header's order.
  std::vector<std::string> names() const;
  /// Whether the file holds a tensor `name`.
  bool has(const std::string& name) const;
  /// Its shape; throws infer::Error naming the file for a tensor it does not hold.
  const std::vector<long>& shape(const std::string& name) const;
  /// The whole tensor, converted to float32.
  Tensor read(const std::string& name);
  /// Rows [row, row + rows) and columns [col, col + cols) of a 2-D tensor, as a [rows, cols]
  /// float32 tensor, reading only their bytes: one run of the file per row, or a single run when
  /// the columns are whole rows. Throws infer::Error for a tensor that is not 2-D, a range outside
  /// its shape, or a value that is NaN or infinite.
  Tensor read(const std::string& name, long row, long rows, long col, long cols);
  /// Bytes of tensor data read from the file so far.
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  const SafetensorsEntry& entry(const std::string& name) const;
  std::string path_;
  std::ifstream in_;
  uint64_t data_start_ = 0, bytes_read_ = 0;
  std::vector<SafetensorsEntry> entries_;
};

/// IEEE half precision (binary16) bits to float.
float half_to_float(uint16_t bits);
/// bfloat16 bits (the top half of a float32) to float.
float bfloat16_to_float(uint16_t bits);

}  // namespace infer
