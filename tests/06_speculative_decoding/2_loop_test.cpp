// Lesson 06, part B: the draft-target loop on the bundled models. Greedy speculation gives the
// target's greedy tokens exactly, with the draft and with prompt lookup; a counting seam at the
// target shows k + 1 tokens per forward with a proposer that is always right and one with a
// proposer that is always wrong; sampled runs draw their tokens from the target's distribution;
// after a rejection both caches hold exactly the kept tokens.
#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "common/testing/compare.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "common/testing/throws.hpp"
#include "common/tokenizer.hpp"
#include "lessons/06_speculative_decoding/speculative.hpp"
#include "tests/02_kv_cache/observed_store.hpp"
#include "tests/06_speculative_decoding/chi_square.hpp"

namespace infer {
namespace {

/// Proposes the target's own greedy continuation (known in advance), or, when `wrong`, a token
/// that is never it.
class Oracle final : public Proposer {
 public:
  Oracle(std::vector<int> prompt, std::vector<int> greedy, bool wrong, int vocab)
      : prompt_(std::move(prompt)), greedy_(std::move(greedy)), wrong_(wrong), vocab_(vocab) {}
  Proposal propose(std::span<const int> context, int k) override {
    Proposal p;
    const size_t done = context.size() - prompt_.size();
    for (size_t i = done; i < greedy_.size() && static_cast<int>(p.tokens.size()) < k; ++i)
      p.tokens.push_back(wrong_ ? (greedy_[i] + 1) % vocab_ : greedy_[i]);
    return p;
  }

 private:
  std::vector<int> prompt_, greedy_;
  bool wrong_;
  int vocab_;
};

std::vector<int> greedy_reference(const std::vector<int>& prompt, int n) {
  const ModelWeights& m = testing::bundled_model();
  Sampler greedy({.temperature = 0.0f});
  KVCache cache(m.config, static_cast<int>(prompt.size()) + n);
  return generate_cached(m, prompt, n, greedy, cache);
}

const SamplingParams kGreedy{.temperature = 0.0f};

GRADED_TEST(Lesson06Loop, GreedyWithTheDraftGivesTheTargetsTokensForEveryK, 3) {
  const ModelWeights& m = testing::bundled_model();
  const std::vector<int> prompt = ByteTokenizer::encode("The fortune you seek ");
  const int n = 40;
  const std::vector<int> want = greedy_reference(prompt, n);
  for (int k = 1; k <= 8; ++k) {
    TargetModel target(m);
    DraftProposer draft(testing::bundled_draft(), kGreedy, m.config.max_position_embeddings);
    KVCache cache(m.config, static_cast<int>(prompt.size()) + n);
    SpecStats st;
    const std::vector<int> got = generate_speculative(target, draft, prompt, n, k, kGreedy, cache, &st);
    EXPECT_EQ(got, want) << "k = " << k;
    EXPECT_GT(st.accepted, 0) << "k = " << k << ": the draft agrees with the target often; none kept is a bug";
    EXPECT_LT(st.rounds, n) << "k = " << k << ": fewer rounds than tokens, or nothing was gained";
  }
}

/// The draft, watched: at each proposal, whether its cache lacks a token the target kept in a
/// round that did not keep every guess (the loop rolled it back too far, and it computes that
/// token again).
class WatchedDraft final : public Proposer {
 public:
  explicit WatchedDraft(const ModelWeights& draft, int max_tokens) : inner_(draft, kGreedy, max_tokens) {}
  Proposal propose(std::span<const int> context, int k) override {
    if (last_context_ > 0) {
      const int kept = static_cast<int>(context.size()) - last_context_ - 1;  // guesses kept last round
      const auto& cached = inner_.cached_tokens();
      size_t have = 0;  // what the cache holds of the context but its last token
      while (have < cached.size() && have + 1 < context.size() && cached[have] == context[have]) ++have;
      if (have + 1 < context.size() && kept < last_proposed_) ++recomputed_;
    }
    Proposal p = inner_.propose(context, k);
    last_context_ = static_cast<int>(context.size());
    last_proposed_ = static_cast<int>(p.tokens.size());
    return p;
  }
  void rollback(int length) override { inner_.rollback(length); }
  /// Proposals that found a kept token missing from the cache.
  int recomputed() const { return recomputed_; }

