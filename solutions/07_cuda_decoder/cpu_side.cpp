// Lesson 07, reference solution, the CPU side: bfloat16, launch configurations, references.
#include <cmath>
#include <cstring>

#include "common/errors.hpp"
#include "lessons/07_cuda_decoder/cuda_decoder.hpp"

namespace infer::gpu {

// ---------------------------------------------------------------- bfloat16 --

uint16_t float_to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x0040);  // keep it a (quiet) NaN
  // Round to nearest, ties to even: add 0x7FFF plus the lowest kept bit, then cut. A carry out
  // of the mantissa moves to the exponent, which is right (and turns the largest finite values
  // into infinity, as rounding should).
  const uint32_t lsb = (bits >> 16) & 1u;
  bits += 0x7FFFu + lsb;
  return static_cast<uint16_t>(bits >> 16);
}

float bf16_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

std::vector<uint16_t> to_bf16(ConstMatrixRef m) {
  std::vector<uint16_t> out(static_cast<size_t>(m.size()));
  for (Eigen::Index r = 0; r < m.rows(); ++r)
    for (Eigen::Index c = 0; c < m.cols(); ++c) out[static_cast<size_t>(r * m.cols() + c)] = float_to_bf16(m(r, c));
  return out;
}

// ----------------------------------------------------- launch configuration --

long grid_blocks(long n, int threads) {
  require(n >= 0, "grid_blocks: n must be >= 0, got ", n);
  require(threads >= 32 && threads <= 1024 && threads % 32 == 0,
          "grid_blocks: threads must be a multiple of 32 in [32, 1024], got ", threads);
  return (n + threads - 1) / threads;
}

Launch gemv_launch(int version, int rows, int cols, bool bf16) {
  require(rows >= 1 && cols >= 1, "gemv_launch: rows and cols must be >= 1, got ", rows, " x ", cols);
  const int versions = bf16 ? gemv_bf16_versions() : gemv_versions();
  if (version < 1 || version > versions)
    throw Error(cat("gemv_launch: ", bf16 ? "bf16 " : "", "version ", version, " does not exist (versions are 1 to ",
                    versions, ")"));
  constexpr int kThreads = 256;
  if (version == 1 && !bf16) return {grid_blocks(rows, kThreads), kThreads};  // a thread per row
  return {grid_blocks(32L * rows, kThreads), kThreads};                      // a warp per row
}

// ------------------------------------------------------------ references --

Vector gemv_reference(ConstMatrixRef w, const Vector& x) {
  require(x.size() == w.cols(), "gemv_reference: x has ", x.size(), " entries, W has ", w.cols(), " columns");
  Vector y(w.rows());
  for (Eigen::Index r = 0; r < w.rows(); ++r) {
    float sum = 0;
    for (Eigen::Index c = 0; c < w.cols(); ++c) sum += w(r, c) * x[c];
    y[r] = sum;
  }
  return y;
}

Vector gemv_bf16_reference(std::span<const uint16_t> w, int rows, int cols, const Vector& x) {
  require(rows >= 0 && cols >= 0 && w.size() == static_cast<size_t>(rows) * static_cast<size_t>(cols),
          "gemv_bf16_reference: ", w.size(), " weights for a ", rows, " x ", cols, " matrix");
  require(x.size() == cols, "gemv_bf16_reference: x has ", x.size(), " entries, W has ", cols, " columns");
  Vector y(rows);
  for (int r = 0; r < rows; ++r) {
    float sum = 0;
    for (int c = 0; c < cols; ++c) sum += bf16_to_float(w[static_cast<size_t>(r) * cols + c]) * x[c];
    y[r] = sum;
  }
  return y;
}

void softmax_rows_reference(MatrixRef x) {
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    if (x.cols() == 0) continue;
    const float max = x.row(r).maxCoeff();
    float sum = 0;
    for (Eigen::Index c = 0; c < x.cols(); ++c) sum += x(r, c) = std::exp(x(r, c) - max);
    x.row(r) /= sum;
  }
}

Matrix embedding_reference(ConstMatrixRef table, std::span<const int> ids) {
  Matrix out(static_cast<Eigen::Index>(ids.size()), table.cols());
  for (size_t i = 0; i < ids.size(); ++i) {
    require(ids[i] >= 0 && ids[i] < table.rows(), "embedding_reference: id ", ids[i], " at index ", i,
            " is outside the vocabulary [0, ", table.rows(), ")");
    out.row(static_cast<Eigen::Index>(i)) = table.row(ids[i]);
  }
  return out;
}

}  // namespace infer::gpu
