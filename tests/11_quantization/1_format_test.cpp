// Lesson 11: the two formats. What a byte holds, which values share a scale, how values round,
// what the formats cost per weight, and what they refuse.
#include <cmath>
#include <vector>

#include "common/testing/compare.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/throws.hpp"
#include "lessons/11_quantization/quantization.hpp"
#include "random_matrix.hpp"

namespace infer {
namespace {

/// Every element of dequantize(q) within half a step (its scale / 2) of w, the float rounding of
/// the division and the product allowed: scale * (0.5 + 1e-5).
::testing::AssertionResult within_half_a_step(ConstMatrixRef w, const QuantizedMatrix& q) {
  const Matrix back = dequantize(q);
  if (back.rows() != w.rows() || back.cols() != w.cols())
    return ::testing::AssertionFailure() << "dequantize gave [" << back.rows() << ", " << back.cols() << "], expected ["
                                         << w.rows() << ", " << w.cols() << "]";
  for (long r = 0; r < w.rows(); ++r)
    for (long c = 0; c < w.cols(); ++c) {
      const float s = q.scales[q.format == WeightFormat::int8 ? r : r * (q.cols / q.group) + c / q.group];
      if (!(std::abs(back(r, c) - w(r, c)) <= s * (0.5f + 1e-5f) + 1e-12f))
        return ::testing::AssertionFailure() << "at (" << r << ", " << c << "): w = " << w(r, c) << ", read back "
                                             << back(r, c) << ", more than half a step (scale " << s << ") away";
    }
  return ::testing::AssertionSuccess();
}

GRADED_TEST(Lesson11Format, BytesPerWeightCountTheScales, 1) {
  EXPECT_DOUBLE_EQ(bytes_per_weight(WeightFormat::f32, 768, 32), 4.0);
  EXPECT_DOUBLE_EQ(bytes_per_weight(WeightFormat::int8, 768, 32), 1.0 + 4.0 / 768);
  EXPECT_DOUBLE_EQ(bytes_per_weight(WeightFormat::int4, 768, 32), 0.5 + 4.0 / 32);
  EXPECT_DOUBLE_EQ(bytes_per_weight(WeightFormat::int4, 768, 128), 0.5 + 4.0 / 128);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { bytes_per_weight(WeightFormat::int4, 768, 100); }, "100"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { bytes_per_weight(WeightFormat::int4, 768, 3); }, "3"))
      << "3 divides 768, but an odd group has no pairs to pack";
  EXPECT_TRUE(testing::throws_error_mentioning([&] { bytes_per_weight(WeightFormat::int8, 0, 32); }, "0"));
}

GRADED_TEST(Lesson11Format, Int8ScaleIsEachRowsLargestMagnitudeOver127, 2) {
  // Row 0's largest magnitude is in column 2, row 1's in column 0: one scale per row (output
  // channel), never per column.
  Matrix w(2, 3);
  w << 0.1f, -0.2f, 1.27f,  //
      -2.54f, 0.5f, 0.0f;
  const QuantizedMatrix q = quantize_int8(w);
  ASSERT_EQ(q.format, WeightFormat::int8);
  ASSERT_EQ(q.rows, 2);
  ASSERT_EQ(q.cols, 3);
  ASSERT_EQ(q.scales.size(), 2u);
  EXPECT_FLOAT_EQ(q.scales[0], 0.01f);
  EXPECT_FLOAT_EQ(q.scales[1], 0.02f);
  ASSERT_EQ(q.q.size(), 6u);
  const int expected[] = {10, -20, 127, -127, 25, 0};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(q.q[i], expected[i]) << "value " << i << " (row-major)";
  EXPECT_EQ(q.bytes(), 6 + 2 * 4);
}

GRADED_TEST(Lesson11Format, Int8RoundsToTheNearestStep, 2) {
  // Scale 1/127 for a row whose largest magnitude is 1: 0.6 and 0.4 steps round to 1 and 0, -0.6
  // to -1, and 2.5 steps away from zero to 3, -2.5 to -3 (truncation gives 0, 0, 0, 2 and -2;
  // floor(v + 0.5) gives -2 for the last).
  const float step = 1.0f / 127.0f;
  Matrix w(1, 6);
  w << 1.0f, 0.6f * step, 0.4f * step, -0.6f * step, 2.5f * step, -2.5f * step;
  const QuantizedMatrix q = quantize_int8(w);
  ASSERT_EQ(q.q.size(), 6u);
  EXPECT_EQ(int{q.q[1]}, 1) << "0.6 of a step rounds to 1 (to the nearest step, not by truncation)";
  EXPECT_EQ(int{q.q[2]}, 0) << "0.4 of a step rounds to 0";
  EXPECT_EQ(int{q.q[3]}, -1) << "-0.6 of a step rounds to -1";
  EXPECT_EQ(int{q.q[4]}, 3) << "2.5 steps round away from zero, to 3";
  EXPECT_EQ(int{q.q[5]}, -3) << "-2.5 steps round away from zero, to -3";
  const Matrix big = random_matrix(37, 91, 11);
  EXPECT_TRUE(within_half_a_step(big, quantize_int8(big)));
}

