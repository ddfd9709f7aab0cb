// Lesson 11's given INT4 x INT8 product (activations.hpp): the fast path against the plain one,
// both against the exact sum in double, and the product against the float-activation one within
// what rounding x to 8 bits can move it.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/testing/throws.hpp"
#include "common/weights.hpp"
#include "lessons/11_quantization/activations.hpp"
#include "lessons/11_quantization/simd.hpp"
#include "tests/11_quantization/random_matrix.hpp"

namespace infer {
namespace {

/// The exact product of the rounded x and W (sum over groups of sw sx d, in double), and the sum
/// of its terms' magnitudes (what float rounding is relative to).
struct Exact {
  Eigen::MatrixXd y, magnitude;
};

Exact exact_product(ConstMatrixRef x, const QuantizedMatrix& w) {
  const Int8Rows xq = quantize_rows_int8(x, w.group);
  const long groups = w.cols / w.group, half = w.group / 2;
  Exact e{Eigen::MatrixXd::Zero(x.rows(), w.rows), Eigen::MatrixXd::Zero(x.rows(), w.rows)};
  for (long j = 0; j < x.rows(); ++j)
    for (long r = 0; r < w.rows; ++r)
      for (long g = 0; g < groups; ++g) {
        const uint8_t* b = w.packed.data() + (r * w.cols + g * w.group) / 2;
        const int8_t* v = xq.q.data() + j * w.cols + g * w.group;
        double d = 0, m = 0;
        for (long i = 0; i < half; ++i) {
          const double lo = ((b[i] & 0x0F) - 8) * v[i], hi = ((b[i] >> 4) - 8) * v[i + half];
          d += lo + hi, m += std::abs(lo) + std::abs(hi);
        }
        const double s = static_cast<double>(w.scales[r * groups + g]) * xq.scales[j * groups + g];
        e.y(j, r) += s * d, e.magnitude(j, r) += s * m;
      }
  return e;
}

using Product = void (*)(ConstMatrixRef, const QuantizedMatrix&, MatrixRef, long, long, bool);

/// `product` over rows [first, first + count) equals the exact sum within 1e-5 of its terms'
/// magnitudes, and leaves the other columns. Float rounding: at most about a hundred roundings of
/// 2^-24 each (the plain path adds 96 groups in a row for groups of 8 over 768 columns: 5.7e-6),
/// relative to the sum of |each product|; a dropped lane, a wrong scale or offset misses by far more.
::testing::AssertionResult matches_exact(Product product, ConstMatrixRef x, const QuantizedMatrix& w, long first,
                                         long count, bool accumulate) {
  const Matrix before = random_matrix(x.rows(), w.rows, 99, 1.0f);
  Matrix y = before;
  product(x, w, y, first, count, accumulate);
  const Exact e = exact_product(x, w);
  for (long j = 0; j < y.rows(); ++j)
    for (long r = 0; r < y.cols(); ++r) {
      const bool mine = r >= first && r < first + count;
      const double expected = mine ? e.y(j, r) + (accumulate ? before(j, r) : 0.0) : before(j, r);
      const double tol = mine ? 1e-5 * (e.magnitude(j, r) + (accumulate ? std::abs(before(j, r)) : 0.0)) + 1e-30 : 0;
      if (!(std::abs(y(j, r) - expected) <= tol))
        return ::testing::AssertionFailure() << "y(" << j << ", " << r << ") = " << y(j, r) << ", expected " << expected
                                             << " within " << tol << " (W " << w.rows << " x " << w.cols
                                             << ", groups of " << w.group << ", " << x.rows() << " rows of x)";
    }
  return ::testing::AssertionSuccess();
}

TEST(Widening, EachLaneIsItsWeightExactly) {
  // simd.hpp's widenings (AVX-512 or AVX2 intrinsics where the build has them, GCC's vector types
  // elsewhere) against the plain arithmetic, lane by lane: int8 q as a float, and each nibble n of
  // a byte as scale * (n - 8), the same float, over every byte value and scales of many sizes.
  using simd::kLanes;
  float out[kLanes], lo_out[kLanes], hi_out[kLanes];
  for (int start = 0; start < 256; start += kLanes) {
    int8_t q[kLanes];
    uint8_t b[kLanes];
    for (int i = 0; i < kLanes; ++i) q[i] = static_cast<int8_t>(start + i - 128), b[i] = static_cast<uint8_t>(start + i);
    Eigen::internal::pstoreu(out, simd::widen_int8(q));
    for (int i = 0; i < kLanes; ++i) ASSERT_EQ(out[i], static_cast<float>(q[i])) << "int8 " << int(q[i]);
    for (const float scale : {1.0f, 0.1f, 3.7e-5f, 1234.5f, 0.0f}) {
      simd::Packet lo, hi;
      simd::widen_int4(b, scale, lo, hi);
      Eigen::internal::pstoreu(lo_out, lo);
      Eigen::internal::pstoreu(hi_out, hi);
      for (int i = 0; i < kLanes; ++i) {
        ASSERT_EQ(lo_out[i], scale * static_cast<float>((b[i] & 0x0F) - 8)) << "byte " << int(b[i]) << ", scale " << scale;
        ASSERT_EQ(hi_out[i], scale * static_cast<float>((b[i] >> 4) - 8)) << "byte " << int(b[i]) << ", scale " << scale;
      }
    }
  }
}

TEST(Int4Int8, FastAndPlainEqualTheExactSum) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) || defined(__AVX2__) && defined(__FMA__)
  // This build has a fast path (AVX-512 VNNI's, or AVX2's): make sure the cases below take it.
  for (int g : {8, 16, 32, 64, 128, 256, 384}) EXPECT_TRUE(int4_int8_vectorized(g)) << g;
#endif
  EXPECT_FALSE(int4_int8_vectorized(96));  // a half of 48 bytes straddles the packets: the plain path
  EXPECT_FALSE(int4_int8_vectorized(4));   // a 32-bit lane would span two groups
  // Columns that are whole packets (768: 384 bytes a row, six of AVX-512's 64 bytes, twelve of
  // AVX2's 32), and that leave groups after them (192: 96 bytes, one packet of 64 and 32 bytes
  // more, or three of 32; 96 and 80: 48 and 40 bytes, a packet and 16 or 8 bytes more); groups
  // from 8 to a packet and more, over several packets (256, 384), and one the fast paths leave to
  // the plain one (96); rows of W not a multiple of 4 (tiles of 4, 3, 2 and 1 rows); the batches of
  // decode and a prefill.
  for (long cols : {768L, 192L, 96L, 80L})
    for (int group : {8, 16, 32, 64, 96, 128, 256, 384})
      for (long n : {1L, 3L, 4L, 5L, 8L, 70L}) {
        if (cols % group) continue;
        const QuantizedMatrix w = quantize_int4(random_matrix(13, cols, static_cast<uint64_t>(cols + group)), group);
        const Matrix x = random_matrix(n, cols, static_cast<uint64_t>(7 * n + group), 1.0f);
        for (Product p : {&linear_int4_int8_rows_into, &linear_int4_int8_plain}) {
          EXPECT_TRUE(matches_exact(p, x, w, 0, 13, false));
          EXPECT_TRUE(matches_exact(p, x, w, 2, 7, true));
          EXPECT_TRUE(matches_exact(p, x, w, 1, 10, false));
          EXPECT_TRUE(matches_exact(p, x, w, 5, 0, false));
        }
      }
}

