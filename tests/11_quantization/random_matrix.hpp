// Lesson 11's tests: seeded random weights and activations.
#pragma once

#include "common/rng.hpp"
#include "common/tensor.hpp"

namespace infer {

/// [rows, cols] of normal values times `scale` (0.05: weights of a trained model's size), seeded.
inline Matrix random_matrix(long rows, long cols, uint64_t seed, float scale = 0.05f) {
  Rng rng(seed);
  Matrix m(rows, cols);
  for (long i = 0; i < m.size(); ++i) m.data()[i] = scale * static_cast<float>(rng.normal());
  return m;
}

}  // namespace infer
