/// @file bench_shape.hpp
/// @brief The model shape the GPU benches measure decode at: a 1.1B-parameter one (TinyLlama's),
/// or, for a bench's `--small` run-through on a machine without a GPU, a small model in its place.
#pragma once

#include <string>

#include "common/model_config.hpp"

namespace infer {

/// TinyLlama's shape: 22 layers, hidden 2048, 32 query heads over 4 K/V heads of 64, MLP 5632,
/// 32,000 tokens, 2,048 positions (its weights come from CudaForward::with_pattern_weights: the
/// shape is what decides a step's bytes and time). With `small`: 2 layers, hidden 128, 4 heads
/// over 2 of 32, MLP 256, 259 tokens, what a bench's `--small` run-through puts in its place.
inline ModelConfig bench_shape_1b(bool small = false) {
  ModelConfig c;
  c.vocab_size = small ? 259 : 32000, c.hidden_size = small ? 128 : 2048, c.intermediate_size = small ? 256 : 5632;
  c.num_hidden_layers = small ? 2 : 22, c.num_attention_heads = small ? 4 : 32;
  c.num_key_value_heads = small ? 2 : 4, c.head_dim = small ? 32 : 64, c.max_position_embeddings = 2048;
  return c;
}

/// How the benches name bench_shape_1b(small) in their rows.
inline std::string bench_shape_name(bool small = false) {
  return small ? "small model in the 1.1B shape's place" : "1.1B shape";
}

}  // namespace infer
