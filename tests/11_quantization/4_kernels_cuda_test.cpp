// Lesson 11 on a CUDA device: the INT8 and INT4 GEMVs against dequantize-then-multiply in double
// precision, on awkward shapes (one row, rows not a multiple of 4, columns not a multiple of 16 or
// 32), every INT4 group from 8 to 128, batches on both sides of a chunk of 8, and x or W at an
// address that is not on a 16-byte boundary. Every y is filled with NaN before the kernel runs, so
// an element it forgets to write fails. W is made here value by value in QuantizedMatrix's layout
// (not by quantize_int8/int4), so these cases grade the kernels alone, and it is handed over in
// device buffers of exactly its bytes: under ./course gpu-check's compute-sanitizer, a kernel that
// reads W as anything wider than it is stored reads past them and is reported. Tolerance: 1e-5
// sqrt(cols) + 1e-4 |ref|, lesson 07's GEMV tolerance (float32 sums in another order). Without a
// device every case skips.
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/cuda_buffer.hpp"
#include "common/cuda_check.hpp"
#include "common/rng.hpp"
#include "common/testing/compare.hpp"
#include "common/testing/device.hpp"
#include "common/testing/graph_capture.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/page_reads.hpp"
#include "common/testing/throws.hpp"
#include "lessons/07_cuda_decoder/fused_kernels.hpp"
#include "lessons/11_quantization/kernels.hpp"
#include "lessons/11_quantization/quantization.hpp"

