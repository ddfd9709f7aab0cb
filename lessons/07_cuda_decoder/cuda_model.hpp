/// @file cuda_model.hpp
/// @brief The decoder on a CUDA device, built from your kernels: weights uploaded once, the KV
/// cache in device memory, one token per step. Given to you (lessons/07_cuda_decoder/given_cuda.cpp),
/// compiled where CUDA is.
///
/// It runs the same forward as lesson 02's forward_cached, one token at a time, with every
/// operation one of lesson 07's kernels: embedding, then per layer rms_norm, three GEMVs, rope,
/// the K/V rows copied into the cache, decode_attention, a GEMV and add, rms_norm, two GEMVs,
/// swiglu, a GEMV and add; then rms_norm and the lm_head GEMV. A prompt is run as one decode step
/// per token: this lesson is about decode (lesson 09 writes a prefill kernel).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/model_config.hpp"
#include "common/tensor.hpp"
#include "common/weights.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"

namespace infer::gpu {

/// How the weight matrices are stored on the device (norms and activations stay float32).
enum class WeightType { F32, BF16 };

/// One sequence's decoder on the device.
class CudaModel {
 public:
  /// Uploads `model`'s weights (matrices as `type`), and reserves a KV cache of `max_tokens`
  /// positions (at most the model's context). Throws infer::Error if there is no device.
  CudaModel(const ModelWeights& model, WeightType type, int max_tokens);
  /// A model of `config`'s shape whose weights are a repeated pseudo-random pattern, for
  /// measuring speed (the values do not matter to the time of a step).
  static std::unique_ptr<CudaModel> with_pattern_weights(const ModelConfig& config, WeightType type, int max_tokens);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  /// Runs `token` at position length(), appends its K/V, and returns its logits [vocab].
  /// Throws infer::Error for a bad id, or when the cache is full.
  Vector decode(int token);
  /// Positions in the cache.
  int length() const;
  /// Positions the cache can hold.
  int max_tokens() const;
  /// Forgets every position.
  void reset();
  /// The model's shape.
  const ModelConfig& config() const;
  /// Bytes of weight matrices a decode step reads (every matrix but the embedding table).
  double weight_bytes_per_step() const;

 private:
  struct Impl;
  explicit CudaModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Lesson 00's generate() on the device: the prompt one token at a time, then one decode step
/// per new token. Same arguments, same stopping rule (EOS or max_new_tokens); `model` must be
/// empty and hold prompt.size() + max_new_tokens positions.
std::vector<int> generate_cuda(CudaModel& model, std::span<const int> prompt, int max_new_tokens, Sampler& sampler,
                               const TokenCallback& on_token = {});

}  // namespace infer::gpu
