// Lesson 03, part B: the batched forward and the engine on real models.
#include <map>
#include <set>
#include <string>

#include "common/linear.hpp"
#include "common/testing/compare.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "common/testing/throws.hpp"
#include "common/tokenizer.hpp"
#include "lessons/03_batching/engine.hpp"
#include "tests/02_kv_cache/observed_store.hpp"

namespace infer {
namespace {

std::vector<int> solo(const ModelWeights& m, const GenerationRequest& r) {
  KVCache cache(m.config, m.config.max_position_embeddings);
  Sampler s(r.sampling);
  return generate_cached(m, r.prompt, r.max_new_tokens, s, cache);
}

GRADED_TEST(Lesson03Engine, ForwardBatchEqualsEachSequenceAlone, 4) {
  const ModelWeights& m = testing::small_model();
  const std::vector<std::vector<int>> prompts = {{1, 5}, {1, 9, 10, 11, 12, 13}, {1, 7, 7, 7}};
  std::vector<std::unique_ptr<KVCache>> batched, alone;
  for (const auto& p : prompts) {
    batched.push_back(std::make_unique<KVCache>(m.config, 32));
    alone.push_back(std::make_unique<KVCache>(m.config, 32));
    forward_cached(m, p, *batched.back());
    forward_cached(m, p, *alone.back());
  }
  const std::vector<int> next = {20, 21, 22};
  std::vector<KVStore*> caches = {batched[0].get(), batched[1].get(), batched[2].get()};
  const Matrix logits = forward_batch(m, next, caches);
  for (int i = 0; i < 3; ++i) {
    const Matrix want = forward_cached(m, std::span(&next[i], 1), *alone[i]);
    EXPECT_TRUE(testing::all_close(want, logits.row(i), 1e-4, 1e-4,
                                   cat("sequence ", i, " (at position ", prompts[i].size(), ") in a batch of 3")));
    EXPECT_EQ(batched[i]->length(), static_cast<int>(prompts[i].size()) + 1) << "sequence " << i << "'s cache";
  }
}

/// While it lives, the rows of x of every product linear() computes, by weight matrix.
class WatchedProducts {
 public:
  WatchedProducts() { before_ = set_linear_watch(&watch_); }
  ~WatchedProducts() { set_linear_watch(before_); }
  WatchedProducts(const WatchedProducts&) = delete;
  WatchedProducts& operator=(const WatchedProducts&) = delete;

  /// The rows of x of each product that read `w`, in order.
  std::vector<long> of(const Matrix& w) const {
    const auto it = rows_.find(w.data());
    return it == rows_.end() ? std::vector<long>{} : it->second;
  }

