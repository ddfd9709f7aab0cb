/// @file tokenizer.hpp
/// @brief The byte-level tokenizer of the bundled models: no files, no merges.
///
/// Vocabulary of 259: id 0 is unknown, 1 is BOS (begin of sequence), 2 is EOS (end of
/// sequence), and byte b is id b + 3. Any UTF-8 text round-trips exactly.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace infer {

/// Bytes to token ids and back, for the bundled models' 259-entry vocabulary.
class ByteTokenizer {
 public:
  static constexpr int kUnk = 0;          ///< unknown (never produced by encode)
  static constexpr int kBos = 1;          ///< begin of sequence
  static constexpr int kEos = 2;          ///< end of sequence
  static constexpr int kByteOffset = 3;   ///< byte b is token b + kByteOffset
  static constexpr int kVocabSize = 259;  ///< 3 specials + 256 bytes

  /// The ids of `text`'s bytes, preceded by BOS when `add_bos`.
  static std::vector<int> encode(std::string_view text, bool add_bos = true);

  /// The bytes of the byte tokens among `ids`; special tokens are skipped.
  /// Throws infer::Error for an id outside [0, 259).
  static std::string decode(std::span<const int> ids);

  /// One token as text: its byte, or "<bos>", "<eos>", "<unk>".
  static std::string piece(int id);
};

}  // namespace infer
