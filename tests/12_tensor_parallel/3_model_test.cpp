// Lesson 12: the model over a group of ranks. Its logits equal the whole model's at 1, 2 and 4
// ranks; a step costs exactly two all-reduces a layer; each rank's KV memory holds its own heads;
// and the engine driving the group from rank 0 generates the single-process engine's greedy text.
#include <vector>

#include "common/testing/compare.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "common/tokenizer.hpp"
#include "lessons/02_kv_cache/kv_cache.hpp"
#include "lessons/03_batching/engine.hpp"
#include "lessons/06_speculative_decoding/speculative.hpp"
#include "lessons/12_tensor_parallel/tensor_parallel.hpp"

namespace infer {
namespace {

/// A prompt of two sequences, then a decode of both, as two steps of the engine; rows of logits.
struct TwoSteps {
  Matrix prefill, decode;
  long all_reduces = 0;  // of rank 0, in the two steps
};

TwoSteps two_steps(const ModelWeights& shard, const ModelProjections& projections, Communicator* comm) {
  const std::vector<int> a = ByteTokenizer::encode("The quick brown fox"), b = ByteTokenizer::encode("Love is");
  KVCache ca(shard.config, 64), cb(shard.config, 64);
  TwoSteps out;
  if (comm) comm->reset_stats();
  out.prefill = forward_step(shard, projections, StepInput{{{a, &ca}, {b, &cb}}});
  const std::vector<int> next_a = {ByteTokenizer::encode(" j", false)[0]}, next_b = {ByteTokenizer::encode(" a", false)[0]};
  out.decode = forward_step(shard, projections, StepInput{{{next_a, &ca}, {next_b, &cb}}});
  if (comm) out.all_reduces = comm->stats().all_reduces;
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
    for (int r = 1; r < world; ++r) EXPECT_EQ(got[r].decode, got[0].decode) << where << ", rank " << r;
  }
}

GRADED_TEST(Lesson12Model, AStepCostsExactlyTwoAllReducesALayer, 2) {
  // One after attention's O, one after the MLP's down: everything else a rank computes alone.
  const ModelWeights& model = testing::bundled_model();
  std::vector<long> reduces(2);
  run_ranks(2, [&](Communicator& comm) {
    auto source = memory_weights(model);
    const ModelWeights shard = load_shard(*source, shard_plan(model.config, comm.rank(), 2));
    reduces[comm.rank()] = two_steps(shard, tensor_parallel(float_projections(shard), comm), &comm).all_reduces;
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(reduces[r], 2L * 2 * model.config.num_hidden_layers) << "rank " << r << ", two steps";
}

GRADED_TEST(Lesson12Model, EachRanksKvCacheHoldsItsOwnHeads, 1) {
  // Lesson 01's capacity formula, per rank: K/V bytes per position fall with the ranks, until
  // each rank holds one K/V head (past that, heads are replicated, not split).
  const ModelWeights& model = testing::bundled_model();
  const ModelConfig& c = model.config;
  const long whole = static_cast<long>(c.num_key_value_heads) * c.head_dim;
  for (int world : {1, 2, 4}) {
    auto source = memory_weights(model);
    const ModelWeights shard = load_shard(*source, shard_plan(c, 0, world));
    KVCache cache(shard.config, 4);
    const Matrix k = Matrix::Ones(1, cache.keys(0).cols());
    cache.append(0, k, k);
    const long want = world <= c.num_key_value_heads ? whole / world : c.head_dim;
    EXPECT_EQ(cache.keys(0).cols(), want) << world << " ranks: K floats per position and layer";
  }
}

/// Greedy ids of `prompts` from the engine on one process, or on `world` ranks (rank 0's engine
/// over TensorParallelRunner, the others following), with prompt lookup when `speculate`.
std::vector<std::vector<int>> greedy_ids(int world, bool speculate) {
  const ModelWeights& model = testing::bundled_model();
  const std::vector<std::string> prompts = {"The quick brown fox", "Love is", "A", "To be or not to be, that is"};
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
    Engine engine(std::make_unique<CpuRunner>(model), std::make_unique<SlotKVManager>(model.config, 3), options, nullptr,
                  speculate ? prompt_lookup_speculator() : nullptr);
    submit_all(engine);
    collect(engine);
    return ids;
  }
  run_ranks(world, [&](Communicator& comm) {
    auto source = memory_weights(model);
    const ModelWeights shard = load_shard(*source, shard_plan(model.config, comm.rank(), world));
    auto runner = std::make_unique<TensorParallelRunner>(shard, tensor_parallel(float_projections(shard), comm), comm, 3);
    if (comm.rank() != 0) return runner->follow();
    auto memory = runner->memory();
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

}  // namespace
}  // namespace infer
