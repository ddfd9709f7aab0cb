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
/// lesson 08's tolerance; rows no tile names are not written. `tile_first` and `tile_rows` are
/// device arrays of `tiles` ints.
/// @throws infer::Error for tiles below 1, a null pointer, a head_dim whose tiles the device's
///         shared memory cannot hold, and as check_paged_batch() (naming paged_chunk_attention)
void paged_chunk_attention(const PagedBatch& a, const int* tile_first, const int* tile_rows, int tiles);

}  // namespace infer::gpu
