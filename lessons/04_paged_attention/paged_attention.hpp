/// @file paged_attention.hpp
/// @brief Lesson 04's contract: KV memory in fixed-size blocks that can live anywhere, a block
/// table per sequence, sharing with copy-on-write, and the engine's scheduler on top of the pool.
///
/// You implement the functions declared here in `exercises/04_paged_attention/paged_attention.cpp`.
/// Nothing else changes: a PagedKVCache is a KVStore, so lesson 02's forward_cached() and lesson
/// 03's forward_batch() run on it as they are (through KVStore::attend, which here reads the
/// keys and values where they lie), and a PagedKVManager is a KVManager, so lesson 03's engine
/// runs on the pool as it is.
///
///     logical positions of one sequence       block table         physical pool (B = 4)
///     [ 0  1  2  3 | 4  5  6  7 | 8  9 ]  ->  [ 5, 2, 7 ]  ->  block 5, block 2, block 7 (partly)
///
/// Position p lives in row `p % B` of block `table[p / B]`: the pool's slot `table[p / B] * B + p % B`.
/// The bookkeeping (the allocator's counts, the tables) stays on the host wherever the rows are.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "common/model_config.hpp"
#include "common/tensor.hpp"
#include "lessons/02_kv_cache/kv_cache.hpp"
#include "lessons/03_batching/engine.hpp"

namespace infer {

/// Blocks needed to hold `tokens` positions in blocks of `block_size`: the ceiling of the
/// ratio (0 for 0 tokens). Given.
int blocks_for(int tokens, int block_size);

/// Block ids 0 .. num_blocks-1 over a fixed pool: a free list and a reference count per block.
///
/// A block is *free* (count 0, on the free list) or *allocated* (count >= 1: the number of
/// sequences whose block table holds it).
class BlockAllocator {
 public:
  /// Every block free. allocate() hands out 0, 1, 2, ... first. Throws for num_blocks < 1.
  explicit BlockAllocator(int num_blocks);

  /// Takes a free block (from the back of the free list) and sets its count to 1.
  /// @throws infer::Error saying "out of KV blocks" and naming num_blocks when none is free.
  int allocate();
  /// One more sequence holds `block`: its count goes up by one.
  /// @throws infer::Error for a block outside [0, num_blocks) or a free one.
  void share(int block);
  /// One sequence lets go of `block`: its count goes down by one, and at 0 the block goes back
  /// on the free list (at the back: the next allocate() takes it).
  /// @throws infer::Error for a block outside [0, num_blocks), or one already free (a double
  ///         free: the message says "double free").
  void free(int block);

  /// Sequences holding `block` (0 when free). Throws for a block outside [0, num_blocks).
  int ref_count(int block) const;
  /// Blocks on the free list.
  int num_free() const { return static_cast<int>(free_list_.size()); }
  /// Blocks in the pool.
  int num_blocks() const { return static_cast<int>(ref_count_.size()); }

 private:
  std::vector<int> free_list_;  ///< free block ids; allocate() takes the back
  std::vector<int> ref_count_;  ///< per block
};

/// A paged KV memory: num_blocks blocks of block_size positions, in every layer, and the
/// allocator that says who holds which block. The bookkeeping (block ids, reference counts, and
/// the tables in PagedKVCache) is the same wherever the rows live; only the rows move. A pool
/// addresses a row by its *slot*: position p of a sequence lies in slot `table[p / B] * B + p % B`.
///
/// Given. PagedKVPool keeps its rows in host memory; lesson 08's CudaPagedKVPool keeps them on a
/// GPU. PagedKVCache, PagedKVManager and lesson 05's PrefixKVManager run over either.
class KVBlockPool {
 public:
  /// num_blocks blocks of block_size positions for a model shaped like `config`.
  /// Throws for num_blocks < 1 or block_size < 1.
  KVBlockPool(const ModelConfig& config, int num_blocks, int block_size);
  virtual ~KVBlockPool() = default;
  KVBlockPool(const KVBlockPool&) = delete;
  KVBlockPool& operator=(const KVBlockPool&) = delete;

