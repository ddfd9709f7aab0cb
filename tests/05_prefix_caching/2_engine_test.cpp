// Lesson 05, part B: the shared-prefix workload's hit rates, and the cache under lesson 03's engine with the
// bundled model: only the unmatched suffix is computed (counted at the forward, a seam like
// lesson 02's counting cache), and the tokens are the same with the cache on and off.
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "common/testing/throws.hpp"
#include "common/tokenizer.hpp"
#include "lessons/05_prefix_caching/prefix_cache.hpp"

namespace infer {
namespace {

/// The CPU runner, counting the positions the forward computes: every chunk's tokens, and, per
/// request, the first chunk it feeds (its prefill: what its store did not already hold).
class CountingRunner final : public ModelRunner {
 public:
  explicit CountingRunner(const ModelWeights& m) : inner_(m) {}
  const ModelConfig& config() const override { return inner_.config(); }
  Matrix forward(const StepInput& step) override {
    for (const Chunk& c : step.chunks) {
      positions += static_cast<long>(c.tokens.size());
      if (seen_.insert(c.id).second) prefills.push_back(static_cast<int>(c.tokens.size()));
    }
    return inner_.forward(step);
  }
  long positions = 0;         ///< positions computed, prefills and decodes alike
  std::vector<int> prefills;  ///< positions computed by each request's first chunk, in order

