/// @file launch.hpp
/// @brief Lesson 07's launch configurations: how many blocks of how many threads a kernel gets.
/// Plain C++ (no CUDA, no Eigen), so the kernels and the CPU tests share it.
#pragma once

/// The GPU's side (lessons 07 to 09 and 11): kernels and the host functions that launch them over
/// device pointers, the device's weights and KV pool, and the forward that runs a step there.
namespace infer::gpu {

/// How a kernel is launched: a grid of `blocks` blocks of `threads` threads each.
struct Launch {
  long blocks = 0;  ///< blocks in the grid (a 1-D grid)
  int threads = 0;  ///< threads per block
};

/// Blocks of `threads` threads that cover `n` items, one item per thread: ceil(n / threads), so 0
/// for n = 0. Throws infer::Error for n < 0, or threads outside [32, 1024] or not a multiple of
/// 32 (a block runs in warps of 32: a partial warp wastes lanes), naming the value.
long grid_blocks(long n, int threads);

/// The launch of GEMV version `version` (float32 or bf16 weights) over a [rows, cols] matrix,
/// blocks of 256 threads in each case:
/// - version 1 of the float32 GEMV, one thread per row: rows threads;
/// - every other version, one warp (32 threads) per row: 32 * rows threads.
/// `bf16` selects the bf16 GEMV's versions (1 and 2, both a warp per row).
/// Counts threads in `long` (32 * rows passes an int's range for rows above 67 million). Throws
/// infer::Error for rows or cols below 1 (the message says "rows and cols"), or a version that
/// does not exist (the message says "version").
Launch gemv_launch(int version, int rows, int cols, bool bf16 = false);

/// The largest float32 GEMV version (versions run 1..gemv_versions()).
inline int gemv_versions() { return 3; }
/// The largest bf16 GEMV version.
inline int gemv_bf16_versions() { return 2; }

}  // namespace infer::gpu
