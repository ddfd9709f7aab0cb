// Lesson 10: the serving engine's step: one forward per step within a token budget, decodes
// first, prompts in chunks, and the same tokens as each request run alone.
#include <algorithm>
#include <string>

#include "common/rng.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "common/testing/throws.hpp"
#include "common/tokenizer.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"
#include "lessons/05_prefix_caching/prefix_cache.hpp"
#include "lessons/10_serving/serving.hpp"

namespace infer {
namespace {

std::vector<int> solo(const ModelWeights& m, const GenerationRequest& r) {
  KVCache cache(m.config, m.config.max_position_embeddings);
  Sampler s(r.sampling);
  return generate_cached(m, r.prompt, r.max_new_tokens, s, cache);
}

/// Wraps the CPU forward and records what each call fed: (step, chunks, tokens).
class CountingForward final : public ModelRunner {
 public:
  struct Call {
    int step, chunks, tokens;
  };
  explicit CountingForward(const ModelWeights& m) : inner_(m) {}
  const ModelConfig& config() const override { return inner_.config(); }
  Matrix forward(const StepInput& input) override {
    int tokens = 0;
    for (const Chunk& c : input.chunks) tokens += static_cast<int>(c.tokens.size());
    calls.push_back({step ? *step : -1, static_cast<int>(input.chunks.size()), tokens});
    return inner_.forward(input);
  }
  std::vector<Call> calls;
  const int* step = nullptr;  ///< the engine's clock, read at each call

