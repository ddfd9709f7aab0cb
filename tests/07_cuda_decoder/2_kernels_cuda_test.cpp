// Lesson 07 on a CUDA device: every kernel version against its CPU reference, on awkward shapes
// (one row, sizes that are not multiples of a warp or a block, head dims 24, 64 and 128). Each
// output is poisoned with NaN before the kernel runs, so an element it forgets to write fails.
// Tolerances are atol + rtol * |ref|, per kernel, below. Without a device every case skips.
#include <cuda_runtime_api.h>

#include <cmath>
#include <functional>
#include <span>
#include <vector>

#include "common/cuda_buffer.hpp"
#include "common/cuda_check.hpp"
#include "common/testing/compare.hpp"
#include "common/testing/device.hpp"
#include "common/testing/graph_capture.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/throws.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"
#include "lessons/07_cuda_decoder/cuda_decoder.hpp"
#include "lessons/07_cuda_decoder/fused_kernels.hpp"
#include "lessons/07_cuda_decoder/kernels.hpp"

namespace infer::gpu {
namespace {

using testing::poisoned;
using testing::random_values;

Matrix as_matrix(const std::vector<float>& v, Eigen::Index rows, Eigen::Index cols) {
  return Eigen::Map<const Matrix>(v.data(), rows, cols);
}

struct Shape {
  int rows, cols;
};
const Shape kGemvShapes[] = {{1, 1}, {1, 37}, {3, 32}, {31, 33}, {257, 100}, {64, 1024}, {130, 4101}};

GRADED_TEST(Lesson07Kernels, EveryGemvVersionMatchesTheReference, 3) {
  REQUIRE_DEVICE();
  for (const Shape s : kGemvShapes) {
    const auto w = random_values(static_cast<size_t>(s.rows) * s.cols, 10 + s.cols), x = random_values(s.cols, 20);
    const Vector want = gemv_reference(as_matrix(w, s.rows, s.cols), as_matrix(x, s.cols, 1).col(0));
    DeviceArray<float> dw(w), dx(x);
    for (int version = 1; version <= gemv_versions(); ++version) {
      DeviceArray<float> dy = poisoned(s.rows);
      gemv_f32(version, dw.get(), dx.get(), dy.get(), s.rows, s.cols);
      const auto got = dy.download();
      // float32 sums in another order: 1e-4 relative plus 1e-5 per sqrt(cols) absolute.
      ASSERT_TRUE(testing::all_close(want, as_matrix(got, s.rows, 1), 1e-5 * std::sqrt(s.cols), 1e-4,
                                     cat("gemv_f32 version ", version, " on ", s.rows, " x ", s.cols)));
    }
  }
}

GRADED_TEST(Lesson07Kernels, EveryBf16GemvVersionMatchesTheReference, 3) {
  REQUIRE_DEVICE();
  for (const Shape s : kGemvShapes) {
    const auto wf = random_values(static_cast<size_t>(s.rows) * s.cols, 30 + s.cols), x = random_values(s.cols, 40);
    const std::vector<uint16_t> w = to_bf16(as_matrix(wf, s.rows, s.cols));
    const Vector want = gemv_bf16_reference(w, s.rows, s.cols, as_matrix(x, s.cols, 1).col(0));
    DeviceArray<uint16_t> dw(w);
    DeviceArray<float> dx(x);
    for (int version = 1; version <= gemv_bf16_versions(); ++version) {
      DeviceArray<float> dy = poisoned(s.rows);
      gemv_bf16(version, dw.get(), dx.get(), dy.get(), s.rows, s.cols);
      ASSERT_TRUE(testing::all_close(want, as_matrix(dy.download(), s.rows, 1), 1e-5 * std::sqrt(s.cols), 1e-4,
                                     cat("gemv_bf16 version ", version, " on ", s.rows, " x ", s.cols)));
    }
  }
}

/// A batched product (y [batch, rows] = x [batch, cols] W^T), float32 and bf16 weights: over each
/// shape and batch, every row of y against the GEMV reference of that row of x alone, y poisoned
/// with NaN first. `name` is what failures call it; `seed` varies the data.
using BatchedF32 = void (*)(const float*, const float*, float*, int, int, int);
using BatchedBf16 = void (*)(const uint16_t*, const float*, float*, int, int, int);
void check_batched_product(const char* name, BatchedF32 f32, BatchedBf16 bf16_product, std::initializer_list<Shape> shapes,
                           std::initializer_list<int> batches, int seed) {
  for (const Shape s : shapes) {
    const auto w = random_values(static_cast<size_t>(s.rows) * s.cols, seed + s.cols);
    const std::vector<uint16_t> wb = to_bf16(as_matrix(w, s.rows, s.cols));
    DeviceArray<float> dw(w);
    DeviceArray<uint16_t> dwb(wb);
    for (const int batch : batches) {
      const auto x = random_values(static_cast<size_t>(batch) * s.cols, seed + 10 + batch);
      const Matrix xs = as_matrix(x, batch, s.cols);
      DeviceArray<float> dx(x);
      for (const bool bf16 : {false, true}) {
        DeviceArray<float> dy = poisoned(static_cast<size_t>(batch) * s.rows);
        if (bf16) bf16_product(dwb.get(), dx.get(), dy.get(), s.rows, s.cols, batch);
        else f32(dw.get(), dx.get(), dy.get(), s.rows, s.cols, batch);
        const Matrix got = as_matrix(dy.download(), batch, s.rows);
        for (int b = 0; b < batch; ++b) {
          const Vector xb = xs.row(b).transpose();
          const Vector want = bf16 ? gemv_bf16_reference(wb, s.rows, s.cols, xb)
                                   : gemv_reference(as_matrix(w, s.rows, s.cols), xb);
          ASSERT_TRUE(testing::all_close(want.transpose(), got.row(b), 1e-5 * std::sqrt(s.cols), 1e-4,
                                         cat(name, bf16 ? "_bf16" : "_f32", " on ", s.rows, " x ", s.cols, ", batch ",
                                             batch, ", row ", b)));
        }
      }
    }
  }
  DeviceArray<float> dw(4), dx(4), dy(4);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { f32(dw.get(), dx.get(), dy.get(), 2, 2, 0); }, "batch"));
}

