// Lesson 02, your turn: a contiguous KV cache, an INT8 one, and the cached forward.
//
// Replace each `throw NotImplemented(...)`. The contract is lessons/02_kv_cache/kv_cache.hpp; the
// lesson text is lessons/02_kv_cache/README.md. Check your work with `./course check 02`.
// The constructors and the trivial accessors are written for you in lessons/02_kv_cache/given.cpp.
#include "lessons/02_kv_cache/kv_cache.hpp"

#include <algorithm>
#include <cmath>

namespace infer {

// ------------------------------------------------------------- float cache --

void KVCache::append(int layer, ConstMatrixRef k, ConstMatrixRef v) {
  // Check everything first (layer, widths, equal row counts, room left): a refused append must
  // leave the cache untouched. Then copy the rows to positions length_[layer] onward
  // (Eigen: k_[layer].middleRows(start, n) = k) and advance length_[layer].
  (void)layer, (void)k, (void)v;
  throw NotImplemented("02", "KVCache::append");
}

ConstMatrixRef KVCache::keys(int layer) const {
  // The stored rows only: k_[layer].topRows(length_[layer]). No copy.
  (void)layer;
  throw NotImplemented("02", "KVCache::keys");
}

ConstMatrixRef KVCache::values(int layer) const {
  (void)layer;
  throw NotImplemented("02", "KVCache::values");
}

void KVCache::reset() { throw NotImplemented("02", "KVCache::reset"); }

size_t KVCache::bytes_used() const {
  // K and V, float32, kv_dim_ values per position, in every layer.
  throw NotImplemented("02", "KVCache::bytes_used");
}

size_t KVCache::bytes_reserved() const { throw NotImplemented("02", "KVCache::bytes_reserved"); }

// -------------------------------------------------------------- INT8 cache --

void Int8KVCache::append(int layer, ConstMatrixRef k, ConstMatrixRef v) {
  // The same checks as KVCache::append. Then, for every new row and every K/V head:
  // scale = max|x| / 127 (use 1 for an all-zero head), q = round(x / scale) (std::lround),
  // stored at q[pos * kv_dim + head * head_dim + i] and scale[pos * kv_heads + head].
  (void)layer, (void)k, (void)v;
  throw NotImplemented("02", "Int8KVCache::append");
}

ConstMatrixRef Int8KVCache::keys(int layer) const {
  // Dequantize the stored rows (q * scale) into k_[layer].dequantized and return it.
  (void)layer;
  throw NotImplemented("02", "Int8KVCache::keys");
}

ConstMatrixRef Int8KVCache::values(int layer) const {
  (void)layer;
  throw NotImplemented("02", "Int8KVCache::values");
}

void Int8KVCache::reset() { throw NotImplemented("02", "Int8KVCache::reset"); }

size_t Int8KVCache::bytes_used() const {
  // Per position and layer: K and V, each kv_dim int8 values plus kv_heads float scales.
  throw NotImplemented("02", "Int8KVCache::bytes_used");
}

size_t Int8KVCache::bytes_reserved() const { throw NotImplemented("02", "Int8KVCache::bytes_reserved"); }

// ---------------------------------------------------------- cached forward --

Matrix forward_cached(const ModelWeights& model, std::span<const int> tokens, KVStore& cache) {
  // Lesson 00's forward, with three changes per layer:
  //   1. RoPE starts at position cache.length() (read it once, before the first layer appends);
  //   2. the new tokens' k and v are appended to the cache;
  //   3. attention over everything cached: cache.attend(l, q, ...), which is causal_attention
  //      over cache.keys(l) and cache.values(l) (it already handles more keys than queries).
  // Validate first (ids, and room for the tokens in the cache and the context) so that a
  // refused call appends nothing.
  (void)model, (void)tokens, (void)cache;
  throw NotImplemented("02", "forward_cached");
}

std::vector<int> generate_cached(const ModelWeights& model, std::span<const int> prompt, int max_new_tokens,
                                 Sampler& sampler, KVStore& cache, const TokenCallback& on_token) {
  // Validate like generate() (plus: the cache is empty and large enough). Prefill the prompt
  // once; then each step samples from the last logits row and feeds only the new token back.
  // Don't run a forward you won't use: after EOS, or after the last token.
  (void)model, (void)prompt, (void)max_new_tokens, (void)sampler, (void)cache, (void)on_token;
  throw NotImplemented("02", "generate_cached");
}

}  // namespace infer
