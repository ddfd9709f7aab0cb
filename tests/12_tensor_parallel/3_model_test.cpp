// Lesson 12: the model over a group of ranks. Its logits equal the whole model's at 1, 2 and 4
// ranks; a step costs exactly two all-reduces a layer; each rank's KV memory holds its own heads;
// and the engine driving the group from rank 0 generates the single-process engine's greedy text.
#include <functional>
#include <memory>
#include <vector>

#include "common/testing/compare.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "common/tokenizer.hpp"
#include "lessons/02_kv_cache/kv_cache.hpp"
#include "lessons/03_batching/engine.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"
#include "lessons/05_prefix_caching/prefix_cache.hpp"
#include "lessons/06_speculative_decoding/speculative.hpp"
#include "lessons/12_tensor_parallel/tensor_parallel.hpp"

namespace infer {
namespace {

/// A prompt of two sequences, then a decode of both, as two steps of the engine; rows of logits.
struct TwoSteps {
  Matrix prefill, decode;
  long all_reduces = 0, broadcasts = 0;  // of this rank, in the two steps
};

TwoSteps two_steps(const ModelWeights& shard, const ModelProjections& projections, Communicator* comm) {
  const std::vector<int> a = ByteTokenizer::encode("The quick brown fox"), b = ByteTokenizer::encode("Love is");
  KVCache ca(shard.config, 64), cb(shard.config, 64);
  TwoSteps out;
  if (comm) comm->reset_stats();
  out.prefill = forward_step(shard, projections, StepInput{{{a, &ca}, {b, &cb}}});
  const std::vector<int> next_a = {ByteTokenizer::encode(" j", false)[0]}, next_b = {ByteTokenizer::encode(" a", false)[0]};
  out.decode = forward_step(shard, projections, StepInput{{{next_a, &ca}, {next_b, &cb}}});
  if (comm) out.all_reduces = comm->stats().all_reduces, out.broadcasts = comm->stats().broadcasts;
  return out;
}

GRADED_TEST(Lesson12Model, LogitsAtOneTwoAndFourRanksEqualTheWholeModels, 4) {
  // Rank 0's logits against the unsharded forward_step: the same function, its sums in another
  // order (each all-reduce adds the ranks' partial sums): 1e-4 + 1e-4 |logit|. Every rank holds
  // the same logits (the thread group adds in rank order everywhere).
  const ModelWeights& model = testing::bundled_model();
  const TwoSteps want = two_steps(model, float_projections(model), nullptr);
  for (int world : {1, 2, 4}) {
    std::vector<TwoSteps> got(world);
    run_ranks(world, [&](Communicator& comm) {
      auto source = memory_weights(model);
      const ModelWeights shard = load_shard(*source, shard_plan(model.config, comm.rank(), world));
      got[comm.rank()] = two_steps(shard, tensor_parallel(float_projections(shard), comm), &comm);
    });
    const std::string where = cat(world, " ranks");
    EXPECT_TRUE(testing::all_close(want.prefill, got[0].prefill, 1e-4, 1e-4, where + ": prefill"));
    EXPECT_TRUE(testing::all_close(want.decode, got[0].decode, 1e-4, 1e-4, where + ": decode"));
    for (int r = 1; r < world; ++r) {
      EXPECT_EQ(got[r].prefill, got[0].prefill) << where << ", rank " << r << ": prefill";
      EXPECT_EQ(got[r].decode, got[0].decode) << where << ", rank " << r << ": decode";
    }
  }
}

GRADED_TEST(Lesson12Model, AStepCostsExactlyTwoAllReducesALayer, 2) {
  // One after attention's O, one after the MLP's down: everything else a rank computes alone.
  const ModelWeights& model = testing::bundled_model();
  std::vector<long> reduces(2), broadcasts(2);
  run_ranks(2, [&](Communicator& comm) {
    auto source = memory_weights(model);
    const ModelWeights shard = load_shard(*source, shard_plan(model.config, comm.rank(), 2));
    const TwoSteps t = two_steps(shard, tensor_parallel(float_projections(shard), comm), &comm);
    reduces[comm.rank()] = t.all_reduces;
    broadcasts[comm.rank()] = t.broadcasts;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(reduces[r], 2L * 2 * model.config.num_hidden_layers) << "rank " << r << ", two steps";
    EXPECT_EQ(broadcasts[r], 0) << "rank " << r << ", two steps: the forward itself broadcasts nothing (every rank "
                                   "holds the step's input already; the all-reduce leaves the sum on every rank)";
  }
}

GRADED_TEST(Lesson12Model, EachRanksKvCacheHoldsItsOwnHeads, 1) {
  // Lesson 01's capacity formula, per rank: K/V bytes per position fall with the ranks, until
  // each rank holds one K/V head (past that, heads are replicated, not split).
  const ModelWeights& model = testing::bundled_model();
  const ModelConfig& c = model.config;
  const long whole = static_cast<long>(c.num_key_value_heads) * c.head_dim;
  for (int world : {1, 2, 4}) {
    for (int rank = 0; rank < world; ++rank) {
      auto source = memory_weights(model);
      const ModelWeights shard = load_shard(*source, shard_plan(c, rank, world));
      KVCache cache(shard.config, 4);
      const Matrix k = Matrix::Ones(1, cache.keys(0).cols());
      cache.append(0, k, k);
      const long want = world <= c.num_key_value_heads ? whole / world : c.head_dim;
      EXPECT_EQ(cache.keys(0).cols(), want) << world << " ranks, rank " << rank << ": K floats per position and layer";
    }
  }
}

/// Lesson 05's memory for greedy_ids(): a pool too small for three sequences at once (so the
/// engine preempts), in blocks of 4 (so that prompts sharing 20 bytes share 5 blocks).
constexpr int kPagedBlocks = 24, kPagedBlockSize = 4;

/// Greedy ids of `prompts` from the engine on one process, or on `world` ranks (rank 0's engine
/// over TensorParallelRunner, the others following), with prompt lookup when `speculate`; over
/// whole-context slots, or when `paged` over lesson 05's prefix cache in a small pool.
std::vector<std::vector<int>> greedy_ids(int world, bool speculate, bool paged = false) {
  const ModelWeights& model = testing::bundled_model();
  const std::vector<std::string> prompts =
      paged ? std::vector<std::string>{"To be or not to be, that is", "To be or not to be, said the", "Love is",
                                       "To be or not to be, that is the question"}
            : std::vector<std::string>{"The quick brown fox", "Love is", "A", "To be or not to be, that is"};
  const auto submit_all = [&](Engine& engine) {
    for (size_t i = 0; i < prompts.size(); ++i)
      engine.submit({.id = static_cast<int>(i), .prompt = ByteTokenizer::encode(prompts[i]), .max_new_tokens = 24,
                     .sampling = {.temperature = 0}});
  };
  const EngineOptions options{.max_running = 3, .speculative_tokens = speculate ? 3 : 0};
  std::vector<std::vector<int>> ids(prompts.size());
  const auto collect = [&](Engine& engine) {
    for (const GenerationResult& r : engine.run()) ids[static_cast<size_t>(r.id)] = r.tokens;
  };
  if (world == 0) {
    std::unique_ptr<KVManager> memory;
    if (paged)
      memory = std::make_unique<PrefixKVManager>(model.config, kPagedBlocks, kPagedBlockSize);
    else
      memory = std::make_unique<SlotKVManager>(model.config, 3);
    Engine engine(std::make_unique<CpuRunner>(model), std::move(memory), options, nullptr,
                  speculate ? prompt_lookup_speculator() : nullptr);
    submit_all(engine);
    collect(engine);
    return ids;
  }
  run_ranks(world, [&](Communicator& comm) {
    auto source = memory_weights(model);
    const ModelWeights shard = load_shard(*source, shard_plan(model.config, comm.rank(), world));
    auto projections = tensor_parallel(float_projections(shard), comm);
    auto runner = paged ? std::make_unique<TensorParallelRunner>(shard, std::move(projections), comm, kPagedBlocks,
                                                                 kPagedBlockSize)
                        : std::make_unique<TensorParallelRunner>(shard, std::move(projections), comm, 3);
    if (comm.rank() != 0) return runner->follow();
    std::unique_ptr<KVManager> memory;
    if (paged)
      memory = std::make_unique<PrefixKVManager>(runner->pool());
    else
      memory = runner->memory();
    Engine engine(std::move(runner), std::move(memory), options, nullptr, speculate ? prompt_lookup_speculator() : nullptr);
    submit_all(engine);
    collect(engine);
  });
  return ids;
}

GRADED_TEST(Lesson12Model, TheEngineOnTwoAndFourRanksGeneratesTheSameGreedyText, 3) {
  // Four requests over three slots (one waits for a slot another frees), greedy, with and without
  // prompt lookup (a rejected guess rolls every rank's cache back).
  for (bool speculate : {false, true}) {
    const auto want = greedy_ids(0, speculate);
    for (int world : {2, 4}) {
      const auto got = greedy_ids(world, speculate);
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_EQ(got[i], want[i]) << world << " ranks, request " << i << (speculate ? ", prompt lookup" : "");
    }
  }
}

GRADED_TEST(Lesson12Model, PagedMemoryWithAPrefixCacheOnRanksGeneratesTheSameGreedyText, 2) {
  // Lesson 05's memory on rank 0 decides every block; each rank's pool holds its own heads of the
  // same blocks. Three prompts share a 20-byte prefix (blocks found in the cache), and 24 blocks of
  // 4 cannot hold three sequences to the end (the engine preempts and recomputes).
  for (bool speculate : {false, true}) {
    const auto want = greedy_ids(0, speculate, true);
    for (int world : {2, 4}) {
      const auto got = greedy_ids(world, speculate, true);
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_EQ(got[i], want[i]) << world << " ranks, request " << i << (speculate ? ", prompt lookup" : "");
    }
  }
}

TEST(Lesson12Given, ABlockCopiedOnRankZeroIsCopiedOnEveryRank) {
  // The given runner's paged memory: a sequence of 10 positions in blocks of 4 is forked, so the
  // two share a partly filled block; reserving the fork's next position copies that block in rank
  // 0's pool (copy-on-write), and the next step must find the copy on every rank.
  const ModelWeights& model = testing::bundled_model();
  const std::vector<int> prompt = ByteTokenizer::encode("To be or n", false);
  const std::vector<int> next_a = {ByteTokenizer::encode("o", false)[0]}, next_b = {ByteTokenizer::encode("e", false)[0]};
  const auto steps = [&](KVBlockPool& pool, const std::function<Matrix(const StepInput&)>& forward) {
    PagedKVCache a(pool, 64);
    a.reserve(static_cast<int>(prompt.size()));  // as the engine does before every step
    forward(StepInput{{{prompt, &a}}});
    const std::unique_ptr<PagedKVCache> b = a.fork();
    b->reserve(b->length() + 1);  // the shared last block is copied here
    a.reserve(a.length() + 1);
    return forward(StepInput{{{next_a, &a}, {next_b, b.get()}}});
  };
  PagedKVPool whole(model.config, 16, 4);
  const Matrix want = steps(whole, [&](const StepInput& step) { return forward_step(model, step); });
  Matrix got;
  run_ranks(2, [&](Communicator& comm) {
    auto source = memory_weights(model);
    const ModelWeights shard = load_shard(*source, shard_plan(model.config, comm.rank(), 2));
    TensorParallelRunner runner(shard, tensor_parallel(float_projections(shard), comm), comm, 16, 4);
    if (comm.rank() != 0) return runner.follow();
    const std::unique_ptr<KVBlockPool> pool = runner.pool();
    got = steps(*pool, [&](const StepInput& step) { return runner.forward(step); });
  });
  EXPECT_TRUE(testing::all_close(want, got, 1e-4, 1e-4, "the step after a copy-on-write, on 2 ranks"));
}

}  // namespace
}  // namespace infer
