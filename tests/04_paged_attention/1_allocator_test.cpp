// Lesson 04, part A: the block allocator on its own.
#include <set>

#include "common/testing/graded.hpp"
#include "common/testing/throws.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"

namespace infer {
namespace {

GRADED_TEST(Lesson04Allocator, HandsOutEveryBlockOnceThenRefuses, 2) {
  BlockAllocator a(5);
  std::set<int> seen;
  for (int i = 0; i < 5; ++i) {
    const int b = a.allocate();
    EXPECT_TRUE(b >= 0 && b < 5) << "allocate() returned block " << b << " of a pool of 5";
    EXPECT_TRUE(seen.insert(b).second) << "block " << b << " was handed out twice";
    EXPECT_EQ(a.ref_count(b), 1) << "a freshly allocated block has one holder";
    EXPECT_EQ(a.num_free(), 4 - i);
  }
  EXPECT_TRUE(testing::throws_error_mentioning([&] { a.allocate(); }, "out of KV blocks"))
      << "the sixth allocate() of a pool of 5";
  EXPECT_EQ(a.num_free(), 0);
}

GRADED_TEST(Lesson04Allocator, FreeReturnsABlockAndRefusesADoubleFree, 2) {
  BlockAllocator a(3);
  const int b0 = a.allocate(), b1 = a.allocate();
  a.free(b0);
  EXPECT_EQ(a.ref_count(b0), 0);
  EXPECT_EQ(a.num_free(), 2);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { a.free(b0); }, "double free")) << "freeing block " << b0 << " twice";
  EXPECT_EQ(a.num_free(), 2) << "a refused free must not put the block on the free list again";
  EXPECT_TRUE(testing::throws_error_mentioning([&] { a.free(7); }, "7")) << "block 7 of a pool of 3";
  EXPECT_TRUE(testing::throws_error_mentioning([&] { a.free(-1); }, "-1"));
  EXPECT_EQ(a.allocate(), b0) << "the block freed last is the next one handed out";
  a.free(b1);
  a.free(b0);
  EXPECT_EQ(a.num_free(), 3) << "every block is back";
}

GRADED_TEST(Lesson04Allocator, SharingCountsHoldersAndTheLastFreeReturnsTheBlock, 2) {
  BlockAllocator a(2);
  const int b = a.allocate();
  a.share(b);
  a.share(b);
  EXPECT_EQ(a.ref_count(b), 3);
  a.free(b);
  EXPECT_EQ(a.ref_count(b), 2);
  EXPECT_EQ(a.num_free(), 1) << "a block still held by two sequences is not free";
  a.free(b);
  a.free(b);
  EXPECT_EQ(a.ref_count(b), 0);
  EXPECT_EQ(a.num_free(), 2);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { a.share(b); }, "free")) << "sharing a free block";
}

}  // namespace
}  // namespace infer
