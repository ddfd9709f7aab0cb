// Lesson 04, part B: paged storage and attention through the block table.
#include <algorithm>
#include <numeric>

#include "common/rng.hpp"
#include "common/testing/allocations.hpp"
#include "common/testing/compare.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "common/testing/throws.hpp"
#include "common/tokenizer.hpp"
#include "common/weights.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"

namespace infer {
namespace {

ModelConfig config(int layers, int heads, int kv_heads, int head_dim, int context = 64) {
  ModelConfig c;
  c.vocab_size = 20, c.hidden_size = heads * head_dim, c.intermediate_size = 24, c.num_hidden_layers = layers;
  c.num_attention_heads = heads, c.num_key_value_heads = kv_heads, c.head_dim = head_dim;
  c.max_position_embeddings = context;
  return c;
}

Matrix random_matrix(Eigen::Index r, Eigen::Index c, Rng& rng) {
  Matrix m(r, c);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>(rng.uniform() * 2 - 1);
  return m;
}

GRADED_TEST(Lesson04Attention, PagedAttentionEqualsContiguousAttention, 4) {
  // Random shapes, block sizes 1, 7 and 16, lengths on and off block boundaries, GQA ratios
  // 1, 2 and 4, one or several queries; the blocks of the table lie in a scrambled order.
  Rng rng(2024);
  struct Heads {
    int h, kv;
  };
  for (const Heads heads : {Heads{4, 4}, Heads{4, 2}, Heads{8, 2}})
    for (const int B : {1, 7, 16})
      for (const int length : {1, 6, 7, 8, 14, 16, 17, 33, 48}) {
        const int hd = 8, layer = 1;
        const ModelConfig c = config(2, heads.h, heads.kv, hd);
        PagedKVPool pool(c, blocks_for(length, B) + 3, B);
        std::vector<int> table(pool.num_blocks());
        std::iota(table.begin(), table.end(), 0);
        for (int i = pool.num_blocks() - 1; i > 0; --i) std::swap(table[i], table[rng.below(i + 1)]);
        table.resize(blocks_for(length, B));

        const Matrix k = random_matrix(length, heads.kv * hd, rng), v = random_matrix(length, heads.kv * hd, rng);
        for (int p = 0; p < length; ++p) {
          pool.key_block(layer, table[p / B]).row(p % B) = k.row(p);
          pool.value_block(layer, table[p / B]).row(p % B) = v.row(p);
        }
        for (const int T : {1, std::min(length, 5)}) {
          const Matrix q = random_matrix(T, heads.h * hd, rng);
          const Matrix want = causal_attention(q, k, v, heads.h, heads.kv, hd);
          const Matrix got = paged_attention(q, pool, table, layer, length, heads.h, heads.kv, hd);
          ASSERT_TRUE(testing::all_close(want, got, 1e-5, 1e-5,
                                         cat("B=", B, " length=", length, " T=", T, " heads=", heads.h, "/", heads.kv)));
        }
      }
}

GRADED_TEST(Lesson04Attention, ReadsTheRowsWhereTheyLieWithoutCopyingThem, 2) {
  // The point of paged attention: the kernel follows the block table to each row. Gathering the
  // rows into one matrix first (and calling causal_attention on it) gives the same numbers, and
  // costs a copy of the whole sequence per call, which is what paging set out to avoid.
  if (!testing::AllocationCounter::available()) GTEST_SKIP() << "allocations are not counted under AddressSanitizer";
  Rng rng(77);
  const int hd = 32, B = 16, length = 250, heads = 8, kv_heads = 2;
  const ModelConfig c = config(1, heads, kv_heads, hd, 256);
  PagedKVPool pool(c, blocks_for(length, B) + 2, B);
  std::vector<int> table(pool.num_blocks());
  std::iota(table.begin(), table.end(), 0);
  for (int i = pool.num_blocks() - 1; i > 0; --i) std::swap(table[i], table[rng.below(i + 1)]);
  table.resize(blocks_for(length, B));
  for (int b : table) {
    pool.key_block(0, b) = random_matrix(B, kv_heads * hd, rng);
    pool.value_block(0, b) = random_matrix(B, kv_heads * hd, rng);
  }
  const Matrix q = random_matrix(1, heads * hd, rng);
  const size_t one_head = static_cast<size_t>(length) * hd * sizeof(float);  // one K/V head's rows
  testing::AllocationCounter counter;
  const Matrix out = paged_attention(q, pool, table, 0, length, heads, kv_heads, hd);
  const size_t largest = counter.largest(), total = counter.bytes();
  EXPECT_EQ(out.cols(), heads * hd);
  EXPECT_LT(largest, one_head / 2)
      << "a decode step over " << length << " positions allocated " << largest << " bytes in one piece, as much as "
      << largest / (hd * sizeof(float)) << " rows of one K/V head: paged_attention copies the rows out of the pool "
      << "instead of reading each through the block table (scratch the size of one row of scores is fine)";
  // A copy made in pieces (one block, or one row, at a time) is a copy too.
  EXPECT_LT(total, one_head)
      << "a decode step over " << length << " positions allocated " << total << " bytes in all (as much as "
      << total / (hd * sizeof(float)) << " rows of one K/V head): something copies the rows in pieces, a block or a "
      << "row at a time (a Matrix or VectorXf made from a block or a row is a copy; read them through a "
      << "ConstMatrixRef, an Eigen::Map or a pointer, where they lie)";
}

GRADED_TEST(Lesson04Attention, RefusesATableTooShortForTheLength, 1) {
  const ModelConfig c = config(1, 2, 2, 4);
  PagedKVPool pool(c, 4, 4);
  const std::vector<int> table = {0, 1};  // 8 positions
  const Matrix q = Matrix::Zero(1, 8);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { paged_attention(q, pool, table, 0, 9, 2, 2, 4); }, "9"))
      << "9 positions need 3 blocks of 4";
  EXPECT_EQ(paged_attention(q, pool, table, 0, 8, 2, 2, 4).rows(), 1) << "8 positions fit in 2 blocks of 4";
  EXPECT_TRUE(testing::throws_error_mentioning([&] { paged_attention(Matrix::Zero(3, 8), pool, table, 0, 2, 2, 2, 4); },
                                               ""))
      << "3 queries over 2 stored positions: the queries are the newest positions, so there cannot be more of them "
         "than positions (refuse it, as the contract says)";
}