  int block_size() const { return block_size_; }              ///< B, positions per block
  int num_blocks() const { return allocator_.num_blocks(); }  ///< blocks in the pool
  int num_layers() const { return num_layers_; }              ///< the model's layers
  int kv_dim() const { return kv_dim_; }                      ///< num_key_value_heads * head_dim
  int context() const { return context_; }                    ///< the model's max_position_embeddings

  BlockAllocator& allocator() { return allocator_; }              ///< who owns which block
  const BlockAllocator& allocator() const { return allocator_; }  ///< who owns which block

  /// Bytes of one block: keys and values, every layer, float32.
  size_t bytes_per_block() const { return 2 * sizeof(float) * static_cast<size_t>(num_layers_) * block_size_ * kv_dim_; }

  /// Writes row i of `k` and of `v` ([slots.size(), kv_dim]) into slot slots[i] of `layer`.
  /// Throws for a bad layer, a slot outside the pool or rows of the wrong shape.
  virtual void write(int layer, std::span<const int> slots, ConstMatrixRef k, ConstMatrixRef v) = 0;
  /// Reads slot slots[i] of `layer` into row i of `out`, keys or values ([slots.size(), kv_dim]):
  /// for tests and tools (the forward reads the rows where they lie).
  virtual void read(int layer, std::span<const int> slots, bool keys, Matrix& out) const = 0;
  /// Copies block `src`'s keys and values into block `dst`, in every layer (copy-on-write).
  virtual void copy_block(int src, int dst) = 0;
  /// paged_attention() of `q` over the first `length` positions of `layer` through
  /// `block_table`. A pool whose rows are on a GPU refuses: a GPU forward reads them there.
  virtual Matrix attend(int layer, ConstMatrixRef q, std::span<const int> block_table, int length, int num_heads,
                        int num_kv_heads, int head_dim) const = 0;

 protected:
  /// Throws unless layer and every slot are inside the pool and k, v are [slots.size(), kv_dim].
  void check_rows(const char* who, int layer, std::span<const int> slots, Eigen::Index k_rows, Eigen::Index v_rows,
                  Eigen::Index k_cols, Eigen::Index v_cols) const;

 private:
  int block_size_, kv_dim_, context_, num_layers_;
  BlockAllocator allocator_;
};

/// The physical KV memory in host memory: per layer, key rows and value rows for num_blocks *
/// block_size positions, block b owning rows [b * B, (b + 1) * B). Given, except copy_block().
class PagedKVPool final : public KVBlockPool {
 public:
  /// Reserves num_blocks blocks of block_size positions for a model shaped like `config`.
  /// Throws for num_blocks < 1 or block_size < 1.
  PagedKVPool(const ModelConfig& config, int num_blocks, int block_size = 16);

  /// The B key rows of `block` in `layer`: [block_size, kv_dim]. Throws for a bad layer or block.
  MatrixRef key_block(int layer, int block);
  ConstMatrixRef key_block(int layer, int block) const;  ///< read-only
  /// The B value rows of `block` in `layer`: [block_size, kv_dim].
  MatrixRef value_block(int layer, int block);
  ConstMatrixRef value_block(int layer, int block) const;  ///< read-only

  /// Copies block `src`'s keys and values into block `dst`, in every layer (copy-on-write; src ==
  /// dst leaves the block as it is). Yours.
  void copy_block(int src, int dst) override;

  void write(int layer, std::span<const int> slots, ConstMatrixRef k, ConstMatrixRef v) override;  ///< given
  void read(int layer, std::span<const int> slots, bool keys, Matrix& out) const override;          ///< given
  /// Your paged_attention() over this pool. Given.
  Matrix attend(int layer, ConstMatrixRef q, std::span<const int> block_table, int length, int num_heads,
                int num_kv_heads, int head_dim) const override;

