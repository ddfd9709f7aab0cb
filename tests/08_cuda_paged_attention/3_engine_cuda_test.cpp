// Lesson 08 on a CUDA device: lesson 03's engine with lesson 04's paged memory, on the GPU through
// your kernels (lesson 04's PagedKVManager over the given CudaPagedKVPool, and the given
// device_paged_attention), against the same engine on the
// CPU. Without a device every case skips.
#include <memory>
#include <string>
#include <vector>

#include "common/cuda_check.hpp"
#include "common/testing/compare.hpp"
#include "common/testing/device.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "common/testing/throws.hpp"
#include "common/tokenizer.hpp"
#include "lessons/03_batching/batching.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"
#include "lessons/05_prefix_caching/prefix_cache.hpp"
#include "lessons/08_cuda_paged_attention/cuda_paged.hpp"

namespace infer::gpu {
namespace {

std::vector<GenerationRequest> requests() {
  std::vector<GenerationRequest> r;
  const char* prompts[] = {"Q: What is a", "A duck walks", "The best way to", "Q: Why", "Fortune favours", "Q: How do",
                           "You will", "Never"};
  for (int i = 0; i < 8; ++i)
    r.push_back({i, ByteTokenizer::encode(prompts[i]), 12 + 5 * i, SamplingParams{.temperature = 0.0f}, i / 3});
  return r;
}

GRADED_TEST(Lesson08Engine, ThePagedEngineOnTheGpuGivesTheCpuEnginesTokens, 3) {
  // Eight greedy requests, a batch of up to 6, and a pool of 14 blocks of 8 positions: too small
  // for all of them at once, so sequences are preempted and resumed. The GPU engine must make the
  // same choices (the same scheduler, the same block counts) and produce the same tokens.
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  Engine cpu(m, Policy::Continuous, 6, std::make_unique<PagedKVManager>(m.config, 14, 8));
  auto pool = std::make_unique<CudaPagedKVPool>(m.config, 14, 8);
  auto forward = std::make_unique<CudaForward>(m, WeightType::F32, device_paged_attention(*pool));
  Engine gpu(std::move(forward), std::make_unique<PagedKVManager>(std::move(pool)), {.max_running = 6});
  for (auto& r : requests()) cpu.submit(r);
  for (auto& r : requests()) gpu.submit(r);
  const auto want = cpu.run(), got = gpu.run();
  ASSERT_EQ(got.size(), want.size());
  int preempted = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i << ": \"" << ByteTokenizer::decode(got[i].tokens)
                                             << "\" on the GPU, \"" << ByteTokenizer::decode(want[i].tokens)
                                             << "\" on the CPU";
    EXPECT_EQ(got[i].finish_step, want[i].finish_step) << "request " << i;
    EXPECT_EQ(got[i].preemptions, want[i].preemptions) << "request " << i;
    preempted += want[i].preemptions;
  }
  EXPECT_GT(preempted, 0) << "the pool was meant to be small enough to preempt someone";
}

GRADED_TEST(Lesson08Engine, EverySplitCountGivesTheCpuLogits, 2) {
  // The same decode steps with the attention split 1, 3 and 64 ways (more splits than positions
  // at first), against lesson 02's CPU forward: logits within 1e-3 + 1e-3 |ref|.
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  const std::vector<int> prompt = ByteTokenizer::encode("Q: What does the fox say?");
  for (int splits : {1, 3, 64}) {
    SCOPED_TRACE(cat(splits, " splits"));
    auto pool = std::make_unique<CudaPagedKVPool>(m.config, 32, 16);
    CudaForward gpu(m, WeightType::F32, device_paged_attention(*pool, splits));
    PagedKVManager kv(std::move(pool));
    auto gstore = kv.open(static_cast<int>(prompt.size()));
    KVCache cstore(m.config, 128);
    const Matrix prefilled = forward_cached(m, prompt, cstore);
    ASSERT_TRUE(testing::all_close(prefilled.row(prefilled.rows() - 1).transpose(), gpu.prefill(prompt, *gstore), 1e-3, 1e-3,
                                   "the prompt's last logits"));
    int token = prompt.back();
    for (int step = 0; step < 20; ++step) {
      KVStore* g[] = {gstore.get()};
      const int t[] = {token};
      const Matrix want = forward_cached(m, t, cstore), got = gpu.decode(t, g);
      ASSERT_TRUE(testing::all_close(want, got, 1e-3, 1e-3, cat("decode step ", step)));
      Eigen::Index best;
      want.row(0).maxCoeff(&best);
      token = static_cast<int>(best);
    }
    kv.close(std::move(gstore));
    EXPECT_EQ(kv.reserved_tokens(), 0) << "closing the sequence gives its blocks back";
  }
}

GRADED_TEST(Lesson08Engine, ForeignCachesAreRefused, 1) {
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  auto pool = std::make_unique<CudaPagedKVPool>(m.config, 8, 16);
  CudaForward gpu(m, WeightType::F32, device_paged_attention(*pool));
  PagedKVManager kv(std::move(pool)), other(std::make_unique<CudaPagedKVPool>(m.config, 8, 16));
  auto mine = kv.open(4), theirs = other.open(4);
  CudaKVStore contiguous(m.config, 16);
  const int t[] = {65};
  KVStore* foreign[] = {theirs.get()};
  KVStore* flat[] = {&contiguous};
  EXPECT_TRUE(testing::throws_error_mentioning([&] { gpu.decode(t, foreign); }, "CudaPagedKVPool"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { gpu.decode(t, flat); }, "PagedKVCache"));
  EXPECT_EQ(kv.preemptions_needed(std::vector<const KVStore*>{mine.get()}), 0);
}

GRADED_TEST(Lesson08Engine, ThePrefixCacheOnTheGpuGivesTheCpuEnginesTokens, 2) {
  // Lesson 05's prefix cache over the device pool: the bookkeeping is the host's, the shared
  // blocks are the GPU's. Requests sharing a long prompt must get the CPU engine's tokens, and
  // the cache must have saved prefill work on the GPU as on the CPU.
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  const std::string system = "Q: What does a wise person say about the sea? A: ";
  std::vector<GenerationRequest> rs;
  for (int i = 0; i < 6; ++i)
    rs.push_back({i, ByteTokenizer::encode(system + std::string(1, static_cast<char>('a' + i))), 10,
                  SamplingParams{.temperature = 0.0f}, i});
  Engine cpu(m, Policy::Continuous, 4, std::make_unique<PrefixKVManager>(m.config, 40, 8));
  auto pool = std::make_unique<CudaPagedKVPool>(m.config, 40, 8);
  auto forward = std::make_unique<CudaForward>(m, WeightType::F32, device_paged_attention(*pool));
  Engine gpu(std::move(forward), std::make_unique<PrefixKVManager>(std::move(pool)), {.max_running = 4});
  for (auto& r : rs) cpu.submit(r);
  for (auto& r : rs) gpu.submit(r);
  const auto want = cpu.run(), got = gpu.run();
  ASSERT_EQ(got.size(), want.size());
  int cached = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    EXPECT_EQ(got[i].cached_tokens, want[i].cached_tokens) << "request " << i;
    cached += got[i].cached_tokens;
  }
  EXPECT_GT(cached, 0) << "later requests were meant to find the shared prompt in the cache";
}

}  // namespace
}  // namespace infer::gpu