 private:
  CpuRunner inner_;
  std::set<int> seen_;
};

struct Served {
  std::vector<GenerationResult> results;
  std::vector<int> prefills;
  long matched = 0;
  int locked_blocks = 0;  ///< cached blocks still locked after the run (none, if every lock was let go)
};

/// Runs `reqs` through the engine over a pool of `blocks` blocks of `block`, with a prefix
/// cache or without (lesson 04's PagedKVManager).
Served serve(const std::vector<GenerationRequest>& reqs, int max_batch, int blocks, int block, bool cache) {
  const ModelWeights& m = testing::bundled_model();
  auto forward = std::make_unique<CountingRunner>(m);
  CountingRunner* counter = forward.get();
  std::unique_ptr<KVManager> memory;
  PrefixKVManager* prefix = nullptr;
  if (cache) {
    auto p = std::make_unique<PrefixKVManager>(m.config, blocks, block);
    prefix = p.get();
    memory = std::move(p);
  } else {
    memory = std::make_unique<PagedKVManager>(m.config, blocks, block);
  }
  Engine engine(std::move(forward), std::move(memory), {.max_running = max_batch});
  for (const auto& r : reqs) engine.submit(r);
  Served out;
  out.results = engine.run();
  out.prefills = counter->prefills;
  if (prefix) {
    out.matched = prefix->matched_tokens();
    out.locked_blocks = prefix->cache().cached_blocks() - prefix->cache().evictable_blocks();
  }
  return out;
}

GenerationRequest request(int id, const std::string& text, int max_new, int arrival, float temperature = 0.0f) {
  GenerationRequest r;
  r.id = id;
  r.prompt = ByteTokenizer::encode(text);
  r.max_new_tokens = max_new;
  r.sampling = {.temperature = temperature, .seed = 90u + id};
  r.arrival_step = arrival;
  return r;
}

GRADED_TEST(Lesson05HitRate, SharedPrefixesKeepTheLruHitRateAbove55Percent, 2) {
  // 1,000 prompts of 48 + 16 tokens, 60% starting with one of 5 common prefixes; blocks of 16,
  // 500 blocks of cache. A request hits when its match covers at least one block: a one-token
  // coincidence is no hit. LRU keeps the hot prefixes, so it should lose (almost) nothing
  // against an unbounded cache.
  const auto reqs = prefix_workload(1000, 0.6, 5, 48, 16, 259, 2024);
  const HitRates lru = prefix_hit_rates(reqs, 16, 500), unbounded = prefix_hit_rates(reqs, 16, 0);
  EXPECT_GT(lru.request_hit_rate, 0.55) << "LRU with 500 blocks";
  EXPECT_GE(lru.request_hit_rate, unbounded.request_hit_rate - 0.01) << "LRU against the unbounded cache";
  EXPECT_LE(unbounded.request_hit_rate, 0.62) << "random prompts should almost never share a whole block";
  EXPECT_EQ(lru.prompt_tokens, 64000);
  EXPECT_NEAR(lru.token_hit_rate, static_cast<double>(lru.matched_tokens) / lru.prompt_tokens, 1e-12);
  // A cache of 4 blocks cannot hold 5 prefixes of 3 blocks each: it must do worse.
  EXPECT_LT(prefix_hit_rates(reqs, 16, 4).request_hit_rate, lru.request_hit_rate);
}

GRADED_TEST(Lesson05HitRate, HitsCountWholeBlocksOnly, 1) {
  // Every prompt shares its first token and nothing else: no request hits.
  std::vector<PrefixRequest> reqs;
  for (int i = 0; i < 20; ++i) reqs.push_back({{1, 10 + i, 10 + i, 10 + i, 10 + i, 10 + i, 10 + i, 10 + i}});
  const HitRates h = prefix_hit_rates(reqs, 4, 0);
  EXPECT_EQ(h.request_hit_rate, 0.0);
  EXPECT_EQ(h.matched_tokens, 0);
  // The same prompt twice: the second matches its two full blocks.
  reqs = {{{1, 2, 3, 4, 5, 6, 7, 8, 9}}, {{1, 2, 3, 4, 5, 6, 7, 8, 9}}};
  const HitRates twice = prefix_hit_rates(reqs, 4, 0);
  EXPECT_EQ(twice.matched_tokens, 8);
  EXPECT_DOUBLE_EQ(twice.request_hit_rate, 0.5);
  EXPECT_EQ(twice.prompt_tokens, 18) << "prompt tokens count every token of each prompt, the partial block's too";
  // A request that hits is inserted whole: what follows its match is cached for the next one.
  reqs = {{{1, 2, 3, 4, 5, 6, 7, 8, 9}}, {{1, 2, 3, 4, 20, 21, 22, 23, 9}}, {{1, 2, 3, 4, 20, 21, 22, 23, 9}}};
  EXPECT_EQ(prefix_hit_rates(reqs, 4, 0).matched_tokens, 0 + 4 + 8)
      << "the second request matches the first block and adds its own second one: the third matches both";
  // Unbounded is unbounded: 300 different one-block prompts, then the same 300 again.
  reqs.clear();
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < 300; ++i) reqs.push_back({{1000 + i, 1, 2, 3}});
  EXPECT_DOUBLE_EQ(prefix_hit_rates(reqs, 4, 0).request_hit_rate, 0.5)
      << "capacity 0 (unbounded) holds all 300 blocks: every request of the second round hits";
}

// -------------------------------------------------------------------- engine --

const std::string kSystem =
    "You are a fortune teller. Answer every question with one short fortune, kind and a little odd. ";

GRADED_TEST(Lesson05Engine, OnlyTheUnmatchedSuffixIsComputed, 3) {
  // Two requests with the same 96-token system prompt, the second arriving after the first is
  // done: its prefill computes only what the cache does not hold, in whole blocks of 16.
  std::vector<GenerationRequest> reqs = {request(1, kSystem + "Q: Will I be rich?", 4, 0),
                                         request(2, kSystem + "Q: Will it rain?", 4, 10)};
  const Served r = serve(reqs, 2, 64, 16, true);
  ASSERT_EQ(r.prefills.size(), 2u);
  const int shared = static_cast<int>(ByteTokenizer::encode(kSystem).size());  // BOS + the system prompt
  const int matched = shared / 16 * 16;
  EXPECT_EQ(r.prefills[0], static_cast<int>(reqs[0].prompt.size())) << "the first request finds nothing cached";
  EXPECT_EQ(r.prefills[1], static_cast<int>(reqs[1].prompt.size()) - matched)
      << "the second computes its prompt minus the cached full blocks of the system prompt";
  EXPECT_EQ(r.results[1].cached_tokens, matched);
  EXPECT_EQ(r.matched, matched);
  EXPECT_EQ(r.locked_blocks, 0) << "every request is done: none of its locks may outlive it";
}

GRADED_TEST(Lesson05Engine, TheTokensAreTheSameWithTheCacheOnAndOff, 3) {
  // Two chats of three turns, sampled with their own seeds: each turn's prompt is the previous
  // turn's prompt, its answer and a new question, so a cache that kept the finished turn hits
  // its answer too. One engine per setting serves every turn.
  struct Chat {
    std::unique_ptr<Engine> engine;
    CountingRunner* counter = nullptr;
    PrefixKVManager* prefix = nullptr;
  };
  const ModelWeights& m = testing::bundled_model();
  auto open = [&](bool cache) {
    Chat c;
    auto forward = std::make_unique<CountingRunner>(m);
    c.counter = forward.get();
    std::unique_ptr<KVManager> memory;
    if (cache) {
      auto p = std::make_unique<PrefixKVManager>(m.config, 96, 8);
      c.prefix = p.get();
      memory = std::move(p);
    } else {
      memory = std::make_unique<PagedKVManager>(m.config, 96, 8);
    }
    c.engine = std::make_unique<Engine>(std::move(forward), std::move(memory), EngineOptions{.max_running = 3});
    return c;
  };
  Chat off = open(false), on = open(true);
  std::vector<std::vector<int>> history = {ByteTokenizer::encode(kSystem + "Q: Hello?"),
                                           ByteTokenizer::encode("Q: A duck?")};
  const auto question = ByteTokenizer::encode(" Q: And then?");
  for (int turn = 0; turn < 3; ++turn) {
    for (int conv = 0; conv < 2; ++conv) {
      GenerationRequest r;
      r.id = 100 * conv + turn;
      r.prompt = history[conv];
      r.max_new_tokens = 10;
      r.sampling = {.temperature = 0.8f, .seed = 7u + static_cast<uint64_t>(r.id)};
      off.engine->submit(r);
      on.engine->submit(r);
    }
    const auto want = off.engine->run(), got = on.engine->run();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i].tokens, want[i].tokens) << "request " << want[i].id;
    for (int conv = 0; conv < 2; ++conv) {  // the next turn: this prompt, its answer, a question
      const auto& answer = want[want.size() - 2 + conv].tokens;
      history[conv].insert(history[conv].end(), answer.begin(), answer.end());
      if (!answer.empty() && answer.back() == m.config.eos_token_id) history[conv].pop_back();
      history[conv].insert(history[conv].end(), question.begin() + 1, question.end());  // without its BOS
    }
  }
  EXPECT_LT(on.counter->positions, off.counter->positions) << "later turns should find the earlier ones cached";
  EXPECT_EQ(off.counter->positions - on.counter->positions, on.prefix->matched_tokens())
      << "positions saved = positions matched (the decodes are the same with the cache on and off)";
}