GRADED_TEST(Lesson04Cache, AllocatesABlockExactlyWhenTheLastOneIsFull, 3) {
  // The boundary: position p needs a new block exactly when p == blocks * B.
  const ModelConfig c = config(2, 2, 2, 4);
  PagedKVPool pool(c, 10, 4);
  PagedKVCache cache(pool, 40);
  Rng rng(5);
  for (int n = 1; n <= 13; ++n) {
    for (int l = 0; l < 2; ++l) cache.append(l, random_matrix(1, 8, rng), random_matrix(1, 8, rng));
    ASSERT_EQ(cache.length(), n);
    ASSERT_EQ(static_cast<int>(cache.block_table().size()), (n + 3) / 4)
        << "after " << n << " positions of blocks of 4 (position p takes a new block when p == blocks * 4: when it "
        << "is written, not as soon as the last block fills)";
    ASSERT_EQ(pool.allocator().num_free(), 10 - (n + 3) / 4);
  }
  PagedKVCache prefilled(pool, 40);  // a prefill ending exactly on a boundary takes no extra block
  for (int l = 0; l < 2; ++l) prefilled.append(l, random_matrix(8, 8, rng), random_matrix(8, 8, rng));
  EXPECT_EQ(prefilled.block_table().size(), 2u) << "8 positions in blocks of 4";
  for (int l = 0; l < 2; ++l) prefilled.append(l, random_matrix(1, 8, rng), random_matrix(1, 8, rng));
  EXPECT_EQ(prefilled.block_table().size(), 3u) << "the 9th position opens a third block";
}

