/// @file cuda_paged.hpp
/// @brief Lesson 04's paged KV memory with its rows on a CUDA device, and the engine's attention
/// over it. Given to you (lessons/08_cuda_paged_attention/given_cuda.cpp), compiled where CUDA is.
///
/// The bookkeeping is lesson 04's, unchanged and on the host: the pool's BlockAllocator hands
/// out block ids, each sequence is a PagedKVCache (its block table), and lesson 04's
/// PagedKVManager (or lesson 05's PrefixKVManager, which shares cached prefixes) admits and
/// preempts. Only the rows move: they live in device memory, one pool per layer, and the
/// forward reads them through the tables with your kernels. Putting it together:
///
///     auto pool = std::make_unique<CudaPagedKVPool>(config, num_blocks, block_size);
///     auto forward = std::make_unique<CudaForward>(weights, WeightType::F32, device_paged_attention(*pool));
///     Engine engine(std::move(forward), std::make_unique<PagedKVManager>(std::move(pool)), {.max_running = max_batch});
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
#include "lessons/08_cuda_paged_attention/chunk_attention.hpp"

namespace infer::gpu {

/// Lesson 04's KVBlockPool with its rows on the device: per layer, keys and values [num_blocks *
/// block_size, kv_dim] in device memory; the allocator (on the host) is the base's.
class CudaPagedKVPool final : public KVBlockPool {
 public:
  /// Reserves num_blocks blocks of block_size positions on the device. Throws infer::Error for
  /// num_blocks or block_size below 1, or without a device.
  CudaPagedKVPool(const ModelConfig& config, int num_blocks, int block_size = 16);
  ~CudaPagedKVPool() override;

  const ModelConfig& config() const;            ///< the model's shape
  float* device_keys(int layer);                ///< layer's keys [num_blocks * block_size, kv_dim]
  float* device_values(int layer);              ///< layer's values, the same shape
  const float* device_keys(int layer) const;    ///< read-only
  const float* device_values(int layer) const;  ///< read-only