GRADED_TEST(Lesson05Engine, MatchesEndingOnABlockBoundaryAndOnePast, 2) {
  // A prompt of exactly two blocks cached, then asked again: the last position is always
  // computed, so one block is reused. Then a prompt one token longer: both blocks are reused.
  std::vector<int> p(16, 40);
  p[0] = 1;
  for (int i = 1; i < 16; ++i) p[i] = 40 + i;
  GenerationRequest a{1, p, 3, {.temperature = 0.0f}, 0};
  GenerationRequest b{2, p, 3, {.temperature = 0.0f}, 6};
  std::vector<int> longer = p;
  longer.push_back(77);
  GenerationRequest c{3, longer, 3, {.temperature = 0.0f}, 12};
  const Served r = serve({a, b, c}, 1, 16, 8, true);
  ASSERT_EQ(r.prefills.size(), 3u);
  EXPECT_EQ(r.prefills[1], 8) << "16 tokens on a block boundary: one block reused, the last 8 recomputed";
  EXPECT_EQ(r.prefills[2], 1) << "17 tokens: both blocks reused, one token computed";
  const Served off = serve({a, b, c}, 1, 16, 8, false);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(r.results[i].tokens, off.results[i].tokens);
}

GRADED_TEST(Lesson05Engine, ABlockEndingOnTheLastSampledTokenIsNotCached, 2) {
  // A's 13-token prompt and its 3 new tokens are 16 tokens, two blocks of 8 exactly; but the last
  // token was sampled, never fed, so position 15 holds no K/V and only the first block is whole.
  // B continues A's text (17 tokens): it may reuse one block, and computes the other 9 positions.
  const std::vector<int> p = ByteTokenizer::encode("The secret of");
  ASSERT_EQ(p.size(), 14u);
  const std::vector<int> prompt(p.begin(), p.begin() + 13);
  const GenerationRequest a{1, prompt, 3, {.temperature = 0.0f}, 0};
  const Served alone = serve({a}, 1, 16, 8, false);
  ASSERT_EQ(alone.results[0].tokens.size(), 3u) << "A must use its 3 tokens (no EOS) to end on the boundary";
  std::vector<int> text = prompt;
  text.insert(text.end(), alone.results[0].tokens.begin(), alone.results[0].tokens.end());
  text.push_back(ByteTokenizer::encode("!", false)[0]);
  const GenerationRequest b{2, text, 3, {.temperature = 0.0f}, 10};
  const Served r = serve({a, b}, 1, 16, 8, true);
  ASSERT_EQ(r.prefills.size(), 2u);
  EXPECT_EQ(r.prefills[1], 9) << "B reused A's second block, whose last row (A's last token) was never written";
  const Served off = serve({a, b}, 1, 16, 8, false);
  EXPECT_EQ(r.results[1].tokens, off.results[1].tokens);
}