TEST(Int4Int8, WithinTheActivationRoundingOfTheFloatProduct) {
  // Rounding x moves each value by at most half its group's step s_x, so a row's product by W moves
  // by at most sum over groups of s_x / 2 times the group's |weights| (as read back); float
  // rounding adds 1e-5 of the sum of |w x|.
  for (int group : {32, 128}) {
    const QuantizedMatrix w = quantize_int4(random_matrix(37, 512, 3), group);
    const Matrix x = random_matrix(5, 512, 4, 1.0f);
    const Matrix wf = dequantize(w);
    const Int8Rows xq = quantize_rows_int8(x, group);
    Matrix y(5, 37);
    linear_int4_int8_rows_into(x, w, y, 0, 37, false);
    const Eigen::MatrixXd exact = x.cast<double>() * wf.cast<double>().transpose();
    double worst = 0;  // the largest share of its bound a difference uses
    for (long j = 0; j < 5; ++j)
      for (long r = 0; r < 37; ++r) {
        double bound = 0, magnitude = 0;
        for (long g = 0; g < 512 / group; ++g) {
          const double step = xq.scales[j * (512 / group) + g];
          bound += step / 2 * wf.row(r).segment(g * group, group).cwiseAbs().cast<double>().sum();
        }
        magnitude = (x.row(j).cwiseAbs().cast<double>().array() * wf.row(r).cwiseAbs().cast<double>().array()).sum();
        const double diff = std::abs(y(j, r) - exact(j, r));
        ASSERT_LE(diff, bound + 1e-5 * magnitude) << "row " << j << " of x, row " << r << " of W, groups of " << group;
        worst = std::max(worst, diff / bound);
      }
    // Not vacuous: rounding x does move the products (by a visible share of the bound).
    EXPECT_GT(worst, 0.01) << group;
  }
}

