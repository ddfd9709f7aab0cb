// Lesson 00: the whole model, on random shapes against the double-precision reference, and on
// the bundled model against the golden fixtures the trainer wrote from its PyTorch model.
#include <algorithm>
#include <numeric>

#include "common/testing/compare.hpp"
#include "common/testing/golden.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "common/testing/throws.hpp"
#include "common/tokenizer.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"
#include "reference.hpp"

namespace infer {
namespace {

using testing::all_close;

ModelConfig small_config(int hidden, int heads, int kv_heads, int head_dim, int layers) {
  ModelConfig c;
  c.vocab_size = 40, c.hidden_size = hidden, c.intermediate_size = 2 * hidden + 8;
  c.num_hidden_layers = layers, c.num_attention_heads = heads, c.num_key_value_heads = kv_heads;
  c.head_dim = head_dim, c.max_position_embeddings = 64;
  c.eos_token_id = 2, c.bos_token_id = 1;
  return c;
}

std::vector<int> some_tokens(int n, int vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int> t(n);
  for (auto& x : t) x = static_cast<int>(rng.below(vocab));
  return t;
}

GRADED_TEST(Lesson00Model, ForwardMatchesReferenceOnRandomModels, 3) {
  // Multi-head (GQA ratio 1), GQA ratio 3, ratio 4 with a head_dim whose half is odd; and one
  // whose config differs from the usual everywhere a forward might assume it: head_dim 16 where
  // hidden / heads is 12, Llama 3's rope_theta of 500,000, an rms_norm_eps of 0.01.
  ModelConfig unusual = small_config(48, 4, 2, 16, 2);
  unusual.rope_theta = 500000.0f, unusual.rms_norm_eps = 1e-2f;
  for (const auto& c : {small_config(32, 4, 4, 8, 2), small_config(48, 6, 2, 8, 2), small_config(40, 4, 1, 10, 3), unusual}) {
    const ModelWeights m = random_model(c, 100 + c.num_key_value_heads);
    const auto tokens = some_tokens(11, c.vocab_size, 7);
    EXPECT_TRUE(all_close(reference::forward(m, tokens), forward(m, tokens), 1e-4, 1e-3,
                          cat("logits of a random model with ", c.num_attention_heads, " query heads, ",
                              c.num_key_value_heads, " K/V heads, head_dim ", c.head_dim, ", hidden ",
                              c.hidden_size, ", rope_theta ", c.rope_theta, ", rms_norm_eps ", c.rms_norm_eps,
                              " (each read from the model's config)")));
  }
}

GRADED_TEST(Lesson00Model, ForwardMatchesGoldenLogits, 4) {
  // The trainer's PyTorch model wrote these (rounded to 6 decimals). float32 on both sides:
  // tolerance 1e-3 + 1e-3 * |logit|. Several positions per prompt catch a RoPE or GQA slip
  // that position 0 alone would not (at position 0 RoPE is the identity).
  const auto golden = testing::load_golden("tiny-fortunes");
  ASSERT_FALSE(golden.logits.empty());
  for (const auto& g : golden.logits) {
    const Matrix logits = forward(testing::bundled_model(), g.ids);
    for (size_t i = 0; i < g.positions.size(); ++i) {
      const Vector want = Eigen::Map<const Vector>(g.logits[i].data(), static_cast<Eigen::Index>(g.logits[i].size()));
      EXPECT_TRUE(all_close(want.transpose(), logits.row(g.positions[i]), 1e-3, 1e-3,
                            cat("logits at position ", g.positions[i], " of \"", g.text, "\"")));
    }
  }
}

GRADED_TEST(Lesson00Model, GreedyContinuationMatchesFixture, 4) {
  const auto golden = testing::load_golden("tiny-fortunes");
  ASSERT_FALSE(golden.greedy.empty());
  const auto& g = golden.greedy.front();
  Sampler greedy({.temperature = 0.0f});
  const auto got = generate(testing::bundled_model(), g.prompt_ids, static_cast<int>(g.ids.size()), greedy);
  ASSERT_EQ(got.size(), g.ids.size()) << "greedy continuation of \"" << g.prompt << "\" has the wrong length";
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], g.ids[i]) << "greedy token " << i << " after \"" << g.prompt << "\" differs: expected "
                                << g.ids[i] << " ('" << ByteTokenizer::piece(g.ids[i]) << "'), got " << got[i]
                                << " ('" << ByteTokenizer::piece(got[i]) << "'); text so far: \""
                                << ByteTokenizer::decode(std::span(g.ids).first(i)) << "\"";
  }
}