namespace infer::gpu {
namespace {

using testing::poisoned;
using testing::random_values;

/// INT8 W [rows, cols]: every q in [-127, 127], a scale per row between 1/127 and 3/127 (weights
/// up to about 3 in magnitude: sums of the size lesson 07's tolerance is stated for).
QuantizedMatrix random_int8(int rows, int cols, uint64_t seed) {
  Rng rng(seed);
  QuantizedMatrix m;
  m.format = WeightFormat::int8;
  m.rows = rows, m.cols = cols, m.group = cols;
  m.q.resize(static_cast<size_t>(rows) * cols);
  for (int8_t& q : m.q) q = static_cast<int8_t>(static_cast<int>(rng.below(255)) - 127);
  for (int r = 0; r < rows; ++r) m.scales.push_back(static_cast<float>(rng.uniform(1.0, 3.0) / 127));
  return m;
}

/// INT4 W [rows, cols] in groups of `group`: every stored nibble in 1..15 (q in [-7, 7]), a scale
/// per group between 1/7 and 3/7, so that a scale read for the wrong group or row shows.
QuantizedMatrix random_int4(int rows, int cols, int group, uint64_t seed) {
  Rng rng(seed);
  QuantizedMatrix m;
  m.format = WeightFormat::int4;
  m.rows = rows, m.cols = cols, m.group = group;
  m.packed.resize(static_cast<size_t>(rows) * cols / 2);
  for (uint8_t& b : m.packed) b = static_cast<uint8_t>((1 + rng.below(15)) | ((1 + rng.below(15)) << 4));
  for (long i = 0; i < static_cast<long>(rows) * (cols / group); ++i)
    m.scales.push_back(static_cast<float>(rng.uniform(1.0, 3.0) / 7));
  return m;
}

/// W(r, c) as QuantizedMatrix documents it: scale * q.
double weight(const QuantizedMatrix& m, long r, long c) {
  if (m.format == WeightFormat::int8) return static_cast<double>(m.scales[r]) * m.q[r * m.cols + c];
  const long g = c / m.group, i = c % m.group, half = m.group / 2;
  const uint8_t byte = m.packed[(r * m.cols + g * m.group) / 2 + i % half];
  const int stored = i < half ? byte & 0x0F : byte >> 4;
  return static_cast<double>(m.scales[r * (m.cols / m.group) + g]) * (stored - 8);
}

/// The reference: x [batch, cols] times W^T, W read back element by element, in double.
Eigen::MatrixXd reference(const QuantizedMatrix& m, const std::vector<float>& x, int batch) {
  Eigen::MatrixXd w(m.rows, m.cols);
  for (long r = 0; r < m.rows; ++r)
    for (long c = 0; c < m.cols; ++c) w(r, c) = weight(m, r, c);
  const Eigen::MatrixXd xs = Eigen::Map<const Matrix>(x.data(), batch, m.cols).cast<double>();
  return xs * w.transpose();
}

/// `host` on the device `offset` elements into a buffer that ends where it ends: with offset 1, an
/// address the 16-byte loads cannot take.
template <typename T>
DeviceArray<T> at_offset(const std::vector<T>& host, size_t offset) {
  std::vector<T> shifted(offset, T{});
  shifted.insert(shifted.end(), host.begin(), host.end());
  return DeviceArray<T>(shifted);
}

/// Runs the kernel of m's format over `batch` rows of x and compares y with the reference.
/// `offset`: where W and x start in their buffers (0, or 1 for addresses off a 16-byte boundary).
/// With `tensor`, the given tensor-core GEMM (lesson 07's fused_kernels.hpp) in the GEMV's place.
::testing::AssertionResult gemv_matches(const QuantizedMatrix& m, int batch, uint64_t seed, size_t offset = 0,
                                        bool tensor = false) {
  const int rows = static_cast<int>(m.rows), cols = static_cast<int>(m.cols);
  const std::vector<float> x = random_values(static_cast<size_t>(batch) * cols, seed);
  DeviceArray<float> dx = at_offset(x, offset), ds(m.scales);
  DeviceArray<float> dy = poisoned(static_cast<size_t>(batch) * rows);
  const std::string what = cat(tensor ? "tensor_gemm_" : "gemv_", m.format == WeightFormat::int8 ? "int8" : "int4",
                               " on ", rows, " x ", cols,
                               m.format == WeightFormat::int4 ? cat(", groups of ", m.group) : std::string(),
                               ", batch ", batch, offset ? ", W and x off a 16-byte boundary" : "");
  if (m.format == WeightFormat::int8) {
    DeviceArray<int8_t> dq = at_offset(m.q, offset);
    if (tensor) tensor_gemm_int8(dq.get() + offset, ds.get(), dx.get() + offset, dy.get(), rows, cols, batch);
    else gemv_int8(dq.get() + offset, ds.get(), dx.get() + offset, dy.get(), rows, cols, batch);
  } else {
    DeviceArray<uint8_t> dp = at_offset(m.packed, offset);
    if (tensor) tensor_gemm_int4(dp.get() + offset, ds.get(), dx.get() + offset, dy.get(), rows, cols, m.group, batch);
    else gemv_int4(dp.get() + offset, ds.get(), dx.get() + offset, dy.get(), rows, cols, m.group, batch);
  }
  const Matrix got = Eigen::Map<const Matrix>(dy.download().data(), batch, rows);
  return testing::all_close(reference(m, x, batch), got, 1e-5 * std::sqrt(cols), 1e-4, what);
}

struct Shape {
  int rows, cols;
};

GRADED_TEST(Lesson11Gpu, Int8GemvMatchesTheReference, 3) {
  // Columns a multiple of 16 (the 16-byte loads) and not (1, 33, 37, 100, 4101); rows a multiple
  // of 4 and not; columns that end part-way through a warp's 512 bytes (48, 1040).
  REQUIRE_DEVICE();
  for (const Shape s : {Shape{1, 1}, Shape{1, 37}, Shape{3, 32}, Shape{31, 33}, Shape{5, 48}, Shape{45, 384},
                        Shape{64, 1040}, Shape{257, 100}, Shape{130, 4101}, Shape{257, 2048}}) {
    const QuantizedMatrix m = random_int8(s.rows, s.cols, 10 + s.cols);
    ASSERT_TRUE(gemv_matches(m, 1, 20));
  }
  for (const Shape s : {Shape{45, 384}, Shape{31, 33}})
    ASSERT_TRUE(gemv_matches(random_int8(s.rows, s.cols, 30), 1, 40, 1));  // W and x one element in
}

GRADED_TEST(Lesson11Gpu, Int4GemvMatchesTheReferenceForEveryGroup, 3) {
  // Groups of 8 (4 bytes: narrower than a 16-byte load), 32, 64 and 128, wherever they divide the
  // columns; columns not a multiple of 32 (24, 40) and ending part-way through a warp's 512 bytes.
  REQUIRE_DEVICE();
  for (const Shape s : {Shape{1, 128}, Shape{3, 256}, Shape{9, 24}, Shape{5, 40}, Shape{31, 1152}, Shape{45, 640},
                        Shape{130, 4096}})
    for (const int group : {8, 32, 64, 128}) {
      if (s.cols % group != 0) continue;
      ASSERT_TRUE(gemv_matches(random_int4(s.rows, s.cols, group, 50 + group + s.cols), 1, 60));
    }
  ASSERT_TRUE(gemv_matches(random_int4(45, 640, 32, 70), 1, 80, 1));  // W and x one element in
}

GRADED_TEST(Lesson11Gpu, BatchedGemvReadsEveryRowOfX, 2) {
  // Batches of 1, under a chunk, a chunk of 8 and past it (9, 17): each row of y against the
  // reference of its own row of x; both kernels, on their wide and plain paths.
  REQUIRE_DEVICE();
  for (const int batch : {1, 3, 8, 9, 17}) {
    for (const Shape s : {Shape{31, 33}, Shape{45, 384}, Shape{130, 4096}})
      ASSERT_TRUE(gemv_matches(random_int8(s.rows, s.cols, 90 + s.cols), batch, 100 + batch));
    ASSERT_TRUE(gemv_matches(random_int4(45, 640, 32, 110), batch, 120 + batch));
    ASSERT_TRUE(gemv_matches(random_int4(45, 640, 8, 130), batch, 140 + batch));
    ASSERT_TRUE(gemv_matches(random_int4(130, 4096, 128, 150), batch, 160 + batch));
  }
}

GRADED_TEST(Lesson11Gpu, BatchedGemvReadsWOnceForEightRowsOfX, 2) {
  // A decode step of 8 sequences reads the bytes of one only if every weight byte meets all 8 rows
  // of x once it is loaded. No output shows it; the reads of W do. W of 512 x 4,096 (INT8: 2 MB;
  // INT4, groups of 32: 1 MB) is watched (common/testing/page_reads.hpp, a working set of 32
  // pages) while batches of 1, 8 and 16 go through, and at most one walk per 8 rows of x is
  // allowed. The reference, emulated, walked it once at every batch (a warp keeps its rows of W
  // while both chunks of 8 go through); a gemv_int8 that launches the batch-1 kernel for each row
  // of x walked it 1, 8 and 16 times.
  REQUIRE_DEVICE();
  REQUIRE_EMULATOR();
  const int rows = 512, cols = 4096;
  for (const WeightFormat format : {WeightFormat::int8, WeightFormat::int4}) {
    const QuantizedMatrix m = format == WeightFormat::int8 ? random_int8(rows, cols, 170) : random_int4(rows, cols, 32, 171);
    DeviceArray<int8_t> dq(m.q);
    DeviceArray<uint8_t> dp(m.packed);
    DeviceArray<float> ds(m.scales);
    for (const int batch : {1, 8, 16}) {
      const std::vector<float> x = random_values(static_cast<size_t>(batch) * cols, 180 + batch);
      DeviceArray<float> dx(x), dy = poisoned(static_cast<size_t>(batch) * rows);
      double passes = 0;
      {
        const void* w = format == WeightFormat::int8 ? static_cast<const void*>(dq.get()) : dp.get();
        testing::PageReadCounter reads(w, format == WeightFormat::int8 ? m.q.size() : m.packed.size());
        if (format == WeightFormat::int8) gemv_int8(dq.get(), ds.get(), dx.get(), dy.get(), rows, cols, batch);
        else gemv_int4(dp.get(), ds.get(), dx.get(), dy.get(), rows, cols, m.group, batch);
        passes = reads.passes();
      }
      const char* name = format == WeightFormat::int8 ? "gemv_int8" : "gemv_int4";
      const double allowed = (batch + 7) / 8 + 0.25;
      std::printf("%s, batch %d: W walked %.2f times\n", name, batch, passes);
      EXPECT_LE(passes, allowed) << name << " at a batch of " << batch << " walked W " << passes
                                 << " times; each weight byte must meet 8 rows of x once loaded (W once per 8 rows)";
      const Matrix got = Eigen::Map<const Matrix>(dy.download().data(), batch, rows);
      EXPECT_TRUE(testing::all_close(reference(m, x, batch), got, 1e-5 * std::sqrt(cols), 1e-4, cat(name, ", batch ", batch)));
    }
  }
}

// The given tensor-core GEMM over the same formats (the forward's steps of 8 rows and more): rows
// that no 16-row tile divides, INT4 groups of 32, 64 and 128, batches of 1 to 65 (two launches).
TEST(GivenTensorGemm, QuantizedFormatsMatchTheReference) {
  REQUIRE_DEVICE();
  if (!tensor_gemm_int8_runs(32, 16)) GTEST_SKIP() << "no tensor cores (compute capability below 8.0)";
  for (const int batch : {1, 8, 17, 65}) {
    for (const Shape s : {Shape{32, 16}, Shape{33, 48}, Shape{45, 384}})
      ASSERT_TRUE(gemv_matches(random_int8(s.rows, s.cols, 170 + s.cols), batch, 180 + batch, 0, true));
    for (const int group : {32, 64, 128})
      ASSERT_TRUE(gemv_matches(random_int4(45, 640, group, 190 + group), batch, 200 + batch, 0, true));
    // Two packets a row: two of the block's four warps have none.
    ASSERT_TRUE(gemv_matches(random_int4(33, 64, 32, 205), batch, 206 + batch, 0, true));
  }
  ASSERT_TRUE(gemv_matches(random_int8(45, 384, 210), 8, 220, 4, true));  // W 4 bytes into its buffer
  EXPECT_FALSE(tensor_gemm_int4_runs(45, 640, 16)) << "a group below 32";
  EXPECT_FALSE(tensor_gemm_int4_runs(45, 96, 64)) << "a group that does not divide cols";
  EXPECT_FALSE(tensor_gemm_int8_runs(31, 64)) << "fewer than 32 rows";
}

GRADED_TEST(Lesson11Gpu, TheGemvsAllocateNothingAndCanBeCapturedInAGraph, 1) {
  // The point of the lesson on the device: W is read as stored, with no float copy of it made
  // even for a moment. A call captured into a CUDA graph may launch kernels and nothing else: a
  // cudaMalloc (of a float copy, say), a cudaFree or a copy makes the capture fail. The decode
  // step is captured this way by the engine (--cuda-graphs), so the GEMVs must allow it.
  REQUIRE_DEVICE();
  const QuantizedMatrix m8 = random_int8(45, 384, 230), m4 = random_int4(45, 640, 32, 231),
                        narrow = random_int4(45, 640, 8, 232);
  const int batch = 3;
  const std::vector<float> x8 = random_values(static_cast<size_t>(batch) * 384, 233),
                           x4 = random_values(static_cast<size_t>(batch) * 640, 234);
  DeviceArray<int8_t> q8(m8.q);
  DeviceArray<uint8_t> p4(m4.packed), pn(narrow.packed);
  DeviceArray<float> s8(m8.scales), s4(m4.scales), sn(narrow.scales), dx8(x8), dx4(x4);
  DeviceArray<float> y8 = poisoned(static_cast<size_t>(batch) * 45), y4 = poisoned(static_cast<size_t>(batch) * 45),
                     yn = poisoned(static_cast<size_t>(batch) * 45);
  testing::captured_launches("the GEMVs (no float copy of W, not even for a moment)", [&] {
    gemv_int8(q8.get(), s8.get(), dx8.get(), y8.get(), 45, 384, batch);
    gemv_int4(p4.get(), s4.get(), dx4.get(), y4.get(), 45, 640, 32, batch);
    gemv_int4(pn.get(), sn.get(), dx4.get(), yn.get(), 45, 640, 8, batch);
  });
  if (HasFailure()) return;
  const double atol8 = 1e-5 * std::sqrt(384.0), atol4 = 1e-5 * std::sqrt(640.0);
  EXPECT_TRUE(testing::all_close(reference(m8, x8, batch), Eigen::Map<const Matrix>(y8.download().data(), batch, 45),
                                 atol8, 1e-4, "gemv_int8, replayed from its graph"));
  EXPECT_TRUE(testing::all_close(reference(m4, x4, batch), Eigen::Map<const Matrix>(y4.download().data(), batch, 45),
                                 atol4, 1e-4, "gemv_int4 (groups of 32), replayed from its graph"));
  EXPECT_TRUE(testing::all_close(reference(narrow, x4, batch),
                                 Eigen::Map<const Matrix>(yn.download().data(), batch, 45), atol4, 1e-4,
                                 "gemv_int4 (groups of 8), replayed from its graph"));
}

GRADED_TEST(Lesson11Gpu, BadArgumentsThrowBeforeLaunching, 1) {
  REQUIRE_DEVICE();
  DeviceArray<int8_t> q(64);
  DeviceArray<uint8_t> p(32);
  DeviceArray<float> s(64), x(64), y(64);
  EXPECT_TRUE(
      testing::throws_error_mentioning([&] { gemv_int8(q.get(), s.get(), x.get(), y.get(), 0, 8, 1); }, "rows"));
  EXPECT_TRUE(
      testing::throws_error_mentioning([&] { gemv_int8(q.get(), s.get(), x.get(), y.get(), 8, 8, 0); }, "batch"));
  EXPECT_TRUE(
      testing::throws_error_mentioning([&] { gemv_int8(nullptr, s.get(), x.get(), y.get(), 8, 8, 1); }, "null"));
  EXPECT_TRUE(
      testing::throws_error_mentioning([&] { gemv_int4(p.get(), s.get(), x.get(), y.get(), 2, 32, 12, 1); }, "12"));
  EXPECT_TRUE(
      testing::throws_error_mentioning([&] { gemv_int4(p.get(), s.get(), x.get(), y.get(), 2, 30, 15, 1); }, "15"));
  EXPECT_TRUE(
      testing::throws_error_mentioning([&] { gemv_int4(p.get(), s.get(), x.get(), y.get(), 2, 32, 0, 1); }, "group"));
  EXPECT_TRUE(
      testing::throws_error_mentioning([&] { gemv_int4(p.get(), s.get(), x.get(), y.get(), 2, 32, 32, 0); }, "batch"));
  EXPECT_TRUE(
      testing::throws_error_mentioning([&] { gemv_int4(p.get(), nullptr, x.get(), y.get(), 2, 32, 32, 1); }, "null"));
}

}  // namespace
}  // namespace infer::gpu