GRADED_TEST(Lesson07Kernels, BatchedGemvEqualsOneGemvPerRow, 2) {
  // Batches of 1, under a chunk, a chunk of 8 and past it (9, 17): every row of the batch
  // against the reference of that row alone, float32 and bf16 weights.
  REQUIRE_DEVICE();
  ASSERT_NO_FATAL_FAILURE(check_batched_product("gemv_batch", gemv_batch_f32, gemv_batch_bf16,
                                                {Shape{1, 37}, Shape{31, 33}, Shape{130, 4101}}, {1, 3, 8, 9, 17}, 90));
}

GRADED_TEST(Lesson07Kernels, SkinnyGemmEqualsOneGemvPerRow, 2) {
  // Shapes of one tile and of several with a partial last one (cols 8, 40, 264, 4104), rows not a
  // multiple of the block's 16, cols that are not a multiple of 8 (the fallback); batches of 1,
  // 2, 3, 5, 16 (one chunk) and 17, 40 (several): every row against its own reference.
  REQUIRE_DEVICE();
  ASSERT_NO_FATAL_FAILURE(check_batched_product(
      "skinny_gemm", skinny_gemm_f32, skinny_gemm_bf16,
      {Shape{1, 8}, Shape{31, 40}, Shape{130, 4104}, Shape{17, 264}, Shape{9, 37}}, {1, 2, 3, 5, 16, 17, 40}, 190));
}

/// The kernel launches `work` makes, counted by capturing it in a CUDA graph (its nodes) instead of
/// running it.
size_t launches_in(const std::function<void()>& work) {
  return testing::captured_launches("the call", work, /*replay=*/false);
}

GRADED_TEST(Lesson07Kernels, BatchedGemvIsOneLaunchForTheBatch, 1) {
  // The batched GEMV's point: W read once for the batch's rows. Calling the one-vector GEMV once
  // per batch row gives the same numbers and reads W batch times over; its launches show it.
  REQUIRE_DEVICE();
  const int rows = 130, cols = 264;
  DeviceArray<float> w(static_cast<size_t>(rows) * cols), x(17 * cols), y(17 * rows);
  DeviceArray<uint16_t> wb(static_cast<size_t>(rows) * cols);
  for (const int batch : {1, 8, 17}) {
    EXPECT_EQ(launches_in([&] { gemv_batch_f32(w.get(), x.get(), y.get(), rows, cols, batch); }), 1u)
        << "gemv_batch_f32 at batch " << batch << ": the whole batch in one launch, not one per row";
    EXPECT_EQ(launches_in([&] { gemv_batch_bf16(wb.get(), x.get(), y.get(), rows, cols, batch); }), 1u)
        << "gemv_batch_bf16 at batch " << batch << ": the whole batch in one launch, not one per row";
  }
}

