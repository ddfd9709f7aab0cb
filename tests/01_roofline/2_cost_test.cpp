// Lesson 01: FLOPs and bytes of prefill and decode, checked on a shape small enough to count by
// hand, then the roofline and the source's scenario table.
#include "common/testing/graded.hpp"
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

GRADED_TEST(Lesson01Roofline, SourceScenarioTableIsClassifiedLikeTheSource, 3) {
  // Llama 3 70B in BF16 on an A100. Decode steps at a short context (128 tokens), where the
  // weights dominate the bytes, as in the source's table.
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

}  // namespace
}  // namespace infer
