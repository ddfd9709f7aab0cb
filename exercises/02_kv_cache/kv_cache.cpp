// Lesson 02, your turn: a contiguous KV cache, an INT8 one, and the cached forward.
//
// Replace each `throw NotImplemented(...)`. The contract is lessons/02_kv_cache/kv_cache.hpp; the
// lesson text is lessons/02_kv_cache/README.md. Check your work with `./course check 02`.
// The constructors and the trivial accessors are written for you in lessons/02_kv_cache/given.cpp.
// Stuck on a function? `./course hint 02 NAME` gives a hint, one tier at a time.
//
// The sections follow the contract header; each names its step of the README.
#include "lessons/02_kv_cache/kv_cache.hpp"

#include <algorithm>
#include <cmath>

namespace infer {

// ------------------------------------------------------------- float cache --
// Step 1 of the README.

void KVCache::append(int layer, ConstMatrixRef k, ConstMatrixRef v) {
  // Stores the new rows at positions length(layer) onward, in this layer only. All or nothing:
  // a bad layer, a width other than kv_dim (the message names "kv_dim"), unequal K and V row
  // counts, or rows that would pass max_tokens (the message names "max_tokens") throw
  // infer::Error and leave the cache exactly as it was.
  (void)layer, (void)k, (void)v;
  throw NotImplemented("02", "KVCache::append");
}

ConstMatrixRef KVCache::keys(int layer) const {
  // The stored rows of this layer only, [length(layer), kv_dim]: a view of the cache's own
  // memory, never a copy.
  (void)layer;
  throw NotImplemented("02", "KVCache::keys");
}

ConstMatrixRef KVCache::values(int layer) const {
  (void)layer;
  throw NotImplemented("02", "KVCache::values");
}

void KVCache::reset() { throw NotImplemented("02", "KVCache::reset"); }

size_t KVCache::bytes_used() const {
  // The bytes of the positions stored: K and V, float32, kv_dim values per position, in every
  // layer. (bytes_reserved is the same for max_tokens positions.)
  throw NotImplemented("02", "KVCache::bytes_used");
}

size_t KVCache::bytes_reserved() const { throw NotImplemented("02", "KVCache::bytes_reserved"); }

// -------------------------------------------------------------- INT8 cache --
// Step 4: write it after the cached forward and generation below.

void Int8KVCache::append(int layer, ConstMatrixRef k, ConstMatrixRef v) {
  // KVCache::append's contract (same checks, same all-or-nothing), but each new row is stored
  // quantized as the class comment in the contract says: one scale per (position, K/V head),
  // so a read is off by at most half a step, and an all-zero head reads back as zeros, not NaN.
  (void)layer, (void)k, (void)v;
  throw NotImplemented("02", "Int8KVCache::append");
}

ConstMatrixRef Int8KVCache::keys(int layer) const {
  // Every stored key of this layer, dequantized to float32, [length(layer), kv_dim]. The stored
  // int8 values and scales are left as they are.
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
  // (bytes_reserved is the same for max_tokens positions.)
  throw NotImplemented("02", "Int8KVCache::bytes_used");
}

size_t Int8KVCache::bytes_reserved() const { throw NotImplemented("02", "Int8KVCache::bytes_reserved"); }

// ---------------------------------------------------------- cached forward --
// Steps 2 and 3.

Matrix forward_cached(const ModelWeights& model, std::span<const int> tokens, KVStore& cache) {
  // Logits for the new tokens only, equal (to float rounding) to forward() over the whole
  // sequence so far. Computes K and V for the new tokens only, appends them to every layer, and
  // attends over everything cached. Throws infer::Error for bad ids, and, before appending
  // anything, when the tokens would not fit the cache or the context (the message says "exceed").
  (void)model, (void)tokens, (void)cache;
  throw NotImplemented("02", "forward_cached");
}

std::vector<int> generate_cached(const ModelWeights& model, std::span<const int> prompt, int max_new_tokens,
                                 Sampler& sampler, KVStore& cache, const TokenCallback& on_token) {
  // The same tokens as generate(), with the same errors, plus two: the cache must be empty (or
  // infer::Error says it must "start empty") and hold prompt.size() + max_new_tokens positions
  // (or infer::Error says "the cache holds N positions", N its max_tokens). Every position's K/V is computed exactly once, and the last
  // token returned is never run through the model (nothing would read its K/V).
  (void)model, (void)prompt, (void)max_new_tokens, (void)sampler, (void)cache, (void)on_token;
  throw NotImplemented("02", "generate_cached");
}

}  // namespace infer
