/// @file kernels.hpp
/// @brief Lesson 07's kernels: the decoder's operations on a CUDA device, as host functions
/// that take device pointers and launch.
///
/// You write them in `exercises/07_cuda_decoder/kernels.cu`. Every pointer here is a device
/// pointer (from cudaMalloc, or into such an array: the GPU forward multiplies by runs of rows of
/// a stacked matrix, so a weight pointer lies wherever row `first` starts), every matrix row-major, every launch on the default stream. Each
/// function checks its sizes and pointers first and throws infer::Error before launching
/// anything: the GEMVs through gemv_launch (its messages say "version" or "rows and cols"), the
/// others naming the function (`rms_norm: ...`); then it launches, and checks the launch
/// (cuda_check_launch): a failed launch throws an infer::Error that names the kernel. None waits
/// for the kernel to finish; a cudaMemcpy back to the host does.
///
/// The tests compare each kernel with its CPU reference within atol + rtol * |ref|: for the
/// GEMVs 1e-5 * sqrt(cols) + 1e-4 |ref| (float32 sums in another order), for RMSNorm, RoPE,
/// softmax and attention 1e-5 + 1e-4 |ref|, for SwiGLU 1e-6 + 1e-5 |ref|; add and embedding
/// exactly. Every output is filled with NaN before the kernel runs.
///
/// On the device, a bfloat16 widens with `__uint_as_float(uint32_t(b) << 16)` (the CPU's
/// bf16_to_float is a host function).
///
/// Where a kernel comes in versions, they form a ladder in the spirit of llm.c's dev/cuda:
/// version 1 is the plain port of the CPU loop, each later version one idea faster. Every version
/// computes the same result, within the tolerance the tests state.
///
/// This header needs no CUDA: a .cpp file can call these functions (linking the lesson's CUDA
/// objects), so the CUDA backend of later lessons is plain C++.
#pragma once

#include <cstdint>

#include "lessons/07_cuda_decoder/launch.hpp"

