// Lesson 11: the decode product over quantized weights, against dequantize-then-multiply, and
// the lesson's point: it never builds a float copy of W.
#include <cmath>
#include <utility>

#include "common/testing/allocations.hpp"
#include "common/linear.hpp"
#include "common/testing/compare.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/page_reads.hpp"
#include "common/testing/throws.hpp"
#include "lessons/11_quantization/quantization.hpp"
#include "random_matrix.hpp"

namespace infer {
namespace {

QuantizedMatrix quantize(WeightFormat format, ConstMatrixRef w, int group) {
  return format == WeightFormat::int8 ? quantize_int8(w) : quantize_int4(w, group);
}

/// Each path of the product: INT8, INT4 in groups of 32 (whole packets) and of 8 (narrower than a
/// packet). (INT8's group is its row; the 32 is not read.)
const std::pair<WeightFormat, int> kEveryPath[] = {
    {WeightFormat::int8, 32}, {WeightFormat::int4, 32}, {WeightFormat::int4, 8}};

/// The product against dequantize(W) in double: within 1e-5 sqrt(cols) + 1e-5 |y| (linear()'s
/// bound: the same float sums in another order).
::testing::AssertionResult matches_reference(ConstMatrixRef x, const QuantizedMatrix& w, ConstMatrixRef y, long first,
                                             long count, ConstMatrixRef before, bool accumulate) {
  const Eigen::MatrixXd ref = x.cast<double>() * dequantize(w).cast<double>().transpose();
  const double atol = 1e-5 * std::sqrt(static_cast<double>(w.cols));
  for (long i = 0; i < y.rows(); ++i)
    for (long j = 0; j < y.cols(); ++j) {
      const bool mine = j >= first && j < first + count;
      const double expected = mine ? ref(i, j) + (accumulate ? before(i, j) : 0.0) : before(i, j);
      if (!(std::abs(y(i, j) - expected) <= atol + 1e-5 * std::abs(expected)))
        return ::testing::AssertionFailure()
               << "y(" << i << ", " << j << ") = " << y(i, j) << ", expected " << expected
               << (mine ? "" : " (a column outside [first, first + count): it must not change)");
    }
  return ::testing::AssertionSuccess();
}

GRADED_TEST(Lesson11Kernel, QuantizedProductEqualsDequantizeThenMultiply, 3) {
  // Odd shapes (rows not a multiple of 4; INT8's 100 columns not a multiple of a SIMD width, 16
  // bytes, or of 256), the batches of decode (1, 3, 8) and one past the decode path (80 rows:
  // prefill); INT4 groups of 8 (narrower than a SIMD packet of bytes), 16 and 48 (half a group,
  // 8 or 24 bytes, is no whole number of 16-byte packets), 32 and 128, over 384 columns.
  for (WeightFormat format : {WeightFormat::int8, WeightFormat::int4})
    for (int group : {8, 16, 32, 48, 128}) {
      if (format == WeightFormat::int8 && group != 32) continue;
      const long cols = format == WeightFormat::int8 ? 100 : 384;
      const Matrix w = random_matrix(45, cols, 7 + group);
      const QuantizedMatrix q = quantize(format, w, group);
      for (long n : {1L, 3L, 8L, 80L}) {
        const Matrix x = random_matrix(n, cols, 100 + n, 1.0f);
        Matrix y = Matrix::Constant(n, 45, 99.0f);
        const Matrix before = y;
        linear_quantized_rows_into(x, q, y, 0, 45, false);
        EXPECT_TRUE(matches_reference(x, q, y, 0, 45, before, false))
            << weight_format_name(format) << " group " << q.group << ", " << n << " rows of x";
      }
    }
}

GRADED_TEST(Lesson11Kernel, QuantizedProductWritesOnlyItsRowsAndAccumulates, 2) {
  // A thread's share: rows [first, first + count) of W into the same columns of y, with and
  // without accumulate; every other column untouched. Every path: INT8, INT4 in groups of 32 and
  // of 8 (narrower than a packet), decode (5 rows of x) and prefill (80).
  const Matrix w = random_matrix(30, 96, 3);
  for (const auto& [format, group] : kEveryPath) {
    const QuantizedMatrix q = quantize(format, w, group);
    for (long n : {5L, 80L}) {
      const Matrix x = random_matrix(n, 96, 4, 1.0f);
      for (bool accumulate : {false, true}) {
        Matrix y = random_matrix(n, 30, 5, 1.0f);
        const Matrix before = y;
        linear_quantized_rows_into(x, q, y, 7, 13, accumulate);
        EXPECT_TRUE(matches_reference(x, q, y, 7, 13, before, accumulate))
            << weight_format_name(format) << " group " << q.group << ", " << n << " rows of x"
            << (accumulate ? ", accumulating" : "");
      }
    }
  }
}

GRADED_TEST(Lesson11Kernel, QuantizedProductNeverMakesAFloatCopyOfW, 3) {
  // The lesson's point: the bytes saved are saved only if the product reads W as stored. A product
  // that reads W back into floats first (dequantize, then multiply) gives the right numbers and
  // reads 4 (int8) or 6.4 (int4) times the bytes. W here is 1024 x 2048: a float copy of it, or of
  // a quarter of it, is 2 to 8 MB; a decode call may allocate up to 64 KB (a tile, a row's
  // scratch). A prefill call (80 rows of x) may read W back a block of rows at a time and hand it
  // to Eigen's product, whose packing buffers are bounded by its operands: under half a float copy
  // of W (the reference: a block of 64 rows, 512 KB, and 1.8 MB in all). Every path: INT8, INT4
  // in groups of 32 and of 8 (narrower than a packet).
  if (!testing::AllocationCounter::available()) GTEST_SKIP() << "allocation counting is off in this build";
  const Matrix w = random_matrix(1024, 2048, 9);
  for (const auto& [format, group] : kEveryPath) {
    const QuantizedMatrix q = quantize(format, w, group);
    for (long n : {1L, 8L, 80L}) {
      const Matrix x = random_matrix(n, 2048, 10, 1.0f);
      Matrix y(n, 1024);
      size_t bytes = 0;
      {
        testing::AllocationCounter counter;
        linear_quantized_rows_into(x, q, y, 0, 1024, false);
        bytes = counter.bytes();
      }
      const size_t limit = n > 8 ? w.size() * sizeof(float) / 2 : 64u * 1024u;
      EXPECT_LE(bytes, limit) << weight_format_name(format) << " group " << q.group << ", " << n
                              << " rows of x: the product allocated " << bytes << " bytes; a float copy of W is "
                              << w.size() * 4 << " bytes";
    }
  }
}

GRADED_TEST(Lesson11Kernel, QuantizedProductReadsWOnceWhateverTheRowsOfX, 2) {
  // The lesson's point for a batch: W is read once per call, so a batch of 8 reads the bytes a
  // batch of 1 does. A product that goes through x a few rows at a time, reading the whole of W
  // for each few, gives the right numbers and reads W twice at 8 rows of x (in fours), or 8 times
  // (one at a time). The counter (common/testing/page_reads.hpp) watches W's bytes page by page
  // with a working set of 32 pages (128 KB): re-reading a few rows of W for every row of x is
  // free, walking the whole of W again is not. W is 1024 x 2048 (2 MB in INT8, 1 MB in INT4, well
  // past the working set); every path: INT8, INT4 in groups of 32 and of 8 (narrower than a
  // packet), at 1, 8 and 64 rows of x (kLinearTileRows: the most a decode call takes).
  const Matrix w = random_matrix(1024, 2048, 9);
  for (const auto& [format, group] : kEveryPath) {
    const QuantizedMatrix q = quantize(format, w, group);
    const void* bytes = format == WeightFormat::int8 ? static_cast<const void*>(q.q.data()) : q.packed.data();
    const size_t size = format == WeightFormat::int8 ? q.q.size() : q.packed.size();
    for (long n : {1L, 8L, static_cast<long>(kLinearTileRows)}) {
      const Matrix x = random_matrix(n, 2048, 10, 1.0f);
      Matrix y(n, 1024);
      double passes = 0;
      {
        testing::PageReadCounter reads(bytes, size);
        linear_quantized_rows_into(x, q, y, 0, 1024, false);
        passes = reads.passes();
      }
      EXPECT_LE(passes, 1.25) << weight_format_name(format) << " group " << q.group << ", " << n
                              << " rows of x: the product walked W " << passes
                              << " times; it must read W once, a few rows of W meeting every row of x before "
                                 "the next rows of W are read";
    }
  }
}

GRADED_TEST(Lesson11Kernel, QuantizedProductRefusesMismatchedShapes, 1) {
  const QuantizedMatrix q = quantize_int8(random_matrix(8, 64, 1));
  Matrix y(2, 8);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { linear_quantized_rows_into(Matrix(2, 63), q, y, 0, 8, false); },
                                               "63"));
  Matrix wrong_y(2, 7);
  EXPECT_TRUE(testing::throws_error_mentioning(
      [&] { linear_quantized_rows_into(Matrix::Zero(2, 64), q, wrong_y, 0, 8, false); }, "7"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { linear_quantized_rows_into(Matrix::Zero(2, 64), q, y, 4, 5, false); },
                                               "9"));
  EXPECT_TRUE(testing::throws_error_mentioning(
      [&] { linear_quantized_rows_into(Matrix::Zero(2, 64), q, y, -2, 3, false); }, "-2"))
      << "rows [-2, 1) of W: refused, not written before y's first column";
}

}  // namespace
}  // namespace infer