GRADED_TEST(Lesson05Engine, APreemptedRequestThatHitsTheCacheKeepsItsTokens, 2) {
  // A pool so small that sequences are preempted, with a shared prefix: every request, resumed
  // or not, must produce what it produces with no cache and a large pool.
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i)
    reqs.push_back(request(i, kSystem.substr(0, 40) + std::string(1, static_cast<char>('a' + i)), 24, i / 3, 0.7f));
  const Served tight = serve(reqs, 4, 18, 4, true), roomy = serve(reqs, 4, 256, 4, false);
  int preempted = 0;
  for (const auto& res : tight.results) preempted += res.preemptions;
  EXPECT_GT(preempted, 0) << "the pool was meant to be too small: the test lost its point";
  EXPECT_GT(tight.matched, 0) << "the shared prefix was meant to hit";
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(tight.results[i].tokens, roomy.results[i].tokens) << "request " << i;
  EXPECT_EQ(tight.locked_blocks, 0) << "finished and preempted sequences alike must let go of their locks";
}

GRADED_TEST(Lesson05Engine, BlocksInUseAreNeverTheOnesEvicted, 2) {
  // The manager on its own, over 8 blocks of 4. Prompt P is cached, then a running sequence A
  // matches it; prompt Q is cached after that, so P is the least recently used entry. A new
  // sequence needing 4 blocks finds 3 free: evicting P would free nothing (A still holds its
  // blocks), so the cache must give up Q instead, and P stays cached for the next request.
  const ModelWeights& m = testing::bundled_model();
  PrefixKVManager mem(m.config, 8, 4);
  auto fill = [&](KVStore& store, const std::vector<int>& tokens) {
    forward_cached(m, std::span(tokens).subspan(static_cast<size_t>(store.length())), store);
  };
  const std::vector<int> P = {1, 50, 51, 52, 53, 54, 55, 56, 57}, Q = {1, 70, 71, 72, 73, 74, 75, 76, 77};
  auto s1 = mem.open_for(P);
  ASSERT_NE(s1, nullptr);
  fill(*s1, P);
  mem.release(std::move(s1), P);
  std::vector<int> a = P;
  a.push_back(60);
  auto running = mem.open_for(a);
  ASSERT_NE(running, nullptr);
  ASSERT_EQ(running->length(), 8) << "A reuses P's two full blocks";
  fill(*running, a);
  auto s2 = mem.open_for(Q);
  ASSERT_NE(s2, nullptr);
  fill(*s2, Q);
  mem.release(std::move(s2), Q);
  const std::vector<int> big = {1, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104};
  auto b = mem.open_for(big);
  ASSERT_NE(b, nullptr) << "evicting the unused entry Q makes room; evicting P (in use) frees nothing";
  std::vector<int> c = P;
  c.push_back(61);
  mem.close(std::move(b));
  auto again = mem.open_for(c);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->length(), 8) << "P, in use when memory ran short, must still be cached";
  mem.close(std::move(again));
  mem.close(std::move(running));
}

