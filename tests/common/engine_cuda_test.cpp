// The whole engine on a CUDA device (issue: "the engine on CUDA"): lesson 10's serving engine
// over lesson 07's forward and lesson 08's paged pool, against the same engine on the CPU.
// What the CPU engine does, the GPU engine must do with the same tokens: chunked prefill under a
// token budget mixed with decodes, lesson 05's prefix cache, lesson 04's preemption, lesson 06's
// speculation, cancellation. These cases check the given engine, not a lesson's kernels: they are
// not graded. Without a device every case skips (`./course gpu-check` runs them on a GPU).
//
// Tolerances: logits within 1e-3 + 1e-3 |ref| of the CPU's (the device sums in another order
// through four layers; the logits are of order 10), as lessons 07 and 08's model tests. Greedy
// ids equal. bf16 weights are compared with the CPU engine over the same weights rounded to bf16,
// and lesson 11's INT8 and INT4 weights with the CPU engine over the same quantized projections,
// so that only the order of the sums differs.
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/cuda_buffer.hpp"
#include "common/cuda_check.hpp"
#include "common/rng.hpp"
#include "common/testing/compare.hpp"
#include "common/testing/device.hpp"
#include "common/testing/models.hpp"
#include "common/testing/throws.hpp"
#include "common/tokenizer.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"
#include "lessons/02_kv_cache/kv_cache.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"
#include "lessons/05_prefix_caching/prefix_cache.hpp"
#include "lessons/06_speculative_decoding/speculative.hpp"
#include "lessons/07_cuda_decoder/cuda_decoder.hpp"
#include "lessons/07_cuda_decoder/cuda_model.hpp"
#include "lessons/07_cuda_decoder/fused_kernels.hpp"
#include "lessons/07_cuda_decoder/kernels.hpp"
#include "lessons/08_cuda_paged_attention/cuda_paged.hpp"
#include "lessons/10_serving/serving.hpp"
#include "lessons/11_quantization/cuda_weights.hpp"
#include "lessons/11_quantization/quantization.hpp"
#include "tests/common/engine_scenarios.hpp"

namespace infer::gpu {
namespace {

/// Greedy requests with prompts from 3 to about 130 bytes (several chunks under a budget of 16),
/// arriving over the first steps.
std::vector<GenerationRequest> requests(int n = 8, int max_new = 20) {
  const std::string long_one =
      "Q: What does a wise person say about the sea, the sky, the wind and the long road home? A: It is said that ";
  const char* prompts[] = {"Q: What is a", "A duck walks", "The best way to", "Q: Why", "Fortune favours",
                           "Q: How do", "You will", "Never"};
  std::vector<GenerationRequest> r;
  for (int i = 0; i < n; ++i) {
    const std::string text = (i % 3 == 1 ? long_one : std::string()) + prompts[i % 8];
    r.push_back({i, ByteTokenizer::encode(text), max_new + 3 * (i % 4), SamplingParams{.temperature = 0.0f}, i / 2});
  }
  return r;
}

/// Runs `rs` through `engine` to the end.
std::vector<GenerationResult> serve(Engine& engine, const std::vector<GenerationRequest>& rs) {
  for (const auto& r : rs) engine.submit(r);
  return engine.run();
}

/// Asserts the same tokens, finishing steps, preemptions and cache hits, request by request.
void expect_same_results(const std::vector<GenerationResult>& got, const std::vector<GenerationResult>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].id, want[i].id);
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << want[i].id << ": \"" << ByteTokenizer::decode(got[i].tokens)
                                             << "\" on the GPU, \"" << ByteTokenizer::decode(want[i].tokens)
                                             << "\" on the CPU";
    EXPECT_EQ(got[i].finish_step, want[i].finish_step) << "request " << want[i].id;
    EXPECT_EQ(got[i].preemptions, want[i].preemptions) << "request " << want[i].id;
    EXPECT_EQ(got[i].cached_tokens, want[i].cached_tokens) << "request " << want[i].id;
  }
}

/// The serving engine on the GPU over a device pool of `blocks` blocks of `block_size`.
std::unique_ptr<Engine> gpu_engine(const ModelWeights& m, const DeviceWeights& weights, int blocks, int block_size,
                                   bool prefix, ServingOptions options, std::unique_ptr<Speculator> speculator = nullptr) {
  CudaPagedParts parts = cuda_paged_parts(m, weights, blocks, block_size);
  std::unique_ptr<KVManager> memory;
  if (prefix) memory = std::make_unique<PrefixKVManager>(std::move(parts.pool));
  else memory = std::make_unique<PagedKVManager>(std::move(parts.pool));
  return serving_engine(std::move(parts.forward), std::move(memory), options, std::move(speculator));
}

/// The same engine on the CPU (over `projections` where given: lesson 11's formats).
std::unique_ptr<Engine> cpu_engine(const ModelWeights& m, int blocks, int block_size, bool prefix,
                                   ServingOptions options, std::unique_ptr<Speculator> speculator = nullptr,
                                   ModelProjections projections = {}) {
  std::unique_ptr<KVManager> memory;
  if (prefix) memory = std::make_unique<PrefixKVManager>(m.config, blocks, block_size);
  else memory = std::make_unique<PagedKVManager>(m.config, blocks, block_size);
  auto runner = projections.lm_head ? std::make_unique<CpuRunner>(m, std::move(projections)) : std::make_unique<CpuRunner>(m);
  return serving_engine(std::move(runner), std::move(memory), options, std::move(speculator));
}