GRADED_TEST(Lesson07Kernels, SkinnyGemmIsOneLaunchPer16BatchRows, 1) {
  // The point of the skinny GEMM: a weight read once for up to 16 batch rows, in one launch. A
  // GEMV launched once per batch row gives the same numbers and reads W batch times over; its
  // launches show it. (Aligned shapes: the fallback for others is gemv_batch's business.)
  REQUIRE_DEVICE();
  const int rows = 130, cols = 264;
  DeviceArray<float> w(static_cast<size_t>(rows) * cols), x(40 * cols), y(40 * rows);
  DeviceArray<uint16_t> wb(static_cast<size_t>(rows) * cols);
  for (const int batch : {1, 5, 16, 17, 40}) {
    const size_t want = static_cast<size_t>((batch + 15) / 16);
    EXPECT_EQ(launches_in([&] { skinny_gemm_f32(w.get(), x.get(), y.get(), rows, cols, batch); }), want)
        << "skinny_gemm_f32 at batch " << batch << ": one launch per 16 batch rows, not one per row";
    EXPECT_EQ(launches_in([&] { skinny_gemm_bf16(wb.get(), x.get(), y.get(), rows, cols, batch); }), want)
        << "skinny_gemm_bf16 at batch " << batch << ": one launch per 16 batch rows, not one per row";
  }
}

/// A batched product of the given kernels, against one GEMV per row: for each case's shape and
/// batch, every row of `product(kind, w, x, y, rows, cols, batch)` (for each of `kinds`: variants,
/// splits) against the GEMV reference of that row of x alone, within the skinny GEMM's tolerance;
/// and nothing written past y's end.
struct ProductCase {
  Shape shape;
  std::vector<int> batches;
};
template <typename Product>
void expect_rows_equal_gemvs(const char* what, const std::vector<ProductCase>& cases, std::span<const int> kinds, int seed,
                             Product product) {
  for (const ProductCase& c : cases) {
    const Shape s = c.shape;
    const auto w = random_values(static_cast<size_t>(s.rows) * s.cols, seed + s.cols);
    const std::vector<uint16_t> wb = to_bf16(as_matrix(w, s.rows, s.cols));
    DeviceArray<uint16_t> dwb(wb);
    for (const int batch : c.batches) {
      const auto x = random_values(static_cast<size_t>(batch) * s.cols, seed + 10 + batch);
      const Matrix xs = as_matrix(x, batch, s.cols);
      DeviceArray<float> dx(x);
      for (const int kind : kinds) {
        const size_t n = static_cast<size_t>(batch) * s.rows, tail = 64;  // NaN past y's end must stay NaN
        DeviceArray<float> dy = poisoned(n + tail);
        product(kind, dwb.get(), dx.get(), dy.get(), s.rows, s.cols, batch);
        const std::vector<float> all = dy.download();
        for (size_t i = n; i < n + tail; ++i)
          ASSERT_TRUE(std::isnan(all[i])) << what << " " << kind << " on " << s.rows << " x " << s.cols << ", batch "
                                          << batch << ": wrote " << i - n << " past y's end";
        const Matrix got = as_matrix(std::vector<float>(all.begin(), all.begin() + static_cast<long>(n)), batch, s.rows);
        for (int b = 0; b < batch; ++b) {
          const Vector want = gemv_bf16_reference(wb, s.rows, s.cols, xs.row(b).transpose());
          ASSERT_TRUE(testing::all_close(want.transpose(), got.row(b), 1e-5 * std::sqrt(s.cols), 1e-4,
                                         cat(what, " ", kind, " on ", s.rows, " x ", s.cols, ", batch ", batch, ", row ", b)));
        }
      }
    }
  }
}

