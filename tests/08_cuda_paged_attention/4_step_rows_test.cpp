// Lesson 08's varlen step, the part every machine can check (given code, not graded): the GPU
// forward runs a chunk of n tokens as n rows of the paged decode kernel, row t with its
// sequence's block table and length L + t + 1. Here the same rows go through lesson 04's CPU
// paged_attention() and must equal lesson 00's causal attention over the whole chunk, and the
// layout must reserve (copying a shared block first) before it reads the tables.
// Tolerance: 1e-5 + 1e-4 |ref| (float sums in another order).
#include <array>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "common/rng.hpp"
#include "common/testing/compare.hpp"
#include "common/testing/models.hpp"
#include "common/testing/throws.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"
#include "lessons/08_cuda_paged_attention/cuda_paged.hpp"

namespace infer::gpu {
namespace {

Matrix random_rows(long rows, long cols, Rng& rng) {
  Matrix m(rows, cols);
  for (long i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>(rng.normal());
  return m;
}

TEST(Lesson08StepRows, AChunkAsRowsOfTheDecodeKernelIsCausalAttention) {
  const ModelConfig& c = testing::bundled_model().config;
  const int B = 4, kv_dim = c.num_key_value_heads * c.head_dim, q_dim = c.num_attention_heads * c.head_dim;
  PagedKVPool pool(c, 32, B);
  Rng rng(11);
  // a: nothing cached, a prompt of 7; b: 10 cached, a decode; f: b forked (sharing b's blocks,
  // the last one half full), a chunk of 3. Both b and f write into that half-full block.
  PagedKVCache a(pool, c.max_position_embeddings), b(pool, c.max_position_embeddings);
  for (int layer = 0; layer < c.num_hidden_layers; ++layer)
    b.append(layer, random_rows(10, kv_dim, rng), random_rows(10, kv_dim, rng));
  std::unique_ptr<PagedKVCache> f = b.fork();
  const std::vector<int> shared = f->block_table();
  PagedKVCache* caches[] = {&a, &b, f.get()};
  const int tokens[] = {7, 1, 3};

  const PagedStepRows r = paged_step_rows(caches, tokens);
  ASSERT_EQ(r.rows, 11);
  EXPECT_EQ(r.lengths, (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 11, 11, 12, 13}));
  EXPECT_EQ(r.max_length, 13);
  EXPECT_EQ(r.max_blocks, 4);
  EXPECT_EQ(b.block_table()[0], f->block_table()[0]) << "a full shared block stays shared";
  EXPECT_NE(b.block_table()[2], shared[2]) << "b, reserved first, copies the half-full block both hold before writing";
  EXPECT_EQ(f->block_table()[2], shared[2]) << "then the fork holds the original alone, and writes into it";
  for (int row = 0, i = 0; i < 3; ++i)
    for (int t = 0; t < tokens[i]; ++t, ++row) {
      const int before = caches[i]->length();
      EXPECT_EQ(r.slots[row], caches[i]->slot(before + t)) << "row " << row;
      const std::vector<int>& table = caches[i]->block_table();
      for (int j = 0; j < r.max_blocks; ++j)
        EXPECT_EQ(r.tables[static_cast<size_t>(row) * r.max_blocks + j], j < static_cast<int>(table.size()) ? table[j] : 0)
            << "row " << row << ", column " << j;
    }

  // The step's new K/V written to the rows' slots (what write_kv_slots does), then every row's
  // attention through its table against causal attention over its sequence.
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    SCOPED_TRACE(cat("layer ", layer));
    const Matrix k = random_rows(r.rows, kv_dim, rng), v = random_rows(r.rows, kv_dim, rng);
    const Matrix q = random_rows(r.rows, q_dim, rng);
    pool.write(layer, r.slots, k, v);
    for (int i = 0; i < 3; ++i) caches[i]->advance(layer, tokens[i]);
    for (int row = 0, i = 0; i < 3; ++i) {
      const Matrix want = causal_attention(q.middleRows(row, tokens[i]), caches[i]->keys(layer),
                                           caches[i]->values(layer), c.num_attention_heads, c.num_key_value_heads,
                                           c.head_dim);
      for (int t = 0; t < tokens[i]; ++t, ++row) {
        const std::span<const int> table(r.tables.data() + static_cast<size_t>(row) * r.max_blocks, r.max_blocks);
        const Matrix got = paged_attention(q.middleRows(row, 1), pool, table, layer, r.lengths[row],
                                           c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        EXPECT_TRUE(testing::all_close(want.middleRows(t, 1), got, 1e-5, 1e-4, cat("row ", row)));
      }
    }
  }
}

TEST(Lesson08StepRows, AStepWithATreeListsEachRowsSlots) {
  // A tree of 5 guesses after 6 cached positions (0 the root; 1 and 2 its children; 3 under 1, 4
  // under 2) beside a chain of 2 after 3: every row lists the slots it sees, read as blocks of one.
  const ModelConfig& c = testing::bundled_model().config;
  const int kv_dim = c.num_key_value_heads * c.head_dim;
  PagedKVPool pool(c, 16, 4);
  Rng rng(5);
  PagedKVCache a(pool, c.max_position_embeddings), b(pool, c.max_position_embeddings);
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    a.append(layer, random_rows(6, kv_dim, rng), random_rows(6, kv_dim, rng));
    b.append(layer, random_rows(3, kv_dim, rng), random_rows(3, kv_dim, rng));
  }
  const int parent[] = {-1, 0, 0, 1, 2};
  TreeMask mask = TreeMask::Constant(5, 5, false);
  for (int i = 0; i < 5; ++i)
    for (int j = i; j != -1; j = parent[j]) mask(i, j) = true;
  PagedKVCache* caches[] = {&a, &b};
  const int tokens[] = {5, 2};
  const TreeMask* masks[] = {&mask, nullptr};
  const PagedStepRows r = paged_step_rows(caches, tokens, masks);
  EXPECT_EQ(r.block_size, 1) << "with a tree, table entries are slots";
  EXPECT_EQ(r.rows, 7);
  EXPECT_EQ(r.lengths, (std::vector<int>{7, 8, 8, 9, 9, 4, 5}));
  EXPECT_EQ(r.max_length, 9);
  ASSERT_GE(r.max_blocks, 9);
  const auto list = [&](int row) {
    return std::vector<int>(r.tables.begin() + static_cast<long>(row) * r.max_blocks,
                            r.tables.begin() + static_cast<long>(row) * r.max_blocks + r.lengths[row]);
  };
  for (int t = 0; t < 5; ++t) {
    std::vector<int> want;
    for (int p = 0; p < 6; ++p) want.push_back(a.slot(p));
    for (int j = 0; j <= t; ++j)
      if (mask(t, j)) want.push_back(a.slot(6 + j));
    EXPECT_EQ(list(t), want) << "tree row " << t;
    EXPECT_EQ(r.slots[t], a.slot(6 + t)) << "its K/V go to the next slot in chunk order, whatever its depth";
  }
  for (int t = 0; t < 2; ++t) {
    std::vector<int> want;
    for (int p = 0; p <= 3 + t; ++p) want.push_back(b.slot(p));
    EXPECT_EQ(list(5 + t), want) << "chain row " << t;
  }
}

TEST(Lesson08StepRows, BadStepsAreRefused) {
  const ModelConfig& c = testing::bundled_model().config;
  PagedKVPool pool(c, 2, 4);
  PagedKVCache a(pool, c.max_position_embeddings);
  PagedKVCache* one[] = {&a};
  PagedKVCache* none[] = {nullptr};
  const int zero[] = {0}, nine[] = {9}, two[] = {1, 1};
  EXPECT_TRUE(testing::throws_error_mentioning([&] { paged_step_rows(one, zero); }, "at least one"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { paged_step_rows(none, two); }, "the same number"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { paged_step_rows(none, std::span(two, 1)); }, "null"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { paged_step_rows(one, nine); }, "out of KV blocks"));
  const TreeMask wrong = TreeMask::Constant(2, 2, true);
  const TreeMask* masks[] = {&wrong};
  const int three[] = {3};
  EXPECT_TRUE(testing::throws_error_mentioning([&] { paged_step_rows(one, three, masks); }, "mask"));
  EXPECT_EQ(a.block_table().size(), 0u) << "a refused reservation takes nothing";
}

// Which kernel reads which row: long causal chunks in tiles of kChunkTileRows rows of one chunk,
// everything else in runs of consecutive rows for the decode kernel; every row exactly once.
TEST(Lesson08StepRows, StepKernelsTilesLongChunksAndRunsTheRest) {
  const int tokens[] = {1, 1, 70, 3, 1, 8, 32};  // rows 0-1 | 2-71 | 72-74, 75 | 76-83 | 84-115
  const StepKernels k = step_kernels(tokens, true);
  EXPECT_EQ(k.tile_first, (std::vector<int>{2, 34, 66, 76, 84}));
  EXPECT_EQ(k.tile_rows, (std::vector<int>{32, 32, 6, 8, 32}));
  EXPECT_EQ(k.run_first, (std::vector<int>{0, 72}));
  EXPECT_EQ(k.run_rows, (std::vector<int>{2, 4})) << "a chunk of 3 and a decode next to it make one run";
  std::vector<int> seen(116, 0);
  for (size_t i = 0; i < k.tile_first.size(); ++i)
    for (int r = 0; r < k.tile_rows[i]; ++r) ++seen[k.tile_first[i] + r];
  for (size_t i = 0; i < k.run_first.size(); ++i)
    for (int r = 0; r < k.run_rows[i]; ++r) ++seen[k.run_first[i] + r];
  EXPECT_EQ(seen, std::vector<int>(116, 1)) << "every row in exactly one tile or run";

  const StepKernels tree = step_kernels(tokens, false);  // a step with a tree: slot lists
  EXPECT_TRUE(tree.tile_first.empty());
  EXPECT_EQ(tree.run_first, std::vector<int>{0});
  EXPECT_EQ(tree.run_rows, std::vector<int>{116});
  const StepKernels all = step_kernels(tokens, true, 2);
  EXPECT_EQ(all.run_first, (std::vector<int>{0, 75})) << "the decodes only";
  EXPECT_EQ(all.run_rows, (std::vector<int>{2, 1}));

  const int none[] = {0};
  EXPECT_TRUE(testing::throws_error_mentioning([&] { step_kernels(none, true); }, "at least one"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { step_kernels({}, true); }, "at least one chunk"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { step_kernels(tokens, true, 1); }, "min_chunk"));
}

// How many ways the engine splits a chunk's tiles over their positions (chunk_attention.hpp):
// about two blocks for each multiprocessor, no split below kChunkSplitMinPositions positions.
TEST(Lesson08StepRows, ChunkSplitsFillTheDeviceWithoutShortSplits) {
  const int least = kChunkSplitMinPositions;
  if (least == 0) {
    EXPECT_EQ(chunk_splits(1, 32, 100000, 132), 1) << "kChunkSplitMinPositions 0: never split";
    GTEST_SKIP() << "the chunk split is off";
  }
  EXPECT_EQ(chunk_splits(1, 32, 64 * least, 132), 9) << "one tile of 32 heads: 264 blocks want 9 splits";
  EXPECT_EQ(chunk_splits(1, 32, 3 * least + 1, 132), 3) << "no split shorter than kChunkSplitMinPositions";
  EXPECT_EQ(chunk_splits(1, 32, least - 1, 132), 1) << "a context shorter than one split";
  EXPECT_EQ(chunk_splits(9, 32, 64 * least, 132), 1) << "288 blocks fill 132 multiprocessors twice";
  EXPECT_EQ(chunk_splits(4, 32, 64 * least, 132), 3) << "128 blocks: 3 splits make 384";
  for (const auto& [tiles, heads, length, sms] : {std::array{0, 1, 1, 1}, std::array{1, 0, 1, 1},
                                                  std::array{1, 1, 0, 1}, std::array{1, 1, 1, 0}})
    EXPECT_TRUE(testing::throws_error_mentioning([&] { chunk_splits(tiles, heads, length, sms); }, "must be >= 1"));
}

}  // namespace
}  // namespace infer::gpu