 private:
  CpuRunner inner_;
};

/// `n` requests on the bundled model: prompts of 2 to `max_prompt` bytes, arriving over a few steps.
std::vector<GenerationRequest> requests(int n, int max_prompt, uint64_t seed, bool sampled) {
  Rng rng(seed);
  std::vector<GenerationRequest> reqs;
  int arrival = 0;
  const std::string text = "The quick brown fox jumps over the lazy dog. Q: What is love? A: Love is patient. ";
  for (int i = 0; i < n; ++i) {
    GenerationRequest r;
    r.id = 100 + i;
    const int len = 2 + static_cast<int>(rng.below(static_cast<uint64_t>(max_prompt - 1)));
    std::string prompt;
    for (int k = 0; k < len; ++k) prompt += text[(static_cast<size_t>(i) * 7 + static_cast<size_t>(k)) % text.size()];
    r.prompt = ByteTokenizer::encode(prompt);
    r.max_new_tokens = 4 + static_cast<int>(rng.below(20));
    r.sampling = sampled ? SamplingParams{.temperature = 0.8f, .top_p = 0.9f, .seed = 40u + i}
                         : SamplingParams{.temperature = 0.0f};
    arrival += static_cast<int>(rng.below(3));
    r.arrival_step = arrival;
    reqs.push_back(r);
  }
  return reqs;
}

/// engine.run(), but an engine that stops making progress fails the test instead of running
/// forever: at most `max_steps` steps.
std::vector<GenerationResult> run_bounded(Engine& engine, int max_steps = 4000) {
  for (int n = 0; !engine.idle(); ++n) {
    if (n == max_steps) {
      std::string unfinished;
      for (const auto& s : engine.running()) unfinished += cat(" ", s->request.id);
      throw Error(cat("the engine made no progress: after ", max_steps, " steps, requests", unfinished, " (and ",
                      engine.waiting(), " waiting) have not finished (is every prefilling sequence planned?)"));
    }
    engine.step();
  }
  return engine.run();
}

void expect_solo_tokens(const ModelWeights& m, const std::vector<GenerationRequest>& reqs,
                        const std::vector<GenerationResult>& results) {
  ASSERT_EQ(results.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(results[i].id, reqs[i].id);
    EXPECT_EQ(results[i].tokens, solo(m, reqs[i]))
        << "request " << reqs[i].id << " (prompt of " << reqs[i].prompt.size()
        << " tokens): its tokens must be those of the request run alone (generate_cached)";
  }
}

GRADED_TEST(Lesson10Engine, GreedyOutputsEqualSoloRunsWithChunkedPrompts, 3) {
  // Budget 12 over at most 4 sequences: prompts up to 60 tokens take several steps each.
  const ModelWeights& m = testing::bundled_model();
  const auto reqs = requests(10, 60, 1, false);
  const auto engine = serving_engine(m, {.max_running = 4, .token_budget = 12});
  for (const auto& r : reqs) engine->submit(r);
  expect_solo_tokens(m, reqs, run_bounded(*engine));
  const auto& log = engine->log();
  EXPECT_TRUE(std::any_of(log.begin(), log.end(), [](const EngineStepLog& s) { return s.prefills > 0 && s.decodes > 0; }))
      << "no step mixed a prefill chunk with decodes";
}

GRADED_TEST(Lesson10Engine, SampledOutputsEqualSoloRuns, 2) {
  // Each request samples with its own seeded sampler, once per token it emits: not after a
  // chunk that leaves part of its prompt unfed.
  const ModelWeights& m = testing::bundled_model();
  const auto reqs = requests(8, 40, 2, true);
  const auto engine = serving_engine(m, {.max_running = 3, .token_budget = 8});
  for (const auto& r : reqs) engine->submit(r);
  expect_solo_tokens(m, reqs, run_bounded(*engine));
}

GRADED_TEST(Lesson10Engine, EveryStepIsOneForwardWithinTheBudget, 3) {
  // The step's point: all of it (decodes and prefill chunks) goes through the weights once.
  const ModelWeights& m = testing::bundled_model();
  auto forward = std::make_unique<CountingForward>(m);
  CountingForward& counter = *forward;
  const ServingOptions options{.max_running = 4, .token_budget = 10};
  const auto engine = serving_engine(std::move(forward), std::make_unique<SlotKVManager>(m.config, 4), options);
  static int clock = 0;
  counter.step = &clock;
  const auto reqs = requests(8, 50, 3, false);
  for (const auto& r : reqs) engine->submit(r);
  std::vector<GenerationResult> results;
  for (int n = 0; !engine->idle(); ++n) {
    ASSERT_LT(n, 4000) << "the engine made no progress in 4000 steps (is every prefilling sequence planned?)";
    clock = engine->now();
    engine->step();
  }
  ASSERT_FALSE(counter.calls.empty()) << "the engine never called the forward";
  for (size_t i = 1; i < counter.calls.size(); ++i)
    ASSERT_NE(counter.calls[i - 1].step, counter.calls[i].step)
        << "step " << counter.calls[i].step << " called the forward more than once: one call must carry every chunk";
  for (const auto& call : counter.calls)
    EXPECT_LE(call.tokens, options.token_budget) << "step " << call.step << " fed " << call.tokens
                                                 << " tokens, over the budget of " << options.token_budget;
  for (const EngineStepLog& s : engine->log()) {
    EXPECT_LE(s.decodes + s.prefill_tokens, options.token_budget) << "step " << s.step;
    EXPECT_EQ(s.forwards, (s.decodes + s.prefills) > 0 ? 1 : 0) << "step " << s.step;
  }
  expect_solo_tokens(m, reqs, engine->run());
}

GRADED_TEST(Lesson10Engine, DecodesNeverStallBehindALongPrompt, 3) {
  // Three sequences decode; at step 4 a 180-token prompt arrives. Budget 16: each step the three
  // decodes come first, and the prompt takes what is left, 13 tokens a step, over 14 steps.
  // Counted in steps, not seconds: every decoding sequence emits a token at every step.
  const ModelWeights& m = testing::bundled_model();
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 3; ++i)
    reqs.push_back({i, ByteTokenizer::encode(i == 0 ? "The " : i == 1 ? "Love is" : "Q: Why"), 40, {.temperature = 0.0f}, 0});
  std::string long_prompt;
  while (long_prompt.size() < 179) long_prompt += "A fortune cookie says that patience is a virtue. ";
  long_prompt.resize(179);
  reqs.push_back({3, ByteTokenizer::encode(long_prompt), 8, {.temperature = 0.0f}, 4});
  ASSERT_EQ(reqs.back().prompt.size(), 180u);
  const auto engine = serving_engine(m, {.max_running = 4, .token_budget = 16});
  for (const auto& r : reqs) engine->submit(r);
  const auto results = run_bounded(*engine);
  for (int i = 0; i < 3; ++i) {
    const GenerationResult& r = results[static_cast<size_t>(i)];
    EXPECT_EQ(r.finish_step - r.first_token_step, static_cast<int>(r.tokens.size()))
        << "request " << i << " emitted " << r.tokens.size() << " tokens between steps " << r.first_token_step
        << " and " << r.finish_step << ": a decoding sequence must get a token at every step";
  }
  const GenerationResult& big = results[3];
  EXPECT_GE(big.first_token_step, 4 + 180 / 13) << "the long prompt cannot be fed faster than the budget allows";
  for (const EngineStepLog& s : engine->log())
    if (s.step >= 4 && s.step < big.first_token_step) {
      const int decoding = static_cast<int>(std::count_if(results.begin(), results.begin() + 3, [&](const auto& r) {
        return r.first_token_step < s.step && r.finish_step > s.step;
      }));
      EXPECT_EQ(s.decodes, decoding) << "step " << s.step << " (the long prompt being fed)";
    }
  expect_solo_tokens(m, reqs, results);
}

GRADED_TEST(Lesson10Engine, PreemptedSequencesResumeWithTheSameTokens, 2) {
  // A pool of 10 blocks of 4 positions for up to 4 sequences: decodes run it dry, the newest is
  // preempted, and later fed its history again (in chunks) and continues where it stopped.
  const ModelWeights& m = testing::bundled_model();
  for (bool sampled : {false, true}) {
    const auto reqs = requests(8, 16, 4, sampled);
    const auto engine = serving_engine(std::make_unique<CpuRunner>(m), std::make_unique<PagedKVManager>(m.config, 10, 4),
                         {.max_running = 4, .token_budget = 8});
    for (const auto& r : reqs) engine->submit(r);
    const auto results = run_bounded(*engine);
    int preemptions = 0;
    for (const auto& r : results) preemptions += r.preemptions;
    EXPECT_GT(preemptions, 0) << "the pool was meant to run dry";
    for (const EngineStepLog& s : engine->log())
      EXPECT_FALSE(s.preempted > 0 && s.admitted > 0)
          << "step " << s.step << " preempted " << s.preempted << " and admitted " << s.admitted
          << ": a step that had to preempt admits nobody (the memory it freed is for its decodes)";
    expect_solo_tokens(m, reqs, results);
    const auto& paged = dynamic_cast<const PagedKVManager&>(engine->memory());
    EXPECT_EQ(paged.pool().allocator().num_free(), paged.pool().num_blocks()) << "every block back in the pool";
  }
}

GRADED_TEST(Lesson10Engine, AHundredRequestsOnATinyPoolEqualSoloRuns, 2) {
  // 100 requests, 10 arriving per step, 16 at once on 20 blocks of 16 positions: sequences are
  // preempted while decoding and while their prompt is still being fed (those start over).
  const ModelWeights& m = testing::bundled_model();
  std::vector<GenerationRequest> reqs;
  const std::string words[] = {"The ", "A fool", "Love is", "You will", "Why", "Q: What", "Never ", "If you"};
  for (int i = 0; i < 100; ++i) {
    const std::string prompt = words[i % 8] + std::string(static_cast<size_t>(i % 5), '.');
    const SamplingParams sampling = i % 4 == 1 ? SamplingParams{.temperature = 0.8f, .seed = 7u + i}
                                               : SamplingParams{.temperature = 0.0f};
    reqs.push_back({i + 1, ByteTokenizer::encode(prompt), 8 + i % 24, sampling, i / 10});
  }
  const auto engine = serving_engine(std::make_unique<CpuRunner>(m), std::make_unique<PagedKVManager>(m.config, 20, 16),
                       {.max_running = 16, .token_budget = 32});
  for (const auto& r : reqs) engine->submit(r);
  const auto results = run_bounded(*engine);
  int preemptions = 0;
  for (const auto& r : results) preemptions += r.preemptions;
  EXPECT_GT(preemptions, 0) << "the pool was meant to run dry";
  expect_solo_tokens(m, reqs, results);
}

GRADED_TEST(Lesson10Engine, PrefixCacheHitsAreNotFedAgain, 2) {
  // Lesson 05's memory hands a newcomer the K/V of a finished request's shared prefix: only the
  // rest of its prompt is fed.
  const ModelWeights& m = testing::bundled_model();
  const std::string system = "You are a fortune teller. Answer in one line. Q: ";
  std::vector<GenerationRequest> reqs;
  const char* questions[] = {"love?", "money?", "work?"};
  for (int i = 0; i < 3; ++i)
    reqs.push_back({i, ByteTokenizer::encode(system + questions[i]), 6, {.temperature = 0.0f}, i * 20});
  auto forward = std::make_unique<CountingForward>(m);
  CountingForward& counter = *forward;
  const auto engine = serving_engine(std::move(forward), std::make_unique<PrefixKVManager>(m.config, 64, 4),
                       {.max_running = 2, .token_budget = 32});
  for (const auto& r : reqs) engine->submit(r);
  const auto results = run_bounded(*engine);
  expect_solo_tokens(m, reqs, results);
  long fed = 0, prompt = 0, cached = 0;
  for (const auto& call : counter.calls) fed += call.tokens;
  for (size_t i = 0; i < reqs.size(); ++i) {
    prompt += static_cast<long>(reqs[i].prompt.size()) + static_cast<long>(results[i].tokens.size()) - 1;
    cached += results[i].cached_tokens;
  }
  EXPECT_GT(cached, 0) << "the later requests were meant to find the system prompt cached";
  EXPECT_EQ(fed, prompt - cached) << "tokens fed: every prompt and generated token but the last, less the cached ones";
}

GRADED_TEST(Lesson10Engine, WithABudgetNoStepCanFillItPlansWhatLesson03Plans, 1) {
  // A budget larger than anything a step could feed: no prompt is ever cut, so the plan must be
  // lesson 03's WholePrompts, step for step (the same first and last steps for every request).
  const ModelWeights& m = testing::bundled_model();
  const auto reqs = requests(12, 40, 5, false);
  const auto chunked = serving_engine(m, {.max_running = 4, .token_budget = 1 << 20});
  Engine whole(m, Policy::Continuous, 4);
  for (const auto& r : reqs) {
    chunked->submit(r);
    whole.submit(r);
  }
  const auto got = run_bounded(*chunked), want = whole.run();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << want[i].id;
    EXPECT_EQ(got[i].first_token_step, want[i].first_token_step) << "request " << want[i].id;
    EXPECT_EQ(got[i].finish_step, want[i].finish_step) << "request " << want[i].id;
  }
}