 private:
  DraftProposer inner_;
  int last_context_ = 0, last_proposed_ = 0, recomputed_ = 0;
};

GRADED_TEST(Lesson06Loop, TheDraftNeverComputesAgainWhatTheTargetKept, 1) {
  // After a round that rejected a guess, the draft's cache must still hold the context and the kept guesses (the first guesses were fed to
  // it while proposing), so the next proposal has nothing to catch up. Rolled back one position
  // too far, the tokens come out the same, with a draft forward more per round.
  const ModelWeights& m = testing::bundled_model();
  const std::vector<int> prompt = ByteTokenizer::encode("The ");
  const int n = 80;
  for (const int k : {2, 4}) {
    TargetModel target(m);
    WatchedDraft draft(testing::bundled_draft(), m.config.max_position_embeddings);
    KVCache cache(m.config, static_cast<int>(prompt.size()) + n);
    SpecStats st;
    EXPECT_EQ(generate_speculative(target, draft, prompt, n, k, kGreedy, cache, &st), greedy_reference(prompt, n));
    EXPECT_LT(st.accepted, st.proposed) << "k = " << k << ": the test needs rounds that reject a guess";
    EXPECT_EQ(draft.recomputed(), 0) << "k = " << k << ": after a rejection the draft had to compute again tokens "
                                     << "it had computed and the target kept (rolled back too far?)";
  }
  // Nor inside a proposal: through the seam, with a store that counts the positions appended to
  // it, a draft that throws away what agrees and computes the whole context again every round
  // (the same tokens, the same cache afterwards) is seen. Each position is computed once for the
  // token it finally holds, and at most once more for each guess fed at it.
  const ModelWeights& d = testing::bundled_draft();
  for (const int k : {2, 4}) {
    long computed = 0;
    CpuRunner runner(d);
    auto store = std::make_unique<testing::ObservedStore>(d.config, d.config.max_position_embeddings,
                                                          [&computed](int layer, int, int rows) {
                                                            if (layer == 0) computed += rows;
                                                          });
    DraftProposer draft(runner, std::move(store), kGreedy);
    TargetModel target(m);
    KVCache cache(m.config, static_cast<int>(prompt.size()) + n);
    SpecStats st;
    const std::vector<int> out = generate_speculative(target, draft, prompt, n, k, kGreedy, cache, &st);
    EXPECT_EQ(out, greedy_reference(prompt, n)) << "k = " << k << ", the draft through the forward seam";
    const long bound = static_cast<long>(prompt.size() + out.size()) + st.proposed;
    EXPECT_LE(computed, bound) << "k = " << k << ": the draft computed " << computed << " positions for a context of "
                               << prompt.size() + out.size() << " tokens and " << st.proposed << " guesses in "
                               << st.rounds << " rounds: catch_up() must keep the cached tokens that agree and run only "
                               << "what is missing";
  }
}

GRADED_TEST(Lesson06Loop, GreedyWithPromptLookupGivesTheTargetsTokensForEveryK, 2) {
  // The bundled model's greedy text loops, which is what prompt lookup feeds on.
  const ModelWeights& m = testing::bundled_model();
  const std::vector<int> prompt = ByteTokenizer::encode("The ");
  const int n = 64;
  const std::vector<int> want = greedy_reference(prompt, n);
  for (int k = 1; k <= 8; ++k) {
    TargetModel target(m);
    NgramProposer lookup(3, 1);
    KVCache cache(m.config, static_cast<int>(prompt.size()) + n);
    SpecStats st;
    EXPECT_EQ(generate_speculative(target, lookup, prompt, n, k, kGreedy, cache, &st), want) << "k = " << k;
    EXPECT_GT(st.accepted, 0) << "k = " << k;
  }
}

GRADED_TEST(Lesson06Loop, OneTargetForwardPerRound, 3) {
  // Always right: each round yields k + 1 tokens from ONE target forward. Always wrong: one token
  // per forward, no more (and no fewer). A loop that runs the target once per token fails.
  const ModelWeights& m = testing::bundled_model();
  const std::vector<int> prompt = ByteTokenizer::encode("A friend ");
  const int n = 30, k = 4;
  const std::vector<int> want = greedy_reference(prompt, n);
  ASSERT_EQ(static_cast<int>(want.size()), n) << "the test needs a continuation without EOS";
  for (const bool wrong : {false, true}) {
    TargetModel target(m);
    Oracle oracle(prompt, want, wrong, m.config.vocab_size);
    KVCache cache(m.config, static_cast<int>(prompt.size()) + n);
    SpecStats st;
    EXPECT_EQ(generate_speculative(target, oracle, prompt, n, k, kGreedy, cache, &st), want);
    const long rounds = wrong ? n : (n + k) / (k + 1);  // 30 tokens in rounds of 5: 6 rounds
    EXPECT_EQ(target.forwards(), 1 + rounds) << (wrong ? "always wrong" : "always right") << ": the prefill, then one forward per round";
    EXPECT_EQ(st.rounds, rounds);
    EXPECT_EQ(st.target_forwards, target.forwards());
    EXPECT_EQ(st.accepted, wrong ? 0 : n - rounds);
    EXPECT_EQ(st.generated, n);
  }
}

GRADED_TEST(Lesson06Loop, GenerationStopsRightAfterEosEvenInsideARound, 1) {
  // This prompt's greedy continuation ends with EOS after 32 tokens. A proposer that knows the
  // target's greedy choices even past EOS gets EOS kept in the middle of a round, with more kept
  // guesses after it: the output must still end at the EOS.
  const ModelWeights& m = testing::bundled_model();
  const std::vector<int> prompt = ByteTokenizer::encode("\t-- Mark Twain\n");
  const int n = 60;
  const std::vector<int> want = greedy_reference(prompt, n);
  ASSERT_EQ(want.back(), m.config.eos_token_id) << "the test needs a continuation that ends with EOS";
  ASSERT_LT(static_cast<int>(want.size()), n - 8);
  std::vector<int> past = want;  // the target's own greedy tokens, continued past EOS
  {
    KVCache cache(m.config, 128);
    std::vector<int> seq = prompt;
    seq.insert(seq.end(), want.begin(), want.end());
    Matrix logits = forward_cached(m, seq, cache);
    for (int i = 0; i < 8; ++i) {
      past.push_back(argmax(logits.row(logits.rows() - 1).transpose()));
      logits = forward_cached(m, std::span(&past.back(), 1), cache);
    }
  }
  for (const int k : {3, 5}) {
    TargetModel target(m);
    Oracle oracle(prompt, past, false, m.config.vocab_size);
    KVCache cache(m.config, static_cast<int>(prompt.size()) + n);
    SpecStats st;
    EXPECT_EQ(generate_speculative(target, oracle, prompt, n, k, kGreedy, cache, &st), want) << "k = " << k;
    // The last round ends like the others: its context is the prompt, every kept guess and one
    // target token per round (the output cut at EOS or not), and the cache holds all of it but
    // the new last token.
    EXPECT_EQ(cache.length(), static_cast<int>(prompt.size() + st.accepted + st.rounds) - 1)
        << "k = " << k << ": after " << st.rounds << " rounds that kept " << st.accepted
        << " guesses, the target's cache holds every guess it kept, those past the EOS too";
  }
}

GRADED_TEST(Lesson06Loop, TheDraftProposesOnlyWhatItsCacheHasRoomFor, 1) {
  // A draft cache of 10 positions and a context of 8: the context's last token and two guesses
  // can be fed back (positions 7, 8, 9), so at most 3 guesses (the last one is never fed).
  const ModelWeights& d = testing::bundled_draft();
  DraftProposer draft(d, kGreedy, 10);
  const std::vector<int> context = ByteTokenizer::encode("Fortune");  // BOS and 7 bytes
  ASSERT_EQ(context.size(), 8u);
  Proposal p;
  ASSERT_NO_THROW(p = draft.propose(context, 5)) << "asked for 5 guesses with room for 3: propose fewer, not fail";
  EXPECT_GE(p.tokens.size(), 1u) << "there is room for guesses";
  EXPECT_LE(p.tokens.size(), 3u) << "a fourth guess would feed the third at position 10 of a 10-position cache";
  EXPECT_LE(draft.cache().length(), 10);
}

GRADED_TEST(Lesson06Loop, TheDraftsRollbackKeepsExactlyWhatItIsTold, 1) {
  // After propose(context, 4) the draft's cache holds the context and its first 3 guesses;
  // rollback(length) must leave exactly `length` of them, in the cache and in cached_tokens().
  const ModelWeights& d = testing::bundled_draft();
  DraftProposer draft(d, {.temperature = 0.0f}, 128);
  const std::vector<int> context = ByteTokenizer::encode("A friend ");
  const Proposal p = draft.propose(context, 4);
  ASSERT_EQ(p.tokens.size(), 4u);
  const int n = static_cast<int>(context.size());
  ASSERT_EQ(draft.cache().length(), n + 3);
  draft.rollback(n + 1);
  EXPECT_EQ(draft.cache().length(), n + 1);
  ASSERT_EQ(draft.cached_tokens().size(), static_cast<size_t>(n + 1));
  EXPECT_EQ(draft.cached_tokens().back(), p.tokens[0]);
  draft.rollback(n + 5);
  EXPECT_EQ(draft.cache().length(), n + 1) << "rolling back to more than it holds changes nothing";
}

GRADED_TEST(Lesson06Loop, AfterARejectionBothCachesHoldExactlyTheKeptTokens, 3) {
  // Sampled speculation with the draft: after the run, the target's cache holds the context but
  // its last token, and the draft's a prefix of it, with the K/V a fresh prefill computes; so
  // the next step's logits are a fresh run's.
  const ModelWeights& m = testing::bundled_model();
  const ModelWeights& d = testing::bundled_draft();
  const std::vector<int> prompt = ByteTokenizer::encode("Q: Will it rain? A:");
  const SamplingParams params{.temperature = 1.0f, .seed = 3};
  const int n = 25;
  TargetModel target(m);
  DraftProposer draft(d, params, m.config.max_position_embeddings);
  KVCache cache(m.config, static_cast<int>(prompt.size()) + n);
  SpecStats st;
  const std::vector<int> out = generate_speculative(target, draft, prompt, n, 5, params, cache, &st);
  ASSERT_LT(st.accepted, st.proposed) << "all " << st.proposed << " guesses were kept, where this seed's sampled run "
                                       << "rejects some with the reference: is verification's Rng seeded once "
                                       << "with params.seed, and drawn in the header's order?";
  std::vector<int> context = prompt;
  context.insert(context.end(), out.begin(), out.end());
  // The cache holds the context but its last token, and, where the run ended at an EOS inside a
  // round, the guesses kept past it too (the header's last round): compare what the output shows.
  const int shown = static_cast<int>(context.size()) - 1;
  ASSERT_EQ(cache.length(), static_cast<int>(prompt.size() + st.accepted + st.rounds) - 1)
      << "after " << st.rounds << " rounds that kept " << st.accepted << " guesses";
  ASSERT_GE(cache.length(), shown);
  KVCache fresh(m.config, static_cast<int>(context.size()));
  forward_cached(m, std::span(context).first(shown), fresh);
  for (int l = 0; l < m.config.num_hidden_layers; ++l)
    EXPECT_LT((cache.keys(l).topRows(shown) - fresh.keys(l)).cwiseAbs().maxCoeff(), 1e-4f) << "target layer " << l;
  if (cache.length() == shown) {  // no guess past an EOS: the next step continues from the cache
    const Matrix next = forward_cached(m, std::span(context).last(1), cache);
    const Matrix full = forward(m, context);
    EXPECT_LT((next.row(0) - full.row(full.rows() - 1)).cwiseAbs().maxCoeff(), 1e-3f);
  }
  // The draft: a prefix of what the target kept (the context, and any guesses past an EOS), and
  // the K/V of that prefix.
  const auto& cached = draft.cached_tokens();
  ASSERT_LE(cached.size(), static_cast<size_t>(cache.length()) + 1);
  const size_t common = std::min(cached.size(), context.size());
  EXPECT_TRUE(std::equal(cached.begin(), cached.begin() + static_cast<long>(common), context.begin()))
      << "the draft cached tokens that were rejected";
  ASSERT_EQ(draft.cache().length(), static_cast<int>(cached.size()));
  KVCache dfresh(d.config, static_cast<int>(cached.size()) + 1);
  forward_cached(d, cached, dfresh);
  for (int l = 0; l < d.config.num_hidden_layers; ++l)
    EXPECT_LT((draft.cache().keys(l) - dfresh.keys(l)).cwiseAbs().maxCoeff(), 1e-4f) << "draft layer " << l;
}

GRADED_TEST(Lesson06Loop, RollbackWorksForAStoreWithoutItsOwnTruncate, 1) {
  // An INT8 target cache rolls back through KVStore's generic truncate(): after a sampled run
  // with rejections it must hold the context but its last token, within INT8's rounding of a
  // fresh float32 prefill.
  const ModelWeights& m = testing::bundled_model();
  const std::vector<int> prompt = ByteTokenizer::encode("Q: Will it rain? A:");
  const SamplingParams params{.temperature = 1.0f, .seed = 3};
  const int n = 25;
  TargetModel target(m);
  DraftProposer draft(testing::bundled_draft(), params, m.config.max_position_embeddings);
  Int8KVCache cache(m.config, static_cast<int>(prompt.size()) + n);
  SpecStats st;
  const std::vector<int> out = generate_speculative(target, draft, prompt, n, 5, params, cache, &st);
  ASSERT_LT(st.accepted, st.proposed) << "all " << st.proposed << " guesses were kept, where this seed's sampled run "
                                       << "rejects some with the reference: is verification's Rng seeded once "
                                       << "with params.seed, and drawn in the header's order?";
  std::vector<int> context = prompt;
  context.insert(context.end(), out.begin(), out.end());
  // As in the test above: the context but its last token, and any guesses kept past an EOS.
  const int shown = static_cast<int>(context.size()) - 1;
  ASSERT_EQ(cache.length(), static_cast<int>(prompt.size() + st.accepted + st.rounds) - 1);
  ASSERT_GE(cache.length(), shown);
  KVCache fresh(m.config, static_cast<int>(context.size()));
  forward_cached(m, std::span(context).first(shown), fresh);
  for (int l = 0; l < m.config.num_hidden_layers; ++l)
    EXPECT_TRUE(testing::all_close(fresh.keys(l), cache.keys(l).topRows(shown), 0.05, 0.02, "INT8 keys after rollback"))
        << "layer " << l;
}

/// Guesses drawn from its own distributions: row i uniform over `sets[i]` (a different set for
/// each row, so a q row paired with the wrong guess gives that guess no mass), with its own Rng.
class UniformGuesser final : public Proposer {
 public:
  UniformGuesser(std::vector<std::vector<int>> sets, int vocab, uint64_t seed)
      : sets_(std::move(sets)), vocab_(vocab), rng_(seed) {}
  Proposal propose(std::span<const int> context, int k) override {
    (void)context;
    Proposal p;
    const int n = std::min(k, static_cast<int>(sets_.size()));
    p.q = Matrix::Zero(n, vocab_);
    for (int i = 0; i < n; ++i) {
      const auto& set = sets_[static_cast<size_t>(i)];
      for (int t : set) p.q(i, t) = 1.0f / static_cast<float>(set.size());
      p.tokens.push_back(set[rng_.below(set.size())]);
    }
    return p;
  }

