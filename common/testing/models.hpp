/// @file models.hpp
/// @brief The models the tests run, each loaded or built once per test binary.
#pragma once

#include "common/weights.hpp"

namespace infer::testing {

/// The bundled target model, models/tiny-fortunes.
inline const ModelWeights& bundled_model() {
  static const ModelWeights m = load_model(bundled_model_dir("tiny-fortunes"));
  return m;
}

/// The bundled draft model, models/tiny-fortunes-draft (lesson 06).
inline const ModelWeights& bundled_draft() {
  static const ModelWeights m = load_model(bundled_model_dir("tiny-fortunes-draft"));
  return m;
}

/// A random model small enough for hundreds of engine requests in a test: 2 layers, 4 query
/// heads sharing 2 K/V heads of 8, a vocabulary of 40 with EOS = 2, a context of 64.
inline const ModelWeights& small_model() {
  static const ModelWeights m = [] {
    ModelConfig c;
    c.vocab_size = 40, c.hidden_size = 32, c.intermediate_size = 48, c.num_hidden_layers = 2;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 8, c.max_position_embeddings = 64;
    c.eos_token_id = 2;
    return random_model(c, 77);
  }();
  return m;
}

}  // namespace infer::testing
