// Lesson 01: FLOPs and bytes of prefill and decode, checked on a shape small enough to count by
// hand, then the roofline and the scenario table.
#include "common/testing/graded.hpp"
#include "common/testing/throws.hpp"
#include "lessons/01_roofline/roofline.hpp"

namespace infer {
namespace {

// 2 layers, hidden 4, 2 query heads over 1 K/V head of 2, MLP 8, vocabulary 10.
// Per layer: q 4x4 + k, v 2x(2x4) + o 4x4 + MLP 3x(4x8) = 16 + 16 + 16 + 96 = 144 matrix parameters.
ModelShape hand_shape() {
  ModelShape s{"hand", 2, 4, 2, 1, 2, 8, 10, false, 0, false};
  s.parameters = 388;  // 40 embed + 40 head + 2 x (144 + 8 norm) + 4 final norm
  return s;
}

GRADED_TEST(Lesson01Params, DenseCountsMatchThePublishedSizes, 2) {
  EXPECT_DOUBLE_EQ(dense_parameter_count(hand_shape()), 388.0) << "40 + 40 + 2 x (144 + 8) + 4";
  for (const ModelShape& s : {llama3_8b(), llama3_70b(), llama3_405b(), mistral_7b()}) {
    EXPECT_NEAR(dense_parameter_count(s) / s.parameters, 1.0, 0.01) << s.name << ": counted "
                                                                    << dense_parameter_count(s) / 1e9 << "B";
  }
}

GRADED_TEST(Lesson01Params, MatmulCountLeavesOutTheEmbeddingTableAndNorms, 1) {
  EXPECT_DOUBLE_EQ(matmul_parameter_count(hand_shape()), 328.0) << "2 x 144 layer matrices + 40 lm_head";
}

GRADED_TEST(Lesson01Params, ATiedLmHeadIsStillAMatmul, 1) {
  // Tying lm_head to the embedding table saves parameters to load, not work: every token is still
  // multiplied by the [vocab, hidden] matrix at the end.
  ModelShape tied = hand_shape();
  tied.tied_embeddings = true;
  EXPECT_DOUBLE_EQ(dense_parameter_count(tied), 348.0) << "388 - 40: the head is the embedding table";
  EXPECT_DOUBLE_EQ(matmul_parameter_count(tied), 328.0) << "still 2 x 144 layer matrices + the 40 of lm_head";
}

GRADED_TEST(Lesson01Cost, PrefillCountsEveryTokenAndEveryPair, 2) {
  const StepCost c = prefill_cost(hand_shape(), 3, DType::F32, DType::F32);
  // matmuls 2 x 328 x 3 = 1968; attention 4 x 2 x (1 + 2 + 3) x 2 heads x 2 layers = 192
  EXPECT_DOUBLE_EQ(c.flops, 2160.0);
  // weights 388 x 4 = 1552; K/V of 3 tokens: 3 x (2 x 2 layers x 1 head x 2 x 4 bytes) = 96
  EXPECT_DOUBLE_EQ(c.bytes, 1648.0);
}

GRADED_TEST(Lesson01Cost, DecodeReadsTheWeightsOncePerBatch, 2) {
  const StepCost c = decode_cost(hand_shape(), 5, 4, DType::F32, DType::F32);
  // per sequence: matmuls 2 x 328 = 656, attention over 5 keys 4 x 2 x 5 x 2 x 2 = 160
  EXPECT_DOUBLE_EQ(c.flops, 4 * 816.0);
  // weights once 1552; per sequence 4 cached tokens read (128) and 1 written (32)
  EXPECT_DOUBLE_EQ(c.bytes, 1552.0 + 4 * (128.0 + 32.0));
}

GRADED_TEST(Lesson01Cost, WeightsAndCacheEachHaveTheirOwnFormatAndCount, 1) {
  // The published parameter count, not the dense count (they differ for a model with parts the
  // dense formula leaves out, as GPT-4-class estimates do), and the K/V in their own format.
  ModelShape s = hand_shape();
  s.parameters = 1000;
  // weights 1000 x 2 bytes (bf16); K/V of 3 tokens in float32: 3 x 32
  EXPECT_DOUBLE_EQ(prefill_cost(s, 3, DType::BF16, DType::F32).bytes, 2000.0 + 96.0)
      << "prefill: shape.parameters x the weights' bytes, the K/V in the cache's own format";
  // weights once, 2000; per sequence 4 cached tokens read and 1 written, in float32
  EXPECT_DOUBLE_EQ(decode_cost(s, 5, 4, DType::BF16, DType::F32).bytes, 2000.0 + 4 * (128.0 + 32.0))
      << "decode: shape.parameters x the weights' bytes, the K/V in the cache's own format";
  // bf16 K/V under float32 weights: 2 bytes a value
  EXPECT_DOUBLE_EQ(decode_cost(hand_shape(), 5, 4, DType::F32, DType::BF16).bytes, 1552.0 + 4 * (64.0 + 16.0));
}

GRADED_TEST(Lesson01Cost, SizesBelowOneAreRefused, 1) {
  using testing::throws_error_mentioning;
  EXPECT_TRUE(throws_error_mentioning([] { prefill_cost(hand_shape(), 0, DType::F32, DType::F32); }, "T"));
  EXPECT_TRUE(throws_error_mentioning([] { decode_cost(hand_shape(), 0, 1, DType::F32, DType::F32); }, "context"));
  EXPECT_TRUE(throws_error_mentioning([] { decode_cost(hand_shape(), 5, 0, DType::F32, DType::F32); }, "batch"));
  const StepCost d = decode_cost(hand_shape(), 5, 4, DType::F32, DType::F32);
  EXPECT_TRUE(throws_error_mentioning([&] { max_tokens_per_second(d, 0, a100_80gb()); }, "batch"));
  const Capacity c = capacity(llama3_8b(), {}, DType::BF16, DType::BF16);
  EXPECT_TRUE(throws_error_mentioning([&] { max_users(c, 0); }, "context"));
  EXPECT_TRUE(throws_error_mentioning([] { capacity(llama3_8b(), {.num_gpus = 0}, DType::BF16, DType::BF16); }, "GPU"));
  EXPECT_TRUE(throws_error_mentioning([] { capacity(llama3_8b(), {.gpu_bytes = 0}, DType::BF16, DType::BF16); }, "GPU"));
  EXPECT_TRUE(throws_error_mentioning(
      [] { capacity(llama3_8b(), {.overhead_fraction = 1.0}, DType::BF16, DType::BF16); }, "overhead_fraction"));
}

GRADED_TEST(Lesson01Cost, IntensityGrowsWithBatchAndPromptLength, 1) {
  double last = 0;
  for (int b : {1, 2, 8, 32, 128, 512}) {
    const double i = decode_cost(llama3_8b(), 1024, b, DType::BF16, DType::BF16).intensity();
    EXPECT_GT(i, last) << "decode intensity at batch " << b;
    last = i;
  }
  last = 0;
  for (int t : {1, 16, 256, 4096}) {
    const double i = prefill_cost(llama3_8b(), t, DType::BF16, DType::BF16).intensity();
    EXPECT_GT(i, last) << "prefill intensity at T = " << t;
    last = i;
  }
}

GRADED_TEST(Lesson01Roofline, A100RidgePointIsNear156, 1) {
  EXPECT_NEAR(ridge_point(a100_80gb()), 156.0, 0.5) << "312 TFLOP/s / 2 TB/s";
}

GRADED_TEST(Lesson01Roofline, MoreBandwidthHelpsOnlyBelowTheRidge, 2) {
  const Hardware hw = a100_80gb();
  Hardware wide = hw;
  wide.bandwidth *= 2;
  EXPECT_DOUBLE_EQ(attainable_flops(wide, 10) / attainable_flops(hw, 10), 2.0) << "memory-bound at 10 FLOP/byte";
  EXPECT_DOUBLE_EQ(attainable_flops(wide, 1000), attainable_flops(hw, 1000)) << "compute-bound at 1000 FLOP/byte";
  EXPECT_DOUBLE_EQ(attainable_flops(hw, 1000), hw.peak_flops);
  EXPECT_DOUBLE_EQ(attainable_flops(hw, 10), hw.bandwidth * 10);
}

GRADED_TEST(Lesson01Roofline, TheBandsEdgesBelongToTheTransition, 1) {
  // A ridge of exactly 4 FLOP/byte: memory-bound strictly below 2, compute-bound strictly above 8.
  Hardware hw = a100_80gb();
  hw.peak_flops = 400e12;
  hw.bandwidth = 100e12;
  EXPECT_EQ(classify(hw, 1.999), Bound::Memory);
  EXPECT_EQ(classify(hw, 2.0), Bound::Transition) << "exactly ridge / 2 is not below it";
  EXPECT_EQ(classify(hw, 8.0), Bound::Transition) << "exactly 2 x ridge is not above it";
  EXPECT_EQ(classify(hw, 8.001), Bound::Compute);
}

GRADED_TEST(Lesson01Roofline, TheFiveScenariosFallInTheirRegimes, 3) {
  // Llama 3 70B in BF16 on an A100. Decode steps at a short context (128 tokens), where the
  // weights dominate the bytes, as in the scenario table.
  const Hardware a100 = a100_80gb();
  const ModelShape m = llama3_70b();
  struct Row {
    const char* scenario;
    StepCost cost;
    Bound expected;
  };
  const Row rows[] = {
      {"prefill, batch 1, 4096 tokens", prefill_cost(m, 4096, DType::BF16, DType::BF16), Bound::Compute},
      {"decode, batch 1", decode_cost(m, 128, 1, DType::BF16, DType::BF16), Bound::Memory},
      {"decode, batch 32", decode_cost(m, 128, 32, DType::BF16, DType::BF16), Bound::Memory},
      {"decode, batch 256", decode_cost(m, 128, 256, DType::BF16, DType::BF16), Bound::Transition},
      {"decode, batch 1024", decode_cost(m, 128, 1024, DType::BF16, DType::BF16), Bound::Compute},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(classify(a100, r.cost.intensity()), r.expected)
        << r.scenario << ": intensity " << r.cost.intensity() << " FLOP/byte against a ridge of "
        << a100.peak_flops / a100.bandwidth << " should be " << bound_name(r.expected) << "-bound";
  }
  EXPECT_NEAR(rows[1].cost.intensity(), 1.0, 0.1) << "decode at batch 1 does about one FLOP per byte of weights";
}

GRADED_TEST(Lesson01Time, EachRoofGivesAFloorAndTheSlowerOneWins, 2) {
  // The hand shape's 3-token prefill (2,160 FLOPs, 1,648 bytes) on a toy device of 1,000 FLOP/s
  // and 100 bytes/s: 16.48 s to move the bytes, 2.16 s to do the arithmetic.
  const Hardware toy{"toy", 1000, 100, 1e9};
  const StepCost c = prefill_cost(hand_shape(), 3, DType::F32, DType::F32);
  const StepTime one = step_time(c, toy);
  EXPECT_DOUBLE_EQ(one.memory_seconds, 16.48);
  EXPECT_DOUBLE_EQ(one.compute_seconds, 2.16);
  EXPECT_DOUBLE_EQ(one.seconds(), 16.48) << "the step waits for the slower roof";
  const StepTime two = step_time(c, toy, 2);
  EXPECT_DOUBLE_EQ(two.memory_seconds, 8.24) << "two devices each move half the bytes";
  EXPECT_DOUBLE_EQ(two.compute_seconds, 1.08) << "and do half the FLOPs";
  EXPECT_DOUBLE_EQ(max_tokens_per_second(decode_cost(hand_shape(), 5, 4, DType::F32, DType::F32), 4, toy),
                   4 / ((1552.0 + 4 * 160.0) / 100)) << "4 tokens per step of 21.92 s";
  EXPECT_TRUE(testing::throws_error_mentioning([&] { step_time(c, toy, 0); }, "gpus"));
}

GRADED_TEST(Lesson01Time, Llama3_70BOnFourA100sDecodesAbout57TokensPerSecond, 2) {
  // 141 GB of BF16 weights do not fit one 80 GiB A100. Split over four (tensor parallelism),
  // each reads a quarter: (70.6e9 x 2 bytes + 127 x 327,680 bytes of K/V read + 327,680
  // written) / (4 x 2 TB/s) = 17.66 ms, so at most 56.6 tokens/s for one user (the traffic
  // between the GPUs is not counted here: lesson 12 models it).
  const StepCost d = decode_cost(llama3_70b(), 128, 1, DType::BF16, DType::BF16);
  const StepTime t = step_time(d, a100_80gb(), 4);
  EXPECT_GT(t.memory_seconds, 10 * t.compute_seconds) << "decode at batch 1 is memory-bound";
  EXPECT_NEAR(t.seconds() * 1e3, 17.66, 0.05) << "ms per decode step";
  EXPECT_NEAR(max_tokens_per_second(d, 1, a100_80gb(), 4), 56.6, 0.2);
  // A 4,096-token prefill on the same four: 2 x 69.5e9 x 4,096 FLOPs of matrix products plus
  // 2.2e13 of attention = 5.91e14 FLOPs at 4 x 312 TFLOP/s = 0.474 s, compute-bound.
  const StepTime p = step_time(prefill_cost(llama3_70b(), 4096, DType::BF16, DType::BF16), a100_80gb(), 4);
  EXPECT_GT(p.compute_seconds, p.memory_seconds) << "prefill of 4,096 tokens is compute-bound";
  EXPECT_NEAR(p.seconds(), 0.474, 0.001) << "seconds for the prefill";
}

}  // namespace
}  // namespace infer