// The given tensor-core GEMM (fused_kernels.hpp; the forward's bf16 products of 8 rows and more):
// every variant, every row of y against the GEMV reference of that row alone, within the skinny
// GEMM's tolerance (x split into two bf16 halves keeps float32's accuracy). Shapes: one 32-row
// tile, rows that no tile divides (the last tile moved back), several column steps per warp and
// fewer columns than warps; batches of 1 to 130 (one to three launches of 64 rows).
TEST(GivenTensorGemm, EveryVariantEqualsOneGemvPerRow) {
  REQUIRE_DEVICE();
  const std::vector<ProductCase> cases = {{{32, 16}, {1, 8, 16, 17}},
                                          {{33, 48}, {3, 32, 33, 64, 65, 130}},
                                          {{64, 272}, {8, 40}},
                                          {{48, 512}, {5, 24}},  // whole chunks of 32 and 64 columns only
                                          {{130, 1040}, {9, 64}}};
  for (const ProductCase& c : cases)
    if (!tensor_gemm_runs(c.shape.rows, c.shape.cols)) GTEST_SKIP() << "no tensor cores (compute capability below 8.0)";
  std::vector<int> variants(kTensorGemmVariants);
  for (int v = 1; v <= kTensorGemmVariants; ++v) variants[v - 1] = v;
  ASSERT_NO_FATAL_FAILURE(expect_rows_equal_gemvs("tensor_gemm_bf16 variant", cases, variants, 300, tensor_gemm_bf16));
}

TEST(GivenTensorGemm, ReadsWOncePer64BatchRowsAndRefusesWhatItCannotTake) {
  REQUIRE_DEVICE();
  if (!tensor_gemm_runs(32, 16)) GTEST_SKIP() << "no tensor cores (compute capability below 8.0)";
  DeviceArray<uint16_t> w(64 * 64);
  DeviceArray<float> x(130 * 64), y(130 * 64);
  for (const int batch : {1, 64, 65, 130})
    EXPECT_EQ(launches_in([&] { tensor_gemm_bf16(kTensorGemmVariant, w.get(), x.get(), y.get(), 64, 64, batch); }),
              static_cast<size_t>((batch + kTensorGemmChunk - 1) / kTensorGemmChunk))
        << "batch " << batch;
  EXPECT_FALSE(tensor_gemm_runs(31, 16));
  EXPECT_FALSE(tensor_gemm_runs(32, 24));
  using testing::throws_error_mentioning;
  EXPECT_TRUE(throws_error_mentioning([&] { tensor_gemm_bf16(1, w.get(), x.get(), y.get(), 31, 64, 1); }, "rows >= 32"));
  EXPECT_TRUE(throws_error_mentioning([&] { tensor_gemm_bf16(1, w.get(), x.get(), y.get(), 32, 24, 1); }, "16"));
  EXPECT_TRUE(throws_error_mentioning([&] { tensor_gemm_bf16(kTensorGemmVariants + 1, w.get(), x.get(), y.get(), 32, 32, 1); },
                                      "variant"));
  EXPECT_TRUE(throws_error_mentioning([&] { tensor_gemm_bf16(1, w.get(), x.get(), y.get(), 32, 32, 0); }, "batch"));
  EXPECT_TRUE(throws_error_mentioning([&] { tensor_gemm_bf16(1, w.get() + 1, x.get(), y.get(), 32, 32, 1); }, "32-byte"));
}

// The given skinny GEMM without staging (fused_kernels.hpp; the forward's bf16 products of 2 to
// kSkinnySplitMaxBatch rows, or what CudaForward::skinny_split says): every split, every row of y
// against the GEMV reference of that row alone, within the skinny GEMM's tolerance. Shapes: one
// row (a group of 4 with 3 past the end), rows that no group of 4 divides, packets that no warp's
// lanes divide, a split whose warps outnumber the packets; batches of 1 to 33 (every kB the launch
// picks, and three launches of 16). One launch per 16 batch rows; the refusals.
TEST(GivenSkinnySplit, EverySplitEqualsOneGemvPerRowAndRefusesWhatItCannotTake) {
  REQUIRE_DEVICE();
  const std::vector<ProductCase> cases = {
      {{1, 8}, {1, 2}}, {{7, 40}, {3, 5, 16}}, {{33, 264}, {2, 8, 9, 17}}, {{130, 1040}, {4, 33}}};
  const int splits[] = {1, 2, 4, 8};
  ASSERT_NO_FATAL_FAILURE(expect_rows_equal_gemvs("skinny_gemm_bf16_split, split", cases, splits, 500, skinny_gemm_bf16_split));
  DeviceArray<uint16_t> w(64 * 64);
  DeviceArray<float> x(40 * 64), y(40 * 64);
  for (const int batch : {1, 16, 17, 40})
    EXPECT_EQ(launches_in([&] { skinny_gemm_bf16_split(2, w.get(), x.get(), y.get(), 64, 64, batch); }),
              static_cast<size_t>((batch + kSkinnySplitChunk - 1) / kSkinnySplitChunk))
        << "batch " << batch;
  using testing::throws_error_mentioning;
  const auto refuses = [&](auto call, const char* why) { EXPECT_TRUE(throws_error_mentioning(call, why)) << why; };
  refuses([&] { skinny_gemm_bf16_split(3, w.get(), x.get(), y.get(), 8, 8, 1); }, "split");
  refuses([&] { skinny_gemm_bf16_split(1, w.get(), x.get(), y.get(), 8, 12, 1); }, "multiple of 8");
  refuses([&] { skinny_gemm_bf16_split(1, w.get(), x.get(), y.get(), 8, 8, 0); }, "batch");
  refuses([&] { skinny_gemm_bf16_split(1, w.get(), x.get(), y.get(), 0, 8, 1); }, ">= 1");
  refuses([&] { skinny_gemm_bf16_split(1, w.get(), nullptr, y.get(), 8, 8, 1); }, "null");
  refuses([&] { skinny_gemm_bf16_split(1, w.get(), x.get() + 1, y.get(), 8, 8, 1); }, "16-byte");
}

