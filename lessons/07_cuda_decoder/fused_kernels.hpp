/// @file fused_kernels.hpp
/// @brief Kernels the GPU forward adds to yours (given, lessons/07_cuda_decoder/given_kernels.cu):
/// a fused residual add and RMSNorm (fewer launches in a decode step, which at batch 1 is a string
/// of small ones), and the skinny GEMM on tensor cores for the larger batches.
///
/// A residual add followed by the next RMSNorm is two launches of yours (add(), rms_norm()) that
/// read the same row twice; production engines fuse them (vLLM's fused_add_rms_norm). Host
/// functions over device pointers, as kernels.hpp's; this header needs no CUDA.
#pragma once

#include <cstdint>

namespace infer::gpu {

/// What gemv_bf16_fused does with each row's sum.
enum class GemvOut {
  Store,       ///< y[r] = the sum
  Accumulate,  ///< y[r] += the sum: the residual add after a block's last product, in its launch
  SwiGlu,      ///< W is [gate; up] stacked (rows even): y[i] = silu(gate_i) * up_i, i < rows / 2
};

/// One row's product y = W x' for bf16 W [rows, cols] and float32 x [cols], with what surrounds
/// it in a decode step folded into the same launch: x' = rms_norm(x) * norm (lesson 00's norm,
/// epsilon eps) when `norm` is not null, x itself otherwise; y as `out` says. At one row a step
/// is a string of small launches (lesson 07's report: a couple of microseconds each, whatever
/// they do), and three of them a layer are not products: the residual add with the next norm
/// (add_rms_norm, twice) and swiglu. Here the norm is a scale on the finished sum (W (x * s *
/// norm) = s W (x * norm), s = 1 / sqrt(mean(x^2) + eps)), and each warp, whose lanes between
/// them read all of x for their rows anyway, sums x's squares on the way: no barrier, no second
/// pass. `split` warps (1, 2, 4 or 8) take two rows (r and r + 1, or gate_i and up_i) and split
/// their columns, each lane two 16-byte packets of each row in flight, reading x (and the norm)
/// once for both rows; with more than one, their sums meet in shared memory (more warps, so more
/// loads in flight, for a matrix of few rows). Within gemv_bf16's tolerance of the launches it
/// replaces, run in turn. Needs cols a multiple of 8, W, x and norm on 16-byte boundaries
/// (cudaMalloc's are); y must not overlap x. Throws infer::Error (naming gemv_bf16_fused)
/// otherwise, for rows or cols below 1, an odd rows with SwiGlu, another split, or a null pointer
/// (but norm).
void gemv_bf16_fused(const uint16_t* w, const float* x, const float* norm, float eps, float* y, int rows, int cols,
                     GemvOut out, int split = 1);


/// For each row r of x [rows, cols]: x[r] += y[r], then h[r] = rms_norm(x[r]) * weight, as add()
/// then rms_norm() compute them (the squares summed in float, in another order). x is updated in
/// place; h may not alias x or y. Throws infer::Error (naming add_rms_norm) for rows or cols below
/// 1 or a null pointer.
void add_rms_norm(float* x, const float* y, const float* weight, float* h, int rows, int cols, float eps);

/// Y = X W^T for bf16 W [rows, cols] (row-major), float32 X [batch, cols] and Y [batch, rows]:
/// your skinny_gemm_bf16's contract and tolerance, on tensor cores (WMMA, bf16 inputs, float32
/// accumulation). A CUDA core does one multiply-add per instruction; a tensor core a 16 x 16 x 16
/// tile of them, so at batch 16 and more the product stays bound by reading W, where float32 sums
/// become bound by the arithmetic (lesson 01's ridge, for the GPU's CUDA cores). Tensor cores take
/// bf16 operands: X is split into X_hi = bf16(X) and X_lo = bf16(X - X_hi), and X W^T = X_hi W^T +
/// X_lo W^T keeps x to about 16 bits (the products are exact in float32), so the sums are as close
/// to float32 x's as the CUDA-core kernels' are, where rounding x to bf16 would keep only 8 of its
/// 24 bits.
///
/// A warp takes 16 or 32 rows of W (a variant's choice) and every batch row of a launch (up to
/// kTensorGemmChunk; larger batches take several launches); the block's 4 or 8 warps split the
/// columns 16 at a time and add their partial sums in a fixed order (the same result every run).
/// Variants 1 to 4 (WMMA, W's tiles loaded by load_matrix_sync, x through shared memory): 1 = (16
/// rows a warp, 4 warps), 2 = (16, 8), 3 = (32, 4), 4 = (32, 8). Variants 5 to 8 (PTX's
/// mma.sync.m16n8k16, whose fragment layout is documented: each lane fills A from its own 16-byte
/// loads of W, 8 consecutive columns of two rows, and B from x's same columns read from the cache,
/// batch rows 8 to a tile; the block's warps split the columns in chunks of 32, each lane with
/// several chunks' loads in flight): 5 = (16 rows a block, 8 warps, 4 chunks in flight), 6 = (32,
/// 4, 2), 7 = (16, 4, 4), 8 = 5 with the next 4 chunks' loads sent before this 4's products (in
/// flight while it multiplies). The forward uses kTensorGemmVariant. Needs tensor_gemm_runs(rows, cols), w on a 32-byte and x on a 16-byte
/// boundary (cudaMalloc's are). Throws infer::Error (naming tensor_gemm_bf16) otherwise, for a
/// variant outside 1..kTensorGemmVariants, batch, rows or cols below 1, or a null pointer.
void tensor_gemm_bf16(int variant, const uint16_t* w, const float* x, float* y, int rows, int cols, int batch);

/// Y = X W^T for bf16 W [rows, cols] (row-major), float32 X [batch, cols] and Y [batch, rows]: your
/// skinny_gemm_bf16's contract and tolerance, without its staging. The reference skinny GEMM stages
/// a tile of x in shared memory between two barriers, so each lane has one 16-byte load of each of
/// its 4 rows in flight per tile; in the GPU report (an H200) it took 2.2 times one GEMV at 2 rows
/// on 4,096 x 4,096 (29% of copy bandwidth), 1.4 times at 2 rows and 5.3 times at 8 on 16,384 x
/// 16,384. Here `split` warps (1, 2, 4 or 8) take 4 rows of W and split its columns between them;
/// each lane loads two 16-byte packets of each of the 4 rows (8 loads in flight; one each at 9
/// rows and more, for registers) before it multiplies any, and multiplies each packet by the 8 values of x at its columns for every batch
/// row of the launch (up to kSkinnySplitChunk), x read through the cache: a weight crosses from
/// memory once per kSkinnySplitChunk batch rows, a value of x is read from the cache once per 4
/// rows of W. The only barrier is the split's join, where the warps' sums meet in shared memory and
/// are added in warp order. Batches above kSkinnySplitChunk take one launch per chunk. Needs cols a
/// multiple of 8, W and x on 16-byte boundaries (cudaMalloc's are). Throws infer::Error (naming
/// skinny_gemm_bf16_split) otherwise, for batch, rows or cols below 1, another split, or a null
/// pointer.
void skinny_gemm_bf16_split(int split, const uint16_t* w, const float* x, float* y, int rows, int cols, int batch);

/// Batch rows per launch of skinny_gemm_bf16_split.
inline constexpr int kSkinnySplitChunk = 16;

/// Whether tensor_gemm_bf16 runs here for a [rows, cols] matrix: a device of compute capability 8.0
/// or later with this binary's kernel compiled for it, rows >= 32, cols a multiple of 16.
bool tensor_gemm_runs(int rows, int cols);

/// The same product for lesson 11's INT8 W, in its layout as lesson 11's kernels.hpp gives it (q
/// from row `first` on a 4-byte boundary, scales from that row's first): a tile of W widened to
/// bf16 in shared memory, where the values -127..127 are exact, the row's scale multiplying its
/// finished sum. Two tensor-core products a tile, with X_hi and X_lo, as for bf16. Within lesson 11's
/// GEMV tolerance of dequantize-then-multiply. One configuration (16 rows a warp, 4 warps), up to
/// kTensorGemmChunk batch rows a launch. Needs tensor_gemm_int8_runs(). Throws infer::Error
/// (naming the function) otherwise, for batch, rows or cols below 1, or a null pointer.
void tensor_gemm_int8(const int8_t* q, const float* scales, const float* x, float* y, int rows, int cols, int batch);

/// tensor_gemm_int8 for lesson 11's INT4 W in groups (packed as its kernels.hpp says): the values
/// -8..7, exact in bf16; the sums of each packet (16 bytes of a row: 32 values of one group, 16 from
/// each half of it) scaled by that group's scale before they join the row's total. Up to 32 batch rows a launch.
/// Needs tensor_gemm_int4_runs(); throws as tensor_gemm_int8 does.
void tensor_gemm_int4(const uint8_t* packed, const float* scales, const float* x, float* y, int rows, int cols,
                      int group, int batch);

/// Whether tensor_gemm_int8 runs here for a [rows, cols] matrix: tensor_gemm_runs(rows, cols).
bool tensor_gemm_int8_runs(int rows, int cols);

/// Whether tensor_gemm_int4 runs here: tensor_gemm_runs(rows, cols), and a group that is a
/// multiple of 32 dividing cols (so that a row's 16-byte packet lies in one group).
bool tensor_gemm_int4_runs(int rows, int cols, int group);

/// x [n] split into two bf16 halves for a product on bf16 inputs that keeps x to about 16 bits, as
/// tensor_gemm_bf16 does in shared memory: hi_lo[i] = bf16(x[i]) (rounded to nearest even), and
/// hi_lo[n + i] = bf16(x[i] - hi_lo[i]) (what the rounding lost). X W^T is then X_hi W^T + X_lo W^T.
/// An infinite x (or one that rounds to infinity in bf16) gives hi = inf and lo = NaN, so the
/// product is NaN where float32 sums would be infinite: activations never come near that.
/// Throws infer::Error (naming split_bf16) for n below 1 or a null pointer.
void split_bf16(const float* x, uint16_t* hi_lo, long n);

/// y[i] = halves[i] + halves[n + i] for i < n: the two products split_bf16's halves gave, joined.
/// Throws infer::Error (naming add_halves) for n below 1 or a null pointer.
void add_halves(const float* halves, float* y, long n);

/// tensor_gemm_bf16's variants, 1 to this.
inline constexpr int kTensorGemmVariants = 8;
/// The variant the forward uses: the GPU report's pick (commit e864848, an H200: geometric mean
/// over its rows of batch 8 and more, v1 0.217, v2 0.199, v3 0.186, v4 0.155 ms; docs/gpu-report.md).
inline constexpr int kTensorGemmVariant = 4;
/// Batch rows per launch of tensor_gemm_bf16.
inline constexpr int kTensorGemmChunk = 64;
/// The forward's bf16 products of this many rows or more go to tensor_gemm_bf16 (where it runs),
/// fewer to your skinny GEMM. The GPU report's pick (commit e864848, an H200): from 4 rows variant 4 beats the
/// skinny GEMM at every larger batch on both of its shapes (4,096 x 4,096 at batch 4: 0.032 against
/// 0.038 ms; 16,384 x 16,384: 0.311 against 0.328 ms); at 2 rows it wins on the small shape only.
inline constexpr int kTensorGemmMinBatch = 4;
/// Lesson 11's quantized products of this many rows or more go to tensor_gemm_int8/int4 (where
/// they run), fewer to its GEMVs. The GPU report's pick (commit e215520, an H200), over the 1.1B
/// step's projections: from 32 rows the tensor-core GEMM wins for every format (int4 groups of 128:
/// 13.2 against 14.7 ms at 32 rows; at 16 rows the GEMVs still won, 7.3 against 7.7 ms), though
/// INT8 and INT4 groups of 32 already win at 16 (int8 6.3 against 8.2 ms).
inline constexpr int kQuantTensorGemmMinBatch = 32;
/// Whether CudaForward's one-row steps fold their norms, residual adds and SwiGLU into the
/// products (gemv_bf16_fused; CudaForward::fuse_one_row), where every matrix is bf16: 7 launches a
/// layer over lesson 08's paged attention instead of 10. Off until a GPU report times the two
/// (lesson 07's bench: decode of the 1.1B shape at batch 1, with and without; tools/gpu_targets.py).
inline constexpr bool kFuseOneRowStep = false;
/// The warps a fused GEMV of the forward should reach (fused_gemv_split): a matrix of few rows
/// gets several warps per pair of rows, so that more loads are in flight. 0 (no split) until a
/// GPU report times the splits (lesson 07's bench: each 1.1B matrix at splits 1 to 8;
/// tools/gpu_targets.py picks the value that makes a step's fused products fastest).
inline constexpr int kFusedGemvWarps = 0;
/// The least of 1, 2 and 4 warps per group of rows whose warps in all (groups times split) reach
/// `warps`, else 8: more warps, so more loads in flight, for a matrix of few rows.
inline int split_to_reach(long groups, int warps) {
  for (int split = 1; split < 8; split *= 2)
    if (groups * split >= warps) return split;
  return 8;
}
/// The split the forward gives gemv_bf16_fused for a matrix of `rows` (pairs of rows).
inline int fused_gemv_split(int rows) { return split_to_reach((static_cast<long>(rows) + 1) / 2, kFusedGemvWarps); }
/// The forward's bf16 products of 2 to this many rows go to skinny_gemm_bf16_split, ahead of your
/// skinny GEMM and the tensor-core GEMM (CudaForward::skinny_split changes it at run time; 0: none).
/// A hypothesis until a GPU report times it: reading W at the GEMV's rate, 8 rows should cost
/// little more than one (lesson 01's ridge for float32 sums lies between 8 and 16 rows). 0 until
/// then (lesson 07's bench: its rows beside your skinny GEMM and the tensor-core GEMM, and the
/// decode rows with it; tools/gpu_targets.py picks the value).
inline constexpr int kSkinnySplitMaxBatch = 0;
/// The warps a product by skinny_gemm_bf16_split should reach: a matrix of R rows gets
/// split_to_reach((R + 3) / 4, warps) warps per group of 4 rows (CudaForward::skinny_split's
/// second argument; this by default). 0 (no split) until a GPU report times the splits on the
/// 1.1B shape's matrices (tools/gpu_targets.py).
inline constexpr int kSkinnySplitWarps = 0;
/// With CudaForward::use_cublas(true), the forward's bf16 products of kCublasMinBatch rows or more
/// go to cuBLAS's bf16 GEMM instead (x split by split_bf16, both halves in one GEMM, joined by
/// add_halves), kCublasChunk rows a call. The GPU report (commit e864848, an H200) timed cuBLAS's
/// GEMM below every kernel of lesson 07 at every batch from 2 to 64 on both of its shapes (16,384
/// x 16,384: 0.137 to 0.145 ms, one GEMV's 0.145), and 4.9 to 8.8 times below the tensor-core
/// GEMM's variant 4 at 64 rows, the size of a prompt chunk.
inline constexpr int kCublasMinBatch = 2;
/// Rows per cuBLAS call of use_cublas's products: its scratch arrays are sized once, for the
/// largest matrix and this many rows (so that a captured graph's addresses stay valid); a prompt
/// chunk of more rows takes one call per kCublasChunk, each reading W once.
inline constexpr int kCublasChunk = 256;

}  // namespace infer::gpu
