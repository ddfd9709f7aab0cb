// Lesson 00: the sampler's properties, on hand-made logits.
#include <cmath>
#include <algorithm>
#include <numeric>
#include <set>

#include "common/testing/compare.hpp"
#include "common/testing/graded.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"

namespace infer {
namespace {

using testing::vec;

GRADED_TEST(Lesson00Sampler, ArgmaxPicksTheFirstOfEqualMaxima, 1) {
  EXPECT_EQ(argmax(vec({0.5f, 2.0f, -1.0f, 2.0f})), 1);
  EXPECT_EQ(argmax(vec({-3.0f, -2.0f, -7.0f})), 1) << "all-negative logits";
}

GRADED_TEST(Lesson00Sampler, TemperatureZeroIsOneHotAtArgmax, 1) {
  const Vector p = sampling_distribution(vec({1.0f, 3.0f, 2.0f}), {.temperature = 0.0f});
  EXPECT_TRUE(testing::all_close(vec({0, 1, 0}), p, 0, 0, "temperature-0 distribution"));
}

GRADED_TEST(Lesson00Sampler, SoftmaxIsStableAndMatchesTheFormula, 2) {
  // Logits near 1000 overflow exp() unless the maximum is subtracted first.
  const Vector l = vec({1000.0f, 999.0f, 997.0f});
  const Vector p = sampling_distribution(l, {.temperature = 0.5f});
  const double e1 = std::exp(-2.0), e2 = std::exp(-6.0), z = 1 + e1 + e2;
  EXPECT_TRUE(testing::all_close(vec({float(1 / z), float(e1 / z), float(e2 / z)}), p, 1e-6, 1e-5,
                                 "softmax(logits / 0.5) of {1000, 999, 997}"));
}

GRADED_TEST(Lesson00Sampler, TinyTemperatureBehavesLikeGreedy, 1) {
  const Vector l = vec({0.1f, 0.3f, 0.25f, -2.0f});
  Sampler s({.temperature = 1e-3f, .seed = 3});
  for (int i = 0; i < 200; ++i) ASSERT_EQ(s.next(l), 1) << "draw " << i << " at temperature 0.001";
}

GRADED_TEST(Lesson00Sampler, TopKNeverLeavesTheKBest, 2) {
  Rng rng(11);
  Vector l(50);
  for (auto& x : l) x = static_cast<float>(rng.normal());
  std::vector<int> order(50);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  const std::set<int> best(order.begin(), order.begin() + 5);

  const Vector p = sampling_distribution(l, {.temperature = 1.0f, .top_k = 5});
  for (int i = 0; i < 50; ++i) {
    if (best.count(i)) EXPECT_GT(p[i], 0.0f) << "token " << i << " is among the 5 best but got probability 0";
    else EXPECT_EQ(p[i], 0.0f) << "token " << i << " is not among the 5 best but got probability " << p[i];
  }
  EXPECT_NEAR(p.sum(), 1.0, 1e-5) << "after top-k the kept probabilities are renormalized";
  Sampler s({.temperature = 1.5f, .top_k = 5, .seed = 12});
  for (int i = 0; i < 2000; ++i) {
    const int t = s.next(l);
    ASSERT_TRUE(best.count(t)) << "draw " << i << " returned token " << t << ", outside the top 5";
  }
}

GRADED_TEST(Lesson00Sampler, TopPKeepsTheSmallestSetReachingP, 2) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 (logits are their logs, in shuffled order).
  const Vector l = vec({std::log(0.15f), std::log(0.5f), std::log(0.05f), std::log(0.3f)});
  const Vector p40 = sampling_distribution(l, {.top_p = 0.4f});
  EXPECT_TRUE(testing::all_close(vec({0, 1, 0, 0}), p40, 1e-6, 0, "top_p 0.4 keeps only the 0.5 token"));
  const Vector p75 = sampling_distribution(l, {.top_p = 0.75f});
  EXPECT_TRUE(testing::all_close(vec({0, 0.625f, 0, 0.375f}), p75, 1e-6, 1e-5,
                                 "top_p 0.75 keeps 0.5 + 0.3 and renormalizes them"));
  const Vector p90 = sampling_distribution(l, {.top_p = 0.9f});
  EXPECT_TRUE(testing::all_close(vec({0.15f / 0.95f, 0.5f / 0.95f, 0, 0.3f / 0.95f}), p90, 1e-6, 1e-5,
                                 "top_p 0.9 keeps 0.5 + 0.3 + 0.15"));
  // Reaching counts: two of four equal tokens make exactly 0.5 (0.25 + 0.25, exact in float).
  const Vector exact = sampling_distribution(vec({1.0f, 1.0f, 1.0f, 1.0f}), {.top_p = 0.5f});
  EXPECT_EQ((exact.array() > 0).count(), 2)
      << "top_p 0.5 over four tokens of 0.25: the first two total exactly 0.5, which reaches it (>=, not >)";
}

GRADED_TEST(Lesson00Sampler, TiesGoToTheSmallerIndex, 1) {
  // Four tokens tie for the best. top_k 2 keeps exactly two of them: the first two.
  const Vector k2 = sampling_distribution(vec({0.0f, 1.0f, 1.0f, 1.0f, 1.0f}), {.top_k = 2});
  EXPECT_TRUE(testing::all_close(vec({0, 0.5f, 0.5f, 0, 0}), k2, 1e-6, 1e-5,
                                 "top_k 2 over four equal best tokens (ties go to the smaller index)"));
  // Four equal tokens: top_p 0.5 is reached by the first two.
  const Vector p50 = sampling_distribution(vec({2.0f, 2.0f, 2.0f, 2.0f}), {.top_p = 0.5f});
  EXPECT_TRUE(testing::all_close(vec({0.5f, 0.5f, 0, 0}), p50, 1e-6, 1e-5,
                                 "top_p 0.5 over four equal tokens (0.25 + 0.25 reaches 0.5; of the ties the "
                                 "smaller indices stay)"));
  // A hundred equal tokens: a sort that is not stable may keep any five of them.
  const Vector many = sampling_distribution(Vector::Constant(100, 0.5f), {.top_k = 5});
  for (int i = 0; i < 100; ++i)
    ASSERT_EQ(many[i] > 0, i < 5) << "top_k 5 over 100 equal tokens keeps tokens 0 to 4; token " << i << " has "
                                  << many[i] << " (rank ties by index: a stable sort, or the index as a tie-break)";
}

GRADED_TEST(Lesson00Sampler, TopPMeasuresWhatTopKLeft, 1) {
  // Probabilities 0.4, 0.3, 0.2, 0.1. top_k 2 leaves 0.4 and 0.3, renormalized to 4/7 and 3/7,
  // and top_p 0.5 is then reached by 4/7 alone. (Measured against the mass before top-k, 0.4 would
  // fall short of 0.5 and both would stay.)
  const Vector l = vec({std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)});
  const Vector p = sampling_distribution(l, {.top_k = 2, .top_p = 0.5f});
  EXPECT_TRUE(testing::all_close(vec({1, 0, 0, 0}), p, 1e-6, 1e-5,
                                 "top_k 2 then top_p 0.5 over probabilities 0.4, 0.3, 0.2, 0.1"));
  // And what the temperature made: at temperature 0.5 the probabilities are 0.4^2, 0.3^2, ...
  // over their sum, 0.533, 0.3, 0.133, 0.033, and top_p 0.5 is reached by the first alone.
  // (Chosen at temperature 1, 0.4 falls short and two tokens would stay.)
  const Vector tempered = sampling_distribution(l, {.temperature = 0.5f, .top_p = 0.5f});
  EXPECT_TRUE(testing::all_close(vec({1, 0, 0, 0}), tempered, 1e-6, 1e-5,
                                 "temperature 0.5 then top_p 0.5: the order is temperature, top-k, top-p"));
}

