// Lesson 03, part A: the scheduler in a step simulator, on hand-worked schedules and on the
// README's exercise of fifty requests.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/rng.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/throws.hpp"
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

GRADED_TEST(Lesson03Sim, ArrivalsOverTimeMatchTheHandWorkedExample, 3) {
  // R0 arrives at 0 wanting 3 tokens, R1 at 1 wanting 1, R2 at 1 wanting 2, R3 at 4 wanting 2.
  const std::vector<SimRequest> reqs = {{0, 1, 3, 0}, {1, 1, 1, 1}, {2, 1, 2, 1}, {3, 1, 2, 4}};
  //   continuous   step 0  1  2  3  4  5
  //   slot A            R0 R0 R0 .  R3 R3
  //   slot B            .  R1 R2 R2 .  .
  const SimRun c = simulate(reqs, Policy::Continuous, 2);
  EXPECT_EQ(starts(c), (std::vector<int>{0, 1, 2, 4})) << "continuous";
  EXPECT_EQ(finishes(c), (std::vector<int>{3, 2, 4, 6})) << "continuous";
  EXPECT_EQ(c.busy_slots, (std::vector<int>{1, 2, 2, 1, 1, 1})) << "continuous";
  //   static       step 0  1  2  3  4  5
  //   slot A            .  R0 R0 R0 R2 R2    the first batch waits for R1 to arrive
  //   slot B            .  R1 .  .  R3 R3    the second waits for R3
  const SimRun s = simulate(reqs, Policy::Static, 2);
  EXPECT_EQ(starts(s), (std::vector<int>{1, 1, 4, 4})) << "static";
  EXPECT_EQ(finishes(s), (std::vector<int>{4, 4, 6, 6})) << "static";
  EXPECT_EQ(s.busy_slots, (std::vector<int>{0, 2, 1, 1, 2, 2})) << "static";
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
  // The contract's recipe exactly (u = 1 - uniform(), rounded down): the same seed must give
  // everyone, the bench and the lesson's figures included, the same lengths.
  Rng rng(3);
  const auto mine = pareto_lengths(100, 1.5, 20, 200, 3);
  for (size_t i = 0; i < mine.size(); ++i) {
    const double u = 1.0 - rng.uniform();
    const int want = static_cast<int>(std::min(200.0, std::floor(20.0 / std::pow(u, 1 / 1.5))));
    ASSERT_EQ(mine[i], want) << "length " << i << " of seed 3: u = 1 - uniform() = " << u << ", 20 / u^(1/1.5) = "
                             << 20.0 / std::pow(u, 1 / 1.5) << ", rounded down and capped at 200";
  }
}

GRADED_TEST(Lesson03Sim, RequestsAreTakenByArrivalThenId, 1) {
  // The same three requests as above, listed in reverse: the schedule is the same, request by
  // request (outcomes stay in the order given). Taking them in the order given, or sorting by
  // arrival alone, starts request 2 first.
  const std::vector<SimRequest> reversed(kThree.rbegin(), kThree.rend());
  for (Policy policy : {Policy::Static, Policy::Continuous}) {
    const char* name = policy == Policy::Static ? "static" : "continuous";
    const SimRun forward = simulate(kThree, policy, 2), backward = simulate(reversed, policy, 2);
    ASSERT_EQ(backward.outcomes.size(), 3u) << name;
    for (int i = 0; i < 3; ++i) {
      const SimOutcome& o = backward.outcomes[2 - i];
      EXPECT_EQ(o.id, i) << name << ": outcomes stay in the order the requests were given";
      EXPECT_EQ(o.start_step, forward.outcomes[i].start_step)
          << name << ": request " << i << " given last-to-first starts at another step (ties in arrival go by id)";
      EXPECT_EQ(o.finish_step, forward.outcomes[i].finish_step) << name << ": request " << i;
    }
  }
}

GRADED_TEST(Lesson03Sim, BadArgumentsAreRefused, 1) {
  // Each refusal names what was wrong with its value, as the contract says (an empty input has
  // no value to name: any infer::Error will do).
  using testing::throws_error_mentioning;
  const std::vector<SimRequest> no_tokens = {{7, 4, 0, 0}}, early = {{8, 4, 2, -3}}, twice = {{5, 4, 2, 0}, {5, 4, 1, 0}};
  EXPECT_TRUE(throws_error_mentioning([&] { simulate(no_tokens, Policy::Continuous, 2); }, "7"))
      << "request 7 wants 0 tokens: the message names the request";
  EXPECT_TRUE(throws_error_mentioning([&] { simulate(early, Policy::Continuous, 2); }, "-3"))
      << "request 8 arrives at step -3: the message names the step";
  EXPECT_TRUE(throws_error_mentioning([&] { simulate(twice, Policy::Static, 2); }, "5")) << "id 5 appears twice";
  EXPECT_TRUE(throws_error_mentioning([] { percentile({}, 50); }, ""));
  EXPECT_TRUE(throws_error_mentioning([] { percentile({1, 2}, 101); }, "101"));
  EXPECT_TRUE(throws_error_mentioning([] { percentile({1, 2}, -1); }, "-1"));
  EXPECT_TRUE(throws_error_mentioning([] { pareto_lengths(-3, 1.5, 20, 200, 1); }, "-3"));
  EXPECT_TRUE(throws_error_mentioning([] { pareto_lengths(5, -2.5, 20, 200, 1); }, "-2.5"));
  EXPECT_TRUE(throws_error_mentioning([] { pareto_lengths(5, 1.5, 0.5, 200, 1); }, "0.5"));
  EXPECT_TRUE(throws_error_mentioning([] { pareto_lengths(5, 1.5, 20, -4, 1); }, "-4"));
  EXPECT_TRUE(throws_error_mentioning([] { summarize(SimRun{}); }, ""));
}

std::vector<SimRequest> pareto_workload(uint64_t seed) {
  // The README's exercise: 50 requests, output lengths Pareto(shape 1.5, scale 20), all at
  // step 0; capped at 200 tokens, a server's max_tokens (the bundled model's context is 256).
  const auto lengths = pareto_lengths(50, 1.5, 20, 200, seed);
  std::vector<SimRequest> reqs;
  for (int i = 0; i < 50; ++i) reqs.push_back({i, 16, lengths[i], 0});
  return reqs;
}

GRADED_TEST(Lesson03Sim, ContinuousNeverLeavesASlotIdleWhileARequestWaits, 3) {
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

GRADED_TEST(Lesson03Sim, ParetoWorkloadKeepsContinuousAbove80PercentAndAheadOfStatic, 4) {
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