GRADED_TEST(Lesson00Model, GenerateStopsRightAfterEosAndStreamsEveryToken, 2) {
  // Run the model greedily by hand (reference forward), then declare the token it emits at
  // step 4 to be EOS: generate must return exactly those 4 tokens.
  ModelConfig c = small_config(32, 4, 2, 8, 2);
  ModelWeights m = random_model(c, 5);
  std::vector<int> seq = {1, 7, 9};
  std::vector<int> expected;
  for (int step = 0; step < 4; ++step) {
    const Matrix logits = reference::forward(m, seq);
    const int next = argmax(logits.row(logits.rows() - 1).transpose());
    seq.push_back(next);
    expected.push_back(next);
  }
  const auto first = std::find(expected.begin(), expected.end(), expected.back());
  ASSERT_EQ(first, expected.end() - 1) << "this random model repeats a token; pick another seed";
  m.config.eos_token_id = expected.back();

  std::vector<int> streamed;
  Sampler greedy({.temperature = 0.0f});
  const auto got = generate(m, std::vector<int>{1, 7, 9}, 20, greedy, [&](int t) { streamed.push_back(t); });
  EXPECT_EQ(got, expected) << "generate should stop right after EOS, keeping it as the last token";
  EXPECT_EQ(streamed, got) << "on_token should see every generated token, in order";

  // As soon as it is chosen: when on_token hears the first token, the sampler has drawn once (a
  // copy of it taken then draws what a fresh one does after one draw), not once per token.
  const ModelWeights r = random_model(small_config(32, 4, 2, 8, 1), 8);
  const Vector flat = Vector::Zero(r.config.vocab_size);
  Sampler sampler({.temperature = 1.0f, .seed = 9});
  std::vector<int> heard, after_first;
  const auto sampled = generate(r, std::vector<int>{1, 4}, 20, sampler, [&](int t) {
    if (heard.empty()) {
      Sampler copy = sampler;
      for (int i = 0; i < 8; ++i) after_first.push_back(copy.next(flat));
    }
    heard.push_back(t);
  });
  ASSERT_GE(sampled.size(), 2u) << "the test needs a generation of more than one token";
  Sampler fresh({.temperature = 1.0f, .seed = 9});
  fresh.next(flat);  // the one draw that chose the first token
  std::vector<int> want;
  for (int i = 0; i < 8; ++i) want.push_back(fresh.next(flat));
  EXPECT_EQ(after_first, want) << "on_token heard the first token after the sampler had drawn more than once: call "
                                  "it as each token is chosen, not after the loop";
}

GRADED_TEST(Lesson00Model, GenerateRefusesToRunPastTheContext, 1) {
  const ModelWeights m = random_model(small_config(32, 4, 2, 8, 1), 6);  // context 64
  Sampler greedy({.temperature = 0.0f});
  const std::vector<int> prompt(60, 5);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { generate(m, prompt, 5, greedy); }, "context"))
      << "60 prompt tokens + 5 new ones do not fit in 64 positions: say so instead of truncating";
  EXPECT_TRUE(testing::throws_error_mentioning([&] { generate(m, std::vector<int>{1, 99}, 1, greedy); },
                                               "vocabulary"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { generate(m, std::vector<int>{1, 4}, -1, greedy); }, ""))
      << "max_new_tokens -1 is refused, not taken as 0";
  EXPECT_EQ(generate(m, std::vector<int>(60, 5), 4, greedy).size(), 4u)
      << "60 prompt tokens + 4 new ones fill the 64 positions exactly: that fits";
  EXPECT_TRUE(testing::throws_error_mentioning([&] { forward(m, std::vector<int>{}); }, "")) << "forward of no tokens";
  EXPECT_TRUE(testing::throws_error_mentioning([&] { forward(m, std::vector<int>{1, 40}); }, ""))
      << "forward of id 40 in a vocabulary of 40";
  EXPECT_TRUE(testing::throws_error_mentioning([&] { forward(m, std::vector<int>(65, 5)); }, "context"))
      << "forward of 65 tokens on a model of 64 positions: refused (RoPE would compute a position the model "
         "never saw); check_tokens() says so";
}

GRADED_TEST(Lesson00Model, SeededSamplingIsReproducible, 1) {
  const ModelWeights m = random_model(small_config(32, 4, 2, 8, 1), 8);
  auto run = [&](uint64_t seed) {
    Sampler s({.temperature = 1.0f, .seed = seed});
    return generate(m, std::vector<int>{1, 4}, 30, s);
  };
  EXPECT_EQ(run(42), run(42)) << "the same seed must give the same tokens";
  EXPECT_NE(run(42), run(43)) << "different seeds should give different samples";
  // And the same tokens as everyone's with that seed: the loop by hand (your forward, the given
  // Sampler, one next() per token), so that a seeded text is the same on every machine.
  std::vector<int> seq = {1, 4}, want;
  Sampler s({.temperature = 1.0f, .seed = 42});
  for (int i = 0; i < 30; ++i) {
    const Matrix logits = forward(m, seq);
    want.push_back(s.next(logits.row(logits.rows() - 1).transpose()));
    seq.push_back(want.back());
    if (want.back() == m.config.eos_token_id) break;
  }
  EXPECT_EQ(run(42), want) << "seed 42: one draw of the sampler per token, from the last row of the logits";
}

}  // namespace
}  // namespace infer