GRADED_TEST(Lesson10Engine, APromptUnderWayIsFedBeforeNewcomers, 2) {
  // A 41-token prompt arrives alone at step 0; budget 8. From step 1 on a newcomer arrives at
  // every step. The prompt under way keeps its place: 8 tokens a step, its last token at step 5
  // (its first token then), whoever arrives meanwhile; and first tokens come in arrival order.
  const ModelWeights& m = testing::bundled_model();
  std::vector<GenerationRequest> reqs;
  reqs.push_back({0, ByteTokenizer::encode("A fortune cookie says patience is a virtue"), 4, {.temperature = 0.0f}, 0});
  ASSERT_EQ(reqs[0].prompt.size(), 43u);
  reqs[0].prompt.resize(41);
  for (int i = 1; i <= 6; ++i)
    reqs.push_back({i, ByteTokenizer::encode(std::string("Q: Why is the sky so blue? ") + static_cast<char>('a' + i)), 4,
                    {.temperature = 0.0f}, i});
  const auto engine = serving_engine(m, {.max_running = 8, .token_budget = 8});
  for (const auto& r : reqs) engine->submit(r);
  const auto results = run_bounded(*engine);
  EXPECT_EQ(results[0].first_token_step, 5)
      << "41 tokens at 8 a step are fed in steps 0 to 5: the prompt under way must not wait for newcomers";
  for (size_t i = 1; i < results.size(); ++i)
    EXPECT_LE(results[i - 1].first_token_step, results[i].first_token_step)
        << "request " << i - 1 << " arrived first, but its first token came after request " << i << "'s";
  expect_solo_tokens(m, reqs, results);
}

