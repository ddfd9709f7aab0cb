// Lesson 05, part A: the radix tree by hand. Blocks of 4 tokens; block ids come from a small
// allocator, so every test can also check who holds which block.
#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "common/rng.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/throws.hpp"
#include "lessons/05_prefix_caching/prefix_cache.hpp"

namespace infer {
namespace {

constexpr int B = 4;

/// `n` consecutive token ids starting at `first`.
std::vector<int> run(int n, int first = 100) {
  std::vector<int> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

/// Blocks for a sequence of `tokens` tokens: fresh ones from `a` (count 1: the caller's hold).
std::vector<int> take(BlockAllocator& a, int tokens) {
  std::vector<int> b;
  for (int i = 0; i < tokens / B; ++i) b.push_back(a.allocate());
  return b;
}

/// The caller lets go of its blocks (the cache keeps its own holds).
void drop(BlockAllocator& a, const std::vector<int>& blocks) {
  for (int b : blocks) a.free(b);
}

/// Inserts `t` as a finished sequence would: fresh blocks, inserted, let go. Returns insert()'s count.
int put(BlockAllocator& a, RadixCache& c, const std::vector<int>& t) {
  const auto b = take(a, static_cast<int>(t.size()));
  const int added = c.insert(t, b);
  drop(a, b);
  return added;
}

/// A request as the engine runs one: its match's blocks shared, fresh ones for the rest of its
/// full blocks, the whole inserted, its own holds let go.
void serve(BlockAllocator& a, RadixCache& c, const std::vector<int>& t) {
  const auto m = c.match(t);
  std::vector<int> blocks = m.blocks;
  for (int b : blocks) a.share(b);
  while (blocks.size() < t.size() / B) blocks.push_back(a.allocate());
  c.insert(t, blocks);
  drop(a, blocks);
}

/// The tree's shape, checked through its public view after an operation: every node reachable
/// from the root exactly once, each child filed under its run's first block and pointing back at
/// its parent, runs and blocks in whole blocks, each lock count exactly the locks held on the
/// node or below it (`locks`: one entry per lock() not yet unlocked), no locked node evicted, and
/// cached_blocks(), evictable_blocks() and num_nodes() what the nodes add up to.
::testing::AssertionResult well_formed(const RadixCache& c, const std::vector<RadixCache::NodeId>& locks) {
  using NodeId = RadixCache::NodeId;
  const auto alive = [&](NodeId id) {
    try {
      c.node(id);
      return true;
    } catch (const Error&) {
      return false;
    }
  };
  std::map<NodeId, int> want_lock;
  for (NodeId n : locks) {
    if (!alive(n)) return ::testing::AssertionFailure() << "node " << n << " is locked, yet it was evicted";
    for (NodeId x = n; x != -1 && alive(x); x = c.node(x).parent) ++want_lock[x];
  }
  std::set<NodeId> seen;
  std::vector<NodeId> todo{0};
  int cached = 0, evictable = 0;
  while (!todo.empty()) {
    const NodeId id = todo.back();
    todo.pop_back();
    if (!seen.insert(id).second) return ::testing::AssertionFailure() << "node " << id << " is reached twice from the root";
    const RadixCache::Node& n = c.node(id);
    const size_t runs = n.tokens.size();
    if (id == 0 && (n.parent != -1 || runs != 0 || !n.blocks.empty()))
      return ::testing::AssertionFailure() << "the root must have no parent, tokens or blocks";
    if (id != 0 && (runs < static_cast<size_t>(B) || runs % B != 0 || n.blocks.size() * B != runs))
      return ::testing::AssertionFailure() << "node " << id << " has " << runs << " tokens and " << n.blocks.size()
                                           << " blocks of " << B << ": runs are whole blocks, at least one";
    if (id != 0 && n.lock != want_lock[id])
      return ::testing::AssertionFailure() << "node " << id << " has lock count " << n.lock << ", but " << want_lock[id]
                                           << " lock(s) are held on it or below it (a split must carry them up)";
    cached += static_cast<int>(n.blocks.size());
    if (id != 0 && n.lock == 0) evictable += static_cast<int>(n.blocks.size());
    for (const auto& [key, child] : n.children) {
      if (!alive(child)) return ::testing::AssertionFailure() << "node " << id << " lists evicted child " << child;
      const RadixCache::Node& ch = c.node(child);
      if (ch.parent != id)
        return ::testing::AssertionFailure() << "node " << child << " is a child of " << id << " but names parent "
                                             << ch.parent;
      if (ch.tokens.size() < static_cast<size_t>(B) || !std::equal(key.begin(), key.end(), ch.tokens.begin()) ||
          key.size() != static_cast<size_t>(B))
        return ::testing::AssertionFailure() << "node " << child << " is filed under a key that is not its run's first block";
      todo.push_back(child);
    }
  }
  if (static_cast<int>(seen.size()) != c.num_nodes())
    return ::testing::AssertionFailure() << c.num_nodes() << " nodes alive, " << seen.size() << " reachable from the root";
  if (cached != c.cached_blocks())
    return ::testing::AssertionFailure() << "cached_blocks() says " << c.cached_blocks() << ", the nodes hold " << cached;
  if (evictable != c.evictable_blocks())
    return ::testing::AssertionFailure() << "evictable_blocks() says " << c.evictable_blocks()
                                         << ", the unlocked nodes hold " << evictable;
  return ::testing::AssertionSuccess();
}

GRADED_TEST(Lesson05Tree, AnEmptyTreeMatchesNothing, 1) {
  BlockAllocator a(8);
  RadixCache c(a, B, 8);
  const auto m = c.match(run(12));
  EXPECT_EQ(m.tokens, 0);
  EXPECT_TRUE(m.blocks.empty());
  EXPECT_EQ(m.node, 0) << "no match ends at the root";
  EXPECT_EQ(c.cached_blocks(), 0);
  EXPECT_EQ(c.num_nodes(), 1);
}

GRADED_TEST(Lesson05Tree, AnExactMatchReturnsTheInsertedBlocksInWholeBlocks, 2) {
  BlockAllocator a(16);
  RadixCache c(a, B, 16);
  const auto tokens = run(10);  // two full blocks and two tokens over
  const auto mine = take(a, 10);
  EXPECT_EQ(c.insert(tokens, mine), 8) << "only full blocks are cached";
  drop(a, mine);
  for (int b : mine) EXPECT_EQ(a.ref_count(b), 1) << "the cache holds each of its blocks once";
  const auto m = c.match(tokens);
  EXPECT_EQ(m.tokens, 8);
  EXPECT_EQ(m.blocks, mine);
  // A match is in whole blocks: 7 matching tokens reuse one block, 3 reuse none.
  EXPECT_EQ(c.match(run(7)).tokens, 4);
  EXPECT_EQ(c.match(run(3)).tokens, 0);
  for (int b : mine) EXPECT_EQ(a.ref_count(b), 1) << "match() shares nothing";
}

GRADED_TEST(Lesson05Tree, AMatchEndingInsideARunSplitsIt, 2) {
  BlockAllocator a(16);
  RadixCache c(a, B, 16);
  const auto mine = take(a, 12);
  c.insert(run(12), mine);
  drop(a, mine);
  ASSERT_EQ(c.num_nodes(), 2) << "one run of three blocks is one node";
  // Shares the first 6 tokens: one block, and the run is split after it.
  std::vector<int> other = run(6);
  other.insert(other.end(), {7, 7, 7, 7, 7, 7});
  const auto m = c.match(other);
  EXPECT_EQ(m.tokens, 4);
  EXPECT_EQ(m.blocks, std::vector<int>({mine[0]}));
  EXPECT_EQ(c.num_nodes(), 3) << "the split adds a node";
  const auto& upper = c.node(m.node);
  EXPECT_EQ(upper.tokens, run(4)) << "the node the match ends on holds exactly the matched run";
  EXPECT_EQ(upper.blocks, std::vector<int>({mine[0]}));
  ASSERT_EQ(upper.children.size(), 1u);
  const auto& lower = c.node(upper.children.begin()->second);
  EXPECT_EQ(lower.tokens, run(8, 104));
  EXPECT_EQ(lower.blocks, std::vector<int>({mine[1], mine[2]}));
  EXPECT_EQ(lower.parent, m.node);
  EXPECT_EQ(c.match(run(12)).tokens, 12) << "the whole run still matches across the split";
  EXPECT_EQ(c.cached_blocks(), 3);
}

GRADED_TEST(Lesson05Tree, DivergenceAtTheFirstBlockAndOnePrefixOfAnother, 2) {
  BlockAllocator a(32);
  RadixCache c(a, B, 32);
  auto put = [&](const std::vector<int>& t) { return infer::put(a, c, t); };
  EXPECT_EQ(put(run(8)), 8);
  std::vector<int> diverge = run(8);
  diverge[0] = 5;  // differs at the very first token
  EXPECT_EQ(put(diverge), 8);
  EXPECT_EQ(c.node(0).children.size(), 2u) << "two runs out of the root";
  EXPECT_EQ(put(run(4)), 0) << "a prefix of a cached run adds nothing";
  EXPECT_EQ(put(run(16)), 8) << "an extension adds only its new blocks";
  EXPECT_EQ(c.cached_blocks(), 6);
  EXPECT_EQ(c.match(run(16)).tokens, 16);
  EXPECT_EQ(c.match(diverge).tokens, 8);
  EXPECT_EQ(a.num_free(), 32 - 6) << "the cache holds six blocks; every duplicate went back";
}

GRADED_TEST(Lesson05Tree, InsertRefusesTooFewTokensAndChangesNothing, 1) {
  BlockAllocator a(8);
  RadixCache c(a, B, 8);
  const auto b = take(a, 8);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { c.insert(run(7), b); }, "tokens"));
  EXPECT_EQ(c.cached_blocks(), 0);
  for (int x : b) EXPECT_EQ(a.ref_count(x), 1);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { RadixCache bad(a, 0, 8); }, "block_size"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { RadixCache bad(a, B, 0); }, "capacity"));
}