/// `m` with every weight matrix rounded to bf16 and back: what the GPU's bf16 weights hold.
ModelWeights rounded_to_bf16(const ModelWeights& m) {
  ModelWeights r = m;
  const auto round = [](Matrix& w) {
    for (Eigen::Index i = 0; i < w.size(); ++i) w.data()[i] = bf16_to_float(float_to_bf16(w.data()[i]));
  };
  round(r.lm_head);
  for (LayerWeights& l : r.layers)
    for (Matrix* w : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj}) round(*w);
  return r;
}

// ----------------------------------------------------------------- the step --

/// One step mixing a prompt chunk (after a cached prefix), a fresh prompt, a decode and a
/// verification chunk (every row's logits), on the GPU through `attention`-shaped caches, against
/// forward_step() on the CPU.
void check_mixed_step(CudaForward& gpu, std::vector<std::unique_ptr<KVStore>>& stores) {
  const ModelWeights& m = testing::bundled_model();
  const std::vector<int> prefix = ByteTokenizer::encode("Q: What is the difference between a duck");
  const std::vector<int> rest = ByteTokenizer::encode(" and a goose? A: Neither");
  const std::vector<int> fresh = ByteTokenizer::encode("Fortune favours the bold, and the bold say");
  const std::vector<int> before_decode = ByteTokenizer::encode("You will meet");
  const std::vector<int> decode = {ByteTokenizer::encode(" a").back()};
  const std::vector<int> before_verify = ByteTokenizer::encode("Never trust");
  const std::vector<int> verify = ByteTokenizer::encode(" a cat wit");
  std::vector<KVCache> cpu;
  for (int i = 0; i < 4; ++i) cpu.emplace_back(m.config, 256);
  // The cached parts, on both sides.
  const std::vector<int>* cached[] = {&prefix, nullptr, &before_decode, &before_verify};
  for (int i = 0; i < 4; ++i)
    if (cached[i]) {
      forward_cached(m, *cached[i], cpu[i]);
      gpu.prefill(*cached[i], *stores[i]);
    }
  StepInput cs, gs;
  const std::vector<int>* fed[] = {&rest, &fresh, &decode, &verify};
  for (int i = 0; i < 4; ++i) {
    const int logits = i == 3 ? static_cast<int>(verify.size()) : 1;
    cs.chunks.push_back({.tokens = *fed[i], .cache = &cpu[i], .id = i, .logits = logits});
    gs.chunks.push_back({.tokens = *fed[i], .cache = stores[i].get(), .id = i, .logits = logits});
  }
  const Matrix want = forward_step(m, cs), got = gpu.forward(gs);
  ASSERT_EQ(got.rows(), want.rows());
  EXPECT_TRUE(testing::all_close(want, got, 1e-3, 1e-3, "the mixed step's logits"));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(stores[i]->length(), cpu[i].length()) << "store " << i;
  // And a decode step after it, reading what the mixed step wrote.
  StepInput cd, gd;
  const int next[] = {65, 66, 67, 68};
  for (int i = 0; i < 4; ++i) {
    cd.chunks.push_back({.tokens = std::span(&next[i], 1), .cache = &cpu[i]});
    gd.chunks.push_back({.tokens = std::span(&next[i], 1), .cache = stores[i].get()});
  }
  EXPECT_TRUE(testing::all_close(forward_step(m, cd), gpu.forward(gd), 1e-3, 1e-3, "the decode step after it"));
}

/// check_mixed_step() over paged caches: the bundled model's forward reading a pool of 64 blocks of
/// 8 through device_paged_attention(pool, splits, tiled_warps).
void check_mixed_step_over_paged_caches(int splits, int tiled_warps) {
  const ModelWeights& m = testing::bundled_model();
  auto pool = std::make_unique<CudaPagedKVPool>(m.config, 64, 8);
  CudaForward gpu(m, WeightType::F32, device_paged_attention(*pool, splits, tiled_warps));
  PagedKVManager kv(std::move(pool));
  std::vector<std::unique_ptr<KVStore>> stores;
  for (int i = 0; i < 4; ++i) stores.push_back(kv.open(0));
  check_mixed_step(gpu, stores);
}

TEST(Lesson10OnTheGpu, AMixedStepOverContiguousCachesEqualsTheCpuStep) {
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  CudaForward gpu(m, WeightType::F32);
  std::vector<std::unique_ptr<KVStore>> stores;
  for (int i = 0; i < 4; ++i) stores.push_back(std::make_unique<CudaKVStore>(m.config, 256));
  check_mixed_step(gpu, stores);
}

TEST(Lesson10OnTheGpu, AMixedStepOverPagedCachesEqualsTheCpuStep) {
  REQUIRE_DEVICE();
  for (int splits : {0, 1, 4}) {  // chosen, one pass, split four ways
    SCOPED_TRACE(cat(splits, " splits (0: chosen)"));
    check_mixed_step_over_paged_caches(splits, 0);
  }
}

TEST(Lesson10OnTheGpu, AMixedStepThroughTheTiledAttentionEqualsTheCpuStep) {
  // The same step with the decode rows through lesson 08's given tiled design
  // (attention_variants.hpp): 4 warps a block split four ways, 8 in one pass (two of the four
  // pairs: over the emulated kernels each takes about 25 s on two cores).
  REQUIRE_DEVICE();
  for (const auto& [warps, splits] : {std::pair{4, 4}, std::pair{8, 1}}) {
    SCOPED_TRACE(cat(splits, " splits, ", warps, " warps a block"));
    check_mixed_step_over_paged_caches(splits, warps);
  }
}