 private:
  std::vector<Matrix> k_, v_;  ///< per layer: [num_blocks * block_size, kv_dim]
};

/// Causal attention like causal_attention(q, K, V, ...), where K and V are the first `length`
/// positions of `layer`, found through `block_table`: position p is row `p % B` of block
/// `block_table[p / B]`. Reads the rows where they lie: no copy of the sequence's rows, not even
/// of one head's, whole or in pieces (the tests measure the largest allocation of a decode step
/// and the total; scratch the size of one row of scores is fine, and so is an array of the
/// table's block addresses: bookkeeping, not a copy of the rows). q holds the queries of the newest q.rows() positions: row i is
/// position length - q.rows() + i.
/// @throws infer::Error if the table has fewer than blocks_for(length, B) blocks (naming
///         `length`), or if q.rows() > length.
Matrix paged_attention(ConstMatrixRef q, const PagedKVPool& pool, std::span<const int> block_table, int layer,
                       int length, int num_heads, int num_kv_heads, int head_dim);

/// One sequence's keys and values in a pool: a block table and a length per layer. A KVStore,
/// so forward_cached() and forward_batch() run on it unchanged. It is bookkeeping only: the rows
/// live in the pool (on the host, or on a GPU in lesson 08), addressed by slot.
///
/// Blocks are taken from the pool only when needed, by reserve(): making room for position p
/// takes a block exactly when p == blocks * B (the last block is full, or there is none), and a
/// block another sequence shares (count > 1) that a position will be written into is first
/// copied to a private block (copy-on-write). The engine reserves every sequence's positions
/// while it plans a step, so its forward never allocates; append() reserves what is missing
/// itself, so that forward_cached() runs on a paged cache as on any store.
class PagedKVCache final : public KVStore {
 public:
  /// An empty sequence over `pool` that may grow to `max_tokens` positions (at most the model's
  /// context). Given. The pool must outlive the cache.
  PagedKVCache(KVBlockPool& pool, int max_tokens);
  /// A sequence whose first `length` positions are already stored, in every layer, in `blocks`
  /// (full blocks, in order: length must be blocks.size() * block_size). Each block gets one more
  /// holder (share); the first append then starts a block of its own. Given: lesson 05's prefix
  /// cache opens sequences this way.
  PagedKVCache(KVBlockPool& pool, int max_tokens, std::span<const int> blocks, int length);
  /// Frees every block it holds (reset()).
  ~PagedKVCache() override;
  PagedKVCache(const PagedKVCache&) = delete;
  PagedKVCache& operator=(const PagedKVCache&) = delete;

  using KVStore::length;  // keep length() visible next to length(layer)
  int num_layers() const override;     ///< given
  int length(int layer) const override;  ///< given
  int max_tokens() const override;     ///< given

  /// Makes room for positions [length(), tokens) (length() is the last layer's): afterwards the
  /// table covers `tokens` positions and every block those positions lie in is this sequence's
  /// alone (a shared one was copied to a fresh block, pool.copy_block(), and the shared one let
  /// go). Writes no row of its own and
  /// changes no length; a table that already covers them privately is left as it is. All or
  /// nothing: throws "out of KV blocks" and takes nothing if the pool is short of the blocks
  /// (new ones and copies) it needs. Throws for tokens outside [0, max_tokens()], naming `tokens`.
  void reserve(int tokens) override;
  /// Appends rows like KVCache::append: position p = length(layer) + i goes to slot
  /// `table[p / B] * B + p % B` of the pool (KVBlockPool::write), after reserve() has made room
  /// for them. All or nothing: throws infer::Error, writing nothing, for the reasons
  /// KVStore::append gives, or when the pool has too few free blocks ("out of KV blocks").
  void append(int layer, ConstMatrixRef k, ConstMatrixRef v) override;
  /// Every stored key of `layer`, read through the table into one [length, kv_dim] matrix
  /// (KVBlockPool::read; for tests and tools: the forward uses attend(), which does not copy).
  /// Valid until the next keys() call; keys() and values() use separate scratch, so both can be
  /// held at once.
  ConstMatrixRef keys(int layer) const override;
  /// Every stored value of `layer`, read like keys().
  ConstMatrixRef values(int layer) const override;
  /// The pool's attention over this sequence's table (on the host: your paged_attention()).
  /// Given.
  Matrix attend(int layer, ConstMatrixRef q, int num_heads, int num_kv_heads, int head_dim) const override;
  /// Frees every block (each free() drops one reference) and forgets every position.
  void reset() override;
  /// Keeps the first `length` positions: the blocks past blocks_for(length, B) leave the table
  /// (one free() each), and nothing is copied (speculative decoding's rollback, lesson 06). Given.
  void truncate(int length) override;
  /// Bytes holding stored positions: length() * (bytes per position, every layer, K and V).
  size_t bytes_used() const override;
  /// Bytes of the blocks in the table: blocks * pool.bytes_per_block(). Less than one block more
  /// than bytes_used() once a sequence only grows one position at a time.
  size_t bytes_reserved() const override;
  /// Itself: a paged store. Given.
  const PagedKVCache* paged() const override { return this; }
  PagedKVCache* paged() override { return this; }  ///< given