 private:
  std::vector<std::vector<int>> sets_;
  int vocab_;
  Rng rng_;
};

/// The k most likely tokens of `probs`, most likely first.
std::vector<int> top_tokens(const Vector& probs, int k) {
  std::vector<int> ids(static_cast<size_t>(probs.size()));
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return probs[a] > probs[b]; });
  ids.resize(static_cast<size_t>(k));
  return ids;
}

GRADED_TEST(Lesson06Loop, SampledSpeculationFollowsTheTargetsDistribution, 2) {
  // The lesson's promise, end to end: sampled speculation draws each token from the target's own
  // distribution (p, with the request's temperature and top-k), whatever the proposer guesses.
  // 1,000 seeded runs of 3 tokens with 2 guesses a round; the first two tokens' joint counts
  // against p(x1) p(x2 | x1) from lesson 00's forward, by a chi-square test at significance
  // 0.001 (the seeds are fixed: a correct loop that draws in the header's order gives the
  // reference's counts, and one that draws in another order fails with probability 0.001). The Rng
  // seeded once per run, p from the request's params, each q row with its own guess: a loop that
  // breaks any of these writes well-formed text and fails here.
  const ModelWeights& m = testing::bundled_model();
  const std::vector<int> prompt = ByteTokenizer::encode("Q: What is");
  const SamplingParams base{.temperature = 1.3f, .top_k = 3};
  auto next_p = [&](const std::vector<int>& context) {
    const Matrix logits = forward(m, context);
    return sampling_distribution(logits.row(logits.rows() - 1).transpose(), base);
  };
  const Vector p1 = next_p(prompt);
  const std::vector<int> first = top_tokens(p1, base.top_k);
  std::vector<Vector> p2;  // p(x2 | x1) for each x1 in first
  for (int x1 : first) {
    std::vector<int> context = prompt;
    context.push_back(x1);
    p2.push_back(next_p(context));
  }
  // The guesser's sets: the target's likely first tokens, then the likely tokens after the most
  // likely first one (so some guesses are kept, some rejected).
  const std::vector<std::vector<int>> sets = {first, top_tokens(p2[0], 4)};
  std::map<std::pair<int, int>, long> counts;
  const int runs = 1000;
  for (int s = 0; s < runs; ++s) {
    SamplingParams params = base;
    params.seed = 5000 + static_cast<uint64_t>(s);
    TargetModel target(m);
    UniformGuesser guesser(sets, m.config.vocab_size, 90000 + static_cast<uint64_t>(s));
    KVCache cache(m.config, static_cast<int>(prompt.size()) + 3);
    const std::vector<int> out = generate_speculative(target, guesser, prompt, 3, 2, params, cache);
    ASSERT_GE(out.size(), 2u) << "seed " << params.seed << ": " << out.size() << " tokens (no EOS is likely here)";
    ++counts[{out[0], out[1]}];
  }
  // The joint distribution's cells; those expected below 5 times are pooled into one
  // (chi-square's rule).
  std::vector<double> p_cells;
  std::vector<long> observed;
  double pooled_p = 0;
  long pooled_o = 0;
  for (size_t a = 0; a < first.size(); ++a) {
    for (int b = 0; b < m.config.vocab_size; ++b) {
      const double p = static_cast<double>(p1[first[a]]) * static_cast<double>(p2[a][b]);
      const long o = counts.count({first[a], b}) ? counts[{first[a], b}] : 0;
      if (p == 0) {
        ASSERT_EQ(o, 0) << "token " << b << " after " << first[a] << " has no mass in p, but was drawn " << o << " times";
        continue;
      }
      if (runs * p < 5) {
        pooled_p += p, pooled_o += o;
      } else {
        p_cells.push_back(p), observed.push_back(o);
      }
    }
  }
  long outside = 0;
  for (const auto& [pair, n] : counts)
    if (std::find(first.begin(), first.end(), pair.first) == first.end()) outside += n;
  ASSERT_EQ(outside, 0) << "first tokens outside the target's top " << base.top_k << ": p was not built with the request's params";
  if (pooled_p > 0) p_cells.push_back(pooled_p), observed.push_back(pooled_o);
  Vector p(static_cast<Eigen::Index>(p_cells.size()));
  for (size_t i = 0; i < p_cells.size(); ++i) p[static_cast<Eigen::Index>(i)] = static_cast<float>(p_cells[i]);
  const double x2 = testing::chi_square(observed, p);
  const int df = static_cast<int>(p_cells.size()) - 1;
  ASSERT_GE(df, 1);
  ASSERT_LE(df, 15);
  EXPECT_LT(x2, testing::chi_square_critical_001(df))
      << "the first two tokens of " << runs << " sampled runs do not follow the target's "
      << "distribution (chi-square " << x2 << " over " << df << " degrees of freedom)";
}

