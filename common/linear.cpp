// y = x W^T: streamed over the cores for few rows of x, Eigen's matrix product for more.
#include "common/linear.hpp"

#include "common/errors.hpp"

namespace infer {

void linear_into(ConstMatrixRef x, ConstMatrixRef w, MatrixRef y) {
  require(x.cols() == w.cols(), "linear: x has ", x.cols(), " columns but W [", w.rows(), ", ", w.cols(), "] expects ",
          w.cols());
  require(y.rows() == x.rows() && y.cols() == w.rows(), "linear: y is ", y.rows(), " x ", y.cols(), ", expected ",
          x.rows(), " x ", w.rows());
  const long n = x.rows(), out = w.rows();
  if (n == 0 || out == 0) return;
  if (n > kLinearStreamRows) {
    y.noalias() = x * w.transpose();
    return;
  }
  // Each thread takes a contiguous share of W's rows; each row, read once, meets every row of x.
#pragma omp parallel for schedule(static) if (out * w.cols() >= (1L << 16))
  for (long r = 0; r < out; ++r) {
    const auto wr = w.row(r);
    for (long b = 0; b < n; ++b) y(b, r) = wr.dot(x.row(b));
  }
}

Matrix linear(ConstMatrixRef x, ConstMatrixRef w) {
  Matrix y(x.rows(), w.rows());
  linear_into(x, w, y);
  return y;
}

}  // namespace infer
