/// @file kv_cache.hpp
/// @brief Lesson 02's contract: keep every token's keys and values, so that each decode step
/// computes only the new token's.
///
/// You implement the classes and functions declared here in `exercises/02_kv_cache/kv_cache.cpp`.
/// They extend lesson 00's model, not replace it: forward_cached() reuses rms_norm, apply_rope,
/// causal_attention and swiglu_mlp, and must produce the same logits as forward() on the whole
/// sequence.
///
///     prefill:  prompt (T tokens)  -> K/V of positions 0..T-1 appended -> logits of position T-1
///     decode:   1 token at position n -> its K/V appended -> attention over positions 0..n
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/model_config.hpp"
#include "common/tensor.hpp"
#include "common/weights.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"

namespace infer {

class PagedKVCache;  // lesson 04
namespace gpu {
class CudaKVStore;  // lesson 07
}

/// Where a sequence's keys and values live. Given to you: the interface that lesson 02's two
/// caches implement, that forward_cached() talks to, and that later lessons implement again
/// (paged blocks in lesson 04).
///
/// Each layer holds rows of `kv_dim = num_key_value_heads * head_dim` values: row p is the
/// (already rotated) key, or the value, of the token at position p. Layers fill in step: a
/// forward appends the same new positions to every layer.
class KVStore {
 public:
  virtual ~KVStore() = default;

  /// Layers stored (the model's num_hidden_layers).
  virtual int num_layers() const = 0;
  /// Positions stored in `layer`: the next append writes position length(layer).
  virtual int length(int layer) const = 0;
  /// Positions the store can hold in each layer.
  virtual int max_tokens() const = 0;

  /// Appends rows of keys and values to `layer` (k and v: [n, kv_dim]). Throws infer::Error,
  /// writing nothing, if the rows would pass max_tokens() (the message names `max_tokens`) or
  /// have the wrong width (the message names `kv_dim`).
  virtual void append(int layer, ConstMatrixRef k, ConstMatrixRef v) = 0;
  /// Every stored key of `layer`, [length(layer), kv_dim], as float32.
  virtual ConstMatrixRef keys(int layer) const = 0;
  /// Every stored value of `layer`, [length(layer), kv_dim], as float32.
  virtual ConstMatrixRef values(int layer) const = 0;
  /// Forgets every position (a contiguous store keeps its memory reserved; lesson 04's paged store
  /// gives its blocks back).
  virtual void reset() = 0;
  /// Makes room for positions up to `tokens` before they are appended, so that appending them
  /// takes no memory: lesson 03's engine calls it for every sequence of a step before the step's
  /// forward runs, which then never allocates. Given default: refuses tokens outside [0,
  /// max_tokens()] and does nothing more (a contiguous store reserved its memory when it was
  /// made). Lesson 04's paged cache takes the blocks they need here, and copies a shared block
  /// they will be written into.
  virtual void reserve(int tokens);
  /// Keeps the first `length` positions of every layer and forgets the rest: speculative
  /// decoding's rollback (lesson 06). Given: copies the kept rows out, reset(), appends them
  /// back; a store that can simply move its end (KVCache) overrides it. Throws infer::Error
  /// unless 0 <= length <= length().
  virtual void truncate(int length);

  /// Causal attention of the newest `q.rows()` positions' queries (q: [T, num_heads * head_dim],
  /// already rotated) over every position stored in `layer`, the T newest included: row i is
  /// the query of position length(layer) - T + i. Given: causal_attention() over keys(layer)
  /// and values(layer). A store that can read its rows where they lie overrides it (lesson 04's
  /// paged cache does, instead of gathering them into one matrix first).
  virtual Matrix attend(int layer, ConstMatrixRef q, int num_heads, int num_kv_heads, int head_dim) const;
  /// Whether attend() is the given one, over keys() and values(): lesson 03's forward_step() then
  /// shares one chunk's query heads out over its threads, each reading keys() and values() itself.
  /// Given: true unless the store is paged(); another store that overrides attend() says false.
  virtual bool attends_over_keys() const { return paged() == nullptr; }

  /// This store as lesson 04's paged cache (its block table, its pool), or nullptr for a store
  /// whose rows are its own. How the engine's memory and lesson 08's GPU forward read a step's
  /// block tables without guessing a store's type.
  virtual const PagedKVCache* paged() const { return nullptr; }
  virtual PagedKVCache* paged() { return nullptr; }  ///< the same, to write through
  /// This store as lesson 07's contiguous cache in device memory, or null: how the CUDA forward
  /// finds the device arrays of the caches a step hands it.
  virtual gpu::CudaKVStore* cuda() { return nullptr; }

