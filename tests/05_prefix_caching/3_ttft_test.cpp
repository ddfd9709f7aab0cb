// Lesson 05, part C: a time model in which a prefill costs the positions it computes, time to
// first token (TTFT) in it, and what a warm prefix cache does to TTFT on the bundled model.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "common/testing/throws.hpp"
#include "common/tokenizer.hpp"
#include "lessons/05_prefix_caching/prefix_cache.hpp"

namespace infer {
namespace {

EngineStepLog entry(int step, int prefills, long prefill_tokens, int decodes) {
  EngineStepLog e;
  e.step = step;
  e.prefills = prefills;
  e.prefill_tokens = prefill_tokens;
  e.decodes = decodes;
  return e;
}

GenerationResult result(int id, int arrival, int first_token) {
  GenerationResult r;
  r.id = id;
  r.arrival_step = arrival;
  r.first_token_step = first_token;
  return r;
}

GRADED_TEST(Lesson05Ttft, EachStepCostsItsFixedPartAndItsPositions, 2) {
  // A prefill of 100 positions, a decode of one, an idle step, then a prefill of 10 next to a decode.
  const std::vector<EngineStepLog> log = {entry(0, 1, 100, 0), entry(1, 0, 0, 1), entry(2, 0, 0, 0),
                                          entry(3, 1, 10, 1)};
  const std::vector<double> end = step_end_ms(log, {.fixed_ms = 2.0, .per_position_ms = 0.1});
  ASSERT_EQ(end.size(), 4u);
  EXPECT_NEAR(end[0], 12.0, 1e-9) << "2 + 100 x 0.1";
  EXPECT_NEAR(end[1], 14.1, 1e-9) << "12 + 2 + 1 x 0.1";
  EXPECT_NEAR(end[2], 16.1, 1e-9) << "an idle step still costs its fixed part";
  EXPECT_NEAR(end[3], 19.2, 1e-9) << "16.1 + 2 + (10 + 1) x 0.1";
  EXPECT_TRUE(step_end_ms({}, {}).empty());
  // Steps out of order, or costs that are not times.
  const std::vector<EngineStepLog> gap = {entry(0, 1, 5, 0), entry(2, 0, 0, 1)};
  EXPECT_TRUE(testing::throws_error_mentioning([&] { step_end_ms(gap, {1.0, 0.1}); }, "step"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { step_end_ms(log, {-1.0, 0.1}); }, "fixed_ms"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { step_end_ms(log, {1.0, std::nan("")}); }, "per_position_ms"));
}

GRADED_TEST(Lesson05Ttft, TtftRunsFromTheArrivalStepToTheEndOfTheFirstTokensStep, 2) {
  const std::vector<double> end = {12.0, 14.1, 16.1, 19.2};
  EXPECT_NEAR(ttft_ms(result(1, 0, 0), end), 12.0, 1e-9) << "arrived at step 0, first token at its end";
  EXPECT_NEAR(ttft_ms(result(2, 1, 3), end), 19.2 - 12.0, 1e-9) << "waited through steps 1 and 2, prefilled in 3";
  EXPECT_NEAR(ttft_ms(result(3, 3, 3), end), 19.2 - 16.1, 1e-9);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { ttft_ms(result(4, 2, 1), end); }, "arrives"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { ttft_ms(result(5, 0, 4), end); }, "first token"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { ttft_ms(result(6, -1, 0), end); }, "arrives"));
}

GRADED_TEST(Lesson05Ttft, TheSimulatorChargesEachPrefillItsPrompt, 1) {
  // Lesson 03's continuous run with 2 slots, written out: requests 0 (prompt 100, 3 tokens) and
  // 1 (prompt 50, 2 tokens) start at step 0; request 2 (prompt 10, 1 token) arrives at step 1
  // and takes request 1's slot at step 2.
  const std::vector<SimRequest> reqs = {{0, 100, 3, 0}, {1, 50, 2, 0}, {2, 10, 1, 1}};
  SimRun run;
  run.max_batch = 2;
  run.outcomes = {{0, 0, 0, 3, 3}, {1, 0, 0, 2, 2}, {2, 1, 2, 3, 1}};
  run.busy_slots = {2, 2, 2};
  const std::vector<EngineStepLog> log = simulated_step_log(reqs, run);
  ASSERT_EQ(log.size(), 3u);
  EXPECT_EQ(log[0].prefill_tokens, 150);
  EXPECT_EQ(log[2].prefill_tokens, 10);
  EXPECT_EQ(log[2].decodes, 1);
  const std::vector<double> end = step_end_ms(log, {2.0, 0.1});
  EXPECT_NEAR(end[2], 22.3, 1e-9) << "(2 + 15) + (2 + 0.2) + (2 + 1.1)";
  EXPECT_NEAR(ttft_ms(result(2, 1, 2), end), 22.3 - 17.0, 1e-9);
}

GRADED_TEST(Lesson05Ttft, AWarmCacheCutsTheModelledTtftOnTheBundledModel, 2) {
  // Two requests whose prompts share a long system prompt (about 95% of them), the second
  // arriving once the first is done. In steps their TTFTs are equal (one step each); with
  // prefills charged, the warm one costs a fraction of the cold one.
  const ModelWeights& m = testing::bundled_model();
  const std::string system =
      "You are a fortune teller. Answer every question with one short fortune, kind and a little odd. "
      "Never explain a fortune, never repeat one, and keep each under twenty words, if you can. ";
  Engine engine(m, Policy::Continuous, 2, std::make_unique<PrefixKVManager>(m.config, 64, 16));
  GenerationRequest cold{1, ByteTokenizer::encode(system + "Rich?"), 3, {.temperature = 0.0f}, 0};
  GenerationRequest warm{2, ByteTokenizer::encode(system + "Rain?"), 3, {.temperature = 0.0f}, 8};
  engine.submit(cold);
  engine.submit(warm);
  const auto results = engine.run();
  const StepCost cost{.fixed_ms = 1.0, .per_position_ms = 0.05};
  const std::vector<double> end = step_end_ms(engine.log(), cost);
  const double t_cold = ttft_ms(results[0], end), t_warm = ttft_ms(results[1], end);
  const int computed = static_cast<int>(warm.prompt.size()) - results[1].cached_tokens;
  EXPECT_GT(results[1].cached_tokens, 0) << "the system prompt was meant to hit";
  EXPECT_NEAR(t_cold, cost.fixed_ms + static_cast<double>(cold.prompt.size()) * cost.per_position_ms, 1e-9);
  EXPECT_NEAR(t_warm, cost.fixed_ms + computed * cost.per_position_ms, 1e-9)
      << "alone in its step, the warm request pays for the positions it computed";
  EXPECT_LT(5 * t_warm, t_cold);
}

}  // namespace
}  // namespace infer
