/// @file prefill_kernels.hpp
/// @brief Lesson 09's kernels: causal prefill attention on a CUDA device, a ladder of three
/// versions, from the scores materialized in device memory to tiles on bf16 tensor cores.
///
/// You write them in `exercises/09_flash_attention/kernels.cu`. As in lessons 07 and 08: every
/// pointer is a device pointer, every launch on the default stream, and the host function checks
/// its arguments and throws infer::Error (naming itself) before launching anything, then checks the
/// launch (cuda_check_launch).
///
/// The attention is tiled_attention's (and lesson 00's causal_attention's): q [T, heads *
/// head_dim], k and v [S, kv_heads * head_dim] with S >= T, query row i at position S - T + i
/// seeing keys 0 .. S - T + i, query head h reading K/V head h / (heads / kv_heads), scores scaled
/// by 1/sqrt(head_dim); out [T, heads * head_dim].
///
/// - version 1, materialized: every score of every head written to the workspace [heads, T, S]
///   (masked scores as -infinity), a softmax kernel over its rows, then a kernel for out = P V.
///   The plain plan, and the baseline the others are measured against.
/// - version 2, tiled in float32: one block per (query tile, query head); tiles of K and V staged
///   in shared memory; for each query row a running max, sum and output (the online softmax); no
///   workspace. Key tiles wholly after the query tile's last position are skipped.
/// - version 3, version 2 with its two matrix products (Q K^T and P V) on tensor cores: Q, K, V and
///   the probabilities P rounded to bfloat16 in shared memory, products accumulated in float32
///   (WMMA fragments of 16 x 16 x 16), the softmax in float32. Needs head_dim a multiple of 16,
///   a device of compute capability 8.0 or later and room for its tiles in the device's shared
///   memory (the reference's layout needs 143,616 bytes at a head_dim of 256: an A100 or H100 has
///   it, an RTX 4090 not); otherwise it runs version 2.
///
/// The tests compare versions 1 and 2 with lesson 00's causal_attention within 1e-5 + 1e-4 |ref|,
/// and version 3 within 2e-2 + 2e-2 |ref| (bf16 keeps 8 bits of mantissa), each output poisoned
/// with NaN first; version 1's workspace too, which must hold no NaN afterwards; and version 3's
/// outputs must show bf16's rounding (some output more than 1e-4 from the float32 reference).
/// With the kernels emulated (`./course check 09 --emulate`) one case also watches the pages of K:
/// versions 2 and 3 must read its last quarter (seen by the last queries alone) at most half as
/// often as its first (the emulator's device memory is the host's, so a test can watch it; on a GPU
/// that case is not graded).
///
/// This header needs no CUDA.
#pragma once

#include <cstddef>

namespace infer::gpu {

/// The largest prefill attention version.
inline int prefill_attention_versions() { return 3; }

/// Floats of workspace version `version` needs: heads * T * S for version 1, 0 for the others.
/// Given. Throws infer::Error for a version outside [1, prefill_attention_versions()] or sizes
/// below 1.
size_t prefill_workspace_floats(int version, int T, int S, int heads);

/// Checks prefill_attention's sizes (not its pointers); throws infer::Error naming `who` for T or
/// S below 1, S < T, heads or kv_heads below 1, heads not a multiple of kv_heads, or head_dim
/// outside [1, 256]. Given.
void check_prefill_shape(int T, int S, int heads, int kv_heads, int head_dim, const char* who);

/// Causal prefill attention, version `version` (see the file's comment), into out.
/// @param version 1 (materialized), 2 (tiled, float32) or 3 (tiled, bf16 tensor cores)
/// @param q [T, heads * head_dim], rotated
/// @param k [S, kv_heads * head_dim], rotated
/// @param v [S, kv_heads * head_dim]
/// @param out [T, heads * head_dim]
/// @param T query rows: the last T of the S positions
/// @param S positions, the cached ones included
/// @param heads query heads
/// @param kv_heads K/V heads, dividing heads
/// @param head_dim values per head
/// @param workspace at least prefill_workspace_floats(version, T, S, heads) floats of device
///        memory (may be null when that is 0)
/// @throws infer::Error before launching, its message naming what it refuses: a version that
///         does not exist ("version"), T or S below 1 or S < T, heads not a multiple of kv_heads,
///         head_dim outside [1, 256] (check_prefill_shape's messages), a null q, k, v or out
///         ("null"), and for version 1 a null workspace ("workspace")
void prefill_attention(int version, const float* q, const float* k, const float* v, float* out, int T, int S,
                       int heads, int kv_heads, int head_dim, float* workspace);

}  // namespace infer::gpu