// gemv_bf16_fused against the launches it replaces, run in turn on the CPU: lesson 00's rms_norm
// (where a norm is given), the bf16 GEMV's reference, then the store, the add into y's old values,
// or SwiGLU over [gate; up]. Odd rows (a warp's second row missing), packets that no warp's lanes
// divide, one row; within the bf16 GEMV's tolerance (the norm's scale is applied to the finished
// sums, and the squares are summed in another order: float32 rounding apart).
TEST(GivenFusedGemv, EveryOutputEqualsTheLaunchesItReplaces) {
  REQUIRE_DEVICE();
  // x of about 1e-3 too, whose mean square (1e-6) is below the norm's epsilon (1e-5): misplace
  // eps and the scale is off by far more than the tolerance.
  const Shape shapes[] = {{1, 8}, {2, 16}, {7, 40}, {64, 264}, {130, 1040}};
  for (const Shape s : shapes)
    for (const double x_scale : {3.0, 1e-3})
    for (const bool with_norm : {false, true})
      for (const GemvOut out : {GemvOut::Store, GemvOut::Accumulate, GemvOut::SwiGlu}) {
        if (out == GemvOut::SwiGlu && s.rows % 2 != 0) continue;
        const std::string what = cat("gemv_bf16_fused on ", s.rows, " x ", s.cols, with_norm ? ", normed" : "",
                                     ", out ", static_cast<int>(out), ", x of about ", x_scale);
        const auto w = random_values(static_cast<size_t>(s.rows) * s.cols, 400 + s.cols);
        const auto x = random_values(s.cols, 410, x_scale), norm = random_values(s.cols, 420);
        const std::vector<uint16_t> wb = to_bf16(as_matrix(w, s.rows, s.cols));
        Vector in = as_matrix(x, s.cols, 1).col(0);
        if (with_norm) in = ::infer::rms_norm(in.transpose(), as_matrix(norm, s.cols, 1).col(0), 1e-5f).transpose();
        const Vector sums = gemv_bf16_reference(wb, s.rows, s.cols, in);
        const int written = out == GemvOut::SwiGlu ? s.rows / 2 : s.rows;
        const auto before = random_values(written, 430);
        Vector want(written);
        for (int i = 0; i < written; ++i) {
          if (out == GemvOut::Store) want[i] = sums[i];
          else if (out == GemvOut::Accumulate) want[i] = before[i] + sums[i];
          else want[i] = sums[i] / (1.0f + std::exp(-sums[i])) * sums[i + written];
        }
        DeviceArray<uint16_t> dw(wb);
        DeviceArray<float> dx(x), dn(norm);
        for (const int split : {1, 2, 4, 8}) {  // warps per pair of rows
          DeviceArray<float> dy = out == GemvOut::Accumulate ? DeviceArray<float>(before) : poisoned(written);
          gemv_bf16_fused(dw.get(), dx.get(), with_norm ? dn.get() : nullptr, 1e-5f, dy.get(), s.rows, s.cols, out, split);
          const auto got = dy.download();
          ASSERT_TRUE(testing::all_close(want.transpose(), Eigen::Map<const Vector>(got.data(), written).transpose(),
                                         1e-5 * std::sqrt(s.cols), 1e-4, cat(what, ", split ", split)));
        }
      }
  DeviceArray<uint16_t> w(16 * 16);
  DeviceArray<float> x(32), y(32);
  using testing::throws_error_mentioning;
  const auto refuses = [&](auto call, const char* why) { EXPECT_TRUE(throws_error_mentioning(call, why)) << why; };
  refuses([&] { gemv_bf16_fused(w.get(), x.get(), nullptr, 1e-5f, y.get(), 4, 12, GemvOut::Store); }, "multiple of 8");
  refuses([&] { gemv_bf16_fused(w.get(), x.get(), nullptr, 1e-5f, y.get(), 3, 8, GemvOut::SwiGlu); }, "even");
  refuses([&] { gemv_bf16_fused(w.get(), x.get(), nullptr, 1e-5f, x.get() + 4, 4, 8, GemvOut::Store); }, "overlap");
  refuses([&] { gemv_bf16_fused(w.get(), x.get(), nullptr, 1e-5f, y.get(), 0, 8, GemvOut::Store); }, ">= 1");
  refuses([&] { gemv_bf16_fused(w.get(), nullptr, nullptr, 1e-5f, y.get(), 4, 8, GemvOut::Store); }, "null");
  refuses([&] { gemv_bf16_fused(w.get(), x.get() + 1, nullptr, 1e-5f, y.get(), 4, 8, GemvOut::Store); }, "16-byte");
  refuses([&] { gemv_bf16_fused(w.get(), x.get(), nullptr, 1e-5f, y.get(), 4, 8, GemvOut::Store, 3); }, "split");
}

