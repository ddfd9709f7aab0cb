// Lesson 00: each op against a plain double-precision reference (reference.hpp).
// Tolerance for float32 against double: |got - ref| <= 1e-5 + 1e-4 * |ref|.
#include <cmath>

#include "common/testing/compare.hpp"
#include "common/testing/graded.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"
#include "reference.hpp"

namespace infer {
namespace {

using testing::all_close;
constexpr double kAtol = 1e-5, kRtol = 1e-4;

GRADED_TEST(Lesson00Ops, RmsNormMatchesReference, 2) {
  const Matrix x = reference::random_matrix(5, 48, 1, 3.0);
  const Vector w = reference::random_matrix(48, 1, 2).col(0);
  const Matrix got = rms_norm(x, w, 1e-5f);
  const Matrix want = reference::to_matrix(reference::rms_norm(reference::to_rows(x), w, 1e-5));
  EXPECT_TRUE(all_close(want, got, kAtol, kRtol, "rms_norm of a [5, 48] input"));
}

GRADED_TEST(Lesson00Ops, RmsNormPutsEpsUnderTheSquareRoot, 1) {
  // A zero row must give zeros (eps keeps the division finite), and a tiny row must be scaled
  // by 1/sqrt(mean + eps), not 1/(sqrt(mean) + eps).
  Matrix x(2, 4);
  x << 0, 0, 0, 0, 1e-3f, -2e-3f, 3e-3f, 1e-3f;
  const Vector w = Vector::Ones(4);
  const Matrix got = rms_norm(x, w, 1e-4f);
  const Matrix want = reference::to_matrix(reference::rms_norm(reference::to_rows(x), w, 1e-4));
  EXPECT_TRUE(all_close(want, got, 1e-6, 1e-4, "rms_norm with eps 1e-4 on a zero row and a tiny row"));
}

GRADED_TEST(Lesson00Ops, RopeMatchesRotateHalfReference, 2) {
  Matrix x = reference::random_matrix(7, 3 * 8, 3);
  const Matrix want = reference::to_matrix(reference::rope(reference::to_rows(x), 8, 5, 10000.0));
  apply_rope(x, 8, 5, 10000.0f);
  EXPECT_TRUE(all_close(want, x, kAtol, kRtol, "apply_rope on 7 rows of 3 heads (head_dim 8) from position 5"));
  // Far out (Llama 3's contexts reach 128K positions) the angle is about 100,000 radians: in float
  // its last digit is worth about 0.008 radians, and cos and sin of it lose the third decimal.
  Matrix far = reference::random_matrix(3, 2 * 64, 4);
  const Matrix far_want = reference::to_matrix(reference::rope(reference::to_rows(far), 64, 100000, 500000.0));
  apply_rope(far, 64, 100000, 500000.0f);
  EXPECT_TRUE(all_close(far_want, far, kAtol, kRtol,
                        "apply_rope at positions 100,000 to 100,002 (head_dim 64, rope_theta 500,000): is the angle "
                        "computed in double?"));
}

GRADED_TEST(Lesson00Ops, RopePairsElementIWithIPlusHalf, 1) {
  // A head with a single 1 at element 0, at position 1: the rotation moves mass into element
  // head_dim/2 (= 4), its rotate-half partner, and nowhere else.
  Matrix x = Matrix::Zero(1, 8);
  x(0, 0) = 1.0f;
  apply_rope(x, 8, 1, 10000.0f);
  EXPECT_NEAR(x(0, 0), std::cos(1.0), 1e-5);
  EXPECT_NEAR(x(0, 4), std::sin(1.0), 1e-5)
      << "element 0 pairs with element head_dim/2 = 4 (Hugging Face's rotate-half layout)";
  EXPECT_NEAR(x(0, 1), 0.0, 1e-6) << "element 1 changed: that is the interleaved (GPT-J) pairing, "
                                     "but the bundled models use rotate-half";
}

GRADED_TEST(Lesson00Ops, RopeScoresDependOnlyOnRelativePosition, 1) {
  // RoPE's point: q at position p and k at position p' score the same as at p+s and p'+s.
  const Matrix q = reference::random_matrix(1, 16, 4), k = reference::random_matrix(1, 16, 5);
  auto score = [&](int pq, int pk) {
    Matrix a = q, b = k;
    apply_rope(a, 16, pq, 10000.0f);
    apply_rope(b, 16, pk, 10000.0f);
    return a.row(0).dot(b.row(0));
  };
  EXPECT_NEAR(score(9, 4), score(109, 104), 1e-3) << "q·k changed when both positions moved by 100";
  EXPECT_GT(std::abs(score(9, 4) - score(9, 8)), 1e-3) << "q·k should change with the distance between positions";
}

GRADED_TEST(Lesson00Ops, AttentionMatchesReferenceMultiHead, 2) {
  const Matrix q = reference::random_matrix(6, 4 * 8, 6), k = reference::random_matrix(6, 4 * 8, 7),
               v = reference::random_matrix(6, 4 * 8, 8);
  const Matrix want = reference::to_matrix(
      reference::attention(reference::to_rows(q), reference::to_rows(k), reference::to_rows(v), 4, 4, 8));
  EXPECT_TRUE(all_close(want, causal_attention(q, k, v, 4, 4, 8), kAtol, kRtol,
                        "causal_attention, 4 heads of 8, 6 tokens"));
}

GRADED_TEST(Lesson00Ops, AttentionSharesKvHeadsAcrossQueryGroups, 2) {
  // 8 query heads over 2 K/V heads: heads 0-3 read K/V head 0, heads 4-7 read K/V head 1.
  const Matrix q = reference::random_matrix(5, 8 * 6, 9), k = reference::random_matrix(5, 2 * 6, 10),
               v = reference::random_matrix(5, 2 * 6, 11);
  const Matrix want = reference::to_matrix(
      reference::attention(reference::to_rows(q), reference::to_rows(k), reference::to_rows(v), 8, 2, 6));
  EXPECT_TRUE(all_close(want, causal_attention(q, k, v, 8, 2, 6), kAtol, kRtol,
                        "grouped-query attention, 8 query heads over 2 K/V heads (query head h reads K/V "
                        "head h / 4)"));
}

GRADED_TEST(Lesson00Ops, AttentionWithMoreKeysThanQueriesEndsAtTheLastKey, 2) {
  // 3 queries, the last 3 tokens of a 10-token sequence: query i sits at position 7 + i.
  const Matrix q = reference::random_matrix(3, 2 * 4, 12), k = reference::random_matrix(10, 1 * 4, 13),
               v = reference::random_matrix(10, 1 * 4, 14);
  const Matrix want = reference::to_matrix(
      reference::attention(reference::to_rows(q), reference::to_rows(k), reference::to_rows(v), 2, 1, 4));
  EXPECT_TRUE(all_close(want, causal_attention(q, k, v, 2, 1, 4), kAtol, kRtol,
                        "3 queries over 10 keys (query row i is at position 10 - 3 + i)"));
}

GRADED_TEST(Lesson00Ops, AttentionNeverLooksAhead, 1) {
  const Matrix q = reference::random_matrix(6, 8, 15), k = reference::random_matrix(6, 8, 16);
  Matrix v = reference::random_matrix(6, 8, 17);
  const Matrix before = causal_attention(q, k, v, 2, 2, 4);
  Matrix k2 = k;
  k2.row(5).setConstant(50.0f);  // change the last token only
  v.row(5).setConstant(-50.0f);
  const Matrix after = causal_attention(q, k2, v, 2, 2, 4);
  EXPECT_TRUE(all_close(before.topRows(5), after.topRows(5), 0, 0,
                        "rows 0-4 after changing token 5's key and value (a causal model cannot see the future)"));
}

GRADED_TEST(Lesson00Ops, AttentionIsStableOnHugeScores, 1) {
  // Scores in the thousands: exp() of them overflows float (inf / inf = NaN) unless each row's
  // largest score is subtracted first, which changes nothing mathematically.
  const Matrix q = reference::random_matrix(4, 2 * 8, 18, 40.0), k = reference::random_matrix(4, 1 * 8, 19, 40.0),
               v = reference::random_matrix(4, 1 * 8, 20);
  const Matrix got = causal_attention(q, k, v, 2, 1, 8);
  ASSERT_TRUE(got.allFinite()) << "causal_attention returned inf or NaN for scores in the thousands: subtract each "
                                  "row's maximum score before exp()";
  const Matrix want = reference::to_matrix(
      reference::attention(reference::to_rows(q), reference::to_rows(k), reference::to_rows(v), 2, 1, 8));
  EXPECT_TRUE(all_close(want, got, kAtol, kRtol, "causal_attention with scores in the thousands"));
}

GRADED_TEST(Lesson00Ops, SwigluMatchesReference, 2) {
  ModelConfig c;
  c.vocab_size = 10, c.hidden_size = 24, c.intermediate_size = 40, c.num_hidden_layers = 1;
  c.num_attention_heads = 2, c.num_key_value_heads = 2, c.head_dim = 12, c.max_position_embeddings = 16;
  const ModelWeights m = random_model(c, 18);
  const Matrix x = reference::random_matrix(4, 24, 19);
  const Matrix want = reference::to_matrix(reference::swiglu(reference::to_rows(x), m.layers[0]));
  EXPECT_TRUE(all_close(want, swiglu_mlp(x, m.layers[0]), kAtol, kRtol, "swiglu_mlp, hidden 24 -> 40 -> 24"));
}

}  // namespace
}  // namespace infer
