// Lesson 02: the cached forward against lesson 00's naive one, step by step.
#include <map>

#include "common/testing/compare.hpp"
#include "common/testing/golden.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "common/testing/throws.hpp"
#include "common/tokenizer.hpp"
#include "lessons/02_kv_cache/kv_cache.hpp"
#include "observed_store.hpp"

namespace infer {
namespace {

// Cached and naive logits do the same float32 arithmetic in a different order.
constexpr double kAtol = 1e-4, kRtol = 1e-4;

ModelConfig shape(int heads, int kv_heads, int head_dim) {
  ModelConfig c;
  c.vocab_size = 50, c.hidden_size = 40, c.intermediate_size = 64, c.num_hidden_layers = 2;
  c.num_attention_heads = heads, c.num_key_value_heads = kv_heads, c.head_dim = head_dim;
  c.max_position_embeddings = 64;
  return c;
}

/// Runs `steps` greedy decode steps with the cache and checks each step's logits against a
/// naive forward over the whole sequence.
void expect_cached_equals_naive(const ModelWeights& m, std::vector<int> seq, int steps, KVStore& cache,
                                double atol, double rtol, const std::string& what) {
  Matrix logits = forward_cached(m, seq, cache);
  for (int step = 0; step <= steps; ++step) {
    const Matrix naive = forward(m, seq);
    ASSERT_TRUE(testing::all_close(naive.row(naive.rows() - 1), logits.row(logits.rows() - 1), atol, rtol,
                                   cat(what, ": logits at step ", step, " (sequence length ", seq.size(), ")")));
    if (step == steps) break;
    seq.push_back(argmax(naive.row(naive.rows() - 1).transpose()));
    logits = forward_cached(m, std::span(&seq.back(), 1), cache);
  }
}

GRADED_TEST(Lesson02Forward, PrefillEqualsTheNaiveForward, 2) {
  const ModelWeights m = random_model(shape(4, 2, 10), 3);
  const std::vector<int> prompt = {1, 5, 9, 11, 20, 33, 7};
  KVCache cache(m.config, 16);
  EXPECT_TRUE(testing::all_close(forward(m, prompt), forward_cached(m, prompt, cache), kAtol, kRtol,
                                 "every row of a 7-token prefill"));
  EXPECT_EQ(cache.length(), 7) << "a prefill of 7 tokens stores 7 positions";
}

GRADED_TEST(Lesson02Forward, CachedLogitsEqualNaiveAtEveryStep, 4) {
  // GQA ratios 1, 2 and 4; a head_dim of 6 has an odd half, where RoPE offsets go wrong first.
  for (const auto& [h, kv, d] : std::vector<std::tuple<int, int, int>>{{4, 4, 10}, {4, 2, 6}, {8, 2, 6}}) {
    const ModelWeights m = random_model(shape(h, kv, d), 10 + h + kv);
    KVCache cache(m.config, 64);
    expect_cached_equals_naive(m, {1, 4, 8}, 30, cache, kAtol, kRtol,
                               cat(h, " query heads over ", kv, " K/V heads of ", d));
  }
  KVCache cache(testing::bundled_model().config, 256);
  expect_cached_equals_naive(testing::bundled_model(), ByteTokenizer::encode("The "), 100, cache, kAtol, kRtol, "the bundled model");
}

GRADED_TEST(Lesson02Forward, EachPositionsKeysAndValuesAreComputedOnce, 3) {
  std::map<std::pair<int, int>, int> appends;  // (layer, position) -> times its K/V was appended
  testing::ObservedStore store(testing::bundled_model().config, testing::bundled_model().config.max_position_embeddings,
                               [&](int layer, int first, int rows) {
                                 for (int p = first; p < first + rows; ++p) ++appends[{layer, p}];
                               });
  Sampler greedy({.temperature = 0.0f});
  const auto prompt = ByteTokenizer::encode("Q: What");
  const auto out = generate_cached(testing::bundled_model(), prompt, 12, greedy, store);
  const int positions = static_cast<int>(prompt.size() + out.size()) - 1;  // the last token is never fed back
  for (int l = 0; l < testing::bundled_model().config.num_hidden_layers; ++l)
    for (int p = 0; p < positions; ++p) {
      const int n = appends.count({l, p}) ? appends[{l, p}] : 0;
      ASSERT_EQ(n, 1) << "layer " << l << ": position " << p << "'s K/V was computed " << n
                      << " times; a cache computes it once";
    }
  for (int l = 0; l < testing::bundled_model().config.num_hidden_layers; ++l)
    EXPECT_EQ(appends.count({l, positions}), 0u)
        << "layer " << l << ": the last generated token (position " << positions
        << ") was run through the model, though no later step reads its K/V";
}

GRADED_TEST(Lesson02Forward, GenerateCachedIsGenerateWithOnePrefill, 2) {
  // Same arguments, same results as lesson 00's generate(): sampled with a seed, streamed, ended
  // by EOS. The prompt goes in as one prefill (its first append to a layer holds every prompt
  // position), and a cache that is not empty is refused.
  const ModelWeights& m = testing::bundled_model();
  const SamplingParams sampled{.temperature = 0.8f, .top_k = 20, .seed = 5};
  const auto prompt = ByteTokenizer::encode("You will");
  Sampler naive_sampler(sampled), cached_sampler(sampled);
  const auto want = generate(m, prompt, 40, naive_sampler);
  std::vector<int> first_appends;  // rows of each append to layer 0
  testing::ObservedStore store(m.config, m.config.max_position_embeddings,
                               [&](int layer, int, int rows) { if (layer == 0) first_appends.push_back(rows); });
  std::vector<int> streamed;
  const auto got = generate_cached(m, prompt, 40, cached_sampler, store, [&](int t) { streamed.push_back(t); });
  EXPECT_EQ(got, want) << "seed 5 at temperature 0.8, top_k 20: lesson 00's generate() wrote \"" << ByteTokenizer::decode(want)
                       << "\", yours \"" << ByteTokenizer::decode(got) << "\"";
  EXPECT_EQ(streamed, got) << "on_token sees every token, in order";
  ASSERT_FALSE(first_appends.empty());
  EXPECT_EQ(first_appends.front(), static_cast<int>(prompt.size()))
      << "the prompt's " << prompt.size() << " tokens go in as one prefill (one forward_cached over all of them)";
  // EOS: this prompt's greedy text ends with EOS after 32 tokens.
  const auto twain = ByteTokenizer::encode("\t-- Mark Twain\n");
  Sampler g1({.temperature = 0.0f}), g2({.temperature = 0.0f});
  KVCache cache(m.config, 256);
  const auto plain = generate(m, twain, 60, g1);
  ASSERT_EQ(plain.back(), m.config.eos_token_id) << "the test needs a text that ends with EOS";
  EXPECT_EQ(generate_cached(m, twain, 60, g2, cache), plain) << "generation stops right after EOS";
  Sampler g3({.temperature = 0.0f});
  EXPECT_TRUE(testing::throws_error_mentioning([&] { generate_cached(m, twain, 4, g3, cache); }, ""))
      << "a cache that holds another sequence's positions is refused (it must start empty)";
}

GRADED_TEST(Lesson02Forward, GreedyContinuationMatchesTheFixture, 2) {
  const auto golden = testing::load_golden("tiny-fortunes");
  const auto& g = golden.greedy.front();
  KVCache cache(testing::bundled_model().config, 256);
  Sampler greedy({.temperature = 0.0f});
  const auto got = generate_cached(testing::bundled_model(), g.prompt_ids, static_cast<int>(g.ids.size()), greedy, cache);
  EXPECT_EQ(got, g.ids) << "greedy text with the cache: \"" << ByteTokenizer::decode(got) << "\"\nexpected: \""
                        << ByteTokenizer::decode(g.ids) << "\"";
}

GRADED_TEST(Lesson02Forward, RefusesWhatTheCacheCannotHold, 1) {
  KVCache cache(testing::bundled_model().config, 8);
  const std::vector<int> ten(10, 40);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { forward_cached(testing::bundled_model(), ten, cache); }, "exceed"));
  EXPECT_EQ(cache.length(), 0) << "nothing may be appended when the tokens do not fit";
  Sampler greedy({.temperature = 0.0f});
  KVCache fresh(testing::bundled_model().config, 8);  // empty whatever the check above did
  EXPECT_TRUE(testing::throws_error_mentioning(
      [&] { generate_cached(testing::bundled_model(), std::vector<int>{1, 40}, 7, greedy, fresh); }, "cache holds 8"));
}

