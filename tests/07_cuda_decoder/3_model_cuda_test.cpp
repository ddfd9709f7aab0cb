// Lesson 07 on a CUDA device: the whole decoder, built from your kernels (the given CudaModel),
// against the CPU model. Without a device every case skips.
#include "common/cuda_check.hpp"
#include "common/testing/compare.hpp"
#include "common/testing/golden.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "common/tokenizer.hpp"
#include "lessons/02_kv_cache/kv_cache.hpp"
#include "lessons/07_cuda_decoder/cuda_model.hpp"

namespace infer::gpu {
namespace {

#define REQUIRE_DEVICE() \
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device here: this case runs on a GPU machine"

GRADED_TEST(Lesson07Model, LogitsEqualTheCpuModelAtEveryStep, 3) {
  // The bundled model, float32 weights, 40 positions: the device sums in another order, through
  // four layers, so 1e-3 + 1e-3 |x| (the logits are of order 10).
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  CudaModel gpu(m, WeightType::F32, 64);
  KVCache cpu(m.config, 64);
  const auto tokens = ByteTokenizer::encode("Q: What is the difference between a duck? A: ");
  for (size_t i = 0; i < 40 && i < tokens.size(); ++i) {
    const Matrix want = forward_cached(m, std::span(&tokens[i], 1), cpu);
    const Vector got = gpu.decode(tokens[i]);
    ASSERT_TRUE(testing::all_close(want.row(0), got.transpose(), 1e-3, 1e-3, cat("logits at position ", i)));
  }
  EXPECT_EQ(gpu.length(), static_cast<int>(std::min<size_t>(40, tokens.size())));
}

GRADED_TEST(Lesson07Model, GreedyTextEqualsTheFixtureOver64Tokens, 3) {
  REQUIRE_DEVICE();
  const auto golden = testing::load_golden("tiny-fortunes");
  const auto& g = golden.greedy.front();
  const int n = std::min<int>(64, static_cast<int>(g.ids.size()));
  CudaModel gpu(testing::bundled_model(), WeightType::F32, static_cast<int>(g.prompt_ids.size()) + n);
  Sampler greedy({.temperature = 0.0f});
  const auto got = generate_cuda(gpu, g.prompt_ids, n, greedy);
  const std::vector<int> want(g.ids.begin(), g.ids.begin() + n);
  EXPECT_EQ(got, want) << "greedy text on the GPU: \"" << ByteTokenizer::decode(got) << "\"\nexpected: \""
                       << ByteTokenizer::decode(want) << "\"";
}

GRADED_TEST(Lesson07Model, Bf16WeightsStayCloseToFloat32, 1) {
  // bfloat16 keeps 8 bits of each weight: the logits move, but not far. On the CPU, lesson 02's
  // forward with the matrices rounded to bf16 moves no logit by more than 0.03 on three prompts;
  // the test allows 0.1 + 1% for the GPU's other summation order.
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  CudaModel f32(m, WeightType::F32, 16), bf16(m, WeightType::BF16, 16);
  for (const int t : ByteTokenizer::encode("The ")) {
    const Vector a = f32.decode(t), b = bf16.decode(t);
    ASSERT_TRUE(b.allFinite()) << "bf16 logits must be finite";
    ASSERT_TRUE(testing::all_close(a, b, 0.1, 0.01, "bf16 against float32 logits"));
  }
}

}  // namespace
}  // namespace infer::gpu
