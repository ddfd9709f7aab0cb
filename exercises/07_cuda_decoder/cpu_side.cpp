// Lesson 07, your turn, the CPU side: bfloat16, launch configurations, the CPU references.
//
// Replace each `throw NotImplemented(...)`. The contract is lessons/07_cuda_decoder/cuda_decoder.hpp
// and launch.hpp; the lesson text is lessons/07_cuda_decoder/README.md. `./course check 07`
// grades this file on any machine; the kernels (kernels.cu) are graded where a GPU is.
// Stuck on a function? `./course hint 07 NAME` gives a hint, one tier at a time.
#include <cmath>
#include <cstring>

#include "common/errors.hpp"
#include "lessons/07_cuda_decoder/cuda_decoder.hpp"

namespace infer::gpu {

// ---------------------------------------------------------------- bfloat16 --

uint16_t float_to_bf16(float x) {
  // The nearest bfloat16, ties to even; an infinity stays infinite, a NaN stays a NaN.
  (void)x;
  throw NotImplemented("07", "float_to_bf16");
}

float bf16_to_float(uint16_t b) {
  // Exact: every bfloat16 is a float32.
  (void)b;
  throw NotImplemented("07", "bf16_to_float");
}

std::vector<uint16_t> to_bf16(ConstMatrixRef m) {
  (void)m;
  throw NotImplemented("07", "to_bf16");
}

// ----------------------------------------------------- launch configuration --

long grid_blocks(long n, int threads) {
  // Enough blocks for n items, one per thread; refuses a block that is not whole warps.
  (void)n, (void)threads;
  throw NotImplemented("07", "grid_blocks");
}

Launch gemv_launch(int version, int rows, int cols, bool bf16) {
  // A thread per row for the float32 version 1, a warp per row for every other version.
  (void)version, (void)rows, (void)cols, (void)bf16;
  throw NotImplemented("07", "gemv_launch");
}

// ------------------------------------------------------------ references --

Vector gemv_reference(ConstMatrixRef w, const Vector& x) {
  // Plain loops in float32, the way a kernel sums: the tests compare kernels with this.
  (void)w, (void)x;
  throw NotImplemented("07", "gemv_reference");
}

Vector gemv_bf16_reference(std::span<const uint16_t> w, int rows, int cols, const Vector& x) {
  (void)w, (void)rows, (void)cols, (void)x;
  throw NotImplemented("07", "gemv_bf16_reference");
}

void softmax_rows_reference(MatrixRef x) {
  // Stable for any finite scores: the row's maximum first.
  (void)x;
  throw NotImplemented("07", "softmax_rows_reference");
}

Matrix embedding_reference(ConstMatrixRef table, std::span<const int> ids) {
  (void)table, (void)ids;
  throw NotImplemented("07", "embedding_reference");
}

}  // namespace infer::gpu
