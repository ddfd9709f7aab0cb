// Lesson 03, part A: the scheduler in a step simulator, on hand-worked schedules and on the
// source's exercise 2.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/testing/graded.hpp"
#include "lessons/03_batching/batching.hpp"

namespace infer {
namespace {

std::vector<int> starts(const SimRun& r) {
  std::vector<int> v;
  for (const auto& o : r.outcomes) v.push_back(o.start_step);
  return v;
}
std::vector<int> finishes(const SimRun& r) {
  std::vector<int> v;
  for (const auto& o : r.outcomes) v.push_back(o.finish_step);
  return v;
}

// Three requests at step 0 wanting 5, 2 and 3 tokens; two slots.
const std::vector<SimRequest> kThree = {{0, 4, 5, 0}, {1, 4, 2, 0}, {2, 4, 3, 0}};

GRADED_TEST(Lesson03Sim, StaticScheduleMatchesTheHandWorkedExample, 2) {
  //   step    0  1  2  3  4  5  6  7
  //   slot A  R0 R0 R0 R0 R0 R2 R2 R2
  //   slot B  R1 R1 .  .  .  .  .  .     R1 idles until its batch ends at 5
  const SimRun r = simulate(kThree, Policy::Static, 2);
  EXPECT_EQ(starts(r), (std::vector<int>{0, 0, 5}));
  EXPECT_EQ(finishes(r), (std::vector<int>{5, 5, 8})) << "a static batch returns every result when its longest ends";
  EXPECT_EQ(r.busy_slots, (std::vector<int>{2, 2, 1, 1, 1, 1, 1, 1}));
}

GRADED_TEST(Lesson03Sim, ContinuousScheduleMatchesTheHandWorkedExample, 2) {
  //   step    0  1  2  3  4
  //   slot A  R0 R0 R0 R0 R0
  //   slot B  R1 R1 R2 R2 R2     R2 takes R1's slot the step after R1's last token
  const SimRun r = simulate(kThree, Policy::Continuous, 2);
  EXPECT_EQ(starts(r), (std::vector<int>{0, 0, 2}));
  EXPECT_EQ(finishes(r), (std::vector<int>{5, 2, 5}));
  EXPECT_EQ(r.busy_slots, (std::vector<int>{2, 2, 2, 2, 2}));
}

GRADED_TEST(Lesson03Sim, ArrivalsOverTimeMatchTheHandWorkedExample, 2) {
  // R0 arrives at 0 wanting 3 tokens, R1 at 1 wanting 1, R2 at 1 wanting 2, R3 at 4 wanting 2.
  const std::vector<SimRequest> reqs = {{0, 1, 3, 0}, {1, 1, 1, 1}, {2, 1, 2, 1}, {3, 1, 2, 4}};
  //   continuous   step 0  1  2  3  4  5
  //   slot A            R0 R0 R0 .  R3 R3
  //   slot B            .  R1 R2 R2 .  .
  const SimRun c = simulate(reqs, Policy::Continuous, 2);
  EXPECT_EQ(starts(c), (std::vector<int>{0, 1, 2, 4}));
  EXPECT_EQ(finishes(c), (std::vector<int>{3, 2, 4, 6}));
  EXPECT_EQ(c.busy_slots, (std::vector<int>{1, 2, 2, 1, 1, 1}));
  //   static       step 0  1  2  3  4  5
  //   slot A            .  R0 R0 R0 R2 R2    the first batch waits for R1 to arrive
  //   slot B            .  R1 .  .  R3 R3    the second waits for R3
  const SimRun s = simulate(reqs, Policy::Static, 2);
  EXPECT_EQ(starts(s), (std::vector<int>{1, 1, 4, 4}));
  EXPECT_EQ(finishes(s), (std::vector<int>{4, 4, 6, 6}));
  EXPECT_EQ(s.busy_slots, (std::vector<int>{0, 2, 1, 1, 2, 2}));
}

GRADED_TEST(Lesson03Sim, PercentilesInterpolateBetweenRanks, 1) {
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 99), 3.97);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7.0);
  const BatchStats st = summarize(simulate(kThree, Policy::Continuous, 2));
  EXPECT_EQ(st.total_steps, 5);
  EXPECT_DOUBLE_EQ(st.mean_latency, 4.0);  // 5, 2, 5
  EXPECT_DOUBLE_EQ(st.throughput, 10.0 / 5);
  EXPECT_DOUBLE_EQ(st.utilization, 1.0);
}