TEST(Lesson10OnTheGpu, AProfiledStepNamesEveryPartAndRunsTheStep) {
  // CudaForward::profile(): the step runs (its caches advance as forward()'s do, and the next
  // step's logits equal those of a forward that ran it plainly), and each part is counted as often
  // as the forward runs it: per layer one of each, add_rms_norm twice but in the last layer.
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  const int L = m.config.num_hidden_layers;
  CudaForward profiled(m, WeightType::F32), plain(m, WeightType::F32);
  CudaKVStore a(m.config, 64), b(m.config, 64);
  const std::vector<int> prompt = ByteTokenizer::encode("You will meet"), next = {65};
  profiled.prefill(prompt, a);
  plain.prefill(prompt, b);
  for (const auto& [tokens, wanted] : {std::pair{next, 1}, std::pair{ByteTokenizer::encode(" a tall"), 3}}) {
    const int before = a.length();
    const std::vector<CudaForward::StepPart> parts =
        profiled.profile(StepInput{{Chunk{.tokens = tokens, .cache = &a, .logits = wanted}}});
    plain.forward(StepInput{{Chunk{.tokens = tokens, .cache = &b, .logits = wanted}}});
    EXPECT_EQ(a.length(), before + static_cast<int>(tokens.size()));
    std::map<std::string, int> times;
    for (const CudaForward::StepPart& p : parts) {
      times[p.name] = p.times;
      EXPECT_GE(p.ms, 0.0) << p.name;
    }
    std::map<std::string, int> want = {{"embedding", 1}, {"rms_norm", 2}, {"q, k, v products", L}, {"rope", L},
                                       {"attention (its cache writes too)", L}, {"o product", L},
                                       {"add_rms_norm", 2 * L - 1}, {"gate, up products", L}, {"swiglu", L},
                                       {"down product", L}, {"add", 1}, {"lm_head product", 1}};
    if (wanted < static_cast<int>(tokens.size())) want["the wanted rows gathered (copies)"] = 1;
    EXPECT_EQ(times, want) << tokens.size() << " tokens, " << wanted << " wanted";
  }
  const Matrix after_profiled = profiled.forward(StepInput{{Chunk{.tokens = next, .cache = &a}}});
  const Matrix after_plain = plain.forward(StepInput{{Chunk{.tokens = next, .cache = &b}}});
  EXPECT_TRUE(testing::all_close(after_plain, after_profiled, 1e-6, 1e-6, "the step after the profiled ones"));
}

TEST(Lesson10OnTheGpu, PagedAttentionRefusesSettingsItCannotRun) {
  REQUIRE_DEVICE();
  CudaPagedKVPool pool(testing::bundled_model().config, 8, 8);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { device_paged_attention(pool, -1); }, "num_splits must be >= 0"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { device_paged_attention(pool, 0, 3); },
                                               "tiled_warps must be 0 (your kernels), 4, 8 or 16, got 3"));
  ModelConfig wide = testing::bundled_model().config;  // head_dim 132: 4 warps a block read it, 8 do not
  wide.head_dim = 132;
  CudaPagedKVPool wide_pool(wide, 8, 8);
  EXPECT_NO_THROW(device_paged_attention(wide_pool, 0, 4));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { device_paged_attention(wide_pool, 0, 8); },
                                               "with 8 warps a block cannot read head_dim 132"));
}

TEST(Lesson10OnTheGpu, ATreeOfGuessesOverPagedCachesEqualsTheCpuStep) {
  // Lesson 06's tree (5 nodes: a root, two children, a grandchild under each) after 20 cached
  // positions, beside a chain: every tree row's logits, each row at its depth, seeing its
  // ancestors only (lesson 08's attention over slot lists).
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  auto pool = std::make_unique<CudaPagedKVPool>(m.config, 64, 8);
  CudaForward gpu(m, WeightType::F32, device_paged_attention(*pool));
  PagedKVManager kv(std::move(pool));
  auto g_tree = kv.open(0), g_chain = kv.open(0);
  KVCache c_tree(m.config, 256), c_chain(m.config, 256);
  const std::vector<int> context = ByteTokenizer::encode("Q: What does the fox say? A: It");
  const std::vector<int> before = ByteTokenizer::encode("You will meet a tall");
  forward_cached(m, context, c_tree);
  forward_cached(m, before, c_chain);
  gpu.prefill(context, *g_tree);
  gpu.prefill(before, *g_chain);
  const TokenTree tree{{35, 118, 122, 100, 124}, {-1, 0, 0, 1, 2}};  // five token ids
  const TreeMask mask = tree_mask(tree);
  const std::vector<int> chain = ByteTokenizer::encode(" stranger");
  StepInput cs, gs;
  cs.chunks.push_back({.tokens = tree.tokens, .cache = &c_tree, .logits = 5, .mask = &mask});
  cs.chunks.push_back({.tokens = chain, .cache = &c_chain});
  gs.chunks.push_back({.tokens = tree.tokens, .cache = g_tree.get(), .logits = 5, .mask = &mask});
  gs.chunks.push_back({.tokens = chain, .cache = g_chain.get()});
  EXPECT_TRUE(testing::all_close(forward_step(m, cs), gpu.forward(gs), 1e-3, 1e-3, "the tree and the chain"));
  // Lesson 07's contiguous attention cannot follow a mask: it refuses, naming it.
  CudaForward flat(m, WeightType::F32);
  CudaKVStore store(m.config, 64);
  StepInput one;
  one.chunks.push_back({.tokens = tree.tokens, .cache = &store, .logits = 5, .mask = &mask});
  EXPECT_TRUE(testing::throws_error_mentioning([&] { flat.forward(one); }, "mask"));
}

