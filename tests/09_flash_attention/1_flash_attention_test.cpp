// Lesson 09, the CPU side: the online softmax against the two-pass softmax, and tiled attention
// against lesson 00's causal_attention (tolerance 1e-5 + 1e-4 |ref|), for tiles that do and do not
// divide the sequence, prefills with and without a cache before them, and grouped-query shapes.
// The lesson's point is checked too: the scratch a call allocates does not grow with the
// sequence, so computing the whole score matrix (or a row of it per query) loses points.
#include <cmath>
#include <limits>
#include <vector>

#include "common/rng.hpp"
#include "common/testing/allocations.hpp"
#include "common/testing/compare.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/page_reads.hpp"
#include "common/testing/throws.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"
#include "lessons/09_flash_attention/flash_attention.hpp"

namespace infer {
namespace {

using testing::throws_error_mentioning;
constexpr float kInf = std::numeric_limits<float>::infinity();

Matrix random_matrix(long rows, long cols, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  Matrix m(rows, cols);
  for (long r = 0; r < rows; ++r)
    for (long c = 0; c < cols; ++c) m(r, c) = static_cast<float>(rng.normal() * scale);
  return m;
}

/// The two-pass softmax, in double.
Vector softmax_reference(const Vector& x) {
  double m = -INFINITY, sum = 0;
  for (float v : x) m = std::max(m, double(v));
  for (float v : x) sum += std::exp(double(v) - m);
  Vector out(x.size());
  for (Eigen::Index i = 0; i < x.size(); ++i) out[i] = static_cast<float>(std::exp(double(x[i]) - m) / sum);
  return out;
}

GRADED_TEST(Lesson09Softmax, AddKeepsTheMaxAndTheRescaledSum, 2) {
  OnlineSoftmax s;
  s.add(1.0f);
  EXPECT_EQ(s.max, 1.0f);
  EXPECT_NEAR(s.sum, 1.0f, 1e-7);
  s.add(3.0f);  // a new max: the old sum is rescaled by exp(1 - 3)
  EXPECT_EQ(s.max, 3.0f);
  EXPECT_NEAR(s.sum, std::exp(-2.0f) + 1.0f, 1e-6);
  s.add(2.0f);  // below the max: adds exp(2 - 3)
  EXPECT_EQ(s.max, 3.0f);
  EXPECT_NEAR(s.sum, std::exp(-2.0f) + 1.0f + std::exp(-1.0f), 1e-6);
  s.add(-kInf);  // a masked score adds nothing
  EXPECT_NEAR(s.sum, std::exp(-2.0f) + 1.0f + std::exp(-1.0f), 1e-6);
  OnlineSoftmax first_masked;  // -infinity into an empty state: still empty (-inf - -inf is NaN)
  first_masked.add(-kInf);
  EXPECT_EQ(first_masked.max, -kInf);
  EXPECT_EQ(first_masked.sum, 0.0f) << "add(-infinity) on an empty state must add nothing, not NaN";
  first_masked.add(2.0f);
  EXPECT_EQ(first_masked.max, 2.0f);
  EXPECT_NEAR(first_masked.sum, 1.0f, 1e-7) << "an empty state that saw -infinity, then 2";
  OnlineSoftmax huge;  // scores whose exp overflows float: never exponentiated
  for (float x : {1000.0f, 2000.0f, 2000.0f, -3000.0f}) huge.add(x);
  EXPECT_EQ(huge.max, 2000.0f);
  EXPECT_NEAR(huge.sum, 2.0f, 1e-6);
  EXPECT_TRUE(std::isfinite(huge.sum));
}

GRADED_TEST(Lesson09Softmax, MergeEqualsOneStream, 2) {
  const Matrix xs = random_matrix(1, 40, 3, 5.0);
  for (int cut = 0; cut <= 40; cut += 5) {
    OnlineSoftmax a, b, all;
    for (int i = 0; i < 40; ++i) (i < cut ? a : b).add(xs(0, i)), all.add(xs(0, i));
    OnlineSoftmax ab = a;
    ab.merge(b);
    OnlineSoftmax ba = b;
    ba.merge(a);
    SCOPED_TRACE(cat("cut at ", cut));
    EXPECT_EQ(ab.max, all.max);
    EXPECT_NEAR(ab.sum, all.sum, 1e-5 * all.sum);
    EXPECT_EQ(ba.max, all.max);
    EXPECT_NEAR(ba.sum, all.sum, 1e-5 * all.sum);
  }
  OnlineSoftmax empty, one;
  one.add(500.0f);
  OnlineSoftmax copy = empty;
  copy.merge(one);
  EXPECT_EQ(copy.max, 500.0f);
  EXPECT_EQ(copy.sum, 1.0f);
  one.merge(empty);
  EXPECT_EQ(one.max, 500.0f);
  EXPECT_EQ(one.sum, 1.0f) << "merging an empty state changes nothing";
  OnlineSoftmax nothing;
  nothing.merge(empty);  // two empty states: still empty, never NaN
  EXPECT_EQ(nothing.max, -kInf);
  EXPECT_EQ(nothing.sum, 0.0f);
}

GRADED_TEST(Lesson09Softmax, OnlineSoftmaxEqualsSoftmax, 2) {
  std::vector<Vector> rows;
  rows.push_back(random_matrix(1, 50, 1).row(0).transpose());
  rows.push_back((random_matrix(1, 50, 2, 1.0).array() + 5000.0f).matrix().row(0).transpose());  // huge
  rows.push_back((random_matrix(1, 50, 3, 1e-6).array() - 1e-3f).matrix().row(0).transpose());  // tiny, near equal
  rows.push_back(Vector::Constant(37, 4.25f));                                                   // all equal
  Vector spiky = Vector::Constant(20, -300.0f);
  spiky[13] = 300.0f;  // exp(600) would overflow
  rows.push_back(spiky);
  rows.push_back(Vector::Constant(1, -7.0f));
  for (size_t i = 0; i < rows.size(); ++i) {
    const Vector got = online_softmax(rows[i]);
    ASSERT_TRUE(got.allFinite()) << "row " << i;
    ASSERT_TRUE(testing::all_close(softmax_reference(rows[i]), got, 1e-6, 1e-5, cat("softmax of row ", i)));
  }
  EXPECT_TRUE(throws_error_mentioning([] { online_softmax(Vector()); }, "empty"));
}

struct Case {
  int T, S, heads, kv_heads, head_dim, tile_q, tile_k;
};

GRADED_TEST(Lesson09Tiled, TiledAttentionEqualsCausalAttention, 4) {
  const Case cases[] = {
      {1, 1, 1, 1, 8, 1, 1},      {7, 7, 2, 1, 8, 4, 4},      {16, 16, 4, 2, 16, 4, 8},  // tiles dividing T
      {33, 33, 4, 4, 24, 8, 16},  {50, 50, 8, 2, 16, 7, 5},   {64, 64, 2, 2, 32, 64, 64},
      {5, 40, 4, 1, 16, 3, 6},    {1, 90, 6, 3, 8, 4, 32},    {20, 83, 8, 8, 8, 16, 16},   // a cache before the prompt
      {13, 13, 2, 1, 16, 100, 3}, {9, 30, 2, 1, 16, 2, 100},                               // tiles larger than it all
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(cat("T ", c.T, ", S ", c.S, ", ", c.heads, "/", c.kv_heads, " heads of ", c.head_dim, ", tiles ",
                     c.tile_q, " x ", c.tile_k));
    const Matrix q = random_matrix(c.T, c.heads * c.head_dim, 10 + c.T);
    const Matrix k = random_matrix(c.S, c.kv_heads * c.head_dim, 20 + c.S);
    const Matrix v = random_matrix(c.S, c.kv_heads * c.head_dim, 30 + c.S);
    const Matrix want = causal_attention(q, k, v, c.heads, c.kv_heads, c.head_dim);
    const Matrix got = tiled_attention(q, k, v, c.heads, c.kv_heads, c.head_dim, c.tile_q, c.tile_k);
    ASSERT_EQ(got.rows(), want.rows());
    ASSERT_EQ(got.cols(), want.cols());
    ASSERT_TRUE(testing::all_close(want, got, 1e-5, 1e-4, "tiled_attention against causal_attention"));
  }
}

GRADED_TEST(Lesson09Tiled, LargeScoresStayFinite, 1) {
  // Scores in the hundreds: exp() of them overflows, the online softmax never takes it.
  const Matrix q = random_matrix(24, 2 * 16, 41, 8.0), k = random_matrix(24, 16, 42, 8.0);
  const Matrix v = random_matrix(24, 16, 43);
  const Matrix want = causal_attention(q, k, v, 2, 1, 16);
  const Matrix got = tiled_attention(q, k, v, 2, 1, 16, 5, 7);
  ASSERT_TRUE(got.allFinite());
  EXPECT_TRUE(testing::all_close(want, got, 1e-5, 1e-4, "tiled attention with scores in the hundreds"));
  // Every score far below zero (-200: exp of it is 0 in float): a running max that starts at 0
  // instead of -infinity never rises to the scores, every exp(s - m) underflows, l stays 0 and
  // out = 0 / 0.
  const Matrix q_low = Matrix::Constant(6, 2 * 4, 10.0f), k_low = Matrix::Constant(6, 4, -10.0f);
  const Matrix v_low = random_matrix(6, 4, 44);
  const Matrix want_low = causal_attention(q_low, k_low, v_low, 2, 1, 4);
  const Matrix got_low = tiled_attention(q_low, k_low, v_low, 2, 1, 4, 2, 3);
  ASSERT_TRUE(got_low.allFinite()) << "every score is -200: the running max must start at -infinity";
  EXPECT_TRUE(testing::all_close(want_low, got_low, 1e-5, 1e-4, "tiled attention with every score -200"));
}

GRADED_TEST(Lesson09Tiled, ScratchDoesNotGrowWithTheSequence, 3) {
  // The lesson's point. Extra heap bytes (all the call allocates, less its result) at 256 and at
  // 1,024 positions, with the same tiles: a tiled call's scratch is the same for both. A call that
  // builds the T x S scores (or a row of S scores per query, or a new scratch per tile) allocates
  // more at 1,024, and loses these points. The same at 2 and at 8 query heads (the scratch is
  // allocated once per call, not once per head), and the tiles are the ones asked for: 64 x 64
  // tiles hold 16 KB of scores, 8 x 8 tiles 256 bytes.
  if (!testing::AllocationCounter::available()) GTEST_SKIP() << "allocation counting is off in this build";
  auto extra_bytes = [](int n, int heads, int tile) {
    const Matrix q = random_matrix(n, heads * 16, 51), k = random_matrix(n, 16, 52), v = random_matrix(n, 16, 53);
    testing::AllocationCounter counter;
    const Matrix out = tiled_attention(q, k, v, heads, 1, 16, tile, tile);
    const size_t result = sizeof(float) * out.size();
    return counter.bytes() - std::min(counter.bytes(), result);
  };
  const size_t small = extra_bytes(256, 2, 32), large = extra_bytes(1024, 2, 32);
  EXPECT_LE(large, small + 1024) << "heap bytes the call allocated (all of them, freed or not), less its result: "
                                 << large << " at 1,024 positions, " << small << " at 256; the scratch must not "
                                 << "depend on the sequence's length, and must be allocated once per call";
  EXPECT_LT(large, 64u << 10) << "a call with 32 x 32 tiles and head_dim 16 needs far less than 64 KiB of scratch";
  const size_t more_heads = extra_bytes(256, 8, 32);
  EXPECT_LE(more_heads, small + 1024) << "heap bytes less the result: " << more_heads << " with 8 query heads, "
                                      << small << " with 2; the scratch is allocated once per call, not per head";
  const size_t narrow = extra_bytes(256, 2, 8), wide = extra_bytes(256, 2, 64);
  EXPECT_LE(narrow + 8192, wide) << "heap bytes less the result: " << narrow << " with 8 x 8 tiles, " << wide
                                 << " with 64 x 64 (whose scores alone are 16 KB): the call must compute in the "
                                 << "tiles tile_q and tile_k ask for";
}

GRADED_TEST(Lesson09Tiled, KeyTilesPastTheDiagonalAreSkipped, 1) {
  // Causality halves a prefill's work only if a query tile never touches the key tiles after its
  // last position. No output shows it; the reads of K do. A prompt of 1,024 tokens in tiles of
  // 64: 16 query tiles, each seeing 1 to 16 key tiles of 64 rows (64 KB of K each, at head_dim
  // 256). K's pages are watched (common/testing/page_reads.hpp, a working set of 32 pages): a
  // call that skips fetches K's pages about 8.5 times over (136 tile pairs of 256; the reference
  // 8.3), one that computes every tile and masks it 16 times.
  const int n = 1024, d = 256, tile = 64;
  const Matrix q = random_matrix(n, d, 71), k = random_matrix(n, d, 72), v = random_matrix(n, d, 73);
  double passes = 0;
  Matrix got;
  {
    testing::PageReadCounter reads(k.data(), sizeof(float) * k.size());
    got = tiled_attention(q, k, v, 1, 1, d, tile, tile);
    passes = reads.passes();
  }
  const double every_tile = n / tile;  // each query tile walking all of K
  EXPECT_LE(passes, 0.6 * every_tile) << "K was walked " << passes << " times; a call that computes every key tile "
                                      << "walks it " << every_tile << " times, one that skips those past each query "
                                      << "tile's last position about " << (every_tile + 1) / 2;
  EXPECT_TRUE(testing::all_close(causal_attention(q, k, v, 1, 1, d), got, 1e-5, 1e-4, "1,024 tokens in tiles of 64"));
}

GRADED_TEST(Lesson09Tiled, BadArgumentsAreRefused, 1) {
  const Matrix q = random_matrix(4, 32, 61), k = random_matrix(6, 16, 62), v = random_matrix(6, 16, 63);
  EXPECT_TRUE(throws_error_mentioning([&] { tiled_attention(q, k, v, 2, 1, 16, 0, 4); }, "tile_q"));
  EXPECT_TRUE(throws_error_mentioning([&] { tiled_attention(q, k, v, 2, 1, 16, 4, 0); }, "tile_k"));
  EXPECT_TRUE(throws_error_mentioning([&] { tiled_attention(q, k, v, 3, 2, 16, 4, 4); }, "kv_heads"));
  EXPECT_TRUE(throws_error_mentioning([&] { tiled_attention(q, k, v, 4, 1, 16, 4, 4); }, "query width"));
  const Matrix narrow = random_matrix(6, 8, 66);
  EXPECT_TRUE(throws_error_mentioning([&] { tiled_attention(q, narrow, v, 2, 1, 16, 4, 4); }, "key width"));
  EXPECT_TRUE(throws_error_mentioning([&] { tiled_attention(q, k, narrow, 2, 1, 16, 4, 4); }, "value width"));
  const Matrix short_k = random_matrix(3, 16, 64), short_v = random_matrix(3, 16, 65);
  EXPECT_TRUE(throws_error_mentioning([&] { tiled_attention(q, short_k, short_v, 2, 1, 16, 4, 4); }, "rows"));
  const Matrix shorter_v = random_matrix(5, 16, 67);  // 6 keys, 5 values
  EXPECT_TRUE(throws_error_mentioning([&] { tiled_attention(q, k, shorter_v, 2, 1, 16, 4, 4); }, "rows"))
      << "k with 6 rows, v with 5";
}

}  // namespace
}  // namespace infer