GRADED_TEST(Lesson03Sim, StatisticsStartAtTheFirstArrival, 1) {
  // Nothing arrives before step 10: steps 0-9 are not part of the run. Two requests of 3 tokens
  // at steps 10 and 12 on two slots finish at 13 and 15, so the run lasts 15 - 10 = 5 steps.
  const std::vector<SimRequest> late = {{0, 4, 3, 10}, {1, 4, 3, 12}};
  const BatchStats st = summarize(simulate(late, Policy::Continuous, 2));
  EXPECT_EQ(st.total_steps, 5) << "from the first arrival (10) to the last finish (15)";
  EXPECT_DOUBLE_EQ(st.throughput, 6.0 / 5) << "6 tokens over 5 steps";
  EXPECT_DOUBLE_EQ(st.utilization, 6.0 / (2 * 5)) << "6 busy slot-steps out of 2 slots x 5 steps";
}

GRADED_TEST(Lesson03Sim, ParetoLengthsHaveTheirTail, 1) {
  // Pareto(shape a, scale m): P(X >= x) = (m / x)^a for x >= m. With a = 1.5 and m = 20, a quarter
  // of the way out is 40 (0.354 of the draws) and 80 (0.125). 20,000 draws put the empirical
  // shares within 0.015 of those (more than 4 standard errors).
  const auto x = pareto_lengths(20000, 1.5, 20, 1000000, 7);
  const double n = static_cast<double>(x.size());
  const double at_least_40 = std::count_if(x.begin(), x.end(), [](int v) { return v >= 40; }) / n;
  const double at_least_80 = std::count_if(x.begin(), x.end(), [](int v) { return v >= 80; }) / n;
  EXPECT_NEAR(at_least_40, std::pow(0.5, 1.5), 0.015) << "share of lengths >= 40";
  EXPECT_NEAR(at_least_80, std::pow(0.25, 1.5), 0.015) << "share of lengths >= 80";
  EXPECT_EQ(*std::min_element(x.begin(), x.end()), 20) << "no length is below the scale";
  const auto capped = pareto_lengths(2000, 1.5, 20, 200, 7);
  EXPECT_EQ(*std::max_element(capped.begin(), capped.end()), 200) << "lengths are capped at 200, and some reach it";
}

std::vector<SimRequest> pareto_workload(uint64_t seed) {
  // The source's exercise 2: 50 requests, output lengths Pareto(shape 1.5, scale 20), all at
  // step 0; capped at 200 tokens, a server's max_tokens (the bundled model's context is 256).
  const auto lengths = pareto_lengths(50, 1.5, 20, 200, seed);
  std::vector<SimRequest> reqs;
  for (int i = 0; i < 50; ++i) reqs.push_back({i, 16, lengths[i], 0});
  return reqs;
}

GRADED_TEST(Lesson03Sim, ContinuousNeverLeavesASlotIdleWhileARequestWaits, 2) {
  const auto reqs = pareto_workload(1);
  const SimRun r = simulate(reqs, Policy::Continuous, 4);
  for (size_t step = 0; step < r.busy_slots.size(); ++step) {
    for (const SimOutcome& o : r.outcomes) {
      if (o.arrival_step <= static_cast<int>(step) && static_cast<int>(step) < o.start_step) {
        ASSERT_EQ(r.busy_slots[step], 4) << "request " << o.id << " was waiting at step " << step << " while only "
                                         << r.busy_slots[step] << " of 4 slots worked";
      }
    }
  }
}

GRADED_TEST(Lesson03Sim, ParetoWorkloadKeepsContinuousAbove80PercentAndAheadOfStatic, 3) {
  // Averaged over 20 seeded workloads, so no single lucky draw decides it.
  double cont_util = 0, static_util = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const auto reqs = pareto_workload(seed);
    const BatchStats c = summarize(simulate(reqs, Policy::Continuous, 4));
    const BatchStats s = summarize(simulate(reqs, Policy::Static, 4));
    EXPECT_GE(c.throughput, s.throughput) << "seed " << seed << ": continuous batching fell behind static";
    cont_util += c.utilization / 20;
    static_util += s.utilization / 20;
  }
  EXPECT_GT(cont_util, 0.8) << "mean utilization of continuous batching over 20 Pareto workloads";
  EXPECT_GT(cont_util, static_util + 0.05) << "continuous " << cont_util << " against static " << static_util;
}

GRADED_TEST(Lesson03Sim, EqualLengthsGiveEqualThroughput, 1) {
  std::vector<SimRequest> reqs;
  for (int i = 0; i < 12; ++i) reqs.push_back({i, 8, 30, 0});
  const BatchStats c = summarize(simulate(reqs, Policy::Continuous, 4));
  const BatchStats s = summarize(simulate(reqs, Policy::Static, 4));
  EXPECT_DOUBLE_EQ(c.throughput, s.throughput) << "with equal lengths nobody finishes early: nothing to refill";
  EXPECT_EQ(c.total_steps, 90);
}

}  // namespace
}  // namespace infer
