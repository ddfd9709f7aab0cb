// Lesson 02, reference solution: a contiguous KV cache, an INT8 one, and the cached forward.
#include "lessons/02_kv_cache/kv_cache.hpp"

#include <algorithm>
#include <cmath>

#include "common/linear.hpp"

namespace infer {

namespace {

void check_append(const KVStore& s, int layer, ConstMatrixRef k, ConstMatrixRef v, int kv_dim) {
  require(layer >= 0 && layer < s.num_layers(), "KV cache: layer ", layer, " is outside [0, ", s.num_layers(), ")");
  require(k.cols() == kv_dim && v.cols() == kv_dim, "KV cache: rows must have kv_dim = ", kv_dim,
          " columns, got ", k.cols(), " (keys) and ", v.cols(), " (values)");
  require(k.rows() == v.rows(), "KV cache: ", k.rows(), " key rows but ", v.rows(), " value rows");
  require(s.length(layer) + k.rows() <= s.max_tokens(), "KV cache: appending ", k.rows(), " positions to layer ",
          layer, " at length ", s.length(layer), " would pass max_tokens ", s.max_tokens());
}

void check_layer(const KVStore& s, int layer) {
  require(layer >= 0 && layer < s.num_layers(), "KV cache: layer ", layer, " is outside [0, ", s.num_layers(), ")");
}

}  // namespace

// ------------------------------------------------------------- float cache --

void KVCache::append(int layer, ConstMatrixRef k, ConstMatrixRef v) {
  check_append(*this, layer, k, v, kv_dim_);
  k_[layer].middleRows(length_[layer], k.rows()) = k;
  v_[layer].middleRows(length_[layer], v.rows()) = v;
  length_[layer] += static_cast<int>(k.rows());
}

ConstMatrixRef KVCache::keys(int layer) const {
  check_layer(*this, layer);
  return k_[layer].topRows(length_[layer]);
}
ConstMatrixRef KVCache::values(int layer) const {
  check_layer(*this, layer);
  return v_[layer].topRows(length_[layer]);
}

void KVCache::reset() { std::fill(length_.begin(), length_.end(), 0); }

size_t KVCache::bytes_used() const {
  return static_cast<size_t>(length()) * kv_dim_ * 2 * sizeof(float) * num_layers();
}
size_t KVCache::bytes_reserved() const {
  return static_cast<size_t>(max_tokens_) * kv_dim_ * 2 * sizeof(float) * num_layers();
}

// -------------------------------------------------------------- INT8 cache --

namespace {

/// Symmetric per-(token, head) quantization: scale = max|x| / 127, q = round(x / scale).
void quantize_rows(ConstMatrixRef x, int first_row, int head_dim, int kv_heads, std::vector<int8_t>& q,
                   std::vector<float>& scale) {
  const int kv_dim = head_dim * kv_heads;
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    const size_t pos = static_cast<size_t>(first_row + r);
    for (int h = 0; h < kv_heads; ++h) {
      auto head = x.row(r).segment(h * head_dim, head_dim);
      const float max_abs = head.cwiseAbs().maxCoeff();
      const float s = max_abs > 0 ? max_abs / 127.0f : 1.0f;  // an all-zero head stores zeros
      scale[pos * kv_heads + h] = s;
      for (int i = 0; i < head_dim; ++i)
        q[pos * kv_dim + h * head_dim + i] = static_cast<int8_t>(std::lround(head[i] / s));
    }
  }
}

void dequantize_rows(const std::vector<int8_t>& q, const std::vector<float>& scale, int rows, int head_dim,
                     int kv_heads, Matrix& out) {
  const int kv_dim = head_dim * kv_heads;
  out.resize(rows, kv_dim);
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < kv_heads; ++h) {
      const float s = scale[static_cast<size_t>(r) * kv_heads + h];
      for (int i = 0; i < head_dim; ++i) out(r, h * head_dim + i) = s * q[static_cast<size_t>(r) * kv_dim + h * head_dim + i];
    }
}

}  // namespace

void Int8KVCache::append(int layer, ConstMatrixRef k, ConstMatrixRef v) {
  check_append(*this, layer, k, v, kv_dim_);
  quantize_rows(k, length_[layer], head_dim_, kv_heads_, k_[layer].q, k_[layer].scale);
  quantize_rows(v, length_[layer], head_dim_, kv_heads_, v_[layer].q, v_[layer].scale);
  length_[layer] += static_cast<int>(k.rows());
}

