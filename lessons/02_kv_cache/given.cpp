// Lesson 02: the plumbing given to students (constructors and accessors), compiled with your
// exercises/ and with the reference.
#include <algorithm>
#include <vector>

#include "lessons/02_kv_cache/kv_cache.hpp"

namespace infer {

Matrix KVStore::attend(int layer, ConstMatrixRef q, int num_heads, int num_kv_heads, int head_dim) const {
  return causal_attention(q, keys(layer), values(layer), num_heads, num_kv_heads, head_dim);
}

void KVStore::reserve(int tokens) {
  require(tokens >= 0 && tokens <= max_tokens(), "KVStore::reserve: ", tokens, " positions, the store holds ",
          max_tokens(), " (max_tokens)");
}

void KVStore::truncate(int length) {
  require(length >= 0 && length <= this->length(), "KVStore::truncate: keep ", length, " positions of a store holding ",
          this->length());
  std::vector<Matrix> k(num_layers()), v(num_layers());
  for (int l = 0; l < num_layers(); ++l) {
    k[l] = keys(l).topRows(length);
    v[l] = values(l).topRows(length);
  }
  reset();
  for (int l = 0; l < num_layers(); ++l)
    if (length > 0) append(l, k[l], v[l]);
}

void KVCache::truncate(int length) {
  require(length >= 0 && length <= this->length(), "KVCache::truncate: keep ", length, " positions of a cache holding ",
          this->length());
  for (int& n : length_) n = std::min(n, length);
}

KVCache::KVCache(const ModelConfig& config, int max_tokens)
    : kv_dim_(config.num_key_value_heads * config.head_dim), max_tokens_(max_tokens) {
  require(max_tokens > 0, "KVCache: max_tokens must be positive, got ", max_tokens);
  k_.assign(config.num_hidden_layers, Matrix::Zero(max_tokens, kv_dim_));
  v_.assign(config.num_hidden_layers, Matrix::Zero(max_tokens, kv_dim_));
  length_.assign(config.num_hidden_layers, 0);
}

int KVCache::num_layers() const { return static_cast<int>(length_.size()); }

int KVCache::length(int layer) const {
  require(layer >= 0 && layer < num_layers(), "KVCache: layer ", layer, " is outside [0, ", num_layers(), ")");
  return length_[layer];
}

int KVCache::max_tokens() const { return max_tokens_; }

Int8KVCache::Int8KVCache(const ModelConfig& config, int max_tokens)
    : kv_dim_(config.num_key_value_heads * config.head_dim),
      head_dim_(config.head_dim),
      kv_heads_(config.num_key_value_heads),
      max_tokens_(max_tokens) {
  require(max_tokens > 0, "Int8KVCache: max_tokens must be positive, got ", max_tokens);
  Quantized empty;
  empty.q.assign(static_cast<size_t>(max_tokens) * kv_dim_, 0);
  empty.scale.assign(static_cast<size_t>(max_tokens) * kv_heads_, 0.0f);
  k_.assign(config.num_hidden_layers, empty);
  v_.assign(config.num_hidden_layers, empty);
  length_.assign(config.num_hidden_layers, 0);
}

int Int8KVCache::num_layers() const { return static_cast<int>(length_.size()); }

int Int8KVCache::length(int layer) const {
  require(layer >= 0 && layer < num_layers(), "Int8KVCache: layer ", layer, " is outside [0, ", num_layers(), ")");
  return length_[layer];
}

int Int8KVCache::max_tokens() const { return max_tokens_; }

}  // namespace infer