TEST(Lesson10OnTheGpu, CudaGraphsReplayTheEagerDecodeSteps) {
  // Three sequences decoding together, then two: the same steps from graphs and launched one
  // kernel at a time give the same logits (the same kernels, the same order), through a change
  // of split count as the contexts grow past 128 positions, with a graph per batch size and split.
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  CudaPagedParts graphed = cuda_paged_parts(m, WeightType::F32, 64, 8), eager = cuda_paged_parts(m, WeightType::F32, 64, 8);
  graphed.forward->use_graphs(true);
  PagedKVManager gm(std::move(graphed.pool)), em(std::move(eager.pool));
  std::vector<std::unique_ptr<KVStore>> gs, es;
  const char* prompts[] = {"Q: What is a duck? A: A duck is", "Fortune favours", "You will meet a tall dark stranger who"};
  for (const char* p : prompts) {
    const std::vector<int> t = ByteTokenizer::encode(p);
    gs.push_back(gm.open(0)), es.push_back(em.open(0));
    graphed.forward->prefill(t, *gs.back());
    eager.forward->prefill(t, *es.back());
  }
  std::vector<int> next = {65, 66, 67};
  for (int step = 0; step < 120; ++step) {
    const size_t batch = step < 60 ? 3 : 2;
    std::vector<KVStore*> g, e;
    for (size_t i = 0; i < batch; ++i) g.push_back(gs[i].get()), e.push_back(es[i].get());
    const std::span<const int> tokens(next.data(), batch);
    const Matrix want = eager.forward->decode(tokens, e), got = graphed.forward->decode(tokens, g);
    ASSERT_TRUE(testing::all_close(want, got, 1e-6, 1e-6, cat("decode step ", step)));
    for (size_t i = 0; i < batch; ++i) {
      Eigen::Index best;
      want.row(static_cast<Eigen::Index>(i)).maxCoeff(&best);
      next[i] = static_cast<int>(best);
    }
  }
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(gs[i]->length(), es[i]->length()) << "the bookkeeping after each replay";
  EXPECT_GE(graphed.forward->graphs_captured(), 2) << "batches of 3 and of 2 are different graphs";
  EXPECT_LE(graphed.forward->graphs_captured(), 6) << "one graph per batch size and split count, not one per step";
}

// --------------------------------------------------------------- the engine --

TEST(Lesson10OnTheGpu, ChunkedPrefillWithPreemptionGivesTheCpuEnginesTokens) {
  // A budget of 16 tokens a step (long prompts go in pieces beside the decodes) and a pool of 24
  // blocks of 8 positions: too small for everyone, so sequences are preempted and recomputed.
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  const ServingOptions o{.max_running = 4, .token_budget = 16};
  auto cpu = cpu_engine(m, 24, 8, false, o);
  auto gpu = gpu_engine(m, WeightType::F32, 24, 8, false, o);
  const auto rs = requests();
  const auto want = serve(*cpu, rs), got = serve(*gpu, rs);
  expect_same_results(got, want);
  int preempted = 0, mixed = 0;
  for (const auto& r : want) preempted += r.preemptions;
  for (const auto& e : gpu->log()) mixed += e.prefills > 0 && e.decodes > 0 && e.prefill_tokens > e.prefills;
  EXPECT_GT(preempted, 0) << "the pool was meant to be small enough to preempt someone";
  EXPECT_GT(mixed, 0) << "some step was meant to carry a prompt chunk beside decodes";
  EXPECT_EQ(gpu->memory().reserved_tokens(), 0) << "every block is back in the pool";
}

TEST(Lesson10OnTheGpu, TheEngineWithCudaGraphsGivesTheCpuEnginesTokens) {
  // Decode steps from graphs beside steps with prompt chunks (launched as before), preemption
  // included: the CPU engine's tokens.
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  const ServingOptions o{.max_running = 4, .token_budget = 16};
  auto cpu = cpu_engine(m, 24, 8, false, o);
  CudaPagedParts parts = cuda_paged_parts(m, WeightType::F32, 24, 8);
  parts.forward->use_graphs(true);
  CudaForward& forward = *parts.forward;
  auto gpu = serving_engine(std::move(parts.forward), std::make_unique<PagedKVManager>(std::move(parts.pool)), o);
  const auto rs = requests();
  expect_same_results(serve(*gpu, rs), serve(*cpu, rs));
  EXPECT_GT(forward.graphs_captured(), 0) << "decode steps were meant to be replayed";
}

TEST(Lesson10OnTheGpu, ThePrefixCacheSavesTheSamePrefillOnTheGpu) {
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  const std::string system = "Q: What does a wise person say about the sea? A: The sea is wide and the ship is small, so ";
  std::vector<GenerationRequest> rs;
  for (int i = 0; i < 6; ++i)
    rs.push_back({i, ByteTokenizer::encode(system + std::string(1, static_cast<char>('a' + i))), 12,
                  SamplingParams{.temperature = 0.0f}, 3 * i});
  const ServingOptions o{.max_running = 4, .token_budget = 32};
  auto cpu = cpu_engine(m, 80, 8, true, o);
  auto gpu = gpu_engine(m, WeightType::F32, 80, 8, true, o);
  const auto want = serve(*cpu, rs), got = serve(*gpu, rs);
  expect_same_results(got, want);
  int cached = 0;
  for (const auto& r : got) cached += r.cached_tokens;
  EXPECT_GT(cached, 0) << "later requests were meant to find the shared prompt in the cache";
}

