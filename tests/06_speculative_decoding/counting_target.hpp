/// @file counting_target.hpp
/// @brief Lesson 06's test seam: the CPU target, counting the forwards it is asked for.
#pragma once

#include "lessons/06_speculative_decoding/speculative.hpp"

namespace infer::testing {

/// The CPU target, counting its forwards and the positions they compute.
class CountingTarget final : public TargetModel {
 public:
  /// Runs `m` (not owned).
  explicit CountingTarget(const ModelWeights& m) : inner_(m) {}
  const ModelConfig& config() const override { return inner_.config(); }
  Matrix forward(std::span<const int> tokens, KVStore& cache) override {
    ++forwards;
    positions += static_cast<long>(tokens.size());
    return inner_.forward(tokens, cache);
  }
  Matrix forward_tree(const TokenTree& tree, KVStore& cache) override {
    ++forwards;
    positions += static_cast<long>(tree.tokens.size());
    return inner_.forward_tree(tree, cache);
  }
  long forwards = 0;   ///< forward() and forward_tree() calls
  long positions = 0;  ///< tokens or tree nodes they computed

 private:
  CpuTarget inner_;
};

}  // namespace infer::testing