GRADED_TEST(Lesson06Loop, PromptLookupProposesWhatFollowedTheLastOccurrence, 2) {
  NgramProposer lookup(3, 1);
  // ... 5 6 7 8 ... 5 6 7 9 ... 6 7: the last 3 (x 6 7) never occurred, the last 2 (6 7) did,
  // most recently followed by 9.
  const std::vector<int> ctx = {5, 6, 7, 8, 4, 5, 6, 7, 9, 3, 6, 7};
  Proposal p = lookup.propose(ctx, 3);
  EXPECT_EQ(p.tokens, (std::vector<int>{9, 3, 6})) << "the most recent earlier occurrence of (6 7)";
  EXPECT_EQ(p.q.rows(), 0) << "certain guesses carry no distribution";
  EXPECT_EQ(lookup.propose(ctx, 1).tokens, std::vector<int>{9});
  // ... 5 6 7 8 ... 6 7 9 ... 5 6 7: (6 7) last came before 9, but the longer (5 6 7) occurred
  // too, before 8: the longest n that finds one wins.
  const std::vector<int> longest = {5, 6, 7, 8, 2, 6, 7, 9, 5, 6, 7};
  EXPECT_EQ(lookup.propose(longest, 3).tokens, (std::vector<int>{8, 2, 6}))
      << "n = 3 found (5 6 7), followed by 8: n runs from max_n down, and the first n that finds one wins";
  const std::vector<int> tail = {1, 2, 3, 4, 1, 2};
  EXPECT_EQ(lookup.propose(tail, 8).tokens, (std::vector<int>{3, 4, 1, 2})) << "up to the context's end";
  EXPECT_TRUE(lookup.propose(std::vector<int>{1, 2, 3}, 4).tokens.empty()) << "nothing repeats";
  NgramProposer two(2, 2);
  EXPECT_TRUE(two.propose(std::vector<int>{4, 1, 5, 1}, 3).tokens.empty()) << "min_n 2: a one-token match is not enough";
  EXPECT_TRUE(testing::throws_error_mentioning([] { NgramProposer bad(1, 2); }, "min_n"));
}

