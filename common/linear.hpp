/// @file linear.hpp
/// @brief y = x W^T, the projection every layer runs, at the speed this machine allows.
///
/// Written plainly, a linear layer is `x * w.transpose()` (tensor.hpp), and every lesson's tests
/// accept that, but for lesson 03's batched forward, whose test watches linear() read each matrix
/// once for the batch (set_linear_watch()). The course's reference engine calls linear() instead,
/// which computes the same product two ways depending on the shape:
///
/// - **Up to kLinearTileRows rows of x** (decode: one row per sequence). At one row the product is
///   memory-bound: each weight is used once, so the time is the time to stream W from memory. The
///   rows of W are split over the cores (OpenMP), each core streaming its own contiguous share.
///   A core takes 4 rows of W at a time and, while they sit in the L1 cache, meets every row of
///   x with them, 4 rows of x at a time: a register tile of 4 x 4 running sums, each a SIMD vector
///   (Eigen's packets: as wide as `-march=native` allows). Every vector loaded from W or x feeds 4
///   multiply-adds, so the loads keep up with the arithmetic, and W is read from memory once
///   whatever the batch. That is what lets a batch of 8 or 32 cost little more than a batch of 1.
///   One row of x (a decode step of one sequence) takes a plainer loop over the same 4 rows of W,
///   each vector of W loaded straight into its multiply-add: the tile's set-up and prefetches
///   cost more than they save on a row of a few hundred floats (linear.cpp says by how much).
/// - **More rows** (prefill): the product is compute-bound, and Eigen's blocked, packed,
///   multi-threaded matrix product is near the machine's peak. (Below about 64 rows its packing
///   of all of W costs more than it saves: `./course bench engine` shows the batched decode.)
///
/// Both give x * w.transpose() up to float rounding (sums in another order): within
/// 1e-5 sqrt(cols) + 1e-5 |y| (tests/common/common_test.cpp compares them on odd shapes).
#pragma once

#include "common/tensor.hpp"

namespace infer {

/// Rows of x up to which linear() streams W through register tiles (decode); Eigen's product above.
inline constexpr int kLinearTileRows = 64;

/// y = x W^T for x [n, in] and W [out, in] (Hugging Face's layout), into y [n, out], which must
/// already have that shape. Throws infer::Error for mismatched shapes (naming them).
void linear_into(ConstMatrixRef x, ConstMatrixRef w, MatrixRef y);

/// y = x W^T, as a new [n, out] matrix.
Matrix linear(ConstMatrixRef x, ConstMatrixRef w);

/// Rows [first, first + count) of W only: y[:, first + i] = x W[first + i]^T (or += with
/// `accumulate`), on the calling thread alone (no OpenMP region of its own). For callers that
/// split one product over threads themselves, each thread its own rows (the engine's forward step:
/// one parallel region a step, not one a product). Each entry equals linear()'s bit for bit up to
/// kLinearTileRows rows of x; above, Eigen's product over the slice. Throws infer::Error for
/// mismatched shapes or rows outside W.
void linear_rows_into(ConstMatrixRef x, ConstMatrixRef w, MatrixRef y, long first, long count, bool accumulate);

/// A contiguous part [begin, end) of a range of indices (rows of W, say).
struct Share {
  long begin = 0;  ///< first index of the part
  long end = 0;    ///< one past its last
  /// Indices in the part.
  long size() const { return end - begin; }
};

/// Part `part` of `parts` of the range [0, n), cut at multiples of `grain` (the tiles of
/// linear_rows_into()): the parts in order cover the range, as even as `grain` allows (a part may
/// be empty). Throws infer::Error for a part outside [0, parts).
Share share_of(long n, int part, int parts, long grain = 4);

/// What linear_into() (and so linear()) reports, where a test watches it: the matrix W (its
/// first element) and the rows of x of each product. Lesson 03's test sees through it that a
/// batched step reads each weight matrix once for all its rows (tests/03_batching); nothing else
/// sets it.
struct LinearWatch {
  void (*seen)(const float* w, long x_rows, void* context) = nullptr;  ///< called once per product
  void* context = nullptr;                                               ///< passed back to `seen`
};

/// Makes `watch` the one linear_into() reports to (nullptr: none), and returns the previous one.
const LinearWatch* set_linear_watch(const LinearWatch* watch);

}  // namespace infer
