// Lesson 07, the part every machine grades: bfloat16, launch configurations, the CPU references.
#include <cmath>
#include <cstring>
#include <limits>

#include "common/rng.hpp"
#include "common/testing/compare.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/throws.hpp"
#include "lessons/07_cuda_decoder/cuda_decoder.hpp"

namespace infer::gpu {
namespace {

float from_bits(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

Matrix random_matrix(Eigen::Index r, Eigen::Index c, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  Matrix m(r, c);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>(rng.normal() * scale);
  return m;
}

GRADED_TEST(Lesson07Bf16, KeepsTheTopSixteenBitsOfExactValues, 1) {
  // Values whose low 16 bits are zero are bfloat16 already: nothing to round.
  for (const float x : {0.0f, -0.0f, 1.0f, -2.5f, 0.15625f, 65536.0f, 1.5f})
    EXPECT_EQ(bf16_to_float(float_to_bf16(x)), x) << x << " is exactly a bfloat16";
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80) << "1.0f is 0x3F800000";
  EXPECT_EQ(float_to_bf16(-2.0f), 0xC000) << "-2.0f is 0xC0000000";
  EXPECT_EQ(bf16_to_float(0x4049), from_bits(0x40490000)) << "widening appends 16 zero bits";
}

GRADED_TEST(Lesson07Bf16, RoundsToNearestWithTiesToEven, 2) {
  EXPECT_EQ(float_to_bf16(from_bits(0x3F807FFF)), 0x3F80) << "below halfway rounds down";
  EXPECT_EQ(float_to_bf16(from_bits(0x3F808001)), 0x3F81) << "above halfway rounds up";
  EXPECT_EQ(float_to_bf16(from_bits(0x3F808000)), 0x3F80) << "exactly halfway, 0x3F80 is even: stays";
  EXPECT_EQ(float_to_bf16(from_bits(0x3F818000)), 0x3F82) << "exactly halfway, 0x3F81 is odd: up to even";
  EXPECT_EQ(float_to_bf16(from_bits(0xBF818000)), 0xBF82) << "negative values round by magnitude the same way";
  EXPECT_EQ(float_to_bf16(from_bits(0x3F80FFFF)), 0x3F81) << "the carry into the next value";
  EXPECT_EQ(float_to_bf16(from_bits(0x3FFFFFFF)), 0x4000) << "the carry into the exponent: 1.99999 rounds to 2";
  // Over many random values the error is at most half a step of the 8-bit mantissa.
  Rng rng(3);
  for (int i = 0; i < 10000; ++i) {
    const float x = static_cast<float>(rng.normal() * 100);
    const float back = bf16_to_float(float_to_bf16(x));
    ASSERT_LE(std::abs(back - x), std::abs(x) * std::ldexp(1.0f, -8) * 1.0001f) << x << " became " << back;
  }
}

GRADED_TEST(Lesson07Bf16, InfinityStaysInfiniteAndNaNStaysNaN, 1) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bf16_to_float(float_to_bf16(inf)), inf);
  EXPECT_EQ(bf16_to_float(float_to_bf16(-inf)), -inf);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the low 16 bits: cutting them would leave 0x7F80, infinity.
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(from_bits(0x7F800001)))))
      << "0x7F800001 is a NaN: rounding must not turn it into infinity";
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(from_bits(0xFFFFFFFF)))))
      << "0xFFFFFFFF is a NaN: rounding up must not carry it anywhere else";
  EXPECT_EQ(float_to_bf16(from_bits(0xFFC00001)) & 0x8000, 0x8000) << "a negative NaN keeps its sign";
  EXPECT_EQ(bf16_to_float(float_to_bf16(from_bits(0x7F7FFFFF))), inf)
      << "the largest float is nearer to infinity than to the largest bfloat16: it overflows";
}

GRADED_TEST(Lesson07Bf16, ConvertsAMatrixInRowMajorOrder, 1) {
  Matrix m(2, 3);
  m << 1, 2, 3, -1, -2, 0.5f;
  const std::vector<uint16_t> b = to_bf16(m);
  ASSERT_EQ(b.size(), 6u);
  EXPECT_EQ(b[1], float_to_bf16(2.0f));
  EXPECT_EQ(b[3], float_to_bf16(-1.0f)) << "row 1 starts at index 3";
  EXPECT_EQ(b[5], float_to_bf16(0.5f));
}

