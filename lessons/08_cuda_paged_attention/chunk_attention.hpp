/// @file chunk_attention.hpp
/// @brief The attention of a step's prompt chunks over the paged pool, in tiles of query rows
/// (given, lessons/08_cuda_paged_attention/given_kernels.cu): what the GPU forward runs for a
/// chunk of many tokens, where your decode kernel serves the one-token rows.
///
/// The forward lays a chunk of n tokens out as n rows of a PagedBatch (paged_step_rows()), row t
/// with its sequence's block table and length L + t + 1. Your paged_decode_attention() computes
/// them correctly, but each row reads its whole context on its own: a prompt of 2,048 tokens reads
/// its keys and values about 1,000 times over. This kernel is lesson 09's version 2 (tiles of 32
/// query rows and 32 keys, the online softmax) with the keys and values read where they lie,
/// through the block table: a tile of K/V crosses from memory once per 32 query rows of a head,
/// and no copy of a sequence's rows is made.
///
/// Host functions over device pointers, as paged_kernels.hpp's; this header needs no CUDA.
#pragma once

#include "lessons/08_cuda_paged_attention/paged_kernels.hpp"

namespace infer::gpu {

/// Query rows per tile: at most this many rows of one chunk share a block of the kernel.
inline constexpr int kChunkTileRows = 32;

/// Causal attention for the rows of `a` that the tiles name, in one launch (a block per tile and
/// query head). Tile i is rows [tile_first[i], tile_first[i] + tile_rows[i]) of `a`: consecutive
/// rows of one chunk, at most kChunkTileRows of them, all reading the block table of the tile's
/// first row. Each of those rows gets what paged_decode_attention() computes for it (the softmax
/// over its lengths[r] positions of q . k / sqrt(head_dim), times the values, grouped-query), within
/// lesson 08's tolerance (the tensor-core design: within the tolerance stated below); rows no tile
/// names are not written. `tile_first` and `tile_rows` are device arrays of `tiles` ints.
///
/// Two designs, the same contract. With `tensor_cores` false, lesson 09's version 2 (CUDA cores:
/// lane j scores position j against one row at a time, float32 throughout). With it true, lesson
/// 09's version 3 (but where yours rounds each operand to bf16 once, this splits it): Q K^T and
/// P V on tensor cores (WMMA, 16 x 16 x 16 tiles), each operand split into two bf16 halves, x = hi
/// + lo with hi = bf16(x) and lo = bf16(x - hi), and three products of halves (hi hi + hi lo + lo
/// hi) summed in float32: what that leaves out (lo lo, and lo's own rounding) is up to about
/// 3 x 2^-18 of each product, so each output value o is within 1e-4 + 1e-4 |o| of the float32
/// design's (the test's largest difference, emulated: 2.6e-5), where plain bf16 operands would
/// keep only 8 bits of 24 (about 4e-3 of each product).
/// Three tensor-core products cost far less than one on CUDA cores (the prompt's attention is
/// bound by arithmetic). The forward uses it where chunk_tensor_cores_run() says it runs
/// (kChunkTensorCores); the bench times both.
/// @throws infer::Error for tiles below 1, a null pointer, a head_dim whose tiles the device's
///         shared memory cannot hold, tensor cores where chunk_tensor_cores_run() is false, and as
///         check_paged_batch() (naming paged_chunk_attention)
void paged_chunk_attention(const PagedBatch& a, const int* tile_first, const int* tile_rows, int tiles,
                           bool tensor_cores = false);

/// The same rows with each tile's positions split `splits` ways (flash decoding, lesson 08's idea,
/// for a tile of a chunk): a tile of a few rows after a long context is a few blocks reading
/// thousands of positions one after another, where a split gives the device `splits` times as many
/// blocks. Tile i's positions are its longest row's, in ranges of `piece` = ceil(longest / splits)
/// rounded up to whole tiles of 32 keys: split s reads [s * piece, min((s + 1) * piece, longest)),
/// and the splits past the end read nothing. The first launch writes each (tile, row, query head,
/// split)'s partial (the output over the split's positions the row sees, and its log-sum-exp) into
/// the workspace; a second merges each row's partials into its output (flash_decoding.hpp's
/// formula), skipping the splits that hold none of its positions. Each row gets what
/// paged_chunk_attention() gives it, within the same tolerance; rows no tile names are not written.
/// @param a the step's rows, as for paged_chunk_attention() (a.out receives the merged rows)
/// @param tile_first device array of `tiles` ints: each tile's first row
/// @param tile_rows device array of `tiles` ints: each tile's rows, 1 to kChunkTileRows
/// @param tiles the tiles, at least 1
/// @param splits ranges of each tile's positions, 1 to 65535 (more than its key tiles is fine)
/// @param partial_out workspace of at least tiles * kChunkTileRows * heads * splits * head_dim floats
/// @param partial_lse workspace of at least tiles * kChunkTileRows * heads * splits floats
/// @param tensor_cores the tensor-core design (where chunk_tensor_cores_run() says it runs)
/// @throws infer::Error as paged_chunk_attention(), for splits outside [1, 65535] and null
///         workspaces (naming paged_chunk_attention_split)
void paged_chunk_attention_split(const PagedBatch& a, const int* tile_first, const int* tile_rows, int tiles,
                                 int splits, float* partial_out, float* partial_lse, bool tensor_cores = false);

/// The shortest range chunk_splits() gives a split of a tile; 0 never splits. A split costs its
/// tile's query rows staged again and 32 partial rows written and merged for each query head: at
/// head_dim 64, 16 KB against the 512 bytes a position's keys and values take, so about an eighth
/// of what 256 positions read (a guess until lesson 08's bench rows in a GPU report compare the
/// chunk kernel unsplit, split as chunk_splits() says and split twice as many ways:
/// tools/gpu_targets.py then keeps it, halves it or sets 0).
inline constexpr int kChunkSplitMinPositions = 256;

/// The number of splits the paged engine gives a step's chunk tiles (given, checked on every
/// machine): enough (tiles x query heads x splits) blocks to give each of the device's
/// `multiprocessors` about two, but no split shorter than kChunkSplitMinPositions positions of
/// `max_length`, and 1 when the tiles alone fill the device (or kChunkSplitMinPositions is 0).
/// Throws infer::Error for values below 1.
int chunk_splits(int tiles, int heads, int max_length, int multiprocessors);

/// Whether paged_chunk_attention() runs on tensor cores here for `head_dim`: a device of compute
/// capability 8.0 or later with the kernel compiled for it, head_dim a multiple of 16, its tiles
/// within the device's shared memory (head_dim 256 takes about 140 KiB).
bool chunk_tensor_cores_run(int head_dim);

/// Whether the forward's chunks use the tensor cores where they run. A hypothesis (the arithmetic
/// says yes by far) until lesson 08's bench rows in a GPU report compare the two.
inline constexpr bool kChunkTensorCores = true;

/// The fewest rows the longest tile of a step must have for the forward to take the tensor-core
/// design (where kChunkTensorCores and chunk_tensor_cores_run() allow it; shorter tiles go to the
/// CUDA cores). Its block is two warps of 16 rows: a tile of 8 leaves one warp only staging and
/// half the other's rows empty. The report at e215520 timed a chunk of 8 after 2,040 positions at
/// 1.20 ms on tensor cores against 0.77 on CUDA cores, and a chunk of 32 at 1.21 against 2.11; 16
/// (one warp's rows full) is a guess between them until lesson 08's bench rows pick it
/// (tools/gpu_targets.py).
inline constexpr int kChunkTensorMinRows = 16;

}  // namespace infer::gpu