namespace infer::gpu {

/// y = W x: W [rows, cols] float32, x [cols], y [rows].
/// - version 1: one thread per row, walking its row (neighbouring threads read addresses a row
///   apart: uncoalesced);
/// - version 2: one warp per row, the 32 lanes reading consecutive columns (coalesced), a warp
///   shuffle reduction at the end;
/// - version 3: version 2 reading float4, 16 bytes per lane per load. Rows start on a 16-byte
///   boundary only when cols is a multiple of 4 (and w and x do, as cudaMalloc returns them);
///   otherwise version 3 runs version 2.
void gemv_f32(int version, const float* w, const float* x, float* y, int rows, int cols);

/// y = W x with bfloat16 weights (rows * cols uint16_t, row-major), float32 x, y and sums.
/// - version 1: one warp per row, one weight (2 bytes) per lane per load;
/// - version 2: one warp per row, eight weights (16 bytes) per lane per load; when cols is not a
///   multiple of 8 (rows not on 16-byte boundaries), version 2 runs version 1. Memory is
///   little-endian on the GPU as on x86: of a 32-bit word loaded at column c, the low 16 bits are
///   column c and the high 16 bits column c + 1.
void gemv_bf16(int version, const uint16_t* w, const float* x, float* y, int rows, int cols);

/// Y = X W^T for a batch of vectors: x [batch, cols] (row b is sequence b's input), y [batch, rows],
/// y[b, r] = sum over c of W[r, c] * x[b, c]; W [rows, cols] float32. What batched decode needs:
/// the point is that W is read from memory once for several batch rows, not once per row, so a
/// decode step of 8 sequences costs about what one costs. The whole batch in one launch. Each batch
/// row must equal gemv_f32 of that row alone, within the GEMV tolerance. Throws for batch below 1,
/// or rows or cols below 1.
void gemv_batch_f32(const float* w, const float* x, float* y, int rows, int cols, int batch);

/// The same with bfloat16 weights (rows * cols uint16_t, row-major), float32 x, y and sums.
void gemv_batch_bf16(const uint16_t* w, const float* x, float* y, int rows, int cols, int batch);

/// Y = X W^T again (gemv_batch_f32's contract, its results within the same tolerance), as a
/// skinny GEMM: the batched GEMV's next rung, for the engine's steps of several rows. A block of
/// 4 warps takes 16 weight rows (4 per warp) and walks the columns in tiles of 256: for each tile
/// it first stages every batch row's 256 values of x in shared memory (float4 loads, the whole
/// block, then a __syncthreads()), then each lane reads its 8 columns of each of its warp's 4
/// rows with 16-byte loads and multiplies them by every staged x row, keeping 4 x B partial sums
/// in registers (B: the launch's batch rows, at most 16). So a weight crosses from memory once per 16 batch rows, and a value of x is read
/// from memory once per block and from shared memory once per 4 weight rows, not once per weight
/// (gemv_batch's cost). Batches above 16 go through in chunks of 16 (one launch each). Needs cols
/// a multiple of 8 and w and x on 16-byte boundaries (as cudaMalloc returns them), so that every
/// row is; otherwise it runs gemv_batch_f32. Throws as gemv_batch_f32 does (the message naming
/// skinny_gemm_f32).
void skinny_gemm_f32(const float* w, const float* x, float* y, int rows, int cols, int batch);

/// The same with bfloat16 weights, widened in registers; float32 x, y and sums.
void skinny_gemm_bf16(const uint16_t* w, const float* x, float* y, int rows, int cols, int batch);

/// RMSNorm of each row of x [rows, cols] into y, with gain `weight` [cols]:
/// y = x / sqrt(mean(x^2) + eps) * weight. One block per row, its threads reducing the sum of
/// squares through shared memory. Throws for rows or cols below 1, or a null pointer.
void rms_norm(const float* x, const float* weight, float* y, int rows, int cols, float eps);

/// Rotary embedding in place, rotate-half layout (lesson 00's apply_rope): x [rows, heads *
/// head_dim], row r at position positions[r] (a device array of rows ints). Throws for rows or
/// heads below 1, or an odd head_dim.
void rope(float* x, const int* positions, int rows, int heads, int head_dim, float theta);

/// x += y, element by element, over n values (the residual additions). Throws for n < 1.
void add(float* x, const float* y, long n);

/// out = silu(gate) * up, element by element, over n values; `out` may be `gate` or `up` (the
/// CUDA model writes over gate). Throws for n < 1.
void swiglu(const float* gate, const float* up, float* out, long n);

/// Softmax of each row of x [rows, cols], in place, the row's maximum subtracted first. Throws for
/// rows or cols below 1, or a null pointer.
void softmax_rows(float* x, int rows, int cols);

/// out [n, hidden] = the rows of table [vocab, hidden] for ids [n] (a device array). An id
/// outside [0, vocab) writes a row of NaN (a kernel cannot throw; the host checks ids first
/// where it has them). Throws for n, vocab or hidden below 1, or a null pointer.
void embedding(const float* table, const int* ids, float* out, int n, int vocab, int hidden);

/// Decode attention for one sequence: the single query q [heads * head_dim] (already rotated)
/// over the `length` cached positions of k and v [length, kv_heads * head_dim], grouped-query
/// (query head h reads K/V head h / (heads / kv_heads)), scaled by 1/sqrt(head_dim), with a
/// stable softmax. out [heads * head_dim]. One block per query head, its scores in shared memory:
/// above 48 KiB of it (about 12,000 positions) the kernel's limit must be raised
/// (cudaFuncSetAttribute), and a length the device cannot hold throws (lesson 08 splits long
/// contexts): the scores and the query head in dynamic shared memory, plus the kernel's own static
/// shared memory (its reductions' slots), must fit the device's opt-in limit per block. Throws for length < 1, or heads not a multiple of kv_heads.
void decode_attention(const float* q, const float* k, const float* v, float* out, int length, int heads,
                      int kv_heads, int head_dim);

}  // namespace infer::gpu
