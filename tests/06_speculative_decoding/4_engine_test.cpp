// Lesson 06, part D: your proposers and verification inside lesson 03's engine. Several requests
// speculate in the same steps as each other's decodes and prefills; greedy, each gets the tokens
// plain decoding gives it, in fewer forwards.
#include <memory>
#include <vector>

#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "common/tokenizer.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"
#include "lessons/06_speculative_decoding/speculative.hpp"

namespace infer {
namespace {

std::vector<GenerationRequest> requests() {
  const char* prompts[] = {"Q: What is a", "A duck walks into a bar", "The best way to", "Q: Why", "Fortune favours",
                           "You will"};
  std::vector<GenerationRequest> r;
  for (int i = 0; i < 6; ++i)
    r.push_back({i, ByteTokenizer::encode(prompts[i]), 20 + 7 * i, SamplingParams{.temperature = 0.0f}, i / 2});
  return r;
}

struct EngineRun {
  std::vector<GenerationResult> results;
  long forwards = 0, proposed = 0, accepted = 0, tokens = 0;
};

EngineRun run(std::unique_ptr<Speculator> speculator, int k) {
  const ModelWeights& m = testing::bundled_model();
  Engine engine(std::make_unique<CpuRunner>(m), std::make_unique<SlotKVManager>(m.config, 4),
                {.max_running = 4, .speculative_tokens = k}, nullptr, std::move(speculator));
  for (const auto& r : requests()) engine.submit(r);
  EngineRun out;
  out.results = engine.run();
  for (const EngineStepLog& e : engine.log()) {
    out.forwards += e.forwards;
    out.proposed += e.proposed;
    out.accepted += e.accepted;
  }
  for (const auto& r : out.results) out.tokens += static_cast<long>(r.tokens.size());
  return out;
}

GRADED_TEST(Lesson06Engine, SpeculatingRequestsGetPlainGreedyTokensInFewerSteps, 3) {
  const EngineRun plain = run(nullptr, 0);
  struct Case {
    const char* name;
    std::unique_ptr<Speculator> speculator;
  };
  Case cases[] = {{"prompt lookup", prompt_lookup_speculator()},
                  {"the draft", draft_speculator(testing::bundled_draft(), testing::bundled_model().config.vocab_size)}};
  for (Case& c : cases) {
    SCOPED_TRACE(c.name);
    const EngineRun spec = run(std::move(c.speculator), 4);
    ASSERT_EQ(spec.results.size(), plain.results.size());
    for (size_t i = 0; i < plain.results.size(); ++i)
      EXPECT_EQ(spec.results[i].tokens, plain.results[i].tokens)
          << "request " << i << ": \"" << ByteTokenizer::decode(spec.results[i].tokens) << "\" speculating, \""
          << ByteTokenizer::decode(plain.results[i].tokens) << "\" decoding plainly";
    EXPECT_GT(spec.proposed, 0) << "no guess was ever fed";
    EXPECT_GT(spec.accepted, 0) << "no guess was ever kept";
    EXPECT_LT(spec.forwards, plain.forwards) << "kept guesses are tokens that cost no step of their own";
  }
}

TEST(Lesson06Given, ADraftThroughTheForwardSeamProposesWhatTheDraftWeightsDo) {
  // The GPU runs the draft through the forward seam (a CudaForward and a device store per
  // sequence); here the seam is a CpuRunner and the stores are paged, and the engine must make
  // the same steps with the same tokens as the draft on its weights and its own KVCache.
  const ModelWeights& d = testing::bundled_draft();
  const int vocab = testing::bundled_model().config.vocab_size;
  const EngineRun direct = run(draft_speculator(d, vocab), 4);
  CpuRunner runner(d);
  PagedKVPool pool(d.config, 256, 8);
  const EngineRun seam = run(
      draft_speculator(runner, [&] { return std::make_unique<PagedKVCache>(pool, d.config.max_position_embeddings); },
                       vocab),
      4);
  ASSERT_EQ(seam.results.size(), direct.results.size());
  for (size_t i = 0; i < direct.results.size(); ++i)
    EXPECT_EQ(seam.results[i].tokens, direct.results[i].tokens) << "request " << i;
  EXPECT_EQ(seam.forwards, direct.forwards);
  EXPECT_EQ(seam.accepted, direct.accepted);
  EXPECT_EQ(pool.allocator().num_free(), pool.num_blocks()) << "each sequence's draft store went back when it left";
}

}  // namespace
}  // namespace infer