  /// A new sequence with the same history: the same block table (each block shared: its count
  /// goes up by one) and the same lengths. The two then grow independently: the first write into
  /// a shared block copies it.
  std::unique_ptr<PagedKVCache> fork() const;

  /// The pool slot of `position`: table[position / B] * B + position % B. Throws for a position
  /// the table does not cover. Given.
  int slot(int position) const;
  /// Records that positions [length(layer), length(layer) + n) of `layer` were written straight
  /// into their slots by someone other than append() (lesson 08's GPU forward writes them on the
  /// device). Throws unless reserve() made room for them. Given.
  void advance(int layer, int n);

  /// Physical block of each logical block, in order.
  const std::vector<int>& block_table() const { return blocks_; }
  /// The pool.
  const KVBlockPool& pool() const { return *pool_; }

 private:
  KVBlockPool* pool_;
  int max_tokens_;
  std::vector<int> blocks_;         ///< the block table
  std::vector<int> length_;         ///< per layer: positions stored
  mutable Matrix gathered_k_;       ///< scratch for keys()
  mutable Matrix gathered_v_;       ///< scratch for values(): separate, so both can be read at once
};

/// The engine's memory as a paged pool: sequences take blocks as they grow, so many more fit in
/// the same bytes than with lesson 03's whole-context slots. The pool may be in host memory
/// (PagedKVPool) or on a GPU (lesson 08's CudaPagedKVPool): the bookkeeping is the same.
///
/// - open(tokens): admits a sequence only if its first `tokens` positions fit in the free blocks;
///   then reserves exactly those blocks.
/// - preemptions_needed(running): a running sequence needs one free block for its next position,
///   p = length(), when p lies past its table (its last block is full, or it has none) or in a
///   block it shares (the block is copied first): what reserve(p + 1) would take. Each sequence
///   is counted on its own, so two that share a partly filled block need one copy each (the
///   second would find the block its own after the first copied, but counting it keeps the
///   answer safe and simple). Preempting a sequence drops its
///   hold on each of its blocks: a block nobody holds any more is free again, and a block left
///   with a single holder is no longer shared (that holder then writes into it in place). The
///   answer is the smallest k such that, with the k newest preempted, the others' needs (counted
///   with the holds that remain) fit in the free blocks plus the freed ones.
class PagedKVManager final : public KVManager {
 public:
  /// A pool of num_blocks blocks of block_size positions in host memory. Given.
  PagedKVManager(const ModelConfig& config, int num_blocks, int block_size = 16);
  /// Over `pool`, wherever its rows live (lesson 08 passes a GPU's). Throws for a null pool. Given.
  explicit PagedKVManager(std::unique_ptr<KVBlockPool> pool);

  /// A PagedKVCache of max_tokens = the model's context with its first `tokens` positions
  /// reserved, or nullptr when they need more blocks than are free (nothing taken). Throws for
  /// tokens outside [0, capacity_tokens()], naming `tokens`.
  std::unique_ptr<KVStore> open(int tokens) override;
  /// Destroys the store (freeing its blocks). Throws for a store that is not one of its pool's.
  /// Given.
  void close(std::unique_ptr<KVStore> store) override;
  /// The class comment's rule. `running` is in admission order: its back is the newest, the
  /// first to be preempted. Throws infer::Error for a store that is not paged (its paged() is
  /// nullptr) or one of another pool.
  int preemptions_needed(std::span<const KVStore* const> running) const override;
  /// min(num_blocks * block_size, the model's context). Given.
  int capacity_tokens() const override;
  /// Allocated blocks * block_size. Given.
  long reserved_tokens() const override;

  /// The pool. Given.
  const KVBlockPool& pool() const { return *pool_; }
  /// The pool, to open stores of your own over it (lesson 05). Given.
  KVBlockPool& pool() { return *pool_; }

 private:
  std::unique_ptr<KVBlockPool> pool_;
};

}  // namespace infer
