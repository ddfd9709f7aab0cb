#include "common/tokenizer.hpp"

#include "common/errors.hpp"

namespace infer {

std::vector<int> ByteTokenizer::encode(std::string_view text, bool add_bos) {
  std::vector<int> ids;
  ids.reserve(text.size() + 1);
  if (add_bos) ids.push_back(kBos);
  for (unsigned char b : text) ids.push_back(static_cast<int>(b) + kByteOffset);
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int> ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int id = ids[i];
    require(id >= 0 && id < kVocabSize, "ByteTokenizer::decode: id ", id, " at index ", i,
            " is outside the vocabulary [0, ", kVocabSize, ")");
    if (id >= kByteOffset) out.push_back(static_cast<char>(id - kByteOffset));
  }
  return out;
}

std::string ByteTokenizer::piece(int id) {
  require(id >= 0 && id < kVocabSize, "ByteTokenizer::piece: id ", id, " is outside the vocabulary [0, ",
          kVocabSize, ")");
  if (id == kBos) return "<bos>";
  if (id == kEos) return "<eos>";
  if (id == kUnk) return "<unk>";
  return std::string(1, static_cast<char>(id - kByteOffset));
}

}  // namespace infer
