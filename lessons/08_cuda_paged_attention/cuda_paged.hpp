/// @file cuda_paged.hpp
/// @brief Lesson 04's paged KV memory on a CUDA device, and the engine over it. Given to you
/// (lessons/08_cuda_paged_attention/given_cuda.cpp), compiled where CUDA is.
///
/// The bookkeeping is lesson 04's, unchanged: a BlockAllocator hands out block ids, each sequence
/// keeps a block table, blocks are taken only as positions reach them. Only the rows move: they
/// live in device memory, one pool per layer, and the forward reads them through the tables with
/// your kernels. Putting it together:
///
///     auto kv = std::make_unique<CudaPagedKVManager>(config, num_blocks, block_size);
///     auto forward = std::make_unique<CudaForward>(weights, WeightType::F32, kv->attention());
///     Engine engine(std::move(forward), std::move(kv), {.max_running = max_batch});
///
/// is lesson 03's engine with lesson 04's admission and preemption, on the GPU: each step uploads
/// the batch's block tables, lengths and slots once, then in every layer one write_kv_slots and
/// one paged attention launch serve the whole batch (lesson 07 launched attention per sequence).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "common/model_config.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"
#include "lessons/07_cuda_decoder/cuda_model.hpp"

namespace infer::gpu {

/// Lesson 04's PagedKVPool with its rows on the device: per layer, keys and values [num_blocks *
/// block_size, kv_dim] in device memory, and the host's BlockAllocator over the block ids.
class CudaPagedKVPool {
 public:
  /// Reserves num_blocks blocks of block_size positions on the device. Throws infer::Error for
  /// num_blocks or block_size below 1, or without a device.
  CudaPagedKVPool(const ModelConfig& config, int num_blocks, int block_size = 16);
  ~CudaPagedKVPool();
  CudaPagedKVPool(const CudaPagedKVPool&) = delete;
  CudaPagedKVPool& operator=(const CudaPagedKVPool&) = delete;

  int block_size() const;  ///< positions per block
  int num_blocks() const;  ///< blocks in the pool
  int num_layers() const;  ///< the model's layers
  int kv_dim() const;      ///< num_key_value_heads * head_dim
  int context() const;     ///< the model's max_position_embeddings
  BlockAllocator& allocator();              ///< who owns which block
  const BlockAllocator& allocator() const;  ///< who owns which block
  float* device_keys(int layer);            ///< layer's keys [num_blocks * block_size, kv_dim]
  float* device_values(int layer);          ///< layer's values, the same shape
  const float* device_keys(int layer) const;    ///< read-only
  const float* device_values(int layer) const;  ///< read-only
  /// Bytes of one block: keys and values, every layer, float32.
  size_t bytes_per_block() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// One sequence's block table over a CudaPagedKVPool: a KVStore, so lesson 03's engine holds it.
/// Blocks are allocated as positions reach them (reserve), never shared: every block has one
/// holder (prefix sharing on the GPU is left to lesson 10).
class CudaPagedKVCache final : public KVStore {
 public:
  /// An empty sequence over `pool` that may grow to `max_tokens` positions (at most the context).
  CudaPagedKVCache(CudaPagedKVPool& pool, int max_tokens);
  /// Gives every block back (reset()).
  ~CudaPagedKVCache() override;
  CudaPagedKVCache(const CudaPagedKVCache&) = delete;
  CudaPagedKVCache& operator=(const CudaPagedKVCache&) = delete;

  using KVStore::length;
  int num_layers() const override;
  int length(int layer) const override;
  int max_tokens() const override;
  /// Copies host rows into their blocks (allocating blocks as positions reach them; all or
  /// nothing, "out of KV blocks" when the pool is short).
  void append(int layer, ConstMatrixRef k, ConstMatrixRef v) override;
  /// The layer's keys gathered through the table to the host (for tests; valid until the next call).
  ConstMatrixRef keys(int layer) const override;
  /// The layer's values, gathered like keys().
  ConstMatrixRef values(int layer) const override;
  /// Gives every block back and forgets every position.
  void reset() override;
  size_t bytes_used() const override;
  /// Blocks in the table times the pool's bytes per block.
  size_t bytes_reserved() const override;

  /// Makes the table cover `tokens` positions (all or nothing: "out of KV blocks" when the pool is
  /// short). Throws for tokens outside [0, max_tokens()].
  void reserve(int tokens);
  /// Records that the position length(layer) of `layer` was written on the device (by
  /// write_kv_slots, into the slot slot(length(layer))).
  void advance(int layer);
  /// The pool row that holds `position`: table[position / B] * B + position % B. Throws for a
  /// position the table does not cover.
  int slot(int position) const;
  /// Physical block of each logical block, in order.
  const std::vector<int>& block_table() const { return blocks_; }
  /// The pool.
  const CudaPagedKVPool& pool() const { return *pool_; }

 private:
  CudaPagedKVPool* pool_;
  int max_tokens_;
  std::vector<int> blocks_;
  std::vector<int> length_;
  mutable Matrix host_;
};

/// Lesson 04's PagedKVManager on the device: open() admits a sequence only if its first positions
/// fit in the free blocks, and a running sequence needs a new block exactly when its last one is
/// full (no block is shared here), the newest preempted until the others fit.
class CudaPagedKVManager final : public KVManager {
 public:
  /// A device pool of num_blocks blocks of block_size positions.
  CudaPagedKVManager(const ModelConfig& config, int num_blocks, int block_size = 16);

  std::unique_ptr<KVStore> open(int tokens) override;
  void close(std::unique_ptr<KVStore> store) override;
  int preemptions_needed(std::span<const KVStore* const> running) const override;
  /// min(num_blocks * block_size, the model's context).
  int capacity_tokens() const override;
  /// Allocated blocks * block_size.
  long reserved_tokens() const override;

  /// The pool.
  CudaPagedKVPool& pool() { return *pool_; }
  /// The forward's DeviceAttention over this pool: paged attention with your kernels, the batch in
  /// one launch per layer, split over the context by choose_splits() (`num_splits` > 0 fixes the
  /// count instead). The manager must outlive it.
  std::unique_ptr<DeviceAttention> attention(int num_splits = 0);

 private:
  ModelConfig config_;
  std::unique_ptr<CudaPagedKVPool> pool_;
};

}  // namespace infer::gpu
