// Lesson 12: which heads, K/V heads and units each rank holds, and the shapes a group refuses.
#include <set>

#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "common/testing/throws.hpp"
#include "lessons/12_tensor_parallel/tensor_parallel.hpp"

namespace infer {
namespace {

ModelConfig gqa_config(int heads, int kv_heads, int units) {
  ModelConfig c = testing::bundled_model().config;
  c.num_attention_heads = heads, c.num_key_value_heads = kv_heads, c.intermediate_size = units;
  c.head_dim = 8, c.hidden_size = heads * 8;
  return c;
}

/// What every plan of a group keeps true, whatever the shape: the ranks' query heads and units
/// tile the model's in rank order, equal in size; each rank's K/V heads are exactly those its
/// query heads read; every K/V head is held by some rank.
void expect_a_good_group(const ModelConfig& c, int world) {
  std::set<long> kv_held;
  for (int r = 0; r < world; ++r) {
    const ShardPlan p = shard_plan(c, r, world);
    const std::string where = cat(c.num_attention_heads, " heads, ", c.num_key_value_heads, " K/V heads, rank ", r,
                                  " of ", world);
    EXPECT_EQ(p.rank, r) << where;
    EXPECT_EQ(p.world, world) << where;
    EXPECT_EQ(p.heads, (Range{r * c.num_attention_heads / world, (r + 1) * c.num_attention_heads / world})) << where;
    EXPECT_EQ(p.units, (Range{r * long(c.intermediate_size) / world, (r + 1) * long(c.intermediate_size) / world}))
        << where;
    std::set<long> read;  // the K/V heads its query heads read
    for (long h = p.heads.begin; h < p.heads.end; ++h) read.insert(h / c.group_size());
    ASSERT_FALSE(read.empty()) << where;
    EXPECT_EQ(p.kv_heads, (Range{*read.begin(), *read.rbegin() + 1})) << where;
    for (long k = p.kv_heads.begin; k < p.kv_heads.end; ++k) kv_held.insert(k);
  }
  EXPECT_EQ(static_cast<int>(kv_held.size()), c.num_key_value_heads) << "every K/V head is held by some rank";
}

GRADED_TEST(Lesson12Plan, RanksSplitHeadsAndUnitsEvenlyInOrder, 2) {
  const ModelConfig& bundled = testing::bundled_model().config;
  for (int world : {1, 2}) expect_a_good_group(bundled, world);
  expect_a_good_group(gqa_config(8, 8, 64), 4);  // multi-head attention: a K/V head per query head
  expect_a_good_group(gqa_config(16, 4, 64), 2);
  expect_a_good_group(gqa_config(16, 4, 64), 4);
}

GRADED_TEST(Lesson12Plan, RanksThatOutnumberTheKvHeadsShareThemInOrder, 2) {
  // vLLM's case: 8 query heads reading 2 K/V heads over 4 ranks. Ranks 0 and 1 hold query heads
  // 0-3, which read K/V head 0; ranks 2 and 3 hold 4-7, which read K/V head 1.
  const ModelConfig c = gqa_config(8, 2, 64);
  expect_a_good_group(c, 4);
  expect_a_good_group(c, 8);
  const Range want[] = {{0, 1}, {0, 1}, {1, 2}, {1, 2}};
  for (int r = 0; r < 4; ++r) EXPECT_EQ(shard_plan(c, r, 4).kv_heads, want[r]) << "rank " << r << " of 4";
  // The bundled model at 4 ranks is the same case.
  expect_a_good_group(testing::bundled_model().config, 4);
}

GRADED_TEST(Lesson12Plan, GroupsThatCannotSplitTheModelAreRefused, 1) {
  const ModelConfig c = gqa_config(8, 2, 64);
  // 8 heads over 3 ranks, where only the query heads fail (3 divides the 48 units and is a
  // multiple of the one K/V head), so the message must be the heads' whatever the checks' order.
  const ModelConfig heads_only = gqa_config(8, 1, 48);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { shard_plan(heads_only, 0, 3); }, "3"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { shard_plan(heads_only, 0, 3); }, "8"))
      << "the message gives the count too";
  EXPECT_TRUE(testing::throws_error_mentioning([&] { shard_plan(c, 0, 0); }, "0"));      // no ranks
  EXPECT_TRUE(testing::throws_error_mentioning([&] { shard_plan(c, 2, 2); }, "rank"));   // past the group
  EXPECT_TRUE(testing::throws_error_mentioning([&] { shard_plan(c, -1, 2); }, "rank"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { shard_plan(gqa_config(8, 2, 60), 0, 8); }, "60"));  // units
  EXPECT_TRUE(testing::throws_error_mentioning([&] { shard_plan(gqa_config(8, 2, 60), 0, 8); }, "8"))
      << "the message gives the world too";
  // 6 query heads over 4 ranks (which share the 2 K/V heads evenly): heads 4 and 5 would be
  // nobody's.
  EXPECT_TRUE(testing::throws_error_mentioning([&] { shard_plan(gqa_config(6, 2, 64), 0, 4); }, "6"))
      << "4 ranks do not divide 6 query heads, though they share 2 K/V heads evenly";
  // 20 query heads, 4 K/V heads (5 queries each), 5 ranks of 4 queries: a rank's queries would
  // straddle two K/V heads in a proportion no rank's K/V slice lines up with.
  EXPECT_TRUE(testing::throws_error_mentioning([&] { shard_plan(gqa_config(20, 4, 60), 0, 5); }, "K/V"))
      << "5 ranks neither divide 4 K/V heads nor are a multiple of them";
  // 12 query heads, 3 K/V heads, 2 ranks: each rank would hold half of K/V head 1.
  EXPECT_TRUE(testing::throws_error_mentioning([&] { shard_plan(gqa_config(12, 3, 64), 0, 2); }, "K/V"));
}

}  // namespace
}  // namespace infer