TEST(GivenCublasHelpers, SplitBf16KeepsXToAbout16BitsAndAddHalvesJoinsTheProducts) {
  // split_bf16: hi = float_to_bf16(x) exactly, lo = bf16(x - hi), so hi + lo is within 2^-16 |x|
  // (lo's own rounding: 8 bits of what hi lost, itself under 2^-8 |x|); add_halves: the two
  // halves summed elementwise, every element written. n odd, and past the grid's 4,096 blocks of
  // 256 threads (the grid-stride loop's second lap), as the output head's 64 rows of 32,000 are.
  REQUIRE_DEVICE();
  for (const long n : {1L, 37L, 4097L, 4096L * 256 + 5}) {
    const auto x = random_values(static_cast<size_t>(n), 900 + n, 3.0);
    DeviceArray<float> dx(x);
    DeviceArray<uint16_t> hi_lo(static_cast<size_t>(2 * n));
    hi_lo.fill_bytes(0xFF);
    split_bf16(dx.get(), hi_lo.get(), n);
    const std::vector<uint16_t> got = hi_lo.download();
    for (long i = 0; i < n; ++i) {
      ASSERT_EQ(got[i], float_to_bf16(x[i])) << "hi of element " << i << " of " << n;
      const float joined = bf16_to_float(got[i]) + bf16_to_float(got[n + i]);
      ASSERT_LE(std::fabs(joined - x[i]), std::ldexp(std::fabs(x[i]), -16)) << "hi + lo of element " << i;
    }
    const auto halves = random_values(static_cast<size_t>(2 * n), 950 + n);
    DeviceArray<float> dh(halves), dy = poisoned(static_cast<size_t>(n));
    add_halves(dh.get(), dy.get(), n);
    const std::vector<float> y = dy.download();
    for (long i = 0; i < n; ++i) ASSERT_EQ(y[i], halves[i] + halves[n + i]) << "element " << i << " of " << n;
  }
  using testing::throws_error_mentioning;
  DeviceArray<float> f(4);
  DeviceArray<uint16_t> h(8);
  EXPECT_TRUE(throws_error_mentioning([&] { split_bf16(f.get(), h.get(), 0); }, "split_bf16"));
  EXPECT_TRUE(throws_error_mentioning([&] { add_halves(f.get(), f.get(), 0); }, "add_halves"));
}

GRADED_TEST(Lesson07Kernels, RmsNormMatchesLesson00, 2) {
  REQUIRE_DEVICE();
  for (const Shape s : {Shape{1, 1}, Shape{1, 192}, Shape{5, 33}, Shape{7, 4097}}) {
    const auto x = random_values(static_cast<size_t>(s.rows) * s.cols, 50, 3.0), w = random_values(s.cols, 60);
    const Matrix want = ::infer::rms_norm(as_matrix(x, s.rows, s.cols), as_matrix(w, s.cols, 1).col(0), 1e-5f);
    DeviceArray<float> dx(x), dw(w);
    DeviceArray<float> dy = poisoned(x.size());
    gpu::rms_norm(dx.get(), dw.get(), dy.get(), s.rows, s.cols, 1e-5f);
    ASSERT_TRUE(testing::all_close(want, as_matrix(dy.download(), s.rows, s.cols), 1e-5, 1e-4,
                                   cat("rms_norm on ", s.rows, " x ", s.cols)));
  }
  // eps is the caller's: values of about 0.1 with an eps of 0.05 (where it weighs as much as x).
  const auto x = random_values(3 * 40, 52, 0.1), w = random_values(40, 62);
  const Matrix want = ::infer::rms_norm(as_matrix(x, 3, 40), as_matrix(w, 40, 1).col(0), 0.05f);
  DeviceArray<float> dx(x), dw(w);
  DeviceArray<float> dy = poisoned(x.size());
  gpu::rms_norm(dx.get(), dw.get(), dy.get(), 3, 40, 0.05f);
  ASSERT_TRUE(testing::all_close(want, as_matrix(dy.download(), 3, 40), 1e-5, 1e-4, "rms_norm with eps 0.05"));
}

