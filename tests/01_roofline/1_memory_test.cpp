// Lesson 01: KV-cache memory and capacity, with the figures of the lesson's source computed by
// your code (none of them is typed into it).
#include <cmath>

#include "common/model_config.hpp"
#include "common/testing/graded.hpp"
#include "common/weights.hpp"
#include "lessons/01_roofline/roofline.hpp"

namespace infer {
namespace {

GRADED_TEST(Lesson01Memory, Llama3_70BHolds327680BytesPerToken, 2) {
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(llama3_70b(), DType::BF16), 327680.0)
      << "2 (K and V) x 80 layers x 8 K/V heads x 128 x 2 bytes = 327,680 bytes (320 KiB) per token";
}

GRADED_TEST(Lesson01Memory, Llama3_70BNeeds1_25GiBAt4kAnd40GiBAt128k, 2) {
  EXPECT_NEAR(kv_bytes(llama3_70b(), 4096, DType::BF16) / kGiB, 1.25, 1e-9) << "one 4,096-token conversation";
  EXPECT_NEAR(kv_bytes(llama3_70b(), 131072, DType::BF16) / kGiB, 40.0, 1e-9)
      << "one 128K-token conversation: half an A100's memory";
}

GRADED_TEST(Lesson01Memory, GqaCutsLlama3_70BKvEightfold, 2) {
  ModelShape mha = llama3_70b();
  mha.num_kv_heads = mha.num_heads;  // the same model with one K/V head per query head
  EXPECT_DOUBLE_EQ(gqa_kv_reduction(llama3_70b()), 8.0);
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(mha, DType::BF16) / kv_bytes_per_token(llama3_70b(), DType::BF16), 8.0)
      << "64 query heads over 8 K/V heads store 8x less K/V than 64 K/V heads";
}

GRADED_TEST(Lesson01Memory, BundledModelShapeComesFromItsConfig, 1) {
  const ModelShape s = shape_from_config(load_config(bundled_model_dir("tiny-fortunes") + "/config.json"), "tiny");
  EXPECT_DOUBLE_EQ(s.parameters, 1649472.0) << "the bundled target's parameter count";
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(s, DType::F32), 1536.0)
      << "2 x 4 layers x 2 K/V heads x 24 x 4 bytes per token in float32";
}

GRADED_TEST(Lesson01Memory, CapacityLeavesWhatWeightsAndOverheadDoNotTake, 2) {
  // Llama 3 70B in BF16 on 4 x A100-80GB with 10% overhead, worked by hand:
  const double total = 4 * 80 * kGiB, weights = 70.6e9 * 2, overhead = 0.1 * total;
  const double budget = total - weights - overhead;
  const Capacity c = capacity(llama3_70b(), {.gpu_bytes = 80 * kGiB, .num_gpus = 4}, DType::BF16, DType::BF16);
  EXPECT_TRUE(c.fits);
  EXPECT_NEAR(c.weight_bytes, weights, 1.0);
  EXPECT_NEAR(c.overhead_bytes, overhead, 1.0);
  EXPECT_NEAR(c.kv_budget_bytes, budget, 1.0);
  EXPECT_EQ(c.max_tokens, static_cast<long>(std::floor(budget / 327680.0)));
  EXPECT_EQ(max_users(c, 4096), c.max_tokens / 4096);

  const Capacity one = capacity(llama3_70b(), {.gpu_bytes = 80 * kGiB, .num_gpus = 1}, DType::BF16, DType::BF16);
  EXPECT_FALSE(one.fits) << "141 GB of BF16 weights do not fit on one 80 GiB GPU";
  EXPECT_EQ(one.max_tokens, 0);
  EXPECT_EQ(one.kv_budget_bytes, 0.0) << "the weights do not fit: nothing is left for the KV cache, not less than nothing";
  // Whole tokens, rounded down: 10.75 tokens' worth of budget holds 10 (not 11).
  ModelShape hand{"hand", 2, 4, 2, 1, 2, 8, 10, false, 0, false};
  hand.parameters = 388;  // 1,552 bytes in float32; 32 bytes of K/V a token
  const Capacity tight = capacity(hand, {.gpu_bytes = 1552 + 344, .num_gpus = 1, .overhead_fraction = 0},
                                  DType::F32, DType::F32);
  EXPECT_NEAR(tight.kv_budget_bytes, 344.0, 1e-9);
  EXPECT_EQ(tight.max_tokens, 10) << "344 bytes of budget at 32 a token: 10 whole tokens";
}

GRADED_TEST(Lesson01Memory, Int4KvServesAboutFourTimesTheUsers, 2) {
  // Llama 3 70B, 4 x A100-80GB, 4K context, FP16 vs FP8 vs INT4 KV.
  const MemoryBudget four_a100{.gpu_bytes = 80 * kGiB, .num_gpus = 4};
  const long fp16 = max_users(capacity(llama3_70b(), four_a100, DType::BF16, DType::FP16), 4096);
  const long fp8 = max_users(capacity(llama3_70b(), four_a100, DType::BF16, DType::FP8), 4096);
  const long int4 = max_users(capacity(llama3_70b(), four_a100, DType::BF16, DType::INT4), 4096);
  EXPECT_GT(fp16, 100) << "FP16 KV at 4K context";
  EXPECT_NEAR(double(fp8) / fp16, 2.0, 0.05);
  EXPECT_NEAR(double(int4) / fp16, 4.0, 0.1) << fp16 << " users with FP16 KV, " << int4 << " with INT4";
}

}  // namespace
}  // namespace infer