TEST(Lesson10OnTheGpu, SpeculativeDecodingGivesPlainGreedyTokens) {
  // Prompt lookup and the bundled draft (on the GPU too), 4 guesses a decode, verified in one
  // step on the GPU: greedy speculation keeps the target's own tokens.
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  const ServingOptions plain{.max_running = 4, .token_budget = 32};
  ServingOptions spec = plain;
  spec.speculative_tokens = 4;
  const auto rs = requests(6, 30);
  auto cpu = cpu_engine(m, 128, 8, false, plain);
  const auto want = serve(*cpu, rs);
  CudaDraft draft = cuda_draft(testing::bundled_draft(), WeightType::F32);  // both models on the GPU
  for (const char* how : {"ngram", "draft"}) {
    SCOPED_TRACE(how);
    const auto speculator = [&] {
      return std::string(how) == "ngram" ? prompt_lookup_speculator()
                                         : draft_speculator(*draft.forward, draft.new_cache, m.config.vocab_size);
    };
    auto gpu = gpu_engine(m, WeightType::F32, 128, 8, false, spec, speculator());
    const auto got = serve(*gpu, rs);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    long accepted = 0;
    for (const auto& e : gpu->log()) accepted += e.accepted;
    EXPECT_GT(accepted, 0) << "some guesses were meant to be kept";
  }
}

TEST(Lesson10OnTheGpu, Bf16WeightsGiveTheTokensOfTheCpuOverTheSameRoundedWeights) {
  REQUIRE_DEVICE();
  const ModelWeights rounded = rounded_to_bf16(testing::bundled_model());
  const ServingOptions o{.max_running = 4, .token_budget = 16};
  auto cpu = cpu_engine(rounded, 96, 8, true, o);
  auto gpu = gpu_engine(testing::bundled_model(), WeightType::BF16, 96, 8, true, o);
  const auto rs = requests();
  expect_same_results(serve(*gpu, rs), serve(*cpu, rs));
}

/// Another way to compute the bf16 products of several rows, turned on or off by `use(forward,
/// on)`: the serving engine with it on (decode steps from graphs that capture its calls, prompt
/// chunks of up to 16 rows, the prefix cache) gives the CPU engine's tokens over the same rounded
/// weights; and one step's logits (prompts of 10 to 14 rows, then a decode step of 5, then a step
/// of two prompts of 150: 300 rows, more than one call of kCublasChunk) equal a forward's without
/// it, within 1e-4 + 1e-4 |ref| (only the order of the sums differs).
void expect_products_agree(const std::function<void(CudaForward&, bool)>& use) {
  const ModelWeights& m = testing::bundled_model();
  const ServingOptions o{.max_running = 4, .token_budget = 16};
  const ModelWeights rounded = rounded_to_bf16(m);  // (the CPU engine keeps a reference)
  auto cpu = cpu_engine(rounded, 96, 8, true, o);
  CudaPagedParts parts = cuda_paged_parts(m, WeightType::BF16, 96, 8);
  use(*parts.forward, true);
  parts.forward->use_graphs(true);
  auto gpu = serving_engine(std::move(parts.forward), std::make_unique<PrefixKVManager>(std::move(parts.pool)), o);
  const auto rs = requests();
  expect_same_results(serve(*gpu, rs), serve(*cpu, rs));

  CudaPagedParts a = cuda_paged_parts(m, WeightType::BF16, 96, 8), b = cuda_paged_parts(m, WeightType::BF16, 96, 8);
  use(*a.forward, false), use(*b.forward, true);
  PagedKVManager am(std::move(a.pool)), bm(std::move(b.pool));
  std::vector<std::unique_ptr<KVStore>> as, bs;
  std::vector<KVStore*> ap, bp;
  const std::vector<int> prompt = ByteTokenizer::encode("Q: What is a duck? A:");
  for (int i = 0; i < 5; ++i) {
    as.push_back(am.open(0)), bs.push_back(bm.open(0));
    const std::vector<int> t(prompt.begin(), prompt.begin() + 10 + i);  // 10 to 14 rows: the other products on b
    const Vector want = a.forward->prefill(t, *as.back()), got = b.forward->prefill(t, *bs.back());
    ASSERT_TRUE(testing::all_close(want.transpose(), got.transpose(), 1e-4, 1e-4, cat("prompt ", i)));
    ap.push_back(as.back().get()), bp.push_back(bs.back().get());
  }
  const std::vector<int> next = {65, 66, 67, 68, 69};
  EXPECT_TRUE(testing::all_close(a.forward->decode(next, ap), b.forward->decode(next, bp), 1e-4, 1e-4,
                                 "a decode step of 5"));
  std::vector<int> long_prompt(150);
  for (size_t i = 0; i < long_prompt.size(); ++i) long_prompt[i] = prompt[i % prompt.size()];
  std::vector<std::unique_ptr<KVStore>> ca, cb;
  StepInput sa, sb;
  for (int i = 0; i < 2; ++i) {
    ca.push_back(am.open(0)), cb.push_back(bm.open(0));
    sa.chunks.push_back({.tokens = long_prompt, .cache = ca.back().get()});
    sb.chunks.push_back({.tokens = long_prompt, .cache = cb.back().get()});
  }
  EXPECT_TRUE(testing::all_close(a.forward->forward(sa), b.forward->forward(sb), 1e-4, 1e-4, "a step of 300 rows"));
}

