// Lesson 11, your turn: weights in 8 and 4 bits, and the decode product that reads them as they
// are stored.
//
// Replace each `throw NotImplemented(...)`. The contract is lessons/11_quantization/quantization.hpp;
// the lesson text is lessons/11_quantization/README.md. Check your work with `./course check 11`.
// What is given (the engine's side of the seam, whole models, the held-out measure) is in
// lessons/11_quantization/given.cpp.
// Stuck on a function? `./course hint 11 NAME` gives a hint, one tier at a time.
#include "lessons/11_quantization/quantization.hpp"

#include <algorithm>
#include <cmath>

#include "common/errors.hpp"
#include "common/linear.hpp"
#include "lessons/11_quantization/simd.hpp"  // given: a packet of INT8 or INT4 widened to floats

namespace infer {

double bytes_per_weight(WeightFormat format, long cols, int group) {
  // The bytes one weight costs, its share of the scales included: a float32 weight is 4 bytes;
  // an int8 weight is one byte plus its row's float scale spread over the row's `cols` weights;
  // an int4 weight is half a byte plus its group's scale spread over `group` weights. Refuses
  // cols < 1, and for int4 a group that is not a positive even divisor of cols (infer::Error).
  (void)format, (void)cols, (void)group;
  throw NotImplemented("11", "bytes_per_weight");
}

QuantizedMatrix quantize_int8(ConstMatrixRef w) {
  // One scale per row (the row's largest magnitude over 127), every value rounded to the nearest
  // step (ties away from zero), in QuantizedMatrix's layout. Afterwards each value reads back
  // within half its row's step, and a row of zeros reads back as zeros. Refuses an empty matrix
  // and values that are not finite.
  (void)w;
  throw NotImplemented("11", "quantize_int8");
}

QuantizedMatrix quantize_int4(ConstMatrixRef w, int group) {
  // One scale per `group` columns of each row (the group's largest magnitude over 7), every value
  // rounded to the nearest step in [-7, 7], packed two to a byte exactly as QuantizedMatrix
  // documents (value i of a group in the low nibble of byte i, value i + group/2 in its high
  // nibble, each stored as q + 8). Each value reads back within half its group's step. Refuses a
  // group that is not a positive even number dividing the columns (naming both), an empty matrix
  // and values that are not finite.
  (void)w, (void)group;
  throw NotImplemented("11", "quantize_int4");
}

Matrix dequantize(const QuantizedMatrix& w) {
  // scale * q for every element, [rows, cols] in float32: what the quantized matrix stands for.
  // Refuses a matrix whose format is neither int8 nor int4.
  (void)w;
  throw NotImplemented("11", "dequantize");
}

void linear_quantized_rows_into(ConstMatrixRef x, const QuantizedMatrix& w, MatrixRef y, long first, long count,
                                bool accumulate) {
  // y[:, first + i] = x dequantize(w)[first + i]^T for i in [0, count) (+= with accumulate), on
  // this thread. What it keeps true: W is read in its small format, once per call whatever the
  // rows of x (a few rows of W meet every row of x before the next are read); the floats it multiplies by exist a small tile at a time, never as a float copy
  // of W (no heap allocation that grows with W). Any number of rows of x (a prefill's many too).
  // Refuses mismatched shapes, rows outside W, and a format other than int8 and int4.
  (void)x, (void)w, (void)y, (void)first, (void)count, (void)accumulate;
  throw NotImplemented("11", "linear_quantized_rows_into");
}

}  // namespace infer
