/// @file linear.hpp
/// @brief y = x W^T, the projection every layer runs, at the speed this machine allows.
///
/// Written plainly, a linear layer is `x * w.transpose()` (tensor.hpp), and every lesson's tests
/// accept that. The course's reference engine calls linear() instead, which computes the same
/// product two ways depending on the shape:
///
/// - **Few rows of x** (decode: one row per sequence, up to 8): the product is memory-bound. Each
///   weight is used once per row of x, so the time is the time to stream W from memory. The rows
///   of W are split over the cores (OpenMP), each core streaming its own contiguous share, and
///   each row of W, read once, is dotted with every row of x while it sits in the L1 cache. The
///   dots run on the widest vectors the compiler was allowed (COURSE_NATIVE: -march=native).
/// - **More rows** (prefill, large batches): the product is compute-bound, and Eigen's blocked,
///   vectorized, multi-threaded matrix product is near the machine's peak.
///
/// Both give x * w.transpose() up to float rounding (sums in another order): within
/// 1e-5 sqrt(cols) + 1e-5 |y| (tests/common/common_test.cpp compares them on odd shapes).
#pragma once

#include "common/tensor.hpp"

namespace infer {

/// Rows of x up to which linear() streams W once per row of W (the decode path).
inline constexpr int kLinearStreamRows = 8;

/// y = x W^T for x [n, in] and W [out, in] (Hugging Face's layout), into y [n, out], which must
/// already have that shape. Throws infer::Error for mismatched shapes (naming them).
void linear_into(ConstMatrixRef x, ConstMatrixRef w, MatrixRef y);

/// y = x W^T, as a new [n, out] matrix.
Matrix linear(ConstMatrixRef x, ConstMatrixRef w);

}  // namespace infer