  /// Copies host rows into their slots on the device (PagedKVCache::append's path: tests and
  /// tools; the forward writes its rows on the device with write_kv_slots).
  void write(int layer, std::span<const int> slots, ConstMatrixRef k, ConstMatrixRef v) override;
  /// Copies rows from their slots to the host (for tests and tools).
  void read(int layer, std::span<const int> slots, bool keys, Matrix& out) const override;
  /// Copies block src to dst on the device, in every layer (copy-on-write).
  void copy_block(int src, int dst) override;
  /// Refuses: these rows are read on the device, by device_paged_attention()'s kernels.
  Matrix attend(int layer, ConstMatrixRef q, std::span<const int> block_table, int length, int num_heads,
                int num_kv_heads, int head_dim) const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A step's rows as lesson 08's kernels read them: chunk i's n_i tokens after L_i cached positions
/// are n_i rows of a PagedBatch, row t with chunk i's block table and length L_i + t + 1 (it sees
/// its sequence up to itself: causal attention through the table, with the decode kernel), and
/// its new K/V going to slot(L_i + t). Host-side, checked on every machine.
///
/// A chunk with a mask (lesson 06's tree of guesses) sees no prefix of its sequence: row t sees
/// the cached positions and the chunk's tokens j with mask(t, j). Then every row of the step gets
/// a list of the slots it sees instead of a block table, which the same kernel reads as a table of
/// blocks of one position (block_size 1: block id = slot): the chain rows list slots 0 .. L + t,
/// the tree rows their cached slots and then their ancestors' and their own.
struct PagedStepRows {
  int rows = 0;               ///< N, the step's tokens
  int block_size = 1;         ///< positions per table entry: the pool's, or 1 when the rows list slots
  int max_blocks = 1;         ///< columns of `tables`
  int max_length = 1;         ///< the largest of `lengths`
  std::vector<int> tables;    ///< [rows, max_blocks]: each row's block table (or slot list), zeros past its end
  std::vector<int> lengths;   ///< [rows]: the positions each row sees
  std::vector<int> slots;     ///< [rows]: where each row's new K/V go (chunk order: slot(L + t))
};

/// Reserves each of `caches` room for its chunk (`tokens[i]` more positions: PagedKVCache::reserve,
/// which copies a shared block first), then lays out the step's rows (PagedStepRows). `masks` is
/// empty (every chunk causal) or one per chunk, null for a causal one, else [n_i, n_i] as
/// infer::Chunk's (check_step() validates them). Block tables are at least `min_blocks` wide (zeros
/// past a table's end): a CUDA graph replays its launches with one width. Given. Throws
/// infer::Error for sizes that differ, a null cache, a count below 1 or a mask of the wrong size,
/// and as reserve().
PagedStepRows paged_step_rows(std::span<PagedKVCache* const> caches, std::span<const int> tokens,
                              std::span<const TreeMask* const> masks = {}, int min_blocks = 0);

/// Chunks of fewer tokens than this go to the decode kernel, row by row: a tile of a few rows
/// leaves most of paged_chunk_attention()'s block idle, while the decode kernel spreads them over
/// blocks (a guess to be measured: lesson08_cuda_bench times both at several chunk sizes).
inline constexpr int kChunkKernelMinTokens = 8;

/// Which kernel reads which rows of a step (PagedStepRows' rows, chunk after chunk).
struct StepKernels {
  std::vector<int> tile_first;  ///< paged_chunk_attention()'s tiles: each one's first row
  std::vector<int> tile_rows;   ///< and its rows (1 to kChunkTileRows)
  std::vector<int> run_first;   ///< the decode kernel's runs of consecutive rows: each one's first row
  std::vector<int> run_rows;    ///< and its rows
};

/// Splits a step whose chunks have `tokens[i]` tokens: each causal chunk of at least `min_chunk`
/// tokens becomes tiles of kChunkTileRows rows (its last tile the rest); every other row (a
/// decode, a short chunk, every row when `causal` is false: a tree's rows list slots) joins a run
/// of consecutive rows for the decode kernel. Every row lands in exactly one tile or run. Given.
/// Throws infer::Error for no chunks, a chunk below 1 token or min_chunk below 2.
StepKernels step_kernels(std::span<const int> tokens, bool causal, int min_chunk = kChunkKernelMinTokens);

/// The forward's DeviceAttention over `pool`: paged attention with your kernels, the batch in one
/// launch per layer, split over the context by choose_splits() (the decode rows) and
/// chunk_splits() (the chunk kernel's tiles; `num_splits` > 0 fixes both counts instead). Its
/// decode steps can be captured in CUDA graphs (CudaForward::use_graphs): with
/// graphs on, every step's tables are as wide as a whole context's, and the kernels are told that
/// many positions as max_length (an upper bound of the lengths, which the kernels read from the
/// device), so that one graph per batch size and split count replays every step. The caches it is given must be PagedKVCaches over `pool` (KVStore::paged()); it
/// reserves each one's next position (a no-op under the engine, which reserved it while
/// planning). The pool must outlive it. `tiled_warps` 4, 8 or 16 sends the decode rows to the given
/// second design instead of your kernels (attention_variants.hpp: 32 positions a warp, that many
/// warps a block; the same contract, the same splits and your merge): the bench's rows say whether
/// the engine should use it; 0, the default, is yours. Throws infer::Error for num_splits below 0,
/// another tiled_warps, or a model the design refuses (head_dim not a multiple of 4 or above its
/// limit for that warp count).
std::unique_ptr<DeviceAttention> device_paged_attention(CudaPagedKVPool& pool, int num_splits = 0, int tiled_warps = 0);

/// The decode kernel cuda_paged_parts() gives the serving engine: 0 for your paged attention; 4, 8
/// or 16 for the given tiled design with that many warps a block (device_paged_attention()'s
/// tiled_warps; for a model the design cannot read, yours). Lesson 08's graded cases run yours
/// whatever this says. The GPU report picks it from lesson 10's bench, which times the 1.1B
/// shape's decode with each; 0 until a report has those rows.
inline constexpr int kEngineTiledWarps = 0;

/// What a program needs to run the engine on a GPU over paged memory (cuda_paged_parts()).
struct CudaPagedParts {
  std::unique_ptr<CudaForward> forward;   ///< the ModelRunner
  std::unique_ptr<CudaPagedKVPool> pool;  ///< the KV rows on the device
};

/// A CudaPagedKVPool of `num_blocks` blocks of `block_size` positions, and lesson 07's forward
/// over `model` (matrices as `weights` says: float32, bf16 or lesson 11's formats) reading it through
/// device_paged_attention() (its decode rows as kEngineTiledWarps says). Give the pool to
/// a PagedKVManager (or lesson 05's PrefixKVManager) and both to the Engine; the forward refers
/// to the pool, so keep them in the same engine. Throws infer::Error as their constructors do (no
/// device, bad sizes).
CudaPagedParts cuda_paged_parts(const ModelWeights& model, const DeviceWeights& weights, int num_blocks,
                                  int block_size = 16);

}  // namespace infer::gpu