// ------------------------------------------------------------------ eviction --

GRADED_TEST(Lesson05Evict, TheLeastRecentlyUsedLeafGoesFirst, 2) {
  BlockAllocator a(16);
  RadixCache c(a, B, 3);
  std::vector<std::vector<int>> seqs = {run(4, 100), run(4, 200), run(4, 300)};
  for (const auto& s : seqs) put(a, c, s);
  c.match(seqs[0]);  // 0 is now the most recent; 1 is the least
  put(a, c, run(4, 400));  // over capacity: one must go
  EXPECT_EQ(c.cached_blocks(), 3);
  EXPECT_EQ(c.match(seqs[1]).tokens, 0) << "the least recently used run is evicted";
  EXPECT_EQ(c.match(seqs[0]).tokens, 4);
  EXPECT_EQ(c.match(seqs[2]).tokens, 4);
  EXPECT_EQ(a.num_free(), 16 - 3) << "the evicted block went back to the pool";
}

GRADED_TEST(Lesson05Evict, EveryMatchAndInsertMakesItsWholePathTheMostRecent, 2) {
  // Capacity 2 runs of one block: each case inserts or matches in some order, then a third run
  // makes one go; the one that must go is the one used least recently.
  auto fresh = [](BlockAllocator& a) { return std::make_unique<RadixCache>(a, B, 2); };
  const std::vector<int> A = run(4, 100), Bs = run(4, 200), C = run(4, 300);
  {
    BlockAllocator a(16);
    auto c = fresh(a);
    put(a, *c, A), put(a, *c, Bs);
    c->match(A);  // A is now more recent than B
    put(a, *c, C);
    EXPECT_EQ(c->match(A).tokens, 4) << "insert A, insert B, match A, insert C: B goes, A stays (a match is a use, "
                                        "later than the insert before it: it moves the clock)";
  }
  {
    BlockAllocator a(16);
    auto c = fresh(a);
    put(a, *c, A);
    c->match(A);
    put(a, *c, Bs);  // B is now more recent than A
    put(a, *c, C);
    EXPECT_EQ(c->match(Bs).tokens, 4) << "insert A, match A, insert B, insert C: A goes, B stays (the run an insert "
                                         "adds is used at that insert)";
  }
  {
    BlockAllocator a(16);
    auto c = fresh(a);
    put(a, *c, A), put(a, *c, Bs);
    put(a, *c, A);  // already cached: inserting it again is a use of its path
    put(a, *c, C);
    EXPECT_EQ(c->match(A).tokens, 4) << "insert A, insert B, insert A again, insert C: B goes (an insert makes every "
                                        "node on its path the most recent, not only a new leaf)";
  }
  {
    // [x y] and [x z] share x; a match of [x y] uses x as well as y. Once y and z are evicted, x
    // is a leaf, used more recently than L.
    BlockAllocator a(32);
    RadixCache c(a, B, 8);
    std::vector<int> xy = run(8, 100), xz = run(4, 100), L = run(4, 900);
    xz.insert(xz.end(), {7, 7, 7, 7});
    put(a, c, xy), put(a, c, xz), put(a, c, L);
    const auto ml = c.match(L);  // L is used here, after the match of [x y]...
    c.lock(ml.node);
    c.match(xy);  // ...and [x y] again after it
    EXPECT_EQ(c.evict_to(2), 2) << "with L locked, the leaves y and z go";
    c.unlock(ml.node);
    EXPECT_EQ(c.evict_to(1), 1);
    EXPECT_EQ(c.match(run(4, 100)).tokens, 4) << "x was used by the last match of [x y], after L: L goes, x stays (a "
                                                 "match makes every node on its path the most recent)";
  }
}