 private:
  std::map<const float*, std::vector<long>> rows_;
  LinearWatch watch_{[](const float* w, long rows, void* self) { static_cast<WatchedProducts*>(self)->rows_[w].push_back(rows); },
                     this};
  const LinearWatch* before_ = nullptr;
};

std::string shown(const std::vector<long>& rows) {
  std::string out;
  for (long r : rows) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

GRADED_TEST(Lesson03Engine, ForwardBatchRunsEachLayerOnceOverTheWholeBatch, 3) {
  // Batching means each layer's weights are read once for all B sequences: layer l of every
  // sequence happens before layer l + 1 of any, and each weight matrix meets all B rows in one
  // product. A loop of forward_cached, one sequence after the other, gives the same logits and
  // reads every weight B times; so does a loop over the rows inside each layer, which keeps the
  // order of the appends. The products are watched through linear() (common/linear.hpp), as the
  // contract asks.
  const ModelWeights& m = testing::small_model();
  std::vector<std::pair<int, int>> log;  // (layer, sequence), in the order of the appends
  std::vector<std::unique_ptr<testing::ObservedStore>> stores;
  std::vector<KVStore*> caches;
  for (int i = 0; i < 3; ++i) {
    stores.push_back(std::make_unique<testing::ObservedStore>(
        m.config, 32, [&log, i](int layer, int, int) { log.emplace_back(layer, i); }));
    caches.push_back(stores.back().get());
    forward_cached(m, std::vector<int>{1, 5 + i}, *stores.back());
  }
  log.clear();
  WatchedProducts products;
  forward_batch(m, std::vector<int>{20, 21, 22}, caches);
  const int layers = m.config.num_hidden_layers;
  for (int l = 0; l < layers; ++l) {
    const LayerWeights& w = m.layers[l];
    const std::pair<const char*, const Matrix*> matrices[] = {{"q_proj", &w.q_proj},     {"k_proj", &w.k_proj},
                                                              {"v_proj", &w.v_proj},     {"o_proj", &w.o_proj},
                                                              {"gate_proj", &w.gate_proj}, {"up_proj", &w.up_proj},
                                                              {"down_proj", &w.down_proj}};
    for (const auto& [name, matrix] : matrices) {
      const std::vector<long> rows = products.of(*matrix);
      ASSERT_FALSE(rows.empty()) << "layer " << l << "'s " << name << " was never read through linear(): the contract "
                                 << "asks for each projection as one linear() call over all 3 rows (common/linear.hpp); "
                                 << "x * W^T gives the same numbers, but this test cannot see it read W once";
      ASSERT_EQ(rows, std::vector<long>{3}) << "layer " << l << "'s " << name << " was read " << rows.size()
                                            << " time(s), by products over " << shown(rows) << " rows: one product over "
                                            << "all 3 rows reads it once for the batch, which is what batching is for";
    }
  }
  ASSERT_EQ(products.of(m.lm_head), std::vector<long>{3})
      << "lm_head: products over " << shown(products.of(m.lm_head)) << " rows (none: not through linear()); "
      << "expected one over all 3 rows";
  ASSERT_EQ(static_cast<int>(log.size()), 3 * layers) << "one append per layer per sequence";
  for (size_t i = 1; i < log.size(); ++i) {
    ASSERT_LE(log[i - 1].first, log[i].first)
        << "sequence " << log[i - 1].second << " appended to layer " << log[i - 1].first << " before sequence "
        << log[i].second << " appended to layer " << log[i].first
        << ": the batch is run one sequence after another, not one layer at a time over all of them";
  }
  for (int l = 0; l < layers; ++l) {
    std::set<int> seen;
    for (const auto& [layer, seq] : log)
      if (layer == l) seen.insert(seq);
    EXPECT_EQ(seen.size(), 3u) << "layer " << l << " must append once for each of the 3 sequences";
  }
}

GRADED_TEST(Lesson03Engine, ForwardBatchRefusesABadCallBeforeAnyAppend, 1) {
  // All or nothing: a call that fails on its last row has appended nothing to the rows before.
  using testing::throws_error_mentioning;
  const ModelWeights& m = testing::small_model();
  KVCache a(m.config, 32), b(m.config, 32), full(m.config, 3);
  for (KVCache* c : {&a, &b, &full}) forward_cached(m, std::vector<int>{1, 5, 6}, *c);
  const auto lengths = [&] {  // every layer's: a forward appends to layer 0 first
    std::vector<int> out;
    for (const KVCache* c : {&a, &b, &full})
      for (int l = 0; l < c->num_layers(); ++l) out.push_back(c->length(l));
    return out;
  };
  const std::vector<int> before = lengths();
  std::vector<KVStore*> shared = {&a, &b, &a};
  EXPECT_TRUE(throws_error_mentioning([&] { forward_batch(m, std::vector<int>{20, 21, 22}, shared); }, ""))
      << "rows 0 and 2 share a cache";
  std::vector<KVStore*> last_full = {&a, &b, &full};
  EXPECT_TRUE(throws_error_mentioning([&] { forward_batch(m, std::vector<int>{20, 21, 22}, last_full); }, ""))
      << "row 2's cache holds 3 positions of 3: no room for one more";
  std::vector<KVStore*> two = {&a, &b};
  EXPECT_TRUE(throws_error_mentioning([&] { forward_batch(m, std::vector<int>{20, m.config.vocab_size}, two); },
                                      std::to_string(m.config.vocab_size)))
      << "row 1's token is outside the vocabulary: the message names it";
  EXPECT_TRUE(throws_error_mentioning([&] { forward_batch(m, std::vector<int>{20}, two); }, "")) << "1 token, 2 caches";
  EXPECT_EQ(lengths(), before) << "a refused call appended to a cache (validate every row before the first append)";
}

GRADED_TEST(Lesson03Engine, BatchedGreedyOutputsEqualSoloRuns, 1) {
  Engine engine(testing::bundled_model(), Policy::Continuous, 3);
  std::vector<GenerationRequest> reqs;
  const char* prompts[] = {"The ", "Q: What", "You will", "Love is", "If you ", "A "};
  for (int i = 0; i < 6; ++i) {
    reqs.push_back({i, ByteTokenizer::encode(prompts[i]), 16 + 4 * i, {.temperature = 0.0f}, i});
    engine.submit(reqs.back());
  }
  const auto results = engine.run();
  ASSERT_EQ(results.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(results[i].id, i);
    EXPECT_EQ(results[i].tokens, solo(testing::bundled_model(), reqs[i]))
        << "request " << i << " (\"" << prompts[i] << "\") in a batch differs from the same request alone";
  }
}

GRADED_TEST(Lesson03Engine, SampledOutputsEqualSoloRunsToo, 1) {
  Engine engine(testing::small_model(), Policy::Continuous, 4);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 10; ++i) {
    reqs.push_back({100 + i, {1, 3 + i, 4 + i}, 20, {.temperature = 0.9f, .top_p = 0.95f, .seed = 1000u + i}, i / 3});
    engine.submit(reqs.back());
  }
  const auto results = engine.run();
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(results[i].tokens, solo(testing::small_model(), reqs[i])) << "request " << reqs[i].id << " with its own seeded sampler";
}

std::vector<GenerationRequest> random_requests(int n, uint64_t seed) {
  Rng rng(seed);
  std::vector<GenerationRequest> reqs;
  int arrival = 0;
  for (int i = 0; i < n; ++i) {
    GenerationRequest r;
    r.id = 5000 + i;
    r.prompt = {1};
    for (int k = 1 + static_cast<int>(rng.below(12)); k > 0; --k) r.prompt.push_back(3 + static_cast<int>(rng.below(37)));
    r.max_new_tokens = 1 + static_cast<int>(rng.below(20));
    r.sampling = {.temperature = 0.0f};
    arrival += static_cast<int>(rng.below(3));
    r.arrival_step = arrival;
    reqs.push_back(r);
  }
  return reqs;
}

GRADED_TEST(Lesson03Engine, TwoHundredRequestsEachCompleteOnceWithTheirOwnOutput, 1) {
  Engine engine(testing::small_model(), Policy::Continuous, 8);
  const auto reqs = random_requests(200, 9);
  for (const auto& r : reqs) engine.submit(r);
  const auto results = engine.run();
  ASSERT_EQ(results.size(), reqs.size()) << "every request gets exactly one result";
  std::set<int> seen;
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(seen.insert(results[i].id).second) << "request " << results[i].id << " came back twice";
    ASSERT_EQ(results[i].id, reqs[i].id) << "results come back in submission order";
    ASSERT_EQ(results[i].tokens, solo(testing::small_model(), reqs[i])) << "request " << reqs[i].id << " got someone else's tokens?";
    ASSERT_LE(results[i].arrival_step, results[i].first_token_step);
    ASSERT_LT(results[i].first_token_step, results[i].finish_step);
  }
}

GRADED_TEST(Lesson03Engine, NeverRunsMoreThanTheBatchSize, 2) {
  // Memory for 8 sequences, a batch of 5: only the scheduler's admissions keep the batch to 5 (with
  // 5 slots, the memory would refuse a sixth whatever the scheduler asked).
  Engine engine(testing::small_model(), Policy::Continuous, 5,
                std::make_unique<SlotKVManager>(testing::small_model().config, 8));
  for (const auto& r : random_requests(60, 4)) engine.submit(r);
  engine.run();
  ASSERT_FALSE(engine.log().empty());
  for (const auto& e : engine.log()) {
    ASSERT_LE(e.occupied, 5) << "step " << e.step;
    ASSERT_LE(e.prefills + e.decodes, 5) << "step " << e.step << ": " << e.prefills << " prefills + " << e.decodes
                                         << " decodes in a batch of 5";
  }
}

GRADED_TEST(Lesson03Engine, EngineFollowsTheSimulatorsSchedule, 2) {
  // Given the lengths the model actually produced, the simulator predicts every start and
  // finish step of the engine, under both policies.
  for (Policy policy : {Policy::Continuous, Policy::Static}) {
    Engine engine(testing::small_model(), policy, 4);
    const auto reqs = random_requests(40, 21);
    for (const auto& r : reqs) engine.submit(r);
    const auto results = engine.run();
    std::vector<SimRequest> sim;
    for (size_t i = 0; i < reqs.size(); ++i)
      sim.push_back({reqs[i].id, static_cast<int>(reqs[i].prompt.size()), static_cast<int>(results[i].tokens.size()),
                     reqs[i].arrival_step});
    const SimRun predicted = simulate(sim, policy, 4);
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(results[i].first_token_step, predicted.outcomes[i].start_step)
          << (policy == Policy::Static ? "static" : "continuous") << ", request " << reqs[i].id;
      EXPECT_EQ(results[i].finish_step, predicted.outcomes[i].finish_step)
          << (policy == Policy::Static ? "static" : "continuous") << ", request " << reqs[i].id;
    }
  }
}

}  // namespace
}  // namespace infer