GRADED_TEST(Lesson04Cache, ReadsBackEveryRowThroughTheTable, 2) {
  // Two sequences growing in turn: their blocks interleave in the pool, yet each reads back
  // exactly what a contiguous cache holds.
  const ModelConfig c = config(3, 4, 2, 4);
  PagedKVPool pool(c, 12, 3);
  PagedKVCache a(pool, 20), b(pool, 20);
  KVCache want_a(c, 20), want_b(c, 20);
  Rng rng(11);
  for (int round = 0; round < 5; ++round)
    for (auto [paged, flat] : {std::pair<KVStore*, KVStore*>{&a, &want_a}, {&b, &want_b}}) {
      const int n = 1 + static_cast<int>(rng.below(3));
      for (int l = 0; l < 3; ++l) {
        const Matrix k = random_matrix(n, 8, rng), v = random_matrix(n, 8, rng);
        paged->append(l, k, v);
        flat->append(l, k, v);
      }
    }
  for (int l = 0; l < 3; ++l) {
    EXPECT_TRUE(testing::all_close(want_a.keys(l), a.keys(l), 0, 0, cat("sequence a, layer ", l, " keys")));
    EXPECT_TRUE(testing::all_close(want_a.values(l), a.values(l), 0, 0, cat("sequence a, layer ", l, " values")));
    EXPECT_TRUE(testing::all_close(want_b.keys(l), b.keys(l), 0, 0, cat("sequence b, layer ", l, " keys")));
    EXPECT_TRUE(testing::all_close(want_b.values(l), b.values(l), 0, 0, cat("sequence b, layer ", l, " values")));
    // Both at once, as causal_attention(q, cache.keys(l), cache.values(l), ...) reads them.
    ConstMatrixRef k = a.keys(l), v = a.values(l);
    EXPECT_TRUE(testing::all_close(want_a.keys(l), k, 0, 0, cat("sequence a, layer ", l, " keys, values held too")));
    EXPECT_TRUE(testing::all_close(want_a.values(l), v, 0, 0, cat("sequence a, layer ", l, " values, keys held too")));
  }
  // A forward fills the layers in turn: in between, layer 0 is a position ahead of the others,
  // and keys(layer) has that layer's length(layer) rows.
  PagedKVCache c2(pool, 20);
  c2.append(0, random_matrix(1, 8, rng), random_matrix(1, 8, rng));
  EXPECT_EQ(c2.keys(0).rows(), 1) << "keys(0) after appending to layer 0 alone: length(0) = 1 rows";
  EXPECT_EQ(c2.values(0).rows(), 1) << "values(0) after appending to layer 0 alone: length(0) = 1 rows";
  EXPECT_EQ(c2.keys(1).rows(), 0) << "keys(1) before layer 1's append: length(1) = 0 rows";
}

GRADED_TEST(Lesson04Cache, AnExhaustedPoolThrowsAndWritesNothing, 2) {
  const ModelConfig c = config(2, 2, 2, 4);
  PagedKVPool pool(c, 2, 4);
  PagedKVCache first(pool, 32), second(pool, 32);
  Rng rng(3);
  const Matrix k = random_matrix(6, 8, rng), v = random_matrix(6, 8, rng);
  for (int l = 0; l < 2; ++l) first.append(l, k, v);  // both blocks
  EXPECT_TRUE(testing::throws_error_mentioning([&] { second.append(0, k.topRows(1), v.topRows(1)); }, "out of KV blocks"));
  EXPECT_EQ(second.length(0), 0) << "a refused append stores nothing";
  EXPECT_TRUE(second.block_table().empty());
  EXPECT_TRUE(testing::throws_error_mentioning([&] { first.append(0, k, v); }, "out of KV blocks"))
      << "6 more positions make 12, in 3 blocks of 4: 1 more block, and none is free";
  EXPECT_EQ(first.length(0), 6) << "a refused append stores nothing, not even the rows that would fit";
  EXPECT_TRUE(testing::all_close(k, first.keys(0), 0, 0, "the first sequence's keys after refused appends"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { second.reserve(1); }, "out of KV blocks"));
  EXPECT_EQ(pool.allocator().num_free(), 0);
}