TEST(Lesson10OnTheGpu, CublasProductsGiveTheTokensOfTheCpuOverTheSameRoundedWeights) {
  // CudaForward::use_cublas: the bf16 products of 2 rows or more by cuBLAS's GEMM (x split in two
  // bf16 halves, as the tensor-core GEMM splits it).
  REQUIRE_DEVICE();
  expect_products_agree([](CudaForward& f, bool on) { f.use_cublas(on); });
}

TEST(Lesson10OnTheGpu, SplitSkinnyProductsGiveTheTokensOfTheCpuOverTheSameRoundedWeights) {
  // CudaForward::skinny_split(16, 1024): the bf16 products of 2 to 16 rows by the given
  // skinny_gemm_bf16_split (no staging), each matrix of the bundled model at split 8 (its 48 to
  // 512 rows are 12 to 128 groups of 4: the join in shared memory is in every product). The step
  // of 300 rows is above its most, so both sides of that comparison run lesson 07's products.
  REQUIRE_DEVICE();
  expect_products_agree([](CudaForward& f, bool on) { f.skinny_split(on ? 16 : 0, 1024); });
}

TEST(Lesson10OnTheGpu, AFusedOneRowStepGivesTheTokensOfTheCpuOverTheSameRoundedWeights) {
  // CudaForward::fuse_one_row: a one-row step's norms, residual adds and SwiGLU inside its
  // products (gemv_bf16_fused), decode steps from graphs too, under the serving engine with the
  // prefix cache and chunked prefill, one request running at a time (every decode step one row)
  // and four: the CPU engine's tokens over the same rounded weights. And one-row steps' logits (a
  // prompt wanting its last row's, decodes) against the unfused forward's, within 1e-4 + 1e-4
  // |ref| (the order of the sums apart). float32 matrices have no fused product: it says so.
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  const ModelWeights rounded = rounded_to_bf16(m);  // (the CPU engine keeps a reference)
  const auto rs = requests();
  for (const int running : {1, 4}) {
    SCOPED_TRACE(cat(running, " running"));
    const ServingOptions o{.max_running = running, .token_budget = 16};
    auto cpu = cpu_engine(rounded, 96, 8, true, o);
    CudaPagedParts parts = cuda_paged_parts(m, WeightType::BF16, 96, 8);
    ASSERT_TRUE(parts.forward->fuse_one_row(true));
    parts.forward->use_graphs(true);
    CudaForward& forward = *parts.forward;
    auto gpu = serving_engine(std::move(parts.forward), std::make_unique<PrefixKVManager>(std::move(parts.pool)), o);
    expect_same_results(serve(*gpu, rs), serve(*cpu, rs));
    ASSERT_GT(forward.graphs_captured(), 0);
    forward.fuse_one_row(false);  // a graph of the fused step would replay it: they go
    EXPECT_EQ(forward.graphs_captured(), 0);
  }

  CudaPagedParts a = cuda_paged_parts(m, WeightType::BF16, 32, 8), b = cuda_paged_parts(m, WeightType::BF16, 32, 8);
  a.forward->fuse_one_row(false);
  ASSERT_TRUE(b.forward->fuse_one_row(true));
  PagedKVManager am(std::move(a.pool)), bm(std::move(b.pool));
  auto ac = am.open(0), bc = bm.open(0);
  const std::vector<int> prompt = ByteTokenizer::encode("Q: What is a duck? A:");
  ASSERT_TRUE(testing::all_close(a.forward->prefill(prompt, *ac).transpose(), b.forward->prefill(prompt, *bc).transpose(),
                                 1e-4, 1e-4, "a prompt's last row"));
  for (const int token : {65, 66, 67}) {
    KVStore* ap[] = {ac.get()};
    KVStore* bp[] = {bc.get()};
    const std::vector<int> next = {token};
    ASSERT_TRUE(testing::all_close(a.forward->decode(next, ap), b.forward->decode(next, bp), 1e-4, 1e-4,
                                   cat("a decode of ", token)));
  }
  am.close(std::move(ac)), bm.close(std::move(bc));
  EXPECT_FALSE(cuda_paged_parts(m, WeightType::F32, 32, 8).forward->fuse_one_row(true));
}

TEST(Lesson10OnTheGpu, QuantizedWeightsGiveTheTokensOfTheCpuOverTheSameFormat) {
  // Lesson 11's INT8 and INT4 (groups of 32: the wide kernels; of 8: the plain ones) through
  // lesson 07's forward, prefix cache and chunked prefill included, against the CPU engine over
  // quantize_model() of the same format: the same rounded weights, summed in another order.
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  const ServingOptions o{.max_running = 4, .token_budget = 16};
  const auto rs = requests();
  for (auto [format, group] : {std::pair{WeightFormat::int8, 32}, {WeightFormat::int4, 32}, {WeightFormat::int4, 8}}) {
    const DeviceWeights weights = quantized_device_weights(format, group);
    SCOPED_TRACE(weights.name);
    auto cpu = cpu_engine(m, 96, 8, true, o, nullptr, quantize_model(m, format, group));
    auto gpu = gpu_engine(m, weights, 96, 8, true, o);
    expect_same_results(serve(*gpu, rs), serve(*cpu, rs));
  }
}

