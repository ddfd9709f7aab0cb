/// @file golden.hpp
/// @brief The golden fixtures the trainer wrote next to each bundled model (golden.json):
/// logits from the PyTorch model at chosen positions, and greedy continuations.
#pragma once

#include <string>
#include <vector>

namespace infer::testing {

/// Logits of one prompt at a few positions.
struct GoldenLogits {
  std::string text;                       ///< the prompt as text
  std::vector<int> ids;                   ///< BOS + its bytes
  std::vector<int> positions;             ///< which rows of the logits were recorded
  std::vector<std::vector<float>> logits; ///< logits[i] is the row at positions[i]
};

/// A greedy continuation: what temperature 0 must produce.
struct GoldenGreedy {
  std::string prompt;           ///< the prompt as text
  std::vector<int> prompt_ids;  ///< BOS + its bytes
  int max_new_tokens = 0;       ///< the generation limit used
  std::vector<int> ids;         ///< the generated ids (ending with EOS if it was produced)
  double min_top2_gap = 0;      ///< smallest best-minus-second logit along the way
};

/// All fixtures of one model.
struct Golden {
  std::vector<GoldenLogits> logits;  ///< logit fixtures
  std::vector<GoldenGreedy> greedy;  ///< greedy fixtures
};

/// Reads models/<model>/golden.json. Throws infer::Error if it is missing or malformed.
Golden load_golden(const std::string& model);

}  // namespace infer::testing