GRADED_TEST(Lesson11Format, Int8AllZeroRowReadsBackAsZeros, 1) {
  Matrix w = random_matrix(3, 16, 5);
  w.row(1).setZero();
  const QuantizedMatrix q = quantize_int8(w);
  ASSERT_EQ(q.scales.size(), 3u);
  EXPECT_EQ(q.scales[1], 0.0f);
  const Matrix back = dequantize(q);
  ASSERT_EQ(back.rows(), 3);
  EXPECT_TRUE(back.row(1).isZero(0)) << "a row of zeros must read back as zeros (not NaN): " << back.row(1);
  EXPECT_TRUE(back.allFinite());
}

GRADED_TEST(Lesson11Format, Int4PacksTwoValuesPerByteInTheDocumentedOrder, 2) {
  // One group of 4: values q = 7, -7, 0, 3 (scale 1). Byte 0 holds values 0 and 2 (low, high),
  // byte 1 values 1 and 3, each as q + 8.
  Matrix w(1, 4);
  w << 7.0f, -7.0f, 0.0f, 3.0f;
  const QuantizedMatrix q = quantize_int4(w, 4);
  ASSERT_EQ(q.format, WeightFormat::int4);
  ASSERT_EQ(q.group, 4);
  ASSERT_EQ(q.packed.size(), 2u);
  ASSERT_EQ(q.scales.size(), 1u);
  EXPECT_FLOAT_EQ(q.scales[0], 1.0f);
  EXPECT_EQ(q.packed[0], (7 + 8) | ((0 + 8) << 4)) << "byte 0: value 0 low, value 2 high";
  EXPECT_EQ(q.packed[1], (-7 + 8) | ((3 + 8) << 4)) << "byte 1: value 1 low, value 3 high";
  EXPECT_TRUE(q.q.empty());
  EXPECT_EQ(q.bytes(), 2 + 4);
  EXPECT_TRUE(testing::all_close(w, dequantize(q), 0, 1e-6, "one group read back"));
  // Ties round away from zero in INT4 too (scale 1): 2.5 to 3, -2.5 to -3 (to even would give 2, -2).
  Matrix ties(1, 4);
  ties << 7.0f, 2.5f, -2.5f, 0.0f;
  const QuantizedMatrix t = quantize_int4(ties, 4);
  ASSERT_EQ(t.packed.size(), 2u);
  EXPECT_EQ(t.packed[0] & 0xF, 7 + 8);
  EXPECT_EQ(t.packed[1] & 0xF, 3 + 8) << "value 1: 2.5 steps round away from zero, to 3";
  EXPECT_EQ(t.packed[0] >> 4, -3 + 8) << "value 2: -2.5 steps round away from zero, to -3";
}

GRADED_TEST(Lesson11Format, Int4EachGroupOfEachRowHasItsOwnScale, 2) {
  // Two rows of two groups of 4, each group with its own largest magnitude: 4 scales, in row-major
  // order (row 0's groups, then row 1's).
  Matrix w(2, 8);
  w << 0.7f, 0.1f, 0.0f, 0.0f, 1.4f, 0.0f, 0.0f, 0.0f,  //
      0.0f, 2.1f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, -2.8f;
  const QuantizedMatrix q = quantize_int4(w, 4);
  ASSERT_EQ(q.scales.size(), 4u);
  EXPECT_FLOAT_EQ(q.scales[0], 0.1f);
  EXPECT_FLOAT_EQ(q.scales[1], 0.2f);
  EXPECT_FLOAT_EQ(q.scales[2], 0.3f);
  EXPECT_FLOAT_EQ(q.scales[3], 0.4f);
  for (int group : {32, 128}) {
    const Matrix big = random_matrix(19, 256, 21 + group);
    EXPECT_TRUE(within_half_a_step(big, quantize_int4(big, group))) << "group " << group;
  }
  Matrix zeros = random_matrix(2, 64, 8);
  zeros.block(1, 32, 1, 32).setZero();
  const Matrix back = dequantize(quantize_int4(zeros, 32));
  EXPECT_TRUE(back.block(1, 32, 1, 32).isZero(0)) << "a group of zeros must read back as zeros";
  EXPECT_TRUE(back.allFinite());
}

GRADED_TEST(Lesson11Format, QuantizersRefuseWhatTheFormatCannotHold, 1) {
  const Matrix w = random_matrix(4, 96, 3);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { quantize_int4(w, 64); }, "64"));  // 96 columns are not whole groups of 64
  EXPECT_TRUE(testing::throws_error_mentioning([&] { quantize_int4(w, 3); }, "3"));    // an odd group has no pairs to pack
  EXPECT_TRUE(testing::throws_error_mentioning([&] { quantize_int4(w, 0); }, "0"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { quantize_int8(Matrix(0, 4)); }, "empty"));
  Matrix bad = w;
  bad(2, 5) = std::nanf("");
  EXPECT_TRUE(testing::throws_error_mentioning([&] { quantize_int8(bad); }, "finite"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { quantize_int4(bad, 32); }, "finite"));
  QuantizedMatrix not_quantized;  // the f32 format has no integers to read back
  not_quantized.format = WeightFormat::f32, not_quantized.rows = 1, not_quantized.cols = 4;
  EXPECT_TRUE(testing::throws_error_mentioning([&] { dequantize(not_quantized); }, "f32"));
}

}  // namespace
}  // namespace infer