GRADED_TEST(Lesson10Engine, AStepFillsItsBudgetWhileWorkWaits, 1) {
  // Four 22-token prompts arrive together; budget 64, room for all four. The first step feeds 64
  // of their 88 tokens: a budget left unused while prompts wait is throughput thrown away (an
  // engine that admits one newcomer a step gives the same tokens, within the budget, and feeds 22).
  const ModelWeights& m = testing::bundled_model();
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    std::vector<int> prompt = ByteTokenizer::encode(std::string(1, static_cast<char>('a' + i)) + ": is it luck or is it work?");
    prompt.resize(22);  // they differ right after BOS: nothing to share
    reqs.push_back({i, prompt, 4, {.temperature = 0.0f}, 0});
  }
  ASSERT_EQ(reqs[3].prompt.size(), 22u);
  const auto engine = serving_engine(m, {.max_running = 8, .token_budget = 64});
  for (const auto& r : reqs) engine->submit(r);
  const auto results = run_bounded(*engine);
  ASSERT_FALSE(engine->log().empty());
  const EngineStepLog& first = engine->log().front();
  EXPECT_EQ(first.decodes + first.prefill_tokens, 64)
      << "the first step fed " << first.decodes + first.prefill_tokens << " tokens, with 88 waiting and a budget of 64";
  ASSERT_GE(engine->log().size(), 2u);
  const EngineStepLog& second = engine->log()[1];
  EXPECT_EQ(second.decodes + second.prefill_tokens, 26)
      << "the second step fed " << second.decodes + second.prefill_tokens << " tokens: 2 decodes, the 2 tokens left of "
      << "the third prompt, and the fourth prompt's 22 (a newcomer is admitted while budget is left, also while a "
      << "prompt is under way)";
  expect_solo_tokens(m, reqs, results);

  // The budget's last token: a 15-token prompt and a 5-token one, budget 16: the first step
  // feeds 15 + 1.
  std::vector<int> p15 = ByteTokenizer::encode("Fifteen tokens."), p5 = ByteTokenizer::encode("Five");
  ASSERT_EQ(p15.size(), 16u);
  p15.resize(15);
  const auto tight = serving_engine(m, {.max_running = 8, .token_budget = 16});
  tight->submit({10, p15, 2, {.temperature = 0.0f}, 0});
  tight->submit({11, p5, 2, {.temperature = 0.0f}, 0});
  run_bounded(*tight);
  EXPECT_EQ(tight->log().front().prefill_tokens, 16) << "15 + 5 tokens waiting, budget 16: the first step feeds 16";

  // No cap of its own on a chunk: a 200-token prompt with a budget of 256 goes in one step.
  std::vector<int> p200(200, 'a');
  p200[0] = 1;
  const auto roomy = serving_engine(m, {.max_running = 8, .token_budget = 256});
  roomy->submit({12, p200, 2, {.temperature = 0.0f}, 0});
  const auto one = run_bounded(*roomy);
  EXPECT_EQ(roomy->log().front().prefill_tokens, 200) << "a chunk is min(what the prompt has left, what the budget "
                                                         "leaves): 200 tokens, budget 256";
  EXPECT_EQ(one[0].first_token_step, 0);
}

GRADED_TEST(Lesson10Engine, AnIdleEngineDoesNothing, 1) {
  const auto engine = serving_engine(testing::bundled_model(), {.max_running = 2, .token_budget = 4});
  EXPECT_TRUE(engine->idle());
  EXPECT_TRUE(engine->step().empty());
  EXPECT_TRUE(engine->log().empty());
  engine->submit({7, ByteTokenizer::encode("Hi"), 3, {.temperature = 0.0f}, 2});
  EXPECT_TRUE(engine->step().empty());  // steps 0 and 1: waiting for the arrival, nothing to feed
  EXPECT_TRUE(engine->step().empty());
  EXPECT_EQ(engine->log().size(), 2u);
  EXPECT_EQ(engine->log()[0].forwards, 0);
  EXPECT_EQ(engine->log()[1].forwards, 0);
  const auto results = run_bounded(*engine);
  EXPECT_EQ(results[0].first_token_step, 2);
  EXPECT_EQ(results[0].tokens.size(), 3u);
  EXPECT_TRUE(engine->idle());
}

}  // namespace
}  // namespace infer