GRADED_TEST(Lesson05Engine, OpenForMakesRoomByTheShortfallAndNeverFromItsOwnMatch, 2) {
  const ModelWeights& m = testing::bundled_model();
  auto fill = [&](KVStore& store, const std::vector<int>& tokens) {
    forward_cached(m, std::span(tokens).subspan(static_cast<size_t>(store.length())), store);
  };
  auto cache = [&](PrefixKVManager& mem, const std::vector<int>& tokens) {
    auto s = mem.open_for(tokens);
    ASSERT_NE(s, nullptr);
    fill(*s, tokens);
    mem.release(std::move(s), tokens);
  };
  const std::vector<int> P = {1, 50, 51, 52, 53, 54, 55, 56, 57}, Q = {1, 70, 71, 72, 73, 74, 75, 76, 77};
  {
    // 5 blocks of 4: P cached (2 blocks), another sequence running (1 block), 2 free. A request
    // of 17 tokens that starts with P's 8 needs 3 more: the only thing evictable is its own
    // match, which it locked before making room. It waits (nullptr), and P stays cached.
    PrefixKVManager mem(m.config, 5, 4);
    cache(mem, P);
    auto other = mem.open_for(std::vector<int>{1, 200, 201});
    ASSERT_NE(other, nullptr);
    std::vector<int> big(P.begin(), P.end() - 1);
    for (int i = 0; i < 9; ++i) big.push_back(300 + i);
    const long matched = mem.matched_tokens(), requested = mem.requested_tokens();
    std::unique_ptr<KVStore> got;
    try {
      got = mem.open_for(big);
    } catch (const Error& e) {
      FAIL() << "open_for threw \"" << e.what() << "\": it evicted the blocks it had just matched (lock the match before "
             << "making room, so that evict_to() cannot take it)";
    }
    EXPECT_EQ(got, nullptr) << "3 blocks needed, 2 free, nothing else evictable: wait";
    EXPECT_EQ(mem.cache().cached_blocks(), 2) << "P, the refused request's own match, stays cached";
    EXPECT_EQ(mem.cache().evictable_blocks(), 2) << "a refused open_for leaves no lock behind";
    EXPECT_EQ(mem.matched_tokens(), matched) << "a refused open_for counts nothing (it will be asked again)";
    EXPECT_EQ(mem.requested_tokens(), requested) << "a refused open_for counts nothing (it will be asked again)";
    mem.close(std::move(other));
  }
  {
    // 6 blocks of 4: P and Q cached (2 blocks each), 2 free. A new 12-token request needs 3
    // blocks: one short. The least recently used entry (P) goes, and Q stays.
    PrefixKVManager mem(m.config, 6, 4);
    cache(mem, P);
    cache(mem, Q);
    auto r = mem.open_for(std::vector<int>{1, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100});
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(mem.cache().cached_blocks(), 2) << "one block short: the cache gives up one entry (2 blocks), not all";
    mem.close(std::move(r));
    std::vector<int> q = Q;
    q.push_back(5);
    auto again = mem.open_for(q);
    ASSERT_NE(again, nullptr);
    EXPECT_EQ(again->length(), 8) << "Q, the more recent entry, is still cached";
    mem.close(std::move(again));
  }
}

GRADED_TEST(Lesson05Engine, BadArgumentsAreRefused, 1) {
  const ModelWeights& m = testing::bundled_model();
  EXPECT_TRUE(testing::throws_error_mentioning([&] { PrefixKVManager bad(m.config, 8, 4, -1); }, "cache_capacity"));
  PrefixKVManager mem(m.config, 8, 4);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { mem.open_for({}); }, "positions"));
  const std::vector<int> too_long(static_cast<size_t>(mem.capacity_tokens()) + 1, 5);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { mem.open_for(too_long); }, "positions"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { mem.release(nullptr, {}); }, "store"));
  EXPECT_TRUE(testing::throws_error_mentioning(
      [&] { mem.release(std::make_unique<KVCache>(m.config, 4), {}); }, "not a store this manager opened"));
  PrefixKVManager other(m.config, 8, 4);
  const std::vector<int> eight = {1, 5, 6, 7, 8, 9, 10, 11};
  auto theirs = other.open_for(eight);
  for (int l = 0; l < m.config.num_hidden_layers; ++l)
    theirs->append(l, Matrix::Zero(8, theirs->paged()->pool().kv_dim()), Matrix::Zero(8, theirs->paged()->pool().kv_dim()));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { mem.release(std::move(theirs), eight); },
                                               "not a store this manager opened"))
      << "a store of another manager's pool";
  EXPECT_EQ(mem.cache().cached_blocks(), 0) << "another pool's blocks went into this manager's tree";
  EXPECT_TRUE(testing::throws_error_mentioning([&] { prefix_hit_rates({}, 0, 0); }, "block_size"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { prefix_hit_rates({}, 4, -1); }, "capacity"));
}

}  // namespace
}  // namespace infer
