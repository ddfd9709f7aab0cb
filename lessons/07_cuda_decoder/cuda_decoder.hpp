/// @file cuda_decoder.hpp
/// @brief Lesson 07's contract, the part every machine can check: bfloat16 and the CPU references
/// the kernels are measured against (the launch configurations are in launch.hpp).
///
/// You implement these in `exercises/07_cuda_decoder/cpu_side.cpp`, and the kernels declared in
/// kernels.hpp in `exercises/07_cuda_decoder/kernels.cu`. The CPU side is graded everywhere; the
/// kernels' tests run where a CUDA device is, and skip cleanly elsewhere.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/tensor.hpp"
#include "lessons/07_cuda_decoder/launch.hpp"

namespace infer::gpu {

// ================================================================ bfloat16 ==

/// The bfloat16 nearest to `x`: float32's sign, its 8 exponent bits and the top 7 of its 23
/// mantissa bits, the rest rounded to nearest with ties to even (the bit pattern's low 16 bits
/// above 0x8000 round up, below round down, exactly 0x8000 round to the even neighbour).
/// Infinities stay infinite; a NaN stays a NaN (a quiet NaN with x's sign: x's top 16 bits with
/// the quiet bit 0x0040 set), never becoming an infinity by rounding its mantissa away.
uint16_t float_to_bf16(float x);

/// The float32 a bfloat16 stands for, exactly: its 16 bits followed by 16 zero bits.
float bf16_to_float(uint16_t b);

/// Every entry of a row-major matrix, converted with float_to_bf16, in row-major order.
std::vector<uint16_t> to_bf16(ConstMatrixRef m);

// ======================================================= the CPU references ==
// What each kernel must compute, written plainly, in float32 with float32 accumulation (like
// the kernels), so a kernel's result can be compared element by element. RMSNorm, RoPE, SwiGLU
// and attention have theirs in lesson 00 (naive_decoder.hpp).

/// y = W x for W [rows, cols] (row-major) and x [cols]: y[r] = sum over c of W[r, c] * x[c].
/// Throws infer::Error if x does not have cols entries (the message gives x's size).
Vector gemv_reference(ConstMatrixRef w, const Vector& x);

/// The same with bfloat16 weights, `w` holding rows * cols values in row-major order: each weight
/// is widened to float32 (bf16_to_float) and the products summed in float32.
/// Throws infer::Error if w does not hold rows * cols values (the message says "weights"), or x
/// does not have cols entries.
Vector gemv_bf16_reference(std::span<const uint16_t> w, int rows, int cols, const Vector& x);

/// Softmax of each row on its own, in place: subtract the row's maximum, exponentiate, divide by
/// the row's sum. Stable for any finite scores.
void softmax_rows_reference(MatrixRef x);

/// The rows of `table` [vocab, hidden] for `ids`, in order: [ids.size(), hidden].
/// Throws infer::Error, naming the id and its index, for an id outside [0, vocab).
Matrix embedding_reference(ConstMatrixRef table, std::span<const int> ids);

}  // namespace infer::gpu