GRADED_TEST(Lesson02Int8, LogitsStayCloseToTheFloatCache, 2) {
  // INT8 keys and values err by at most half a quantization step each. On the bundled model
  // `./course bench 02` measures the largest logit difference over 200 greedy steps at 0.13
  // against the float cache (our reading, not measured: mostly a shift of all logits together,
  // which softmax ignores); the test allows 0.25.
  Int8KVCache cache(testing::bundled_model().config, 256);
  expect_cached_equals_naive(testing::bundled_model(), ByteTokenizer::encode("The "), 64, cache, 0.25, 0.0, "INT8 cache");
}

GRADED_TEST(Lesson02Int8, GreedyTextIsUnchangedOnTheBundledModel, 2) {
  const auto golden = testing::load_golden("tiny-fortunes");
  const auto& g = golden.greedy.front();
  Int8KVCache cache(testing::bundled_model().config, 256);
  Sampler greedy({.temperature = 0.0f});
  const int n = std::min<int>(64, static_cast<int>(g.ids.size()));
  const auto got = generate_cached(testing::bundled_model(), g.prompt_ids, n, greedy, cache);
  EXPECT_EQ(got, std::vector<int>(g.ids.begin(), g.ids.begin() + n))
      << "greedy text with the INT8 cache: \"" << ByteTokenizer::decode(got) << "\"";
}

}  // namespace
}  // namespace infer
