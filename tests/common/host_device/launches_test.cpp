// Kernel launches per decode step of the GPU forward, counted on the host stand-in (it counts every
// launch the given engine code makes; the code is the same on a GPU). A decode step at batch 1 is
// launch-bound on a large GPU (lesson 07's report): these cases pin how many launches a step
// makes, so that a change that adds some is seen. Not speed: the count of what the host asks for.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "common/cuda_timing.hpp"
#include "common/timer.hpp"
#include "common/testing/models.hpp"
#include "lessons/07_cuda_decoder/cuda_model.hpp"
#include "lessons/08_cuda_paged_attention/cuda_paged.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"
#include "tests/common/host_device/capture.hpp"

namespace infer::gpu {
namespace {

/// Launches of one decode step of `batch` one-token chunks after a prompt of 5 each.
long launches_per_step(CudaForward& forward, KVManager& memory, int batch) {
  std::vector<std::unique_ptr<KVStore>> stores;
  std::vector<KVStore*> caches;
  const std::vector<int> prompt = {3, 4, 5, 6, 7};
  for (int b = 0; b < batch; ++b) {
    stores.push_back(memory.open(0));
    forward.prefill(prompt, *stores.back());
    caches.push_back(stores.back().get());
  }
  const std::vector<int> tokens(batch, 9);
  forward.decode(tokens, caches);  // (a graph is captured here, where they are on)
  const long before = host_device::launches();
  forward.decode(tokens, caches);
  const long n = host_device::launches() - before;
  for (auto& s : stores) memory.close(std::move(s));
  return n;
}

TEST(Launches, ADecodeStepLaunchesAFixedNumberOfKernelsPerLayer) {
  const ModelWeights& m = testing::bundled_model();
  const int layers = m.config.num_hidden_layers;
  CudaPagedParts parts = cuda_paged_parts(m, WeightType::F32, 64, 8);
  PagedKVManager memory(std::move(parts.pool));
  const long one = launches_per_step(*parts.forward, memory, 1), four = launches_per_step(*parts.forward, memory, 4);
  std::printf("[launches per decode step, %d layers: %ld at batch 1, %ld at batch 4]\n", layers, one, four);
  // Per layer at batch 1: the stacked Q/K/V product, one RoPE for q and k, the slot write and the
  // attention, the O product, the residual add with the next norm (add_rms_norm), the stacked
  // gate/up product, SwiGLU, down, the add with the next layer's norm (10); besides them the
  // embedding, the first layer's norm, the final norm and the head. Above batch 1 the stacked
  // products run as three and two (their outputs must be arrays of their own) and RoPE as two:
  // 14 a layer. (Before the stacking and the fusion: 16 a layer at every batch.)
  EXPECT_EQ(one, 10L * layers + 4);
  EXPECT_EQ(four, 14L * layers + 4);
  parts.forward->use_graphs(true);
  EXPECT_EQ(launches_per_step(*parts.forward, memory, 1), 1) << "a replayed step is one graph launch";

  // A fused one-row step (fuse_one_row, bf16 matrices): the Q/K/V product with the input norm in
  // it, RoPE, the slot write and the attention, the O product with the residual add, the gate/up
  // product with the norm and SwiGLU, the down product with the add (7 a layer); besides them the
  // embedding and the head with the final norm. Steps of more rows as before.
  CudaPagedParts fused = cuda_paged_parts(m, WeightType::BF16, 64, 8);
  ASSERT_TRUE(fused.forward->fuse_one_row(true));
  PagedKVManager fused_memory(std::move(fused.pool));
  EXPECT_EQ(launches_per_step(*fused.forward, fused_memory, 1), 7L * layers + 2);
  EXPECT_EQ(launches_per_step(*fused.forward, fused_memory, 4), 14L * layers + 4);
}

// device_paged_attention(pool, splits, tiled_warps): the decode rows go to the tiled design where
// asked (every decode row of every layer, split or not), to your kernel otherwise; and the serving
// engine's parts follow kEngineTiledWarps.
TEST(Launches, TheTiledDesignReadsTheDecodeRowsWhereAskedTo) {
  const ModelWeights& m = testing::bundled_model();
  const long layers = m.config.num_hidden_layers;
  // Rows the tiled design reads in a prompt of 5 (below kChunkKernelMinTokens: the decode kernel's)
  // and a decode step, for 2 sequences.
  const auto tiled_rows = [&](CudaForward& forward, KVManager& memory) {
    auto a = memory.open(0), b = memory.open(0);
    const std::vector<int> prompt = {3, 4, 5, 6, 7}, next = {9, 9};
    const long before = host_device::tiled_kernel_rows();
    forward.prefill(prompt, *a);
    forward.prefill(prompt, *b);
    KVStore* caches[] = {a.get(), b.get()};
    forward.decode(next, caches);
    const long n = host_device::tiled_kernel_rows() - before;
    memory.close(std::move(a)), memory.close(std::move(b));
    return n;
  };
  for (const int warps : {0, 4})
    for (const int splits : {1, 3}) {
      SCOPED_TRACE(cat(warps, " warps (0: yours), ", splits, " splits"));
      auto pool = std::make_unique<CudaPagedKVPool>(m.config, 64, 8);
      CudaForward forward(m, WeightType::F32, device_paged_attention(*pool, splits, warps));
      PagedKVManager memory(std::move(pool));
      EXPECT_EQ(tiled_rows(forward, memory), warps > 0 ? (5 + 5 + 2) * layers : 0);
    }
  CudaPagedParts parts = cuda_paged_parts(m, WeightType::F32, 64, 8);
  PagedKVManager memory(std::move(parts.pool));
  EXPECT_EQ(tiled_rows(*parts.forward, memory), kEngineTiledWarps > 0 ? (5 + 5 + 2) * layers : 0)
      << "the serving engine's parts follow kEngineTiledWarps";
}

// The lesson's point for a prompt on the GPU: its rows go to the chunk kernel in tiles, each tile
// of K/V read once for 32 query rows, not row by row through the decode kernel (each row reading
// its whole context again). In a mixed step the decodes still go to the decode kernel.
TEST(Launches, APromptGoesToTheChunkKernelAndDecodesToTheDecodeKernel) {
  const ModelWeights& m = testing::bundled_model();
  const long layers = m.config.num_hidden_layers;
  CudaPagedParts parts = cuda_paged_parts(m, WeightType::F32, 64, 8);
  PagedKVManager memory(std::move(parts.pool));
  auto a = memory.open(0), b = memory.open(0), c = memory.open(0);
  std::vector<int> prompt(40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = 3 + static_cast<int>(i % 50);
  long decode = host_device::decode_kernel_rows(), chunk = host_device::chunk_kernel_rows();
  parts.forward->prefill(prompt, *a);
  EXPECT_EQ(host_device::chunk_kernel_rows() - chunk, 40 * layers) << "the prompt's 40 rows, in every layer";
  EXPECT_EQ(host_device::decode_kernel_rows() - decode, 0) << "no prompt row through the decode kernel";

  // One step: a's decode, b's prompt of 20, c's short chunk of 3 (below kChunkKernelMinTokens).
  const std::vector<int> one = {9}, twenty(prompt.begin(), prompt.begin() + 20), three = {5, 6, 7};
  StepInput step;
  step.chunks = {{one, a.get()}, {twenty, b.get()}, {three, c.get()}};
  decode = host_device::decode_kernel_rows(), chunk = host_device::chunk_kernel_rows();
  parts.forward->forward(step);
  EXPECT_EQ(host_device::chunk_kernel_rows() - chunk, 20 * layers);
  EXPECT_EQ(host_device::decode_kernel_rows() - decode, 4 * layers) << "the decode and the short chunk";
  memory.close(std::move(a)), memory.close(std::move(b)), memory.close(std::move(c));
}

// CudaForward::skinny_split(max): the bf16 products of 2 to max rows go to the given
// skinny_gemm_bf16_split, every one of them (each layer's seven: q, k, v, o, gate, up and down,
// each a product of its own at more than one row; and the head's, for the rows that want
// logits); a step of more rows, a step of one, and the forward after skinny_split(0) leave it
// alone. The kernel itself is held to its reference by GivenSkinnySplit.*; the engine's tokens
// with it, by Lesson10OnTheGpu.SplitSkinnyProducts*.
TEST(Launches, SkinnySplitTakesTheProductsOfTwoToItsMostRows) {
  const ModelWeights& m = testing::bundled_model();
  const long layers = m.config.num_hidden_layers;
  CudaPagedParts parts = cuda_paged_parts(m, WeightType::BF16, 64, 8);
  PagedKVManager memory(std::move(parts.pool));
  const auto products = [&](int max_batch, int batch) {
    parts.forward->skinny_split(max_batch);
    const long before = host_device::skinny_split_products();
    launches_per_step(*parts.forward, memory, batch);  // two steps of `batch` rows, after their prompts of 5
    return host_device::skinny_split_products() - before;
  };
  const long prompt = 7 * layers, per_step = 7 * layers + 1;  // a prompt wants one row of logits: the head's is a GEMV
  EXPECT_EQ(products(8, 2), 2 * prompt + 2 * per_step) << "the two prompts of 5 (their head: one row) and two steps of 2";
  EXPECT_EQ(products(4, 4), 2 * per_step) << "two decode steps of 4 (the prompts of 5 above the most)";
  EXPECT_EQ(products(4, 5), 0) << "steps of 5 rows, above the most";
  EXPECT_EQ(products(0, 2), 0) << "skinny_split(0)";
  EXPECT_EQ(products(8, 1), prompt) << "the prompt of 5; one-row decode steps stay with the GEMV";
  EXPECT_THROW(parts.forward->skinny_split(-1), Error);
  EXPECT_THROW(parts.forward->skinny_split(8, -1), Error);
  EXPECT_GT(CudaForward::skinny_split_wave(), 0);
}

// The benches' held stream (cuda_time_each_ms, hold): where a hold cannot work (here every call
// runs at once, so the hold waits for a release that comes only after it), it stalls once, for
// its 2 s, then holding stops and every later timing is taken without it, never hanging a bench.
TEST(Timing, AHoldThatCannotBeReleasedStallsOnceAndStops) {
  ASSERT_FALSE(detail::hold_failed.load());
  int runs = 0;
  Stopwatch clock;
  const double first = cuda_time_each_ms([&] { ++runs; }, 1, 4, true);
  EXPECT_GE(clock.seconds(), 1.9);
  EXPECT_TRUE(detail::hold_failed.load());
  Stopwatch again;
  const double second = cuda_time_each_ms([&] { ++runs; }, 3, 4, true);
  EXPECT_LT(again.seconds(), 1.0);
  EXPECT_EQ(runs, 2 + 4 + 2 + 3 * 4);  // two untimed runs, then reps x n, each time
  EXPECT_GE(first, 0.0);
  EXPECT_GE(second, 0.0);
}

}  // namespace
}  // namespace infer::gpu