GRADED_TEST(Lesson06Loop, BadArgumentsAreRefused, 1) {
  const ModelWeights& m = testing::bundled_model();
  TargetModel target(m);
  NgramProposer lookup;
  const std::vector<int> prompt = ByteTokenizer::encode("Hi");
  KVCache cache(m.config, 16);
  EXPECT_TRUE(testing::throws_error_mentioning(
      [&] { generate_speculative(target, lookup, prompt, 4, -1, kGreedy, cache); }, "k must be"));
  EXPECT_TRUE(testing::throws_error_mentioning(
      [&] { generate_speculative(target, lookup, prompt, 40, 2, kGreedy, cache); }, "cache holds"));
  EXPECT_TRUE(testing::throws_error_mentioning(
      [&] { generate_speculative(target, lookup, std::vector<int>{}, 4, 2, kGreedy, cache); }, "empty"));
  class TooMany final : public Proposer {
    Proposal propose(std::span<const int>, int k) override { return {std::vector<int>(static_cast<size_t>(k) + 1, 5), {}}; }
  } too_many;
  EXPECT_TRUE(testing::throws_error_mentioning(
      [&] { generate_speculative(target, too_many, prompt, 8, 2, kGreedy, cache); }, "at most"));
}

}  // namespace
}  // namespace infer
