/// @file attention_variants.hpp
/// @brief Lesson 08's bench: a second design of paged decode attention, timed beside yours on the
/// same inputs, its output compared with yours (given, not graded).
///
/// Why a second design: the course's GPU report measured the reference paged_decode_attention at
/// about 15% of the H200's copy bandwidth, where a memory-bound kernel should reach most of it. That
/// kernel walks the positions one per warp: each position costs a dependent block-table read, a key
/// read, and then for every query head a warp-wide sum (five shuffles) and two exponentials that all
/// 32 lanes compute alike. Few bytes are in flight, and most of the work is repeated 32 times.
///
/// This one takes 32 positions per warp at once: each lane finds its own position's row and reads
/// its whole key row (16-byte loads), so a warp has many rows in flight; the softmax needs one warp
/// reduction per head for 32 positions and one exponential per position and head; then the 32
/// value rows are read by the whole warp, one after another (coalesced), weighted from shared
/// memory. The report's rows say whether it wins on a GPU; until then that is a hypothesis.
#pragma once

#include "lessons/08_cuda_paged_attention/paged_kernels.hpp"

namespace infer::gpu {

/// paged_decode_attention()'s contract, computed by the tiled design above with `warps` warps a
/// block (4; or 8, for head_dim up to 128: twice the warps per block where a batch gives few
/// blocks; or 16, for head_dim up to 128 and up to 4 query heads a K/V head). Also refuses a head_dim that is not a multiple of 4 or above 256, q, k_pool or v_pool
/// off a 16-byte boundary, and another warp count (infer::Error naming the function).
void paged_decode_attention_tiled(const PagedBatch& a, int warps = 4);

/// The same design split over the context as your paged_decode_attention_split(): one launch
/// computes every (sequence, K/V head, split) partial, split s reading split_range(length,
/// num_splits, s)'s positions, into your workspace layout, then your merge_attention_partials()
/// combines them into a.out. For the blocks a batch of a few sequences leaves idle (at batch 1, a
/// block per K/V head: 8 on a GPU of 132 multiprocessors). Refuses num_splits outside [1, 65535]
/// and a null workspace, and as paged_decode_attention_tiled().
void paged_decode_attention_tiled_split(const PagedBatch& a, int num_splits, float* partial_out, float* partial_lse,
                                        int warps = 4);

}  // namespace infer::gpu
