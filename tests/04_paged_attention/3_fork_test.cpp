// Lesson 04, part C: fork and copy-on-write.
#include "common/rng.hpp"
#include "common/testing/compare.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "common/tokenizer.hpp"
#include "common/weights.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"

namespace infer {
namespace {

ModelConfig config() {  // 2 layers, kv_dim 8
  ModelConfig c;
  c.vocab_size = 20, c.hidden_size = 16, c.intermediate_size = 24, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 4, c.max_position_embeddings = 64;
  return c;
}

Matrix rows(int n, float base) {
  Matrix m(n, 8);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = base + 0.5f * static_cast<float>(i);
  return m;
}

void append_all(PagedKVCache& cache, const Matrix& k, const Matrix& v) {
  for (int l = 0; l < cache.num_layers(); ++l) cache.append(l, k, v);
}

GRADED_TEST(Lesson04Fork, AChildSharesEveryBlockOfItsParent, 2) {
  PagedKVPool pool(config(), 8, 4);
  PagedKVCache parent(pool, 64);
  append_all(parent, rows(10, 1), rows(10, 2));  // 2 full blocks and one partly filled
  const int free_before = pool.allocator().num_free();
  auto child = parent.fork();
  EXPECT_EQ(child->block_table(), parent.block_table()) << "the child's table is the parent's";
  EXPECT_EQ(child->length(), 10);
  for (int b : parent.block_table()) EXPECT_EQ(pool.allocator().ref_count(b), 2) << "block " << b << " after one fork";
  EXPECT_EQ(pool.allocator().num_free(), free_before) << "a fork copies no data and takes no block";
  EXPECT_TRUE(testing::all_close(parent.keys(1), child->keys(1), 0, 0, "the child's keys"));
}

GRADED_TEST(Lesson04Fork, TheFirstWriteToASharedBlockCopiesItAndLeavesTheOtherUntouched, 4) {
  PagedKVPool pool(config(), 8, 4);
  PagedKVCache parent(pool, 64);
  append_all(parent, rows(10, 1), rows(10, 2));
  auto child = parent.fork();
  const std::vector<int> shared = parent.block_table();
  const Matrix parent_keys = parent.keys(0), parent_values = parent.values(1);

  append_all(*child, rows(1, 100), rows(1, 200));  // position 10: inside shared block 2
  const std::vector<int>& mine = child->block_table();
  ASSERT_EQ(mine.size(), 3u);
  EXPECT_EQ(mine[0], shared[0]) << "full block 0 is still shared";
  EXPECT_EQ(mine[1], shared[1]) << "full block 1 is still shared";
  EXPECT_NE(mine[2], shared[2]) << "the child wrote into shared block " << shared[2] << ": it needs a private copy";
  EXPECT_EQ(pool.allocator().ref_count(shared[0]), 2);
  EXPECT_EQ(pool.allocator().ref_count(shared[2]), 1) << "the original now belongs to the parent alone";
  EXPECT_EQ(pool.allocator().ref_count(mine[2]), 1);
  EXPECT_EQ(parent.block_table(), shared) << "the parent's table does not change";
  EXPECT_TRUE(testing::all_close(parent_keys, parent.keys(0), 0, 0, "the parent's keys after the child's write"));
  EXPECT_TRUE(testing::all_close(parent_values, parent.values(1), 0, 0, "the parent's values after the child's write"));
  Matrix child_keys(11, 8);
  child_keys << parent_keys, rows(1, 100);
  EXPECT_TRUE(testing::all_close(child_keys, child->keys(0), 0, 0, "the child's keys: the shared 10 and its own"));

  const int free_before = pool.allocator().num_free();
  append_all(parent, rows(1, 300), rows(1, 400));  // the parent's block 2 is private now
  EXPECT_EQ(pool.allocator().num_free(), free_before) << "writing into a block held alone copies nothing";
  EXPECT_EQ(parent.block_table(), shared);
  EXPECT_TRUE(testing::all_close(child_keys, child->keys(0), 0, 0, "the child's keys after the parent's write"));
}

GRADED_TEST(Lesson04Fork, ReserveMakesTheCopyBeforeAnyWrite, 2) {
  // The engine reserves a step's positions while it plans, and its forward only writes: so the
  // copy of a shared block is reserve()'s job, not append()'s.
  PagedKVPool pool(config(), 8, 4);
  PagedKVCache parent(pool, 64);
  append_all(parent, rows(10, 1), rows(10, 2));
  auto child = parent.fork();
  const std::vector<int> shared = parent.block_table();
  child->reserve(12);  // positions 10 and 11: inside shared block 2
  ASSERT_EQ(child->block_table().size(), 3u);
  EXPECT_NE(child->block_table()[2], shared[2])
      << "reserve() left shared block " << shared[2] << " in the child's table for positions it is about to write: "
      << "copy it there, so that the forward that follows writes and never allocates";
  EXPECT_EQ(pool.allocator().ref_count(shared[2]), 1) << "the original belongs to the parent alone after the copy";
  EXPECT_EQ(child->length(), 10) << "reserve() stores nothing";
  EXPECT_TRUE(testing::all_close(parent.keys(1), child->keys(1), 0, 0, "the child's keys: the copy holds the rows"));
  const int free_before = pool.allocator().num_free();
  append_all(*child, rows(2, 100), rows(2, 200));
  EXPECT_EQ(pool.allocator().num_free(), free_before) << "appending what reserve() made room for takes no block";
  EXPECT_EQ(parent.block_table(), shared);
  child->reserve(11);
  EXPECT_EQ(pool.allocator().num_free(), free_before) << "reserving positions already stored takes nothing";
}

GRADED_TEST(Lesson04Fork, AForkOfATableReservedAheadCopiesEveryBlockItWrites, 2) {
  // The table may run ahead of the length (the engine reserves a prompt's blocks when it admits
  // it): a fork then shares blocks nobody has written yet, and a write may fall in several
  // shared blocks at once. Each is copied, not only the one the first new position lies in.
  PagedKVPool pool(config(), 10, 4);
  PagedKVCache parent(pool, 64);
  parent.reserve(12);  // 3 blocks
  append_all(parent, rows(5, 1), rows(5, 2));  // positions 0..4: block 1 partly written, block 2 not yet
  auto child = parent.fork();
  const std::vector<int> shared = parent.block_table();
  parent.reserve(12);  // positions 5..11 lie in shared blocks 1 and 2
  for (int j = 1; j < 3; ++j) {
    EXPECT_NE(parent.block_table()[j], shared[j]) << "the parent's block " << j << " is shared with its fork and "
                                                  << "positions 5..11 will be written into it: reserve() copies it";
    EXPECT_EQ(pool.allocator().ref_count(parent.block_table()[j]), 1) << "block " << j << " of the parent after reserve(12)";
  }
  append_all(*child, rows(7, 30), rows(7, 40));  // the child first: its rows must survive the parent's
  append_all(parent, rows(7, 10), rows(7, 20));
  Matrix want_parent(12, 8), want_child(12, 8);
  want_parent << rows(5, 1), rows(7, 10);
  want_child << rows(5, 1), rows(7, 30);
  EXPECT_TRUE(testing::all_close(want_parent, parent.keys(0), 0, 0, "the parent's keys after both wrote positions 5..11"));
  EXPECT_TRUE(testing::all_close(want_child, child->keys(0), 0, 0, "the child's keys after both wrote positions 5..11"));
}

GRADED_TEST(Lesson04Fork, ForkingOnABlockBoundaryCopiesNothing, 2) {
  PagedKVPool pool(config(), 8, 4);
  PagedKVCache parent(pool, 64);
  append_all(parent, rows(8, 1), rows(8, 2));  // exactly 2 full blocks
  auto child = parent.fork();
  append_all(*child, rows(1, 5), rows(1, 6));
  EXPECT_EQ(child->block_table().size(), 3u);
  EXPECT_EQ(child->block_table()[0], parent.block_table()[0]);
  EXPECT_EQ(child->block_table()[1], parent.block_table()[1]);
  EXPECT_EQ(pool.allocator().num_free(), 8 - 3) << "2 shared blocks + 1 new one; nothing copied";
  child.reset();
  EXPECT_EQ(pool.allocator().ref_count(parent.block_table()[0]), 1) << "the child is gone: one holder left";
  parent.reset();
  EXPECT_EQ(pool.allocator().num_free(), 8) << "every block is back once both sequences finish";
}

GRADED_TEST(Lesson04Fork, ParallelSamplingFromOnePrefillEqualsSeparateRuns, 3) {
  // One prompt, prefilled once, then forked into three samples with their own seeds: each is
  // exactly the generation of the prompt alone with that seed, and the prompt's blocks are
  // stored once.
  const ModelWeights& m = testing::bundled_model();
  const std::vector<int> prompt = ByteTokenizer::encode("The secret of a happy life is");
  const int B = 16, steps = 24;
  PagedKVPool pool(m.config, 32, B);
  PagedKVCache parent(pool, m.config.max_position_embeddings);
  const Matrix logits = forward_cached(m, prompt, parent);
  const int prompt_blocks = static_cast<int>(parent.block_table().size());
  std::vector<std::unique_ptr<PagedKVCache>> children;
  for (int i = 0; i < 3; ++i) children.push_back(parent.fork());

  for (int i = 0; i < 3; ++i) {
    const SamplingParams params{.temperature = 0.9f, .top_p = 0.95f, .seed = 70u + i};
    Sampler sampler(params);
    std::vector<int> got = {sampler.next(logits.row(logits.rows() - 1).transpose())};
    while (static_cast<int>(got.size()) < steps) {
      const Matrix next = forward_cached(m, std::span(&got.back(), 1), *children[i]);
      got.push_back(sampler.next(next.row(0).transpose()));
    }
    KVCache alone(m.config, m.config.max_position_embeddings);
    Sampler solo(params);
    std::vector<int> want = generate_cached(m, prompt, steps, solo, alone);
    want.resize(std::find(want.begin(), want.end(), m.config.eos_token_id) - want.begin());
    got.resize(want.size());
    EXPECT_EQ(got, want) << "sample " << i << " (seed " << params.seed << ")";
  }
  // The full blocks of the prompt are stored once; each child copied at most the last one.
  int shared_full = 0;
  for (int b = 0; b < static_cast<int>(prompt.size()) / B; ++b)
    shared_full += pool.allocator().ref_count(parent.block_table()[b]) == 4;
  EXPECT_EQ(shared_full, static_cast<int>(prompt.size()) / B) << "full prompt blocks held by the parent and 3 children";
  EXPECT_LE(pool.num_blocks() - pool.allocator().num_free(), prompt_blocks + 3 * blocks_for(steps + B, B));
}

}  // namespace
}  // namespace infer