ConstMatrixRef Int8KVCache::keys(int layer) const {
  check_layer(*this, layer);
  dequantize_rows(k_[layer].q, k_[layer].scale, length_[layer], head_dim_, kv_heads_, k_[layer].dequantized);
  return k_[layer].dequantized;
}
ConstMatrixRef Int8KVCache::values(int layer) const {
  check_layer(*this, layer);
  dequantize_rows(v_[layer].q, v_[layer].scale, length_[layer], head_dim_, kv_heads_, v_[layer].dequantized);
  return v_[layer].dequantized;
}

void Int8KVCache::reset() { std::fill(length_.begin(), length_.end(), 0); }

size_t Int8KVCache::bytes_used() const {
  const size_t per_token = 2 * (kv_dim_ * sizeof(int8_t) + kv_heads_ * sizeof(float));  // K and V
  return static_cast<size_t>(length()) * per_token * num_layers();
}
size_t Int8KVCache::bytes_reserved() const {
  const size_t per_token = 2 * (kv_dim_ * sizeof(int8_t) + kv_heads_ * sizeof(float));
  return static_cast<size_t>(max_tokens_) * per_token * num_layers();
}

// ---------------------------------------------------------- cached forward --

Matrix forward_cached(const ModelWeights& model, std::span<const int> tokens, KVStore& cache) {
  const ModelConfig& c = model.config;
  require(cache.num_layers() == c.num_hidden_layers, "forward_cached: the cache has ", cache.num_layers(),
          " layers, the model ", c.num_hidden_layers);
  const int start = cache.length();  // position of tokens[0]
  require(!tokens.empty(), "forward_cached: no tokens to run");
  require(start + static_cast<int>(tokens.size()) <= std::min(cache.max_tokens(), c.max_position_embeddings),
          "forward_cached: ", tokens.size(), " tokens at position ", start, " exceed the cache's ", cache.max_tokens(),
          " or the model's context of ", c.max_position_embeddings, " positions");
  for (size_t i = 0; i < tokens.size(); ++i)
    require(tokens[i] >= 0 && tokens[i] < c.vocab_size, "forward_cached: token ", tokens[i], " at index ", i,
            " is outside the vocabulary [0, ", c.vocab_size, ")");

  const Eigen::Index T = static_cast<Eigen::Index>(tokens.size());
  Matrix x(T, c.hidden_size);
  for (Eigen::Index t = 0; t < T; ++t) x.row(t) = model.embed_tokens.row(tokens[t]);

  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& layer = model.layers[l];
    const Matrix h = rms_norm(x, layer.input_layernorm, c.rms_norm_eps);
    Matrix q = linear(h, layer.q_proj);
    Matrix k = linear(h, layer.k_proj);  // only the new tokens' keys and values
    const Matrix v = linear(h, layer.v_proj);
    apply_rope(q, c.head_dim, start, c.rope_theta);
    apply_rope(k, c.head_dim, start, c.rope_theta);
    cache.append(l, k, v);
    // The new queries attend over every cached position, their own included.
    const Matrix attn = cache.attend(l, q, c.num_attention_heads, c.num_key_value_heads, c.head_dim);
    x += linear(attn, layer.o_proj);
    x += swiglu_mlp(rms_norm(x, layer.post_attention_layernorm, c.rms_norm_eps), layer);
  }
  return linear(rms_norm(x, model.norm, c.rms_norm_eps), model.lm_head);
}

std::vector<int> generate_cached(const ModelWeights& model, std::span<const int> prompt, int max_new_tokens,
                                 Sampler& sampler, KVStore& cache, const TokenCallback& on_token) {
  const ModelConfig& c = model.config;
  check_tokens(c, prompt, "generate_cached");
  require(max_new_tokens >= 0, "generate_cached: max_new_tokens must be >= 0, got ", max_new_tokens);
  require(prompt.size() + max_new_tokens <= static_cast<size_t>(c.max_position_embeddings),
          "generate_cached: prompt of ", prompt.size(), " tokens + max_new_tokens ", max_new_tokens,
          " exceeds the context of ", c.max_position_embeddings, " positions");
  require(cache.length() == 0, "generate_cached: the cache must start empty, it holds ", cache.length(), " positions");
  require(prompt.size() + max_new_tokens <= static_cast<size_t>(cache.max_tokens()), "generate_cached: the cache holds ",
          cache.max_tokens(), " positions, the generation needs ", prompt.size() + max_new_tokens);

  std::vector<int> generated;
  if (max_new_tokens == 0) return generated;
  Matrix logits = forward_cached(model, prompt, cache);  // prefill
  for (int step = 0; step < max_new_tokens; ++step) {
    const int next = sampler.next(logits.row(logits.rows() - 1).transpose());
    generated.push_back(next);
    if (on_token) on_token(next);
    if (next == c.eos_token_id || step + 1 == max_new_tokens) break;
    logits = forward_cached(model, std::span(&generated.back(), 1), cache);  // decode
  }
  return generated;
}

}  // namespace infer