GRADED_TEST(Lesson07Kernels, RopeMatchesLesson00AtEachRowsPosition, 2) {
  // Positions in the tens of thousands (where an angle in float is off by a hundredth of a radian)
  // and Llama 3's theta of 500,000 besides the usual 10,000.
  REQUIRE_DEVICE();
  for (const float theta : {10000.0f, 500000.0f})
    for (const int head_dim : {24, 64, 128}) {
      const int rows = 5, heads = 5;
      const std::vector<int> positions = {0, 7, 250, 5000, 60000};
      const auto x = random_values(static_cast<size_t>(rows) * heads * head_dim, 70 + head_dim);
      Matrix want = as_matrix(x, rows, heads * head_dim);
      for (int r = 0; r < rows; ++r) {
        auto row = want.row(r);
        apply_rope(row, head_dim, positions[r], theta);
      }
      DeviceArray<float> dx(x);
      DeviceArray<int> dpos(positions);
      rope(dx.get(), dpos.get(), rows, heads, head_dim, theta);
      ASSERT_TRUE(testing::all_close(want, as_matrix(dx.download(), rows, heads * head_dim), 1e-5, 1e-4,
                                     cat("rope, head_dim ", head_dim, ", theta ", theta,
                                         ", positions 0, 7, 250, 5000, 60000")));
    }
}

GRADED_TEST(Lesson07Kernels, SwigluAddAndSoftmaxMatchTheirReferences, 2) {
  REQUIRE_DEVICE();
  const long n = 1000003;  // not a multiple of any block
  const auto gate = random_values(n, 80, 4.0), up = random_values(n, 81);
  DeviceArray<float> dg(gate), du(up);
  DeviceArray<float> dout = poisoned(n);
  swiglu(dg.get(), du.get(), dout.get(), n);
  const auto got = dout.download();
  for (long i = 0; i < n; ++i) {
    const double want = gate[i] / (1.0 + std::exp(-static_cast<double>(gate[i]))) * up[i];
    ASSERT_NEAR(got[i], want, 1e-6 + 1e-5 * std::abs(want)) << "swiglu element " << i;
  }
  add(dg.get(), du.get(), n);  // gate += up
  const auto sum = dg.download();
  for (long i = 0; i < n; ++i) ASSERT_EQ(sum[i], gate[i] + up[i]) << "add element " << i;
  for (const Shape s : {Shape{1, 1}, Shape{3, 255}, Shape{4, 5000}}) {
    const auto x = random_values(static_cast<size_t>(s.rows) * s.cols, 90, 30.0);  // scores in the tens
    Matrix want = as_matrix(x, s.rows, s.cols);
    softmax_rows_reference(want);
    DeviceArray<float> dx(x);
    softmax_rows(dx.get(), s.rows, s.cols);
    ASSERT_TRUE(testing::all_close(want, as_matrix(dx.download(), s.rows, s.cols), 1e-6, 1e-4,
                                   cat("softmax_rows on ", s.rows, " x ", s.cols)));
  }
}

