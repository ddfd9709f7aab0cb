/// @file tensor.hpp
/// @brief Float32 matrices and vectors over Eigen, laid out the way the weights are.
///
/// A weight matrix is stored as Hugging Face stores it, [out_features, in_features],
/// row-major. Activations of T tokens are a [T, features] row-major matrix, one row
/// per token, so a linear layer is `x * W.transpose()`.
#pragma once

#include <Eigen/Core>  // not Eigen/Dense: its solvers and geometry, unused, took 0.2 s of each file's compile
#include <string>
#include <vector>

namespace infer {

/// Row-major float32 matrix: rows are tokens (activations) or output features (weights).
using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// Column vector of float32 (a norm's weights, one token's logits).
using Vector = Eigen::VectorXf;
/// A writable view of a Matrix or of a block of rows of one (no copy).
using MatrixRef = Eigen::Ref<Matrix>;
/// A read-only view of a Matrix or of a block of rows of one.
using ConstMatrixRef = Eigen::Ref<const Matrix>;

/// A named n-dimensional float32 tensor as read from a file, before it becomes a Matrix.
struct Tensor {
  std::vector<long> shape;  ///< Dimensions, outermost first.
  std::vector<float> data;  ///< Row-major values; size is the product of shape.

  /// Number of elements the shape describes.
  long numel() const {
    long n = 1;
    for (long d : shape) n *= d;
    return n;
  }
};

/// "[192, 512]" for error messages.
std::string shape_string(const std::vector<long>& shape);

}  // namespace infer