TEST(Lesson10OnTheGpu, AQuantizedForwardReadsItsFormatsBytes) {
  // What a decode step reads of the weights, as the forward counts it: each format's bytes, scales
  // included (lesson 11's bytes_per_weight), and far fewer than float32's.
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  const double f32 = CudaForward(m, WeightType::F32).weight_bytes_per_step();
  for (auto [format, group] : {std::pair{WeightFormat::int8, 32}, {WeightFormat::int4, 32}}) {
    const double bytes = CudaForward(m, quantized_device_weights(format, group)).weight_bytes_per_step();
    EXPECT_DOUBLE_EQ(bytes, static_cast<double>(quantize_model(m, format, group).bytes())) << weight_format_name(format);
    EXPECT_LT(bytes, f32 / (format == WeightFormat::int8 ? 3.5 : 6.0)) << weight_format_name(format);
  }
  using testing::throws_error_mentioning;
  EXPECT_TRUE(throws_error_mentioning([] { quantized_device_weights(WeightFormat::f32); }, "WeightType::F32"));
  EXPECT_TRUE(throws_error_mentioning([] { quantized_device_weights(WeightFormat::int4, 0); }, "at least 2"));
  EXPECT_TRUE(throws_error_mentioning([&] { CudaForward(m, quantized_device_weights(WeightFormat::int4, 7)); },
                                      "a group of 7"));
}

TEST(Lesson10OnTheGpu, APoolThatRunsDryLosesNothing) {
  // Twelve requests, a pool of 20 blocks of 8 (enough for the longest alone): everyone finishes,
  // with every token asked for (or EOS), and the pool is whole at the end.
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  auto gpu = gpu_engine(m, WeightType::F32, 20, 8, false, {.max_running = 6, .token_budget = 24});
  const auto rs = requests(12, 24);
  const auto got = serve(*gpu, rs);
  ASSERT_EQ(got.size(), rs.size());
  int preempted = 0;
  for (size_t i = 0; i < rs.size(); ++i) {
    const bool eos = !got[i].tokens.empty() && got[i].tokens.back() == m.config.eos_token_id;
    EXPECT_TRUE(eos || static_cast<int>(got[i].tokens.size()) == rs[i].max_new_tokens) << "request " << i;
    preempted += got[i].preemptions;
  }
  EXPECT_GT(preempted, 0) << "the pool was meant to run dry";
  EXPECT_EQ(gpu->memory().reserved_tokens(), 0);
}

TEST(Lesson10OnTheGpu, CancellingFreesTheDeviceBlocks) {
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  auto gpu = gpu_engine(m, WeightType::F32, 64, 8, false, {.max_running = 4, .token_budget = 16});
  for (const auto& r : requests(4, 40)) gpu->submit(r);
  for (int i = 0; i < 6; ++i) gpu->step();
  EXPECT_GT(gpu->memory().reserved_tokens(), 0);
  for (int id = 0; id < 4; ++id) gpu->cancel(id);
  while (!gpu->idle()) gpu->step();
  EXPECT_EQ(gpu->memory().reserved_tokens(), 0) << "cancelled sequences give their blocks back";
}

TEST(Lesson10OnTheGpu, TheFusedAddAndNormEqualsLesson07sAddThenNorm) {
  // The forward's add_rms_norm (given) against lesson 07's add() then rms_norm() on the same rows:
  // x gets the same sums (exactly), h the same norm up to the order of the squares' sum (1e-5
  // relative, float32 sums of 2,048 squares). Rows of 2,048 (the 1.1B shape's hidden size) and of
  // 100 (not a multiple of the block's threads).
  REQUIRE_DEVICE();
  for (const int cols : {2048, 100}) {
    const int rows = 3;
    Rng rng(static_cast<uint64_t>(cols));
    std::vector<float> x(static_cast<size_t>(rows) * cols), y(x.size()), w(static_cast<size_t>(cols));
    for (float& v : x) v = static_cast<float>(rng.uniform(-2, 2));
    for (float& v : y) v = static_cast<float>(rng.uniform(-2, 2));
    for (float& v : w) v = static_cast<float>(rng.uniform(0.5, 1.5));
    DeviceArray<float> x1(x), x2(x), dy(y), dw(w), h1(x.size()), h2(x.size());
    add(x1.get(), dy.get(), static_cast<long>(x.size()));
    rms_norm(x1.get(), dw.get(), h1.get(), rows, cols, 1e-5f);
    add_rms_norm(x2.get(), dy.get(), dw.get(), h2.get(), rows, cols, 1e-5f);
    EXPECT_EQ(x2.download(), x1.download()) << "cols " << cols << ": the residual sums";
    const std::vector<float> want = h1.download(), got = h2.download();
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i]) + 1e-6) << "cols " << cols << ", element " << i;
  }
  using testing::throws_error_mentioning;
  EXPECT_TRUE(throws_error_mentioning(
      [] { add_rms_norm(nullptr, nullptr, nullptr, nullptr, 0, 4, 1e-5f); }, "add_rms_norm"));
}