GRADED_TEST(Lesson07Kernels, EmbeddingCopiesRowsAndMarksBadIds, 1) {
  REQUIRE_DEVICE();
  const int vocab = 259, hidden = 192;
  const auto table = random_values(static_cast<size_t>(vocab) * hidden, 100);
  const std::vector<int> ids = {1, 258, 0, 40, 40};
  DeviceArray<float> dt(table);
  DeviceArray<int> dids(ids);
  DeviceArray<float> dout = poisoned(ids.size() * hidden);
  embedding(dt.get(), dids.get(), dout.get(), static_cast<int>(ids.size()), vocab, hidden);
  const Matrix want = embedding_reference(as_matrix(table, vocab, hidden), ids);
  ASSERT_TRUE(testing::all_close(want, as_matrix(dout.download(), 5, hidden), 0, 0, "embedding rows"));
  DeviceArray<int> bad(std::vector<int>{3, 259, -1});
  embedding(dt.get(), bad.get(), dout.get(), 3, vocab, hidden);
  const auto got = dout.download();
  EXPECT_FALSE(std::isnan(got[0])) << "id 3 is in the vocabulary";
  EXPECT_TRUE(std::isnan(got[hidden])) << "id 259 is outside a vocabulary of 259: its row must be NaN";
  EXPECT_TRUE(std::isnan(got[2 * hidden])) << "id -1 is outside the vocabulary: its row must be NaN";
}

GRADED_TEST(Lesson07Kernels, DecodeAttentionMatchesLesson00, 3) {
  REQUIRE_DEVICE();
  struct Case {
    int length, heads, kv_heads, head_dim;
  };
  // (13,000 positions: 52 KB of scores, past the 48 KiB a kernel gets unless its limit is raised)
  // (the last: a query 60 times larger, scores of a few hundred, whose exp() overflows float)
  for (const Case c : {Case{1, 8, 2, 24}, Case{37, 8, 2, 24}, Case{256, 4, 4, 64}, Case{1000, 8, 1, 128},
                       Case{5000, 2, 2, 64}, Case{13000, 2, 1, 16}, Case{300, 4, 2, 64}}) {
    const int kv_dim = c.kv_heads * c.head_dim;
    const double q_scale = c.length == 300 ? 60.0 : 1.0;
    const auto q = random_values(static_cast<size_t>(c.heads) * c.head_dim, 110, q_scale), k = random_values(
        static_cast<size_t>(c.length) * kv_dim, 111), v = random_values(static_cast<size_t>(c.length) * kv_dim, 112);
    const Matrix want = causal_attention(as_matrix(q, 1, c.heads * c.head_dim), as_matrix(k, c.length, kv_dim),
                                         as_matrix(v, c.length, kv_dim), c.heads, c.kv_heads, c.head_dim);
    DeviceArray<float> dq(q), dk(k), dv(v);
    DeviceArray<float> dout = poisoned(q.size());
    decode_attention(dq.get(), dk.get(), dv.get(), dout.get(), c.length, c.heads, c.kv_heads, c.head_dim);
    ASSERT_TRUE(testing::all_close(want, as_matrix(dout.download(), 1, c.heads * c.head_dim), 1e-5, 1e-4,
                                   cat("decode_attention over ", c.length, " positions, ", c.heads, " heads over ",
                                       c.kv_heads, ", head_dim ", c.head_dim)));
  }
}

GRADED_TEST(Lesson07Kernels, BadShapesThrowNamingTheKernel, 1) {
  REQUIRE_DEVICE();
  DeviceArray<float> a(16), b(16), c(16);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { gemv_f32(4, a.get(), b.get(), c.get(), 4, 4); }, "version"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { gemv_f32(1, a.get(), b.get(), c.get(), 0, 4); }, "rows"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { gpu::rms_norm(a.get(), nullptr, c.get(), 1, 4, 1e-5f); }, "rms_norm"));
  EXPECT_TRUE(testing::throws_error_mentioning(
      [&] { decode_attention(a.get(), b.get(), c.get(), a.get(), 2, 3, 2, 4); }, "decode_attention"));
  // Each throw kernels.hpp promises, before any launch.
  DeviceArray<int> ids(std::vector<int>{0, 1});
  DeviceArray<uint16_t> w16(16);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { gemv_bf16(3, w16.get(), b.get(), c.get(), 4, 4); }, "version"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { gemv_batch_f32(a.get(), b.get(), c.get(), 4, 4, 0); }, "batch"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { skinny_gemm_f32(a.get(), b.get(), c.get(), 4, 4, 0); }, "batch"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { gpu::softmax_rows(a.get(), 0, 4); }, "softmax_rows"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { gpu::rope(a.get(), ids.get(), 2, 1, 3, 10000.0f); }, "rope"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { gpu::add(a.get(), b.get(), 0); }, "add"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { gpu::swiglu(a.get(), b.get(), c.get(), 0); }, "swiglu"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { gpu::embedding(a.get(), ids.get(), c.get(), 2, 0, 4); }, "embedding"));
}

}  // namespace
}  // namespace infer::gpu