GRADED_TEST(Lesson04Cache, AReserveTakesAllItsBlocksOrNone, 1) {
  // 3 blocks of 4: the first sequence reserves 2, one stays free. Reserving 9 positions (3
  // blocks) must fail without taking that one, or the pool leaks a block to a refused request.
  const ModelConfig c = config(2, 2, 2, 4);
  PagedKVPool pool(c, 3, 4);
  PagedKVCache first(pool, 32), second(pool, 32);
  first.reserve(5);
  ASSERT_EQ(pool.allocator().num_free(), 1);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { second.reserve(9); }, "out of KV blocks"));
  EXPECT_EQ(pool.allocator().num_free(), 1) << "a refused reserve takes no block";
  EXPECT_TRUE(second.block_table().empty()) << "a refused reserve leaves the table as it was";
  second.reserve(4);
  EXPECT_EQ(pool.allocator().num_free(), 0) << "4 positions fit in the last free block";
  PagedKVPool roomy(c, 8, 4);
  PagedKVCache small(roomy, 8);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { small.reserve(12); }, "12"))
      << "reserve(12) on a sequence of max_tokens 8: refused, not 3 blocks taken";
  EXPECT_EQ(roomy.allocator().num_free(), 8) << "a refused reserve takes no block";
  EXPECT_TRUE(testing::throws_error_mentioning([&] { small.reserve(-1); }, "-1"));
}

GRADED_TEST(Lesson04Cache, ReservesLessThanABlockMoreThanItUsesAndGivesEveryBlockBack, 2) {
  const ModelConfig c = config(2, 2, 2, 4);
  PagedKVPool pool(c, 8, 4);
  Rng rng(8);
  {
    PagedKVCache cache(pool, 32);
    for (int l = 0; l < 2; ++l) cache.append(l, random_matrix(5, 8, rng), random_matrix(5, 8, rng));
    const size_t per_position = pool.bytes_per_block() / 4;
    EXPECT_EQ(cache.bytes_used(), 5 * per_position);
    EXPECT_EQ(cache.bytes_reserved(), 2 * pool.bytes_per_block()) << "5 positions in blocks of 4 take 2 blocks";
    EXPECT_LT(cache.bytes_reserved() - cache.bytes_used(), pool.bytes_per_block());
    cache.reserve(12);
    EXPECT_EQ(cache.block_table().size(), 3u) << "reserve(12) makes the table cover 12 positions";
    EXPECT_EQ(cache.length(), 5) << "reserve() stores nothing";
    cache.reset();
    EXPECT_EQ(pool.allocator().num_free(), 8) << "reset() frees every block";
    EXPECT_EQ(cache.length(), 0);
    for (int l = 0; l < 2; ++l) cache.append(l, random_matrix(3, 8, rng), random_matrix(3, 8, rng));
    EXPECT_EQ(pool.allocator().num_free(), 7);
  }
  EXPECT_EQ(pool.allocator().num_free(), 8) << "a destroyed sequence gives its blocks back";
}

GRADED_TEST(Lesson04Cache, TheModelOnAPagedCacheEqualsTheContiguousCache, 3) {
  // forward_cached() runs on the paged cache unchanged (its attention goes through attend()).
  const ModelWeights& m = testing::bundled_model();
  const std::vector<int> prompt = ByteTokenizer::encode("You will meet");
  for (const int B : {1, 7, 16}) {
    PagedKVPool pool(m.config, blocks_for(m.config.max_position_embeddings, B), B);
    PagedKVCache paged(pool, m.config.max_position_embeddings);
    KVCache flat(m.config, m.config.max_position_embeddings);
    Matrix want = forward_cached(m, prompt, flat), got = forward_cached(m, prompt, paged);
    ASSERT_TRUE(testing::all_close(want, got, 1e-4, 1e-4, cat("prefill logits, B=", B)));
    for (int step = 0; step < 40; ++step) {
      int next = 0;
      want.row(want.rows() - 1).maxCoeff(&next);
      want = forward_cached(m, std::span(&next, 1), flat);
      got = forward_cached(m, std::span(&next, 1), paged);
      ASSERT_TRUE(testing::all_close(want, got, 1e-4, 1e-4, cat("decode step ", step, ", B=", B)));
    }
    EXPECT_EQ(static_cast<int>(paged.block_table().size()), blocks_for(paged.length(), B));
  }
}

}  // namespace
}  // namespace infer