TEST(Lesson10OnTheGpu, TheNaiveGpuForwardEqualsLesson00) {
  // What `serve --naive --device cuda` runs every token: the whole sequence from an emptied store.
  REQUIRE_DEVICE();
  const ModelWeights& m = testing::bundled_model();
  CudaModel gpu(m, WeightType::F32, m.config.max_position_embeddings);
  for (const char* text : {"Q", "Q: What is a duck?", "Fortune favours the bold, and the bold say so twice."}) {
    const std::vector<int> tokens = ByteTokenizer::encode(text);
    gpu.reset();
    const Matrix want = forward(m, tokens);
    EXPECT_TRUE(testing::all_close(want.bottomRows(1), gpu.prefill(tokens).transpose(), 1e-3, 1e-3, text));
  }
}


// ------------------------------------------------------------ random scenarios --

/// Request r's greedy tokens alone on the CPU (generate_cached's), with the lead of each chosen
/// token's logit over the next most likely one. Two logits within this file's tolerance of the
/// CPU's may trade places where their lead is below twice it: that is the tie allowed.
testing::Expected greedy_with_leads(const ModelWeights& m, const GenerationRequest& r) {
  KVCache cache(m.config, m.config.max_position_embeddings);
  testing::Expected e;
  Matrix logits = forward_cached(m, r.prompt, cache);
  float largest = 0.0f;
  for (int step = 0; step < r.max_new_tokens; ++step) {
    const Eigen::VectorXf row = logits.row(logits.rows() - 1).transpose();
    Eigen::Index best = 0;
    const float top = row.maxCoeff(&best);
    float second = -std::numeric_limits<float>::infinity();
    for (Eigen::Index v = 0; v < row.size(); ++v)
      if (v != best) second = std::max(second, row[v]);
    e.tokens.push_back(static_cast<int>(best));
    e.leads.push_back(top - second);
    largest = std::max(largest, std::abs(top));
    if (best == m.config.eos_token_id || step + 1 == r.max_new_tokens) break;
    logits = forward_cached(m, std::span(&e.tokens.back(), 1), cache);
  }
  e.tie = 2.0f * (1e-3f + 1e-3f * largest);
  return e;
}

/// tests/common/engine_scenarios.hpp's scenario `seed` on the GPU engine, its matrices as `type`
/// says: lesson 07's forward over its slots in device memory or lesson 08's pool on the device
/// (under lesson 04's or 05's bookkeeping), the draft on the device too. A greedy request gets the
/// tokens it gets alone on the CPU (over the same weights rounded to bf16, for bf16); a sampled one
/// is checked for length and finish only (the device sums in another order, and a draw near a
/// boundary between two tokens may go the other way).
void run_gpu_scenario(uint64_t seed, WeightType type) {
  const ModelWeights& m = testing::bundled_model();
  const ModelWeights reference = type == WeightType::BF16 ? rounded_to_bf16(m) : m;
  const testing::Scenario s = testing::draw_scenario(seed);
  SCOPED_TRACE(s.describe());
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<KVManager> memory;
  if (s.memory == testing::ScenarioMemory::Slots) {
    runner = std::make_unique<CudaForward>(m, type);
    memory = cuda_slots(m.config, s.max_running);
  } else {
    CudaPagedParts parts = cuda_paged_parts(m, type, s.num_blocks, s.block_size);
    runner = std::move(parts.forward);
    if (s.memory == testing::ScenarioMemory::Prefix) memory = std::make_unique<PrefixKVManager>(std::move(parts.pool));
    else memory = std::make_unique<PagedKVManager>(std::move(parts.pool));
  }
  CudaDraft draft;  // (before the engine, whose speculator runs it)
  std::unique_ptr<Speculator> speculator;
  if (s.speculation == testing::ScenarioSpeculation::Lookup) speculator = prompt_lookup_speculator();
  if (s.speculation == testing::ScenarioSpeculation::Draft) {
    draft = cuda_draft(testing::bundled_draft(), type);
    speculator = draft_speculator(*draft.forward, draft.new_cache, m.config.vocab_size);
  }
  Engine engine(std::move(runner), std::move(memory), testing::scenario_options(s), testing::scenario_planner(s),
                std::move(speculator));
  testing::run_scenario(engine, s, testing::draw_plan(seed), m.config.eos_token_id,
                        [&](const GenerationRequest& r) -> std::optional<testing::Expected> {
                          if (r.sampling.temperature > 0.0f) return std::nullopt;
                          return greedy_with_leads(reference, r);
                        });
}

class RandomScenario : public ::testing::TestWithParam<uint64_t> {};

TEST_P(RandomScenario, EveryGreedyRequestGetsTheCpusTokensAndLeavesNothingBehind) {
  REQUIRE_DEVICE();
  run_gpu_scenario(GetParam(), WeightType::F32);
}

class Bf16RandomScenario : public ::testing::TestWithParam<uint64_t> {};

TEST_P(Bf16RandomScenario, EveryGreedyRequestGetsTheCpusTokensOverTheRoundedWeights) {
  REQUIRE_DEVICE();
  run_gpu_scenario(GetParam(), WeightType::BF16);
}

// One test per scenario (a failure's name is its seed): the first 40 of the CPU's 100; in bf16, 10.
INSTANTIATE_TEST_SUITE_P(Gpu, RandomScenario, ::testing::Range<uint64_t>(1, 41),
                         [](const ::testing::TestParamInfo<uint64_t>& info) { return std::to_string(info.param); });
INSTANTIATE_TEST_SUITE_P(Gpu, Bf16RandomScenario, ::testing::Range<uint64_t>(1, 11),
                         [](const ::testing::TestParamInfo<uint64_t>& info) { return std::to_string(info.param); });

}  // namespace
}  // namespace infer::gpu
