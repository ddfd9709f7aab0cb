/// @file activations.hpp
/// @brief Given, going further: INT4 weights times 8-bit activations, summed in integers.
///
/// Your linear_quantized_rows_into() widens every INT4 weight to a float before it meets x. On a
/// CPU with a few cores per memory channel that widening, not memory, bounds the INT4 decode
/// (`./course bench 11` shows INT4 well below its own memory roof). llama.cpp's answer, and the
/// one here: round x too, per group, to 8 bits, and multiply the 4-bit weights by the 8-bit
/// activations in integers. With AVX-512 VNNI (Vector Neural Network Instructions) one
/// instruction (`vpdpbusd`) multiplies 64 unsigned bytes by 64 signed bytes and adds each four
/// products into a 32-bit sum: a packet of stored nibbles (q + 8, so 1..15, unsigned) meets a
/// packet of 8-bit x (rearranged once per call into the nibbles' order), and the + 8 is taken off
/// by starting each 32-bit sum from -8 times the 8 values of x it multiplies. The float arithmetic
/// is left to, per 16 sums, one conversion, one product of W's and x's scales and one multiply-add.
/// With AVX2 (no VNNI), packets of 32 bytes: `vpmaddubsw` multiplies 32 unsigned bytes by 32
/// signed ones and adds each two products into 16 bits, `vpmaddwd` by ones adds each two of those
/// into 32 bits: the same sums, three instructions where VNNI takes one, on half the bytes.
///
/// The price is a second rounding: each x, rounded to its group's step s_x = max |x| / 127, moves
/// by at most s_x / 2, so a product over one group moves by at most s_x / 2 times the sum of the
/// group's |weights| read back. `./course bench 11` measures what that costs in bits per byte
/// and buys in tokens/s (`--activations int8` in every program that takes `--weights int4`).
#pragma once

#include "common/projection.hpp"
#include "common/tensor.hpp"
#include "lessons/11_quantization/quantization.hpp"

namespace infer {

/// Rows of x in 8 bits for INT4 weights in groups of `group` columns: row j's group g is
/// `q[j * cols + g * group ...]`, `group` values in [-127, 127], read back as `scales[j * (cols /
/// group) + g]` times q. Each scale is max |x| over the group / 127 (0 for a group of zeros, whose
/// q are 0; NaN for a group holding a value that is not finite, so that the product is NaN as the
/// float product would be), and each value within half its group's step.
struct Int8Rows {
  long rows = 0;              ///< rows of x
  long cols = 0;              ///< columns of x
  int group = 0;              ///< columns sharing one scale
  std::vector<int8_t> q;      ///< rows * cols values
  std::vector<float> scales;  ///< rows * (cols / group)
};

/// x [n, cols] rounded to 8 bits per group of `group` columns (Int8Rows says how). Throws
/// infer::Error for a group that is not a positive even divisor of cols.
Int8Rows quantize_rows_int8(ConstMatrixRef x, int group);

/// linear_quantized_rows_into()'s contract for INT4 `w`, with x rounded first by
/// quantize_rows_int8(x, w.group): for i in [0, count), y[:, first + i] = the sum over groups g of
/// w.scale(first + i, g) * xq.scale(j, g) * (the group's integer sum of q_w q_x), (+= with
/// `accumulate`), on the calling thread alone. W is read once, as stored, for any rows of x. With
/// AVX-512 VNNI and a group whose half is 4, 8, 16, 32 or a multiple of 64 bytes (groups of 8, 16,
/// 32, 64, 128, 256, 384...), 64 bytes of W at a time through `vpdpbusd`; without VNNI but with
/// AVX2 and FMA, and a half of 4, 8, 16 or a multiple of 32 bytes (the same groups), 32 bytes at a
/// time through `vpmaddubsw` and `vpmaddwd`; otherwise (another processor, another group)
/// linear_int4_int8_plain(). All sum the same integers; they differ by float rounding only, within
/// 1e-5 of the sum of the terms' magnitudes. Throws infer::Error for a W
/// that is not INT4 (or whose group or arrays do not fit its shape), mismatched shapes or rows
/// outside W.
void linear_int4_int8_rows_into(ConstMatrixRef x, const QuantizedMatrix& w, MatrixRef y, long first, long count,
                                bool accumulate);

/// The same product written plainly, one group at a time (the reference the fast path is tested
/// against, and its fallback). Same contract.
void linear_int4_int8_plain(ConstMatrixRef x, const QuantizedMatrix& w, MatrixRef y, long first, long count,
                            bool accumulate);

/// Whether linear_int4_int8_rows_into() takes a vectorized path (VNNI's or AVX2's) for groups of
/// `group` on this build.
bool int4_int8_vectorized(int group);

/// Which path linear_int4_int8_rows_into() takes for groups of `group` on this build, in words
/// ("AVX-512 VNNI", "AVX2" or "the plain loop"), for a bench to say what it measured.
const char* int4_int8_path(int group);

/// An INT4 QuantizedMatrix behind the engine's seam, its products by 8-bit activations:
/// rows_into() is linear_int4_int8_rows_into().
class Int4Int8Projection final : public Projection {
 public:
  /// Takes `w`; throws infer::Error unless it is INT4.
  explicit Int4Int8Projection(QuantizedMatrix w);
  long rows() const override { return w_.rows; }
  long cols() const override { return w_.cols; }
  long bytes() const override { return w_.bytes(); }
  void rows_into(ConstMatrixRef x, MatrixRef y, long first, long count, bool accumulate) const override {
    linear_int4_int8_rows_into(x, w_, y, first, count, accumulate);
  }
  /// The weights read back. The activations' rounding happens in the product, not here: measure
  /// this format through the engine's forward (bits_per_byte() over projections), not the plain one.
  Matrix to_float() const override { return dequantize(w_); }

 private:
  QuantizedMatrix w_;
};

}  // namespace infer
