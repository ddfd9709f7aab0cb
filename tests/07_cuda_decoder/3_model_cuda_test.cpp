// Lesson 07 on a CUDA device: the whole decoder, built from your kernels (the given CudaModel),
// against the CPU model. Without a device every case skips.
#include <memory>
#include <vector>

#include "common/cuda_check.hpp"
#include "common/testing/device.hpp"
#include "common/testing/throws.hpp"
#include "common/testing/compare.hpp"
#include "common/testing/golden.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "common/tokenizer.hpp"
#include "lessons/02_kv_cache/kv_cache.hpp"
#include "lessons/03_batching/batching.hpp"
#include "lessons/07_cuda_decoder/cuda_model.hpp"

namespace infer::gpu {
namespace {

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
  // The engine on the GPU, one request: what `./course generate --device cuda` runs.
  const ModelWeights& m = testing::bundled_model();
  Engine gpu(std::make_unique<CudaForward>(m, WeightType::F32),
             cuda_slots(m.config, 1, static_cast<int>(g.prompt_ids.size()) + n), {.max_running = 1});
  GenerationRequest r;
  r.prompt = g.prompt_ids;
  r.max_new_tokens = n;
  r.sampling.temperature = 0.0f;
  gpu.submit(r);
  const std::vector<int> got = gpu.run().front().tokens;
  const std::vector<int> want(g.ids.begin(), g.ids.begin() + n);
  EXPECT_EQ(got, want) << "greedy text on the GPU: \"" << ByteTokenizer::decode(got) << "\"\nexpected: \""
                       << ByteTokenizer::decode(want) << "\"";
}

GRADED_TEST(Lesson07Model, BatchedDecodeEqualsTheCpuForwardBatch, 3) {
  // Five sequences of different lengths decoded together, 12 steps, against lesson 03's
  // forward_batch on the CPU: same tolerance as one sequence. Batches of 5 and (after two
  // finish) 3 go through gemv_batch_*; a lone sequence through gemv_*.
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  CudaForward gpu(m, WeightType::F32);
  const std::vector<std::vector<int>> prompts = {ByteTokenizer::encode("Q: Why"), ByteTokenizer::encode("A duck"),
                                                 ByteTokenizer::encode("The"), ByteTokenizer::encode("Fortune: you"),
                                                 ByteTokenizer::encode("Q")};
  std::vector<std::unique_ptr<KVStore>> dev, host;
  for (const auto& p : prompts) {
    dev.push_back(std::make_unique<CudaKVStore>(m.config, 64));
    host.push_back(std::make_unique<KVCache>(m.config, 64));
    const Vector got = gpu.prefill(p, *dev.back());
    const Matrix want = forward_cached(m, p, *host.back());
    ASSERT_TRUE(testing::all_close(want.row(want.rows() - 1), got.transpose(), 1e-3, 1e-3, "prefill logits"));
  }
  for (int step = 0; step < 12; ++step) {
    const size_t live = step < 6 ? 5 : step < 11 ? 3 : 1;
    std::vector<int> tokens;
    std::vector<KVStore*> d, h;
    for (size_t i = 0; i < live; ++i) {
      tokens.push_back(40 + static_cast<int>(7 * i + step) % 80);
      d.push_back(dev[i].get());
      h.push_back(host[i].get());
    }
    const Matrix got = gpu.decode(tokens, d), want = forward_batch(m, tokens, h);
    ASSERT_TRUE(testing::all_close(want, got, 1e-3, 1e-3, cat("batched logits at step ", step, ", batch ", live)));
  }
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(dev[i]->length(), host[i]->length()) << "sequence " << i;
  // Its caches must be its own kind, and every call is checked before anything runs.
  KVCache cpu_cache(m.config, 8);
  KVStore* wrong[] = {&cpu_cache};
  const int token = 5;
  EXPECT_TRUE(testing::throws_error_mentioning([&] { gpu.decode(std::span(&token, 1), wrong); }, "CudaKVStore"));
  KVStore* twice[] = {dev[0].get(), dev[0].get()};
  const int two[] = {5, 6};
  EXPECT_TRUE(testing::throws_error_mentioning([&] { gpu.decode(two, twice); }, "share"));
}

GRADED_TEST(Lesson07Model, TheEngineOnTheGpuGivesTheCpuEnginesTokens, 3) {
  // Lesson 03's engine, unchanged, over the CUDA forward and device caches: six greedy requests
  // through three slots, continuous batching, equal to the CPU engine's tokens.
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  auto requests = [] {
    std::vector<GenerationRequest> r;
    const char* prompts[] = {"Q: What", "A duck", "The best", "Q: Why", "Fortune", "Q: How"};
    for (int i = 0; i < 6; ++i)
      r.push_back({i, ByteTokenizer::encode(prompts[i]), 10 + 3 * i, SamplingParams{.temperature = 0.0f}, i / 2});
    return r;
  };
  Engine cpu(m, Policy::Continuous, 3);
  Engine gpu(std::make_unique<CudaForward>(m, WeightType::F32), cuda_slots(m.config, 3, 128), {.max_running = 3});
  for (auto& r : requests()) cpu.submit(r);
  for (auto& r : requests()) gpu.submit(r);
  const auto want = cpu.run(), got = gpu.run();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i << ": \"" << ByteTokenizer::decode(got[i].tokens)
                                             << "\" on the GPU, \"" << ByteTokenizer::decode(want[i].tokens)
                                             << "\" on the CPU";
    EXPECT_EQ(got[i].finish_step, want[i].finish_step) << "request " << i;
  }
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
