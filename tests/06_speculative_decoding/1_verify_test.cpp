// Lesson 06, part A: the acceptance rule on its own, without a model. Greedy verification by
// hand, and exact speculative sampling checked by its output distribution: many seeded rounds,
// a chi-square test against the target's p.
#include <cmath>
#include <vector>

#include "common/testing/compare.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/throws.hpp"
#include "lessons/06_speculative_decoding/speculative.hpp"
#include "tests/06_speculative_decoding/chi_square.hpp"

namespace infer {
namespace {

using testing::chi_square;
using testing::vec;

Matrix rows(std::initializer_list<Vector> vs) {
  Matrix m(static_cast<Eigen::Index>(vs.size()), vs.begin()->size());
  Eigen::Index i = 0;
  for (const Vector& v : vs) m.row(i++) = v.transpose();
  return m;
}

// Five tokens: four degrees of freedom.
const double kChi2Df4At001 = testing::chi_square_critical_001(4);

GRADED_TEST(Lesson06Verify, TheResidualIsThePositivePartOfPMinusQNormalized, 1) {
  const Vector r = residual_distribution(vec({0.5f, 0.3f, 0.2f, 0.0f}), vec({0.1f, 0.5f, 0.2f, 0.2f}));
  EXPECT_NEAR(r[0], 1.0f, 1e-6f) << "only token 0 has p > q";
  EXPECT_NEAR(r.sum(), 1.0f, 1e-6f);
  const Vector r2 = residual_distribution(vec({0.4f, 0.4f, 0.2f}), vec({0.2f, 0.2f, 0.6f}));
  EXPECT_NEAR(r2[0], 0.5f, 1e-6f);
  EXPECT_NEAR(r2[1], 0.5f, 1e-6f);
  EXPECT_EQ(r2[2], 0.0f);
  const Vector same = residual_distribution(vec({0.25f, 0.75f}), vec({0.25f, 0.75f}));
  EXPECT_NEAR(same[1], 0.75f, 1e-6f) << "p = q: nothing is left, so p itself";
  EXPECT_TRUE(testing::throws_error_mentioning([] { residual_distribution(vec({1.0f}), vec({0.5f, 0.5f})); }, "entries"));
  EXPECT_TRUE(testing::throws_error_mentioning([] { residual_distribution(vec({1.5f, -0.5f}), vec({0.5f, 0.5f})); }, ">= 0"));
}

GRADED_TEST(Lesson06Verify, GreedyKeepsGuessesWhileTheyAreTheTargetsArgmax, 2) {
  // Four rows of logits over five tokens; argmaxes 3, 1, 4, 0.
  const Matrix logits = rows({vec({0, 1, 2, 9, 0}), vec({0, 8, 2, 1, 0}), vec({0, 1, 2, 1, 7}), vec({6, 1, 2, 1, 0})});
  Verdict v = verify_greedy(logits, std::vector<int>{3, 1, 4});
  EXPECT_EQ(v.accepted, 3);
  EXPECT_EQ(v.next_token, 0) << "all kept: the bonus is the last row's argmax";
  v = verify_greedy(logits, std::vector<int>{3, 2, 4});
  EXPECT_EQ(v.accepted, 1);
  EXPECT_EQ(v.next_token, 1) << "rejected at the second guess: the target's own choice there";
  v = verify_greedy(logits, std::vector<int>{0, 1, 4});
  EXPECT_EQ(v.accepted, 0) << "a wrong first guess ends the round, even if later ones match";
  EXPECT_EQ(v.next_token, 3);
  v = verify_greedy(logits.topRows(1), std::vector<int>{});
  EXPECT_EQ(v.accepted, 0);
  EXPECT_EQ(v.next_token, 3) << "no guesses: one plain greedy token";
  EXPECT_TRUE(testing::throws_error_mentioning([&] { verify_greedy(logits, std::vector<int>{3, 1}); }, "rows"));
}

/// Rounds of k = 2 with a target and a draft that do not depend on the context: the target's
/// rows p0, p1, p2 and the draft's q0, q1 are the same in every round, and different from each
/// other. The first token emitted must follow p0; the second (when the first guess was kept)
/// p1; the third (when both were kept: the bonus) p2.
struct Emitted {
  std::vector<long> first, second, third;
  long rounds = 0, kept_first = 0;
};

Emitted run_rounds(const Matrix& P, const Matrix& Q, int trials, uint64_t seed) {
  const int V = static_cast<int>(P.cols());
  Emitted e{std::vector<long>(V), std::vector<long>(V), std::vector<long>(V)};
  Rng draft_rng(seed), verify_rng(seed + 1);
  for (int t = 0; t < trials; ++t) {
    const std::vector<int> guess = {sample_from(Q.row(0).transpose(), draft_rng.uniform()),
                                    sample_from(Q.row(1).transpose(), draft_rng.uniform())};
    const Verdict v = verify_sampled(P, Q, guess, verify_rng);
    ++e.rounds;
    if (v.accepted == 0) {
      ++e.first[v.next_token];
      continue;
    }
    ++e.kept_first;
    ++e.first[guess[0]];
    if (v.accepted == 1) {
      ++e.second[v.next_token];
      continue;
    }
    ++e.second[guess[1]];
    ++e.third[v.next_token];
  }
  return e;
}

GRADED_TEST(Lesson06Verify, SampledOutputFollowsTheTargetWithACloseDraft, 3) {
  const Matrix P = rows({vec({0.35f, 0.25f, 0.2f, 0.15f, 0.05f}), vec({0.1f, 0.2f, 0.4f, 0.2f, 0.1f}),
                         vec({0.05f, 0.05f, 0.1f, 0.3f, 0.5f})});
  const Matrix Q = rows({vec({0.3f, 0.3f, 0.15f, 0.15f, 0.1f}), vec({0.15f, 0.15f, 0.35f, 0.25f, 0.1f})});
  const Emitted e = run_rounds(P, Q, 40000, 11);
  EXPECT_LT(chi_square(e.first, P.row(0).transpose()), kChi2Df4At001) << "the first token emitted must follow p0";
  EXPECT_LT(chi_square(e.second, P.row(1).transpose()), kChi2Df4At001) << "the one after a kept guess, p1";
  EXPECT_LT(chi_square(e.third, P.row(2).transpose()), kChi2Df4At001) << "the bonus after two kept guesses, p2";
  // The first guess is kept with probability sum(min(p0, q0)) = 0.9; over 40,000 rounds 4.5
  // standard deviations are 0.0068.
  EXPECT_NEAR(static_cast<double>(e.kept_first) / e.rounds, 0.9, 0.0068);
}

GRADED_TEST(Lesson06Verify, SampledOutputFollowsTheTargetWithAFarDraft, 3) {
  // The draft puts most of its mass where the target puts little, and none on token 0.
  const Matrix P = rows({vec({0.5f, 0.2f, 0.15f, 0.1f, 0.05f}), vec({0.3f, 0.3f, 0.2f, 0.1f, 0.1f}),
                         vec({0.6f, 0.1f, 0.1f, 0.1f, 0.1f})});
  const Matrix Q = rows({vec({0.0f, 0.05f, 0.15f, 0.3f, 0.5f}), vec({0.1f, 0.1f, 0.2f, 0.3f, 0.3f})});
  const Emitted e = run_rounds(P, Q, 40000, 23);
  EXPECT_LT(chi_square(e.first, P.row(0).transpose()), kChi2Df4At001) << "the first token emitted must follow p0";
  EXPECT_LT(chi_square(e.second, P.row(1).transpose()), kChi2Df4At001) << "the one after a kept guess, p1";
  EXPECT_LT(chi_square(e.third, P.row(2).transpose()), kChi2Df4At001) << "the bonus after two kept guesses, p2";
  // sum(min(p0, q0)) = 0 + 0.05 + 0.15 + 0.1 + 0.05 = 0.35.
  EXPECT_NEAR(static_cast<double>(e.kept_first) / e.rounds, 0.35, 0.0108);
}

GRADED_TEST(Lesson06Verify, CertainGuessesAreKeptWithTheTargetsProbability, 1) {
  // A one-hot q (a prompt-lookup guess): kept with probability p(x), and on a rejection the
  // target's token is drawn from p without x.
  const Vector p = vec({0.1f, 0.6f, 0.3f});
  const Matrix P = rows({p, p}), Q = rows({vec({0, 1, 0})});
  Rng rng(5);
  std::vector<long> first(3);
  for (int t = 0; t < 30000; ++t) {
    const Verdict v = verify_sampled(P, Q, std::vector<int>{1}, rng);
    ++first[v.accepted == 1 ? 1 : v.next_token];
    if (v.accepted == 0) {
      EXPECT_NE(v.next_token, 1) << "a rejected guess cannot come back";
    }
  }
  EXPECT_LT(chi_square(first, p), testing::chi_square_critical_001(2)) << "two degrees of freedom at 0.001";
}

GRADED_TEST(Lesson06Verify, BadShapesAreRefused, 1) {
  const Vector p = vec({0.5f, 0.5f});
  Rng rng(1);
  EXPECT_TRUE(testing::throws_error_mentioning(
      [&] { verify_sampled(rows({p}), rows({p}), std::vector<int>{0}, rng); }, "rows"));
  EXPECT_TRUE(testing::throws_error_mentioning(
      [&] { verify_sampled(rows({p, p}), rows({p}), std::vector<int>{7}, rng); }, "vocabulary"));
}

}  // namespace
}  // namespace infer