GRADED_TEST(Lesson05Evict, LockedNodesAndTheirAncestorsAreNeverEvicted, 2) {
  BlockAllocator a(32);
  RadixCache c(a, B, 32);
  auto put = [&](const std::vector<int>& t) { infer::put(a, c, t); };
  put(run(8));
  std::vector<int> branch = run(4);
  branch.insert(branch.end(), {9, 9, 9, 9});
  put(branch);  // splits run(8) after its first block
  const auto m = c.match(run(8));
  c.lock(m.node);
  EXPECT_EQ(c.evictable_blocks(), 1) << "only the other branch is evictable";
  EXPECT_EQ(c.evict_to(0), 1);
  EXPECT_EQ(c.cached_blocks(), 2) << "the locked leaf and its parent stay";
  EXPECT_EQ(c.match(run(8)).tokens, 8);
  c.unlock(m.node);
  EXPECT_EQ(c.evict_to(0), 2);
  EXPECT_EQ(c.cached_blocks(), 0);
  EXPECT_EQ(a.num_free(), 32) << "every block back, once each";
  EXPECT_TRUE(testing::throws_error_mentioning([&] { c.unlock(0); }, "not locked"));
  put(run(8));
  const auto leaf = c.match(run(8));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { c.unlock(leaf.node); }, "not locked"))
      << "a leaf nobody locked";
  EXPECT_EQ(c.evict_to(0), 2) << "evict_to returns blocks, not nodes";
  put(run(12, 500));  // one node of 3 blocks
  EXPECT_EQ(c.evict_to(0), 3) << "one node of 3 blocks evicted: evict_to returns the blocks it let go of (3), not the "
                                 "nodes (1)";
  EXPECT_TRUE(testing::throws_error_mentioning([&] { c.lock(leaf.node); }, "")) << "locking a node that was evicted";
  EXPECT_TRUE(testing::throws_error_mentioning([&] { c.lock(1000); }, "")) << "locking a node that never existed";
}

