// Lesson 08, the CPU side (graded on every machine): split ranges, partial attention with its
// log-sum-exp, and the exact merge that flash decoding rests on. The reference is lesson 00's
// attention (the last position of causal_attention is decode attention), and a log-sum-exp
// computed in double. Tolerance: 1e-5 + 1e-4 |ref| for outputs, 1e-4 + 1e-5 |ref| for lse.
#include <cmath>
#include <limits>
#include <vector>

#include "common/rng.hpp"
#include "common/testing/compare.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/throws.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"
#include "lessons/08_cuda_paged_attention/flash_decoding.hpp"

namespace infer::gpu {
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

/// Decode attention of q over all of k and v: lesson 00's causal attention, last row.
Matrix decode_reference(const Vector& q, const Matrix& k, const Matrix& v, int heads, int kv_heads, int head_dim) {
  const Matrix all = causal_attention(q.transpose(), k, v, heads, kv_heads, head_dim);  // one query at the end
  Matrix out(heads, head_dim);
  for (int h = 0; h < heads; ++h) out.row(h) = all.row(0).segment(static_cast<long>(h) * head_dim, head_dim);
  return out;
}

/// log(sum over [begin, end) of exp(q.k / sqrt(d))) for head h, in double.
double lse_reference(const Vector& q, const Matrix& k, int begin, int end, int h, int group, int head_dim) {
  std::vector<double> s;
  const long col = static_cast<long>(h / group) * head_dim;
  for (int p = begin; p < end; ++p) {
    double dot = 0;
    for (int d = 0; d < head_dim; ++d) dot += double(q[static_cast<long>(h) * head_dim + d]) * k(p, col + d);
    s.push_back(dot / std::sqrt(double(head_dim)));
  }
  double m = -INFINITY;
  for (double x : s) m = std::max(m, x);
  double sum = 0;
  for (double x : s) sum += std::exp(x - m);
  return m + std::log(sum);
}

struct Shape {
  int heads, kv_heads, head_dim;
};
const Shape kShapes[] = {{1, 1, 16}, {4, 4, 24}, {8, 4, 16}, {8, 2, 24}, {8, 1, 16}, {6, 3, 8}};

GRADED_TEST(Lesson08Cpu, SplitRangesCoverTheSequenceInOrder, 2) {
  for (int length = 0; length <= 70; ++length) {
    for (int splits = 1; splits <= 80; ++splits) {
      const int chunk = (length + splits - 1) / splits;
      int at = 0;
      for (int s = 0; s < splits; ++s) {
        const PositionRange r = split_range(length, splits, s);
        SCOPED_TRACE(cat("length ", length, ", ", splits, " splits, split ", s));
        ASSERT_EQ(r.begin, std::min(s * chunk, length));
        ASSERT_EQ(r.begin, at) << "the ranges must follow each other with no gap or overlap";
        ASSERT_GE(r.end, r.begin);
        ASSERT_EQ(r.end, std::min((s + 1) * chunk, length));
        at = r.end;
      }
      ASSERT_EQ(at, length) << "the ranges must cover every position: length " << length << ", " << splits << " splits";
    }
  }
  // No int overflow at the largest length: (split + 1) * chunk passes 2^31 - 1 here.
  const int huge = std::numeric_limits<int>::max();
  const PositionRange last = split_range(huge, 2, 1);
  EXPECT_EQ(last.begin, 1073741824);
  EXPECT_EQ(last.end, huge);
  EXPECT_TRUE(throws_error_mentioning([] { split_range(-1, 2, 0); }, "-1"));
  EXPECT_TRUE(throws_error_mentioning([] { split_range(10, 0, 0); }, "num_splits"));
  EXPECT_TRUE(throws_error_mentioning([] { split_range(10, 4, 4); }, "4"));
  EXPECT_TRUE(throws_error_mentioning([] { split_range(10, 4, -1); }, "-1"));
}

GRADED_TEST(Lesson08Cpu, APartialOverTheWholeSequenceIsAttention, 2) {
  for (const Shape s : kShapes) {
    for (int length : {1, 2, 7, 33}) {
      SCOPED_TRACE(cat(s.heads, "/", s.kv_heads, " heads of ", s.head_dim, ", ", length, " positions"));
      const int kvd = s.kv_heads * s.head_dim;
      const Vector q = random_matrix(s.heads * s.head_dim, 1, 1 + length).col(0);
      const Matrix k = random_matrix(length, kvd, 2 + length), v = random_matrix(length, kvd, 3 + length);
      const AttentionPartial p = attention_partial(q, k, v, {0, length}, s.heads, s.kv_heads, s.head_dim);
      ASSERT_EQ(p.out.rows(), s.heads);
      ASSERT_EQ(p.out.cols(), s.head_dim);
      ASSERT_EQ(p.lse.size(), s.heads);
      ASSERT_TRUE(testing::all_close(decode_reference(q, k, v, s.heads, s.kv_heads, s.head_dim), p.out, 1e-5, 1e-4,
                                     "the partial's output over every position"));
      for (int h = 0; h < s.heads; ++h) {
        const double want = lse_reference(q, k, 0, length, h, s.heads / s.kv_heads, s.head_dim);
        ASSERT_NEAR(p.lse[h], want, 1e-4 + 1e-5 * std::abs(want)) << "lse of head " << h;
      }
      // A range in the middle: its own softmax, its own lse.
      if (length >= 7) {
        const AttentionPartial mid = attention_partial(q, k, v, {2, 5}, s.heads, s.kv_heads, s.head_dim);
        const Matrix ks = k.middleRows(2, 3), vs = v.middleRows(2, 3);
        ASSERT_TRUE(testing::all_close(decode_reference(q, ks, vs, s.heads, s.kv_heads, s.head_dim), mid.out, 1e-5,
                                       1e-4, "the partial over positions [2, 5)"));
        const double want = lse_reference(q, k, 2, 5, 0, s.heads / s.kv_heads, s.head_dim);
        ASSERT_NEAR(mid.lse[0], want, 1e-4 + 1e-5 * std::abs(want)) << "lse over [2, 5)";
      }
    }
  }
}

GRADED_TEST(Lesson08Cpu, AnEmptyRangeIsZerosAndMinusInfinity, 1) {
  const Vector q = random_matrix(8 * 16, 1, 5).col(0);
  const Matrix k = random_matrix(9, 2 * 16, 6), v = random_matrix(9, 2 * 16, 7);
  for (int at : {0, 4, 9}) {
    const AttentionPartial p = attention_partial(q, k, v, {at, at}, 8, 2, 16);
    ASSERT_EQ(p.out.rows(), 8);
    ASSERT_EQ(p.out.cols(), 16);
    EXPECT_TRUE(p.out.isZero(0)) << "an empty range's output must be zeros, at " << at;
    for (int h = 0; h < 8; ++h) EXPECT_EQ(p.lse[h], -kInf) << "an empty range's lse must be -infinity";
  }
}

GRADED_TEST(Lesson08Cpu, MergedPartialsEqualUnsplitForEverySplitCount, 3) {
  for (const Shape s : kShapes) {
    for (int length : {1, 5, 17, 64, 100}) {
      const int kvd = s.kv_heads * s.head_dim;
      const Vector q = random_matrix(s.heads * s.head_dim, 1, 11 + length).col(0);
      const Matrix k = random_matrix(length, kvd, 12 + length), v = random_matrix(length, kvd, 13 + length);
      const Matrix want = decode_reference(q, k, v, s.heads, s.kv_heads, s.head_dim);
      for (int splits = 1; splits <= length + 3; splits += (splits < 12 ? 1 : 7)) {
        SCOPED_TRACE(cat(s.heads, "/", s.kv_heads, " heads of ", s.head_dim, ", ", length, " positions, ", splits,
                         " splits"));
        std::vector<AttentionPartial> parts;
        for (int i = 0; i < splits; ++i)
          parts.push_back(attention_partial(q, k, v, split_range(length, splits, i), s.heads, s.kv_heads, s.head_dim));
        const AttentionPartial merged = merge_partials(parts);
        ASSERT_TRUE(testing::all_close(want, merged.out, 1e-5, 1e-4, "the merge of every split"));
        for (int h = 0; h < s.heads; ++h) {
          const double lse = lse_reference(q, k, 0, length, h, s.heads / s.kv_heads, s.head_dim);
          ASSERT_NEAR(merged.lse[h], lse, 1e-4 + 1e-5 * std::abs(lse)) << "the merged lse of head " << h;
        }
        // The order of the partials does not matter.
        std::vector<AttentionPartial> reversed(parts.rbegin(), parts.rend());
        ASSERT_TRUE(testing::all_close(want, merge_partials(reversed).out, 1e-5, 1e-4, "the merge in reverse order"));
      }
    }
  }
}

GRADED_TEST(Lesson08Cpu, TheMergeIsStableForHugeScores, 2) {
  // Scores near 400: exp() of them is infinite in float, so both the partial and the merge must
  // subtract a maximum first. Scores within a range differ by multiples of 5 (they mix); the last
  // range sits 100 lower (it weighs nothing). Every score is exact in float; an lse near 400 is
  // held to float's 3e-5, so the tolerance here is 1e-5 + 1e-3 |ref|.
  const int heads = 2, head_dim = 4, length = 12;
  Vector q(heads * head_dim);
  q << 40, 0, 0, 0, 0, 40, 0, 0;
  Matrix k = Matrix::Zero(length, head_dim), v = random_matrix(length, head_dim, 21);
  for (int p = 0; p < length; ++p) {
    k(p, 0) = 20.0f + 0.25f * (p % 4), k(p, 1) = 19.75f - 0.25f * (p % 3);  // scores 20 k: 390 to 405
    if (p >= 8) k(p, 0) -= 5.0f, k(p, 1) -= 5.0f;                              // the last range 100 lower
  }
  const Matrix want = decode_reference(q, k, v, heads, 1, head_dim);
  ASSERT_TRUE(want.allFinite()) << "the reference itself must be finite";
  std::vector<AttentionPartial> parts;
  for (int i = 0; i < 3; ++i) parts.push_back(attention_partial(q, k, v, split_range(length, 3, i), heads, 1, head_dim));
  for (const AttentionPartial& p : parts) {
    ASSERT_TRUE(p.out.allFinite()) << "a partial over huge scores must be finite";
    ASSERT_TRUE(p.lse.allFinite()) << "a partial's lse over huge scores must be finite";
  }
  const double lse0 = lse_reference(q, k, 0, 4, 0, 2, head_dim);
  EXPECT_NEAR(parts[0].lse[0], lse0, 1e-4 + 1e-5 * std::abs(lse0));
  const AttentionPartial merged = merge_partials(parts);
  ASSERT_TRUE(merged.out.allFinite() && merged.lse.allFinite()) << "the merge of huge lse values must be finite";
  EXPECT_TRUE(testing::all_close(want, merged.out, 1e-5, 1e-3, "the merge of partials with lse near 400"));
}

GRADED_TEST(Lesson08Cpu, EmptyPartialsWeighNothing, 1) {
  const Vector q = random_matrix(4 * 8, 1, 31).col(0);
  const Matrix k = random_matrix(6, 2 * 8, 32), v = random_matrix(6, 2 * 8, 33);
  const AttentionPartial full = attention_partial(q, k, v, {0, 6}, 4, 2, 8);
  const AttentionPartial empty = attention_partial(q, k, v, {6, 6}, 4, 2, 8);
  const std::vector<AttentionPartial> with_empties{empty, full, empty, empty};
  const AttentionPartial merged = merge_partials(with_empties);
  EXPECT_TRUE(testing::all_close(full.out, merged.out, 1e-6, 1e-6, "one partial merged with empty ones"));
  EXPECT_TRUE(testing::all_close(full.lse, merged.lse, 1e-6, 1e-6, "its lse"));
  const std::vector<AttentionPartial> only_empties{empty, empty};
  const AttentionPartial nothing = merge_partials(only_empties);
  EXPECT_TRUE(nothing.out.isZero(0)) << "merging only empty partials must give zeros, never NaN";
  for (int h = 0; h < 4; ++h) EXPECT_EQ(nothing.lse[h], -kInf) << "and an lse of -infinity";
}

GRADED_TEST(Lesson08Cpu, BadShapesAreRefused, 1) {
  const Vector q = random_matrix(8 * 16, 1, 41).col(0);
  const Matrix k = random_matrix(9, 2 * 16, 42), v = random_matrix(9, 2 * 16, 43);
  EXPECT_TRUE(throws_error_mentioning([&] { attention_partial(q, k, v, {0, 10}, 8, 2, 16); }, "range"));
  EXPECT_TRUE(throws_error_mentioning([&] { attention_partial(q, k, v, {5, 4}, 8, 2, 16); }, "range"));
  // Each call breaks one rule only, so the order of the checks does not matter.
  const Matrix k3 = random_matrix(9, 3 * 16, 45), v3 = random_matrix(9, 3 * 16, 46);
  EXPECT_TRUE(throws_error_mentioning([&] { attention_partial(q, k3, v3, {0, 9}, 8, 3, 16); }, "heads"));
  const Vector q0 = random_matrix(4, 1, 47).col(0);
  const Matrix k0 = random_matrix(9, 0, 48);
  EXPECT_TRUE(throws_error_mentioning([&] { attention_partial(q0, k0, k0, {0, 9}, 4, 0, 1); }, "heads"));
  const Vector no_q(0);  // heads x head_dim = 0 values: only head_dim is wrong
  EXPECT_TRUE(throws_error_mentioning([&] { attention_partial(no_q, k0, k0, {0, 9}, 4, 1, 0); }, "head_dim"));
  const Vector short_q = random_matrix(4 * 16, 1, 49).col(0);
  EXPECT_TRUE(throws_error_mentioning([&] { attention_partial(short_q, k, v, {0, 9}, 8, 2, 16); }, "query"));
  const Matrix narrow = random_matrix(9, 16, 44);
  EXPECT_TRUE(throws_error_mentioning([&] { attention_partial(q, narrow, v, {0, 9}, 8, 2, 16); }, "key width"));
  EXPECT_TRUE(throws_error_mentioning([&] { attention_partial(q, k, narrow, {0, 9}, 8, 2, 16); }, "value width"));
  const Matrix few = random_matrix(5, 2 * 16, 50);
  EXPECT_TRUE(throws_error_mentioning([&] { attention_partial(q, k, few, {0, 5}, 8, 2, 16); }, "rows"));
  EXPECT_TRUE(throws_error_mentioning([] { merge_partials({}); }, "no partials"));
  const AttentionPartial a = attention_partial(q, k, v, {0, 9}, 8, 2, 16);
  const AttentionPartial b{Matrix::Zero(4, 16), Vector::Zero(4)};
  const std::vector<AttentionPartial> mixed{a, b};
  EXPECT_TRUE(throws_error_mentioning([&] { merge_partials(mixed); }, "partial 1"));
  const AttentionPartial short_lse{a.out, a.lse.head(5)};  // the outputs agree, the lse does not
  const std::vector<AttentionPartial> short_second{a, short_lse};
  EXPECT_TRUE(throws_error_mentioning([&] { merge_partials(short_second); }, "partial 1"))
      << "a partial whose lse has 5 rows where its output has 8";
}

}  // namespace
}  // namespace infer::gpu
