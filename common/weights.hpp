/// @file weights.hpp
/// @brief A Llama-family model's weights, loaded once and never modified.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/model_config.hpp"
#include "common/tensor.hpp"

namespace infer {

/// One decoder layer. Matrices are [out_features, in_features] as Hugging Face stores them.
struct LayerWeights {
  Vector input_layernorm;           ///< [hidden] RMSNorm before attention
  Matrix q_proj;                    ///< [heads * head_dim, hidden]
  Matrix k_proj;                    ///< [kv_heads * head_dim, hidden]
  Matrix v_proj;                    ///< [kv_heads * head_dim, hidden]
  Matrix o_proj;                    ///< [hidden, heads * head_dim]
  Vector post_attention_layernorm;  ///< [hidden] RMSNorm before the MLP
  Matrix gate_proj;                 ///< [intermediate, hidden]
  Matrix up_proj;                   ///< [intermediate, hidden]
  Matrix down_proj;                 ///< [hidden, intermediate]
};

/// The whole model. Immutable after loading: per-request state lives elsewhere.
struct ModelWeights {
  ModelConfig config;               ///< the shape every tensor was checked against
  Matrix embed_tokens;              ///< [vocab, hidden]
  std::vector<LayerWeights> layers; ///< num_hidden_layers of them
  Vector norm;                      ///< [hidden] final RMSNorm
  Matrix lm_head;                   ///< [vocab, hidden] (a copy of embed_tokens when tied)

  /// Number of parameters (counting a tied head once).
  long parameter_count() const;
};

/// Loads `dir/config.json` and `dir/model.safetensors` with Hugging Face tensor names
/// (`model.layers.{i}.self_attn.q_proj.weight`, ...). Every tensor is checked against the
/// config: a missing tensor, an unexpected one, or a wrong shape throws infer::Error naming
/// the file, the tensor, the expected shape and the shape found.
ModelWeights load_model(const std::string& dir);

/// A model of the given shape with seeded random weights (normal, std 0.02 for matrices,
/// 1 + small noise for norms): for tests on shapes other than the bundled model's.
ModelWeights random_model(const ModelConfig& config, uint64_t seed);

/// Writes `model` as `dir/config.json` and `dir/model.safetensors` (float32, Hugging Face tensor
/// names; no lm_head tensor when the embeddings are tied), creating `dir`; load_model(dir) reads
/// it back exactly. For `./course make-model`, which makes random models of any shape for the
/// engine's large-model figures. Throws infer::Error when a file cannot be written.
void save_model(const ModelWeights& model, const std::string& dir);

/// Path of a model bundled with the course ("tiny-fortunes", "tiny-fortunes-draft").
std::string bundled_model_dir(const std::string& name);

}  // namespace infer