GRADED_TEST(Lesson00Sampler, EachTokenOwnsAHalfOpenInterval, 1) {
  // Token i is drawn for u in [c(i-1), c(i)), c the cumulative sums: a u exactly on a boundary
  // belongs to the next token, so that each token's chance is exactly its probability.
  const Vector p = vec({0.25f, 0.25f, 0.5f});
  EXPECT_EQ(sample_from(p, 0.25), 1) << "u = 0.25 = probs[0]: the first index whose cumulative sum exceeds u is 1";
  EXPECT_EQ(sample_from(p, 0.5), 2) << "u = 0.5 = probs[0] + probs[1]: the first index whose cumulative sum exceeds u is 2";
}

GRADED_TEST(Lesson00Sampler, SampleFromInvertsTheCumulativeDistribution, 1) {
  const Vector p = vec({0.2f, 0.3f, 0.5f});
  EXPECT_EQ(sample_from(p, 0.0), 0);
  EXPECT_EQ(sample_from(p, 0.19), 0);
  EXPECT_EQ(sample_from(p, 0.21), 1);
  EXPECT_EQ(sample_from(p, 0.49), 1);
  EXPECT_EQ(sample_from(p, 0.51), 2);
  EXPECT_EQ(sample_from(p, 0.999999), 2);
  EXPECT_EQ(sample_from(vec({0, 0.5f, 0, 0.5f, 0}), 0.0), 1) << "zero-probability tokens are never drawn";
  EXPECT_EQ(sample_from(vec({0, 0.5f, 0, 0.5f, 0}), 0.999999), 3) << "zero-probability tokens are never drawn";
  EXPECT_EQ(sample_from(vec({0.5f, 0.4999f, 0}), 0.99995), 1)
      << "the probabilities total 0.9999, below u: the last index with non-zero probability, 1, not the last index";
}

GRADED_TEST(Lesson00Sampler, SampledFrequenciesFollowTheDistribution, 2) {
  // 20,000 seeded draws at temperature 1; Pearson's chi-square against softmax(logits).
  // With 5 degrees of freedom, 25.7 is the 99.99th percentile: a correct sampler passes with
  // this seed, and a sampler that ignores the distribution lands in the thousands.
  const Vector l = vec({1.0f, 0.0f, 2.0f, -1.0f, 0.5f, 1.5f});
  const Vector p = sampling_distribution(l, {.temperature = 1.0f});
  Sampler s({.temperature = 1.0f, .seed = 2024});
  const int n = 20000;
  std::vector<int> count(6, 0);
  for (int i = 0; i < n; ++i) ++count.at(s.next(l));
  double chi2 = 0;
  for (int i = 0; i < 6; ++i) chi2 += std::pow(count[i] - n * p[i], 2) / (n * p[i]);
  EXPECT_LT(chi2, 25.7) << "observed counts are far from the softmax probabilities";
}

}  // namespace
}  // namespace infer
