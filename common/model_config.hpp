/// @file model_config.hpp
/// @brief The shape of a Llama-family model, read from a Hugging Face config.json.
#pragma once

#include <string>

namespace infer {

/// The longest context ModelConfig::validate() accepts: the engines reserve memory per position.
inline constexpr int kMaxPositions = 1 << 20;
/// The most parameters ModelConfig::validate() accepts (120 GB of float32).
inline constexpr double kMaxParameters = 3e10;

/// The hyperparameters of a Llama-family decoder, under the names Hugging Face uses.
struct ModelConfig {
  int vocab_size = 0;               ///< `vocab_size`
  int hidden_size = 0;              ///< `hidden_size`: the residual stream's width (dim)
  int intermediate_size = 0;        ///< `intermediate_size`: the SwiGLU MLP's hidden width
  int num_hidden_layers = 0;        ///< `num_hidden_layers`
  int num_attention_heads = 0;      ///< `num_attention_heads`: query heads
  int num_key_value_heads = 0;      ///< `num_key_value_heads`: K/V heads (GQA when fewer than query heads)
  int head_dim = 0;                 ///< `head_dim`, or hidden_size / num_attention_heads when absent
  int max_position_embeddings = 0;  ///< `max_position_embeddings`: the context length
  float rms_norm_eps = 1e-5f;       ///< `rms_norm_eps`
  float rope_theta = 10000.0f;      ///< `rope_theta`: RoPE's base frequency
  bool tie_word_embeddings = false; ///< `tie_word_embeddings`: the output head reuses the embedding
  int bos_token_id = 1;             ///< `bos_token_id`
  int eos_token_id = 2;             ///< `eos_token_id`

  /// Query heads that share one K/V head (1 for multi-head attention).
  int group_size() const { return num_attention_heads / num_key_value_heads; }

  /// Throws infer::Error if the numbers cannot describe a model (zero sizes, heads that
  /// don't divide, an odd head_dim RoPE cannot rotate) or describe one too large to hold (a
  /// context above kMaxPositions, more than kMaxParameters). `where` names the source.
  void validate(const std::string& where) const;
};

/// Parses a config.json. Throws infer::Error naming the file and the key for: a path that is
/// missing or not a file; invalid JSON; a missing required key; an integer key that is not a
/// JSON integer within an int's range (192.7, true and 2^32 + 4 are refused, never truncated);
/// a real key that is not finite or does not fit a float; and what this engine does not
/// implement: a model_type other than "llama", a hidden_act other than "silu", rope_scaling,
/// attention or MLP biases. Then ModelConfig::validate().
ModelConfig load_config(const std::string& path);

}  // namespace infer