GRADED_TEST(Lesson05Evict, TheDestructorGivesEveryBlockBack, 1) {
  BlockAllocator a(16);
  {
    RadixCache c(a, B, 16);
    put(a, c, run(8));
    std::vector<int> other = run(4);
    other.insert(other.end(), {7, 7, 7, 7, 7, 7, 7, 7});
    put(a, c, other);
    EXPECT_EQ(a.num_free(), 16 - c.cached_blocks());
  }
  EXPECT_EQ(a.num_free(), 16) << "a destroyed cache holds nothing";
}

GRADED_TEST(Lesson05Evict, CapacityAndOwnershipHoldAfterEveryOperation, 3) {
  // Random inserts, matches, locks and unlocks over a small alphabet (so runs share prefixes and
  // split often); after each one: the capacity holds unless all is locked, and every block's
  // count is exactly the cache's hold plus the test's.
  BlockAllocator a(400);
  RadixCache c(a, B, 20);
  Rng rng(5);
  std::vector<RadixCache::NodeId> locked;
  for (int op = 0; op < 600; ++op) {
    std::vector<int> t(B * (1 + static_cast<int>(rng.below(6))));
    for (int& x : t) x = static_cast<int>(rng.below(3));
    const double u = rng.uniform();
    if (u < 0.6) {
      serve(a, c, t);
    } else if (u < 0.8) {
      const auto m = c.match(t);
      c.lock(m.node);
      locked.push_back(m.node);
    } else if (!locked.empty()) {
      c.unlock(locked.back());
      locked.pop_back();
    }
    ASSERT_TRUE(c.cached_blocks() <= c.capacity_blocks() || c.evictable_blocks() == 0)
        << "operation " << op << ": " << c.cached_blocks() << " blocks cached, capacity " << c.capacity_blocks();
    int held = 0;
    for (int b = 0; b < a.num_blocks(); ++b) {
      ASSERT_LE(a.ref_count(b), 1) << "operation " << op << ": block " << b << " held twice";
      held += a.ref_count(b);
    }
    ASSERT_EQ(held, c.cached_blocks()) << "operation " << op << ": blocks held by nobody, or by a dead node";
  }
  while (!locked.empty()) {
    c.unlock(locked.back());
    locked.pop_back();
  }
  c.evict_to(0);
  EXPECT_EQ(a.num_free(), a.num_blocks());
}