  /// Bytes holding stored positions (including any scales).
  virtual size_t bytes_used() const = 0;
  /// Bytes reserved for this sequence, including any scales: max_tokens() positions for the
  /// contiguous caches, the blocks in its table for lesson 04's paged one.
  virtual size_t bytes_reserved() const = 0;

  /// The sequence length: positions stored in every layer.
  int length() const { return num_layers() > 0 ? length(num_layers() - 1) : 0; }
};

/// A contiguous float32 cache for one sequence: per layer, a [max_tokens, kv_dim] block for
/// keys and one for values, reserved up front, filled from the top.
class KVCache final : public KVStore {
 public:
  /// Reserves room for `max_tokens` positions of a model shaped like `config`.
  /// Throws infer::Error if max_tokens is not positive.
  KVCache(const ModelConfig& config, int max_tokens);

  using KVStore::length;  // keep length() visible next to length(layer)
  int num_layers() const override;
  int length(int layer) const override;
  int max_tokens() const override;
  void append(int layer, ConstMatrixRef k, ConstMatrixRef v) override;
  ConstMatrixRef keys(int layer) const override;
  ConstMatrixRef values(int layer) const override;
  void reset() override;
  void truncate(int length) override;  ///< given: moves the end, copies nothing
  size_t bytes_used() const override;
  size_t bytes_reserved() const override;

 private:
  int kv_dim_ = 0;
  int max_tokens_ = 0;
  std::vector<Matrix> k_, v_;  ///< per layer: [max_tokens, kv_dim]
  std::vector<int> length_;    ///< per layer: positions stored
};

/// An INT8 cache: each row of each K/V head is stored as int8 values with one float scale,
/// `scale = max|x| / 127`, `q = round(x / scale)` (to the nearest, ties away from zero:
/// std::lround; |q| <= 127 then holds without a clamp); reading dequantizes `q * scale`. An all-zero
/// head gets scale 1 (any scale stores zeros; 1 avoids dividing by 0). A quarter of the float32
/// bytes, plus one float per head per token for K and for V.
class Int8KVCache final : public KVStore {
 public:
  /// Reserves room for `max_tokens` positions of a model shaped like `config`.
  Int8KVCache(const ModelConfig& config, int max_tokens);

  using KVStore::length;  // keep length() visible next to length(layer)
  int num_layers() const override;
  int length(int layer) const override;
  int max_tokens() const override;
  void append(int layer, ConstMatrixRef k, ConstMatrixRef v) override;
  ConstMatrixRef keys(int layer) const override;    ///< dequantized on read
  ConstMatrixRef values(int layer) const override;  ///< dequantized on read
  void reset() override;
  size_t bytes_used() const override;
  size_t bytes_reserved() const override;

 private:
  /// @cond DETAIL
  /// One layer's quantized K or V. (Kept from the walkthrough, which lists no private members:
  /// Doxygen would link a "Classes" section the page does not have.)
  struct Quantized {
    std::vector<int8_t> q;       ///< [max_tokens * kv_dim]
    std::vector<float> scale;    ///< [max_tokens * kv_heads]
    mutable Matrix dequantized;  ///< scratch for reads: [length, kv_dim]
  };
  /// @endcond
  int kv_dim_ = 0, head_dim_ = 0, kv_heads_ = 0, max_tokens_ = 0;
  std::vector<Quantized> k_, v_;
  std::vector<int> length_;
};

/// The model over `tokens`, which sit at positions cache.length() onward: computes only their
/// K/V, appends them to `cache`, and attends over everything cached.
///
/// With an empty cache and the whole prompt this is the prefill; with one token it is a decode
/// step. Either way the logits equal forward() on the whole sequence so far.
/// @return [tokens.size(), vocab] logits for the new tokens
/// @throws infer::Error for bad ids, or, before anything is appended, if the new tokens would
///         not fit in the cache or the context (the message says they "exceed" it).
Matrix forward_cached(const ModelWeights& model, std::span<const int> tokens, KVStore& cache);

/// Lesson 00's generate() with a cache: one prefill of the prompt, then one decode step per
/// token. Same arguments, same results, same exceptions; in addition `cache` must be empty (or
/// infer::Error says it must "start empty"), and hold prompt.size() + max_new_tokens positions
/// (or infer::Error says "the cache holds N positions" and what the generation needs). The tests
/// give each refusal a call that breaks only its own rule: the order of the checks is yours. The last token is never run through the model (no
/// later step would read its K/V), so at most prompt.size() + max_new_tokens - 1 positions are
/// stored; the demand is one more on purpose: it is the same bound as the context's, so a
/// generation that fits the model's context fits a context-sized cache.
std::vector<int> generate_cached(const ModelWeights& model, std::span<const int> prompt, int max_new_tokens,
                                 Sampler& sampler, KVStore& cache, const TokenCallback& on_token = {});

}  // namespace infer
