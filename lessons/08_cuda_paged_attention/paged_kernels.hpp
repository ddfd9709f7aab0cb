/// @file paged_kernels.hpp
/// @brief Lesson 08's kernels: decode attention for a whole batch over a paged KV pool on a CUDA
/// device, in one pass or split over the context (flash decoding), and the write of a step's new
/// keys and values into their blocks.
///
/// You write them in `exercises/08_cuda_paged_attention/kernels.cu`. As in lesson 07: every
/// pointer is a device pointer, every launch on the default stream; each function checks its
/// sizes first and throws infer::Error (naming the function) before launching anything, then
/// checks the launch (cuda_check_launch). Kernels cannot check the block tables' contents: the
/// host that builds them does. Each call is its launches and nothing else (no allocation, copy or
/// synchronization), so that the engine can capture its decode step in a CUDA graph: a test
/// captures each function and counts its launches (one each; two for the split version).
///
/// The pool's layout is lesson 04's: per layer, keys [num_blocks * block_size, kv_heads *
/// head_dim] and values the same, block b owning rows [b * block_size, (b + 1) * block_size).
/// Position p of sequence i is row `table[p / block_size] * block_size + p % block_size`, where
/// `table` is row i of `block_tables`.
///
/// The tests compare with lesson 04's paged_attention (the CPU reference) within
/// 1e-5 + 1e-4 |ref|, every output poisoned with NaN first; write_kv_slots exactly. With the kernels
/// emulated (`./course check 08 --emulate`) one case also watches the pages of K while 8 query
/// heads on one K/V head go through: they must read it about once between them (the emulator's
/// device memory is the host's, so a test can watch it; on a GPU that case is not graded).
///
/// This header needs no CUDA: plain C++ calls these functions (the engine's paged attention does).
#pragma once

namespace infer::gpu {

/// One decode step's attention for a batch, as the kernels read it.
struct PagedBatch {
  const float* q = nullptr;             ///< [batch, heads * head_dim]: one query per sequence, rotated
  const float* k_pool = nullptr;        ///< one layer's keys [num_blocks * block_size, kv_heads * head_dim]
  const float* v_pool = nullptr;        ///< that layer's values, the same shape
  const int* block_tables = nullptr;    ///< [batch, max_blocks]: row i is sequence i's block table
  const int* lengths = nullptr;         ///< [batch]: positions of sequence i, each in [1, max_length]
  float* out = nullptr;                 ///< [batch, heads * head_dim]
  int batch = 0;                        ///< sequences
  int max_blocks = 0;                   ///< columns of block_tables (entries past a table's end are not read)
  int block_size = 0;                   ///< positions per block
  int heads = 0;                        ///< query heads
  int kv_heads = 0;                     ///< K/V heads; divides heads (grouped-query)
  int head_dim = 0;                     ///< values per head, at most 256
  int max_length = 0;                   ///< the largest of lengths, or more (the host knows it; a CUDA graph passes a bound)
};

/// Checks a PagedBatch's sizes (not the device arrays' contents); throws infer::Error naming
/// `who` and the bad field: batch, block_size, heads, kv_heads below 1; heads not a multiple of
/// kv_heads; head_dim outside [1, 256]; max_length below 1 or above max_blocks * block_size; a
/// null pointer. Given.
void check_paged_batch(const PagedBatch& a, const char* who);

/// Decode attention for every sequence of the batch in one launch: out row i, head h = the
/// softmax over sequence i's lengths[i] positions of q . k / sqrt(head_dim), times the values,
/// grouped-query (head h reads K/V head h / (heads / kv_heads)). The keys and values are read
/// where they lie, through the block table: no copy of a sequence's rows. The query heads that
/// share a K/V head are computed by the block that reads it (up to 8 per block; a larger group
/// takes several blocks), so each key and value crosses from memory once per step for every 8
/// query heads, not once per query head. A grid's y and z sides hold at most 65,535 blocks: the
/// tests and the engine keep batch and num_splits (below) far under that, and the reference
/// refuses more, should a grid side of yours carry either.
void paged_decode_attention(const PagedBatch& a);

/// The same result computed in `num_splits` pieces per sequence (split_range's ranges of its own
/// length): one launch computes every (sequence, K/V head, split) partial into the workspace,
/// a second merges them (merge_attention_partials). Splits past a sequence's end are empty: their
/// partials are written too, as zeros with an lse of -infinity, and count for nothing.
/// @param a the batch, as for paged_decode_attention (a.out receives the merged result)
/// @param num_splits ranges per sequence, at least 1 (more than a sequence's length is fine)
/// @param partial_out workspace of at least batch * heads * num_splits * head_dim floats:
///        partial (i, h, s) at ((i * heads + h) * num_splits + s) * head_dim
/// @param partial_lse workspace of at least batch * heads * num_splits floats, the same order
/// @throws infer::Error for num_splits < 1 (and as check_paged_batch)
void paged_decode_attention_split(const PagedBatch& a, int num_splits, float* partial_out, float* partial_lse);

/// merge_partials on the device: for each of `rows` rows (a sequence's query head), the
/// `num_splits` partials [rows, num_splits, head_dim] with their lse [rows, num_splits] merged
/// into out [rows, head_dim]. A row whose partials are all empty gets zeros.
/// @throws infer::Error for rows, num_splits or head_dim below 1, or a null pointer
void merge_attention_partials(const float* partial_out, const float* partial_lse, float* out, int rows,
                              int num_splits, int head_dim);

/// A step's new keys and values into the pool, for the whole batch in one launch: row i of k and
/// v [batch, kv_dim] goes to row slots[i] of k_pool and v_pool [pool rows, kv_dim]. (vLLM's
/// "slot mapping": slot = block * block_size + offset.) Slots are distinct; the host checks them.
/// @throws infer::Error for batch or kv_dim below 1, or a null pointer (require_device_pointers)
void write_kv_slots(const float* k, const float* v, float* k_pool, float* v_pool, const int* slots, int batch,
                    int kv_dim);

}  // namespace infer::gpu