GRADED_TEST(Lesson05Evict, TheTreeStaysWellFormedAfterEveryOperation, 2) {
  // Random requests over a small alphabet, so runs share prefixes and split often, locked ones
  // included; after each operation the whole tree is checked (well_formed above). One kind of
  // operation is open_for()'s: a request locks its match, then everything evictable goes, so its
  // own match is all that stays.
  BlockAllocator a(400);
  RadixCache c(a, B, 24);
  Rng rng(11);
  std::vector<RadixCache::NodeId> locked;
  std::vector<std::vector<int>> seen;  // requests so far: most new ones continue a part of one
  for (int op = 0; op < 800; ++op) {
    std::vector<int> t;
    if (!seen.empty() && rng.uniform() < 0.7) {  // so that runs, locked ones too, split inside
      const std::vector<int>& old = seen[rng.below(seen.size())];
      t.assign(old.begin(), old.begin() + static_cast<long>(rng.below(old.size() + 1)));
    }
    const size_t n = B * (1 + rng.below(6)) + rng.below(B);
    while (t.size() < n) t.push_back(static_cast<int>(rng.below(3)));
    seen.push_back(t);
    const double u = rng.uniform();
    const char* what = "";
    if (u < 0.45) {
      what = "a request served";
      serve(a, c, t);
    } else if (u < 0.65) {
      what = "a match locked";
      locked.push_back(c.match(t).node);
      c.lock(locked.back());
    } else if (u < 0.8) {
      what = "a lock let go";
      if (!locked.empty()) {
        c.unlock(locked.back());
        locked.pop_back();
      }
    } else if (u < 0.9) {
      what = "a request's match locked, then everything else evicted";
      const RadixCache::Match m = c.match(t);
      c.lock(m.node);
      locked.push_back(m.node);
      c.evict_to(-1);
      ASSERT_TRUE(well_formed(c, locked)) << "operation " << op << ": " << what;
      EXPECT_EQ(c.match(t).blocks, m.blocks) << "operation " << op << ": a locked match must survive the eviction";
      c.unlock(m.node);
      locked.pop_back();
    } else {
      what = "an eviction down to a random size";
      c.evict_to(static_cast<int>(rng.below(static_cast<uint64_t>(c.cached_blocks()) + 1)));
    }
    ASSERT_TRUE(well_formed(c, locked)) << "operation " << op << ": " << what;
  }
}

GRADED_TEST(Lesson05Evict, AnEvictedBlockReusedElsewhereIsNeverMatched, 2) {
  // The bug real engines hit: a tree entry still pointing at a block that was freed and handed
  // to another sequence. After eviction, the freed block is reallocated and the old prefix must
  // miss.
  BlockAllocator a(2);
  RadixCache c(a, B, 2);
  const auto b = take(a, 8);
  c.insert(run(8), b);
  drop(a, b);
  c.evict_to(0);
  ASSERT_EQ(a.num_free(), 2);
  const int reused = a.allocate();  // someone else's K/V now
  EXPECT_EQ(c.match(run(8)).tokens, 0) << "an evicted run matched: its block " << reused << " belongs to another";
  a.free(reused);
}

GRADED_TEST(Lesson05Evict, EvictedNodesGiveTheirSlotsBackSoMemoryStaysFlat, 2) {
  // A server's cache sees request after request: 5,000 different prompts of 1 to 3 blocks, some
  // sharing a first block (so runs split), through a cache of 8 blocks. The tree never holds more
  // than a dozen nodes; the node array must not hold more either.
  constexpr int kCapacity = 8;
  BlockAllocator a(kCapacity + 4);
  RadixCache c(a, B, kCapacity);
  Rng rng(11);
  for (int i = 0; i < 5000; ++i) {
    std::vector<int> t(B * (1 + static_cast<int>(rng.below(3))));
    for (int& x : t) x = 3 + static_cast<int>(rng.below(200));
    if (rng.uniform() < 0.3) std::fill(t.begin(), t.begin() + B, 1);  // a common first block
    serve(a, c, t);
    ASSERT_LE(c.node_slots(), 2 * kCapacity + 2)
        << "after " << i + 1 << " prompts through a cache of " << kCapacity << " blocks the node array has "
        << c.node_slots() << " slots for " << c.num_nodes()
        << " nodes alive: take new nodes from new_node() and give evicted ones back with drop_node(), or a "
           "server's memory grows with every request it has ever seen";
  }
  EXPECT_LE(c.cached_blocks(), kCapacity);
}

}  // namespace
}  // namespace infer