TEST(Int4Int8, RoundsEachGroupWithinHalfAStep) {
  Matrix x = random_matrix(3, 64, 5, 2.0f);
  x.row(1).segment(32, 32).setZero();  // a group of zeros
  const Int8Rows q = quantize_rows_int8(x, 32);
  ASSERT_EQ(q.scales.size(), 6u);
  for (long j = 0; j < 3; ++j)
    for (long c = 0; c < 64; ++c) {
      const float s = q.scales[j * 2 + c / 32];
      EXPECT_LE(std::abs(x(j, c) - s * q.q[j * 64 + c]), s / 2 * (1 + 1e-6f)) << j << ", " << c;
      EXPECT_LE(std::abs(q.q[j * 64 + c]), 127);
    }
  EXPECT_EQ(q.scales[3], 0.0f);
  for (long c = 32; c < 64; ++c) EXPECT_EQ(q.q[64 + c], 0);
  // The largest |value| of each group is +-127 exactly.
  for (long j = 0; j < 3; ++j) {
    if (j == 1) continue;
    long top = 0;
    x.row(j).head(32).cwiseAbs().maxCoeff(&top);
    EXPECT_EQ(std::abs(q.q[j * 64 + top]), 127);
  }
  EXPECT_TRUE(testing::throws_error_mentioning([&] { quantize_rows_int8(x, 48); }, "a group of 48"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { quantize_rows_int8(x, 0); }, "a group of 0"));
}

TEST(Int4Int8, AValueNotFiniteGivesNaNInItsRowOnly) {
  // As the float product would: NaN (or inf) in a row of x makes that row's products NaN; nothing
  // is clamped into a plausible number.
  const QuantizedMatrix w = quantize_int4(random_matrix(8, 256, 6), 32);
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    Matrix x = random_matrix(2, 256, 7, 1.0f);
    x(1, 40) = bad;
    for (Product p : {&linear_int4_int8_rows_into, &linear_int4_int8_plain}) {
      Matrix y(2, 8);
      p(x, w, y, 0, 8, false);
      EXPECT_TRUE(y.row(0).allFinite());
      for (long r = 0; r < 8; ++r) EXPECT_TRUE(std::isnan(y(1, r))) << r << " " << bad;
    }
  }
}

TEST(Int4Int8, RefusesWhatItCannotMultiply) {
  const QuantizedMatrix w4 = quantize_int4(random_matrix(8, 64, 8), 32);
  const QuantizedMatrix w8 = quantize_int8(random_matrix(8, 64, 8));
  Matrix y(2, 8);
  for (Product p : {&linear_int4_int8_rows_into, &linear_int4_int8_plain}) {
    EXPECT_TRUE(testing::throws_error_mentioning([&] { p(Matrix::Zero(2, 64), w8, y, 0, 8, false); }, "expected int4"));
    EXPECT_TRUE(testing::throws_error_mentioning([&] { p(Matrix::Zero(2, 63), w4, y, 0, 8, false); }, "63 columns"));
    Matrix wrong_y(2, 7);
    EXPECT_TRUE(testing::throws_error_mentioning([&] { p(Matrix::Zero(2, 64), w4, wrong_y, 0, 8, false); }, "2 x 7"));
    EXPECT_TRUE(testing::throws_error_mentioning([&] { p(Matrix::Zero(2, 64), w4, y, 4, 5, false); }, "rows [4, 9)"));
    QuantizedMatrix no_group = w4;
    no_group.group = 0;
    EXPECT_TRUE(testing::throws_error_mentioning([&] { p(Matrix::Zero(2, 64), no_group, y, 0, 8, false); }, "a group of 0"));
    QuantizedMatrix short_scales = w4;
    short_scales.scales.pop_back();
    EXPECT_TRUE(testing::throws_error_mentioning([&] { p(Matrix::Zero(2, 64), short_scales, y, 0, 8, false); },
                                                 "15 scales"));
  }
  EXPECT_TRUE(testing::throws_error_mentioning([&] { Int4Int8Projection{w8}; }, "int4"));
}

TEST(Int4Int8, TheEngineMeasureOfBitsPerByte) {
  // bits_per_byte() over projections (the engine's forward) equals the plain one over the same
  // weights read back, for INT4 with float activations; 8-bit activations run through the same
  // forward (what they cost, lesson 11's bench measures).
  const ModelWeights model = load_model(bundled_model_dir("tiny-fortunes"));
  std::vector<std::string> quotes = heldout_quotes();
  quotes.resize(5);
  const ModelProjections int4 = quantize_model(model, WeightFormat::int4, 32);
  const double plain = bits_per_byte(dequantized_model(model, int4), quotes);
  EXPECT_NEAR(bits_per_byte(model, int4, quotes), plain, 1e-4);
  const double a8 = bits_per_byte(model, quantize_model(model, WeightFormat::int4, 32, true), quotes);
  // The activations' rounding is in it (what it costs, the bench measures).
  EXPECT_TRUE(std::isfinite(a8));
  EXPECT_NE(a8, plain);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { quantize_model(model, WeightFormat::int8, 32, true); },
                                               "8-bit activations with int8"));
}

}  // namespace
}  // namespace infer
