// Lesson 06, part C: tree speculation. The tree mask lets each node see
// exactly itself and its ancestors; a forward over the tree gives each node the logits of its
// own path; a tree never accepts fewer guesses than the chain along its first branch; and greedy
// tree speculation gives the target's greedy tokens with one target forward per round.
#include <algorithm>
#include <utility>
#include <vector>

#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "common/testing/throws.hpp"
#include "common/tokenizer.hpp"
#include "lessons/06_speculative_decoding/speculative.hpp"

namespace infer {
namespace {

/// The README's tree: root t; a, b under it; c, d under a; e, f under b.
TokenTree small_tree() { return {{40, 41, 42, 43, 44, 45, 46}, {-1, 0, 0, 1, 1, 2, 2}}; }

GRADED_TEST(Lesson06Tree, TheMaskLetsEachNodeSeeExactlyItselfAndItsAncestors, 2) {
  const TreeMask m = tree_mask(small_tree());
  ASSERT_EQ(m.rows(), 7);
  ASSERT_EQ(m.cols(), 7);
  const std::vector<std::vector<int>> sees = {{0}, {0, 1}, {0, 2}, {0, 1, 3}, {0, 1, 4}, {0, 2, 5}, {0, 2, 6}};
  for (int i = 0; i < 7; ++i)
    for (int j = 0; j < 7; ++j) {
      const bool want = std::find(sees[i].begin(), sees[i].end(), j) != sees[i].end();
      EXPECT_EQ(m(i, j), want) << "node " << i << " and node " << j;
    }
  // A chain is a tree: its mask is the causal one.
  const TreeMask chain = tree_mask({{5, 6, 7}, {-1, 0, 1}});
  EXPECT_TRUE(chain(2, 0) && chain(2, 1) && chain(2, 2) && !chain(1, 2) && !chain(0, 1));
  EXPECT_TRUE(testing::throws_error_mentioning([] { tree_mask({{5, 6}, {-1, 1}}); }, "parent"));
  EXPECT_TRUE(testing::throws_error_mentioning([] { tree_mask({{5, 6}, {0, 0}}); }, "parent"));
  EXPECT_TRUE(testing::throws_error_mentioning([] { tree_mask({{5, 6}, {-1}}); }, "parents"));
}

GRADED_TEST(Lesson06Tree, ATreeForwardGivesEachNodeTheLogitsOfItsOwnPath, 2) {
  // forward_tree() (given) runs your mask: row i must be what the model says after the context
  // and the path to node i, and keeping one path leaves the cache a plain run would leave.
  const ModelWeights& m = testing::bundled_model();
  const std::vector<int> context = ByteTokenizer::encode("Q: Rain? A: ");
  const TokenTree tree{{context.back(), 84, 104, 105, 111, 101, 32}, {-1, 0, 0, 1, 1, 2, 2}};
  KVCache cache(m.config, 64);
  forward_cached(m, std::span(context).first(context.size() - 1), cache);
  const int start = cache.length();
  const Matrix logits = forward_tree(m, tree, cache);
  for (int i = 0; i < 7; ++i) {
    std::vector<int> path_tokens;
    for (int j = i; j != -1; j = tree.parent[j]) path_tokens.insert(path_tokens.begin(), tree.tokens[j]);
    std::vector<int> seq(context.begin(), context.end() - 1);
    seq.insert(seq.end(), path_tokens.begin(), path_tokens.end());
    const Matrix want = forward(m, seq);
    EXPECT_LT((logits.row(i) - want.row(want.rows() - 1)).cwiseAbs().maxCoeff(), 1e-3f) << "node " << i;
  }
  keep_tree_path(cache, start, std::vector<int>{0, 2, 5});
  std::vector<int> kept(context.begin(), context.end());
  kept.insert(kept.end(), {104, 101});
  KVCache fresh(m.config, 64);
  forward_cached(m, kept, fresh);
  ASSERT_EQ(cache.length(), fresh.length());
  for (int l = 0; l < m.config.num_hidden_layers; ++l)
    EXPECT_LT((cache.keys(l) - fresh.keys(l)).cwiseAbs().maxCoeff(), 1e-4f) << "layer " << l;
}

GRADED_TEST(Lesson06Tree, GreedyVerificationFollowsTheTargetsArgmaxDownTheTree, 2) {
  // Logits over 50 tokens whose argmax is given per node.
  auto logits_with_argmax = [](const std::vector<int>& best) {
    Matrix l = Matrix::Zero(static_cast<Eigen::Index>(best.size()), 50);
    for (size_t i = 0; i < best.size(); ++i) l(static_cast<Eigen::Index>(i), best[i]) = 5.0f;
    return l;
  };
  const TokenTree t = small_tree();
  // The root wants 42 (node 2), node 2 wants 46 (node 6), node 6 wants 9: path 2, 6; next 9.
  TreeVerdict v = verify_tree_greedy(logits_with_argmax({42, 1, 46, 1, 1, 1, 9}), t);
  EXPECT_EQ(v.path, (std::vector<int>{2, 6}));
  EXPECT_EQ(v.next_token, 9);
  // The root wants 43: that is node 3's token, but node 3 is no child of the root.
  v = verify_tree_greedy(logits_with_argmax({43, 1, 1, 1, 1, 1, 1}), t);
  EXPECT_TRUE(v.path.empty());
  EXPECT_EQ(v.next_token, 43);
  v = verify_tree_greedy(logits_with_argmax({41, 44, 1, 1, 7, 1, 1}), t);
  EXPECT_EQ(v.path, (std::vector<int>{1, 4}));
  EXPECT_EQ(v.next_token, 7);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { verify_tree_greedy(logits_with_argmax({1, 2}), t); }, "rows"));
}