GRADED_TEST(Lesson07Launch, BlocksCoverEveryItem, 1) {
  EXPECT_EQ(grid_blocks(0, 256), 0);
  EXPECT_EQ(grid_blocks(1, 256), 1);
  EXPECT_EQ(grid_blocks(256, 256), 1);
  EXPECT_EQ(grid_blocks(257, 256), 2);
  EXPECT_EQ(grid_blocks(5000000000L, 1024), 4882813) << "more items than an int holds";
  EXPECT_TRUE(testing::throws_error_mentioning([] { grid_blocks(10, 100); }, "100"))
      << "100 threads is not a whole number of warps";
  EXPECT_TRUE(testing::throws_error_mentioning([] { grid_blocks(10, 2048); }, "2048"));
  EXPECT_TRUE(testing::throws_error_mentioning([] { grid_blocks(-1, 256); }, "-1"));
}

GRADED_TEST(Lesson07Launch, GemvGivesAThreadOrAWarpToEachRow, 1) {
  const Launch v1 = gemv_launch(1, 1000, 64), v2 = gemv_launch(2, 1000, 64), v3 = gemv_launch(3, 1000, 64);
  EXPECT_EQ(v1.threads, 256);
  EXPECT_EQ(v1.blocks, 4) << "1,000 rows, a thread each, 256 a block";
  EXPECT_EQ(v2.blocks, 125) << "1,000 rows, a warp each, 8 warps a block";
  EXPECT_EQ(v3.blocks, 125);
  EXPECT_EQ(gemv_launch(1, 1000, 64, true).blocks, 125) << "the bf16 versions give each row a warp";
  EXPECT_EQ(gemv_launch(2, 9, 64, true).blocks, 2) << "9 warps need 2 blocks of 8";
  EXPECT_TRUE(testing::throws_error_mentioning([] { gemv_launch(4, 10, 10); }, "version"));
  EXPECT_TRUE(testing::throws_error_mentioning([] { gemv_launch(3, 10, 10, true); }, "version"));
  EXPECT_TRUE(testing::throws_error_mentioning([] { gemv_launch(1, 0, 10); }, "rows"));
  EXPECT_TRUE(testing::throws_error_mentioning([] { gemv_launch(2, 10, 0); }, "cols"));
  EXPECT_EQ(gemv_launch(2, 100000000, 8).blocks, 12500000) << "3.2 billion threads: count them in long";
}

GRADED_TEST(Lesson07Reference, GemvSumsEachRowAgainstX, 1) {
  const Matrix w = random_matrix(7, 13, 1);
  const Vector x = random_matrix(13, 1, 2).col(0);
  const Vector want = (w.cast<double>() * x.cast<double>()).cast<float>();
  EXPECT_TRUE(testing::all_close(want, gemv_reference(w, x), 1e-5, 1e-5, "gemv_reference of a 7 x 13 matrix"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { gemv_reference(w, Vector::Zero(12)); }, "12"));
}

GRADED_TEST(Lesson07Reference, Bf16GemvWidensEachWeight, 1) {
  const Matrix w = random_matrix(5, 24, 3);
  const Vector x = random_matrix(24, 1, 4).col(0);
  const std::vector<uint16_t> b = to_bf16(w);
  Matrix widened(5, 24);
  for (int i = 0; i < 5 * 24; ++i) widened.data()[i] = bf16_to_float(b[static_cast<size_t>(i)]);
  EXPECT_TRUE(testing::all_close(gemv_reference(widened, x), gemv_bf16_reference(b, 5, 24, x), 1e-6, 1e-6,
                                 "the bf16 reference against the float reference over the widened weights"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { gemv_bf16_reference(b, 5, 25, x); }, "weights"));
  const Vector x23 = random_matrix(23, 1, 5).col(0);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { gemv_bf16_reference(b, 5, 23, x23); }, "weights"))
      << "120 weights for a 5 x 23 matrix: too many is refused too";
}

GRADED_TEST(Lesson07Reference, SoftmaxRowsIsStable, 1) {
  Matrix x(2, 3);
  x << 1000, 999, 997, 0, 0, 0;
  softmax_rows_reference(x);
  const double e1 = std::exp(-1.0), e3 = std::exp(-3.0), z = 1 + e1 + e3;
  Matrix want(2, 3);
  want << float(1 / z), float(e1 / z), float(e3 / z), 1 / 3.0f, 1 / 3.0f, 1 / 3.0f;
  EXPECT_TRUE(testing::all_close(want, x, 1e-6, 1e-5, "softmax of {1000, 999, 997} and of three zeros"));
}

GRADED_TEST(Lesson07Reference, EmbeddingCopiesRowsAndRefusesBadIds, 1) {
  const Matrix table = random_matrix(10, 4, 5);
  const std::vector<int> ids = {3, 0, 3, 9};
  const Matrix got = embedding_reference(table, ids);
  ASSERT_EQ(got.rows(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(testing::all_close(table.row(ids[i]), got.row(i), 0, 0, cat("row ", i)));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { embedding_reference(table, std::vector<int>{1, 10}); }, "10"));
}

}  // namespace
}  // namespace infer::gpu