GRADED_TEST(Lesson06Tree, ATreeNeverAcceptsFewerThanTheChainAlongItsFirstBranch, 2) {
  // At every point of a greedy continuation: the draft's tree (2 branches, 3 levels) and the
  // chain of its first children (the draft's greedy guesses), both verified by the target.
  const ModelWeights& m = testing::bundled_model();
  const ModelWeights& d = testing::bundled_draft();
  std::vector<int> text = ByteTokenizer::encode("A friend in need ");
  Sampler greedy({.temperature = 0.0f});
  KVCache plain(m.config, 128);
  const std::vector<int> cont = generate_cached(m, text, 40, greedy, plain);
  text.insert(text.end(), cont.begin(), cont.end());
  DraftProposer draft(d, {.temperature = 0.0f}, 256);
  long tree_total = 0, chain_total = 0;
  int wider = 0;
  for (size_t n = 18; n <= text.size(); n += 3) {
    const std::span<const int> ctx(text.data(), n);
    const TokenTree tree = draft.propose_tree(ctx, 2, 3);
    ASSERT_EQ(tree.tokens.size(), 15u) << "1 + 2 + 4 + 8 nodes";
    ASSERT_EQ(draft.cache().length(), static_cast<int>(n) - 1) << "the draft's cache ends as it began";
    std::vector<int> chain;  // the first branch: first child of each node, nodes numbered level by level
    for (int node = 0;;) {
      int child = -1;
      for (size_t c = 1; c < tree.parent.size() && child < 0; ++c)
        if (tree.parent[c] == node) child = static_cast<int>(c);
      if (child < 0) break;
      chain.push_back(tree.tokens[child]);
      node = child;
    }
    ASSERT_EQ(chain.size(), 3u);
    KVCache cache(m.config, 128);
    forward_cached(m, ctx.first(n - 1), cache);
    const TreeVerdict tv = verify_tree_greedy(forward_tree(m, tree, cache), tree);
    cache.truncate(static_cast<int>(n) - 1);
    std::vector<int> feed{ctx.back()};
    feed.insert(feed.end(), chain.begin(), chain.end());
    const Verdict cv = verify_greedy(forward_cached(m, feed, cache), chain);
    EXPECT_GE(static_cast<int>(tv.path.size()), cv.accepted) << "context of " << n << " tokens";
    tree_total += static_cast<long>(tv.path.size());
    chain_total += cv.accepted;
    wider += tv.path.size() > static_cast<size_t>(cv.accepted);
  }
  EXPECT_GT(wider, 0) << "the second branches were meant to win somewhere: the test lost its point";
}

GRADED_TEST(Lesson06Tree, GreedyTreeSpeculationGivesTheTargetsTokensInOneForwardPerRound, 3) {
  const ModelWeights& m = testing::bundled_model();
  const std::vector<int> prompt = ByteTokenizer::encode("The fortune you seek ");
  const int n = 40;
  Sampler greedy({.temperature = 0.0f});
  KVCache plain(m.config, static_cast<int>(prompt.size()) + n);
  const std::vector<int> want = generate_cached(m, prompt, n, greedy, plain);
  ASSERT_EQ(static_cast<int>(want.size()), n) << "the test needs a continuation without EOS";
  for (const auto& [branches, depth] : std::vector<std::pair<int, int>>{{2, 3}, {1, 4}, {3, 2}}) {
    TargetModel target(m);
    DraftProposer draft(testing::bundled_draft(), {.temperature = 0.0f}, 256);
    KVCache cache(m.config, static_cast<int>(prompt.size()) + n);
    SpecStats st;
    EXPECT_EQ(generate_tree(target, draft, prompt, n, branches, depth, cache, &st), want)
        << branches << " branches, " << depth << " levels";
    EXPECT_EQ(target.forwards(), 1 + st.rounds) << "the prefill, then one forward per round";
    EXPECT_EQ(st.generated, st.accepted + st.rounds) << "each round: its accepted guesses and one target token";
    EXPECT_LT(st.rounds, n) << "nothing was gained";
    EXPECT_EQ(cache.length(), static_cast<int>(prompt.size()) + n - 1)
        << "the target's cache: the context but its last token, no leftover tree nodes";
  }
  {
    // Far larger than any cache holds (2 branches, 64 levels: 2^65 nodes, more than a long
    // counts): each round's tree is cut to what the caches have room for.
    const std::vector<int> text = ByteTokenizer::encode("The secret of");
    const int many = 66;
    KVCache cached(m.config, static_cast<int>(text.size()) + many);
    const std::vector<int> expected = generate_cached(m, text, many, greedy, cached);
    TargetModel target(m);
    DraftProposer draft(testing::bundled_draft(), {.temperature = 0.0f}, 256);
    KVCache cache(m.config, m.config.max_position_embeddings);
    EXPECT_EQ(generate_tree(target, draft, text, many, 2, 64, cache), expected)
        << "2 branches, 64 levels: the tree must be cut to the room the caches have";
  }
  TargetModel target(m);
  DraftProposer draft(testing::bundled_draft(), {.temperature = 0.0f}, 256);
  KVCache cache(m.config, 64);
  EXPECT_TRUE(testing::throws_error_mentioning(
      [&] { generate_tree(target, draft, prompt, 8, 0, 3, cache); }, "branches"));
}

}  // namespace
}  // namespace infer
