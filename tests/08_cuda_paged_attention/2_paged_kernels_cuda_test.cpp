// Lesson 08 on a CUDA device: the paged kernels against lesson 04's CPU paged attention, over
// shuffled block tables (no sequence's blocks in order), block sizes 8, 16 and 32, lengths that
// are not multiples of the block size, grouped-query ratios 1 to 12, head dims 24 to 256, scores
// in the hundreds, a batch of sequences of different lengths in one launch (counted: each call is
// captured in a CUDA graph). Outputs are poisoned with NaN first.
// Tolerance 1e-5 + 1e-4 |ref| (float32 sums in another order). Without a device every case skips.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <vector>

#include "common/cuda_buffer.hpp"
#include "common/cuda_check.hpp"
#include "common/rng.hpp"
#include "common/testing/compare.hpp"
#include "common/testing/device.hpp"
#include "common/testing/graph_capture.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/page_reads.hpp"
#include "common/testing/throws.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"
#include "lessons/08_cuda_paged_attention/chunk_attention.hpp"
#include "lessons/08_cuda_paged_attention/cuda_paged.hpp"
#include "lessons/08_cuda_paged_attention/flash_decoding.hpp"
#include "lessons/08_cuda_paged_attention/paged_kernels.hpp"

namespace infer::gpu {
namespace {

using testing::poisoned;
using testing::random_values;

struct Shape {
  int heads, kv_heads, head_dim;
};

/// A batch of sequences over one shuffled pool, on the host (lesson 04's PagedKVPool, the
/// reference) and on the device (the same rows), with each sequence's table and query.
struct PagedFixture {
  Shape s;
  int block_size, num_blocks, max_blocks = 1;
  std::vector<int> lengths;
  std::vector<std::vector<int>> tables;
  std::unique_ptr<PagedKVPool> pool;
  std::vector<float> q;
  DeviceArray<float> dq, dk, dv;
  DeviceArray<int> dtables, dlengths;

  PagedFixture(Shape shape, int bs, std::vector<int> lens, uint64_t seed) : s(shape), block_size(bs), lengths(lens) {
    int total = 0;
    for (int len : lengths) total += blocks_for(len, bs);
    num_blocks = total + 3;  // a few blocks nobody uses
    ModelConfig c;
    c.num_hidden_layers = 1, c.num_attention_heads = s.heads, c.num_key_value_heads = s.kv_heads;
    c.head_dim = s.head_dim, c.max_position_embeddings = 1 << 20;
    pool = std::make_unique<PagedKVPool>(c, num_blocks, bs);
    const int kvd = s.kv_heads * s.head_dim;
    const auto k = random_values(static_cast<size_t>(num_blocks) * bs * kvd, seed);
    const auto v = random_values(k.size(), seed + 1);
    for (int b = 0; b < num_blocks; ++b) {
      pool->key_block(0, b) = Eigen::Map<const Matrix>(k.data() + static_cast<size_t>(b) * bs * kvd, bs, kvd);
      pool->value_block(0, b) = Eigen::Map<const Matrix>(v.data() + static_cast<size_t>(b) * bs * kvd, bs, kvd);
    }
    // Blocks handed out in a shuffled order: no table is contiguous or ascending.
    std::vector<int> order(num_blocks);
    std::iota(order.begin(), order.end(), 0);
    Rng rng(seed + 2);
    for (int i = num_blocks - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
    size_t next = 0;
    for (int len : lengths) {
      tables.emplace_back(order.begin() + next, order.begin() + next + blocks_for(len, bs));
      next += tables.back().size();
      max_blocks = std::max(max_blocks, static_cast<int>(tables.back().size()));
    }
    std::vector<int> flat(lengths.size() * max_blocks, -1);  // entries past a table's end: never read
    for (size_t i = 0; i < tables.size(); ++i) std::copy(tables[i].begin(), tables[i].end(), flat.begin() + i * max_blocks);
    q = random_values(lengths.size() * s.heads * s.head_dim, seed + 3);
    dq = DeviceArray<float>(q), dk = DeviceArray<float>(k), dv = DeviceArray<float>(v);
    dtables = DeviceArray<int>(flat), dlengths = DeviceArray<int>(lengths);
  }

  int batch() const { return static_cast<int>(lengths.size()); }
  size_t out_size() const { return static_cast<size_t>(batch()) * s.heads * s.head_dim; }

  PagedBatch args(float* out) const {
    PagedBatch a;
    a.q = dq.get(), a.k_pool = dk.get(), a.v_pool = dv.get(), a.block_tables = dtables.get();
    a.lengths = dlengths.get(), a.out = out, a.batch = batch(), a.max_blocks = max_blocks, a.block_size = block_size;
    a.heads = s.heads, a.kv_heads = s.kv_heads, a.head_dim = s.head_dim;
    a.max_length = *std::max_element(lengths.begin(), lengths.end());
    return a;
  }

  /// Lesson 04's paged_attention for every sequence, [batch, heads * head_dim].
  Matrix reference() const {
    const int qd = s.heads * s.head_dim;
    Matrix want(batch(), qd);
    for (int i = 0; i < batch(); ++i) {
      const Matrix qi = Eigen::Map<const Matrix>(q.data() + static_cast<size_t>(i) * qd, 1, qd);
      want.row(i) = paged_attention(qi, *pool, tables[i], 0, lengths[i], s.heads, s.kv_heads, s.head_dim).row(0);
    }
    return want;
  }

  /// Multiplies every query by `factor` (on the host and the device): scores grow by it.
  void scale_queries(float factor) {
    for (float& x : q) x *= factor;
    dq = DeviceArray<float>(q);
  }

  Matrix download(const DeviceArray<float>& out) const {
    const auto got = out.download();
    return Eigen::Map<const Matrix>(got.data(), batch(), s.heads * s.head_dim);
  }
};

const Shape kShapes[] = {{4, 4, 24}, {8, 4, 64}, {8, 2, 128}, {8, 1, 64}, {6, 2, 24}, {12, 1, 64}, {32, 8, 128}};

GRADED_TEST(Lesson08Kernels, PagedAttentionMatchesLesson04, 4) {
  REQUIRE_DEVICE();
  uint64_t seed = 100;
  for (const Shape s : kShapes) {
    for (int bs : {8, 16, 32}) {
      PagedFixture f(s, bs, {1, bs - 1, bs, bs + 1, 3 * bs + 5, 77}, seed += 10);
      SCOPED_TRACE(cat(s.heads, "/", s.kv_heads, " heads of ", s.head_dim, ", blocks of ", bs));
      DeviceArray<float> out = poisoned(f.out_size());
      paged_decode_attention(f.args(out.get()));
      ASSERT_TRUE(testing::all_close(f.reference(), f.download(out), 1e-5, 1e-4,
                                     "paged_decode_attention against lesson 04's paged_attention"));
    }
  }
  // The widest heads the contract allows (256) and one between the common sizes (160).
  for (const Shape s : {Shape{4, 2, 256}, Shape{2, 1, 160}}) {
    PagedFixture f(s, 16, {1, 17, 40}, seed += 10);
    SCOPED_TRACE(cat(s.heads, "/", s.kv_heads, " heads of ", s.head_dim));
    DeviceArray<float> out = poisoned(f.out_size());
    paged_decode_attention(f.args(out.get()));
    ASSERT_TRUE(testing::all_close(f.reference(), f.download(out), 1e-5, 1e-4,
                                   "paged_decode_attention against lesson 04's paged_attention"));
  }
}

/// A batch whose queries are 60 times larger: scores of a few hundred, whose exp() overflows float.
PagedFixture scores_in_the_hundreds() {
  PagedFixture f({8, 2, 64}, 16, {1, 30, 200}, 61);
  f.scale_queries(60.0f);
  return f;
}

GRADED_TEST(Lesson08Kernels, ScoresInTheHundredsStayFinite, 1) {
  // Every softmax on the way (each warp's, the block's merge of its warps) must subtract its max.
  // (The splits' merge, Step 5, meets the same scores in SplitEqualsUnsplitForEverySplitCount.)
  REQUIRE_DEVICE();
  PagedFixture f = scores_in_the_hundreds();
  const Matrix want = f.reference();
  ASSERT_TRUE(want.allFinite());
  DeviceArray<float> out = poisoned(f.out_size());
  paged_decode_attention(f.args(out.get()));
  ASSERT_TRUE(testing::all_close(want, f.download(out), 1e-5, 1e-4, "paged_decode_attention, scores in the hundreds"));
}

GRADED_TEST(Lesson08Kernels, LongContextsMatchLesson04, 2) {
  REQUIRE_DEVICE();
  PagedFixture f({32, 8, 128}, 16, {5000, 1, 2049}, 7);
  DeviceArray<float> out = poisoned(f.out_size());
  paged_decode_attention(f.args(out.get()));
  ASSERT_TRUE(testing::all_close(f.reference(), f.download(out), 1e-5, 1e-4, "5,000 positions in one pass"));
}

GRADED_TEST(Lesson08Kernels, QueryHeadsOfAKvHeadReadItTogether, 2) {
  // Grouped-query attention saves a decode step's reads only if the query heads of one K/V head
  // read its keys together: one block for the group, not one per query head. No output shows it;
  // the reads of K do. One sequence of 2,048 positions, 8 query heads on 1 K/V head of 128 dims:
  // K is 1 MB, 256 pages, watched (common/testing/page_reads.hpp, a working set of 32 pages). The
  // reference walks it 0.98 times (emulated); with a block per query head it walked it 7.82 times.
  REQUIRE_DEVICE();
  REQUIRE_EMULATOR();
  PagedFixture f({8, 1, 128}, 16, {2048}, 91);
  DeviceArray<float> out = poisoned(f.out_size());
  double passes = 0;
  {
    testing::PageReadCounter reads(f.dk.get(), sizeof(float) * f.dk.size());
    paged_decode_attention(f.args(out.get()));
    passes = reads.passes();
  }
  EXPECT_LE(passes, 2.0) << "K was walked " << passes << " times for 8 query heads on 1 K/V head: the query heads "
                         << "of a K/V head read each key once between them, not once each";
  EXPECT_TRUE(testing::all_close(f.reference(), f.download(out), 1e-5, 1e-4, "8 query heads on 1 K/V head"));
}

GRADED_TEST(Lesson08Kernels, SplitEqualsUnsplitForEverySplitCount, 3) {
  REQUIRE_DEVICE();
  for (const Shape s : {Shape{8, 2, 64}, Shape{6, 6, 24}, Shape{12, 1, 128}}) {
    PagedFixture f(s, 16, {1, 9, 40, 100}, 300 + s.heads);
    const Matrix want = f.reference();
    for (int splits = 1; splits <= 104; splits += (splits < 16 ? 1 : 11)) {  // past every length, too
      SCOPED_TRACE(cat(s.heads, "/", s.kv_heads, " heads of ", s.head_dim, ", ", splits, " splits"));
      const size_t rows = static_cast<size_t>(f.batch()) * s.heads;
      DeviceArray<float> out = poisoned(f.out_size()), po = poisoned(rows * splits * s.head_dim),
                         pl = poisoned(rows * splits);
      paged_decode_attention_split(f.args(out.get()), splits, po.get(), pl.get());
      ASSERT_TRUE(testing::all_close(want, f.download(out), 1e-5, 1e-4, "the split attention, merged"));
    }
  }
  // Scores in the hundreds over 3 splits (the first sequence, of 1 position, leaves two of them
  // empty): the merge of the splits subtracts its max too.
  PagedFixture f = scores_in_the_hundreds();
  const Matrix want = f.reference();
  const size_t rows = static_cast<size_t>(f.batch()) * 8;
  DeviceArray<float> split = poisoned(f.out_size()), po = poisoned(rows * 3 * 64), pl = poisoned(rows * 3);
  paged_decode_attention_split(f.args(split.get()), 3, po.get(), pl.get());
  ASSERT_TRUE(testing::all_close(want, f.download(split), 1e-5, 1e-4, "3 splits, scores in the hundreds"));
}

GRADED_TEST(Lesson08Kernels, EachSplitsPartialMatchesTheCpuPartial, 2) {
  // The workspace itself: partial (i, h, s) and its lse equal attention_partial over split_range.
  REQUIRE_DEVICE();
  const Shape s{8, 2, 24};
  PagedFixture f(s, 8, {30, 3}, 55);
  const int splits = 5, rows = f.batch() * s.heads;
  DeviceArray<float> out = poisoned(f.out_size()), po = poisoned(static_cast<size_t>(rows) * splits * s.head_dim),
                     pl = poisoned(static_cast<size_t>(rows) * splits);
  paged_decode_attention_split(f.args(out.get()), splits, po.get(), pl.get());
  const auto parts = po.download(), lses = pl.download();
  for (int i = 0; i < f.batch(); ++i) {
    Matrix keys(f.lengths[i], s.kv_heads * s.head_dim), values(keys.rows(), keys.cols());
    for (int p = 0; p < f.lengths[i]; ++p) {
      keys.row(p) = f.pool->key_block(0, f.tables[i][p / 8]).row(p % 8);
      values.row(p) = f.pool->value_block(0, f.tables[i][p / 8]).row(p % 8);
    }
    const Vector q = Eigen::Map<const Vector>(f.q.data() + static_cast<size_t>(i) * s.heads * s.head_dim,
                                              s.heads * s.head_dim);
    for (int sp = 0; sp < splits; ++sp) {
      const AttentionPartial want =
          attention_partial(q, keys, values, split_range(f.lengths[i], splits, sp), s.heads, s.kv_heads, s.head_dim);
      for (int h = 0; h < s.heads; ++h) {
        SCOPED_TRACE(cat("sequence ", i, ", head ", h, ", split ", sp));
        const size_t row = static_cast<size_t>(i) * s.heads + h;
        const float lse = lses[row * splits + sp];
        if (std::isinf(want.lse[h])) {
          ASSERT_TRUE(std::isinf(lse) && lse < 0) << "an empty split's lse must be -infinity, got " << lse;
          const Vector got = Eigen::Map<const Vector>(parts.data() + (row * splits + sp) * s.head_dim, s.head_dim);
          ASSERT_TRUE(got.isZero(0.0f)) << "an empty split's partial output must be written as zeros (the workspace "
                                           "was poisoned with NaN), got " << got.transpose();
          continue;
        }
        ASSERT_NEAR(lse, want.lse[h], 1e-4 + 1e-5 * std::abs(want.lse[h])) << "the split's lse";
        const Vector got = Eigen::Map<const Vector>(parts.data() + (row * splits + sp) * s.head_dim, s.head_dim);
        ASSERT_TRUE(testing::all_close(want.out.row(h).transpose(), got, 1e-5, 1e-4, "the split's partial output"));
      }
    }
  }
}

GRADED_TEST(Lesson08Kernels, MergeKernelEqualsTheCpuMerge, 2) {
  REQUIRE_DEVICE();
  const int rows = 37, splits = 6, hd = 40;
  auto po = random_values(static_cast<size_t>(rows) * splits * hd, 71);
  auto pl = random_values(static_cast<size_t>(rows) * splits, 72);
  const float inf = std::numeric_limits<float>::infinity();
  for (int r = 0; r < rows; ++r)
    for (int s = 0; s < splits; ++s) {
      float& lse = pl[static_cast<size_t>(r) * splits + s];
      lse = lse * 30.0f + (r % 3 == 0 ? 500.0f : 0.0f);  // spreads of tens, and lse values in the hundreds
      if ((r + s) % 4 == 0 || r == 5) {                   // empty splits; every split of row 5
        lse = -inf;
        std::fill_n(po.begin() + (static_cast<size_t>(r) * splits + s) * hd, hd, 0.0f);
      }
    }
  DeviceArray<float> dpo(po), dpl(pl), out = poisoned(static_cast<size_t>(rows) * hd);
  merge_attention_partials(dpo.get(), dpl.get(), out.get(), rows, splits, hd);
  const auto got = out.download();
  for (int r = 0; r < rows; ++r) {
    std::vector<AttentionPartial> parts;
    for (int s = 0; s < splits; ++s) {
      AttentionPartial p{Matrix(1, hd), Vector::Constant(1, pl[static_cast<size_t>(r) * splits + s])};
      p.out.row(0) = Eigen::Map<const Eigen::RowVectorXf>(po.data() + (static_cast<size_t>(r) * splits + s) * hd, hd);
      parts.push_back(p);
    }
    const AttentionPartial want = merge_partials(parts);
    const Eigen::RowVectorXf row = Eigen::Map<const Eigen::RowVectorXf>(got.data() + static_cast<size_t>(r) * hd, hd);
    ASSERT_TRUE(testing::all_close(want.out.row(0), row, 1e-5, 1e-4, cat("merged row ", r)));
  }
}

GRADED_TEST(Lesson08Kernels, WriteKvSlotsPutsEachRowInItsSlot, 1) {
  REQUIRE_DEVICE();
  const int pool_rows = 50, kvd = 72, batch = 7;
  const std::vector<int> slots{49, 0, 17, 3, 31, 32, 8};
  const auto k = random_values(static_cast<size_t>(batch) * kvd, 81), v = random_values(k.size(), 82);
  const auto kp0 = random_values(static_cast<size_t>(pool_rows) * kvd, 83), vp0 = random_values(kp0.size(), 84);
  DeviceArray<float> dk(k), dv(v), kp(kp0), vp(vp0);
  DeviceArray<int> ds(slots);
  write_kv_slots(dk.get(), dv.get(), kp.get(), vp.get(), ds.get(), batch, kvd);
  auto want_k = kp0, want_v = vp0;
  for (int i = 0; i < batch; ++i)
    for (int c = 0; c < kvd; ++c) {
      want_k[static_cast<size_t>(slots[i]) * kvd + c] = k[static_cast<size_t>(i) * kvd + c];
      want_v[static_cast<size_t>(slots[i]) * kvd + c] = v[static_cast<size_t>(i) * kvd + c];
    }
  EXPECT_EQ(kp.download(), want_k) << "keys: each row in its slot, every other row of the pool untouched";
  EXPECT_EQ(vp.download(), want_v) << "values: each row in its slot, every other row of the pool untouched";
}

GRADED_TEST(Lesson08Kernels, BadArgumentsAreRefusedBeforeLaunching, 1) {
  REQUIRE_DEVICE();
  PagedFixture f({8, 2, 24}, 8, {10}, 91);
  DeviceArray<float> out(f.out_size()), po(1000), pl(100);
  using testing::throws_error_mentioning;
  PagedBatch a = f.args(out.get());
  a.kv_heads = 3;
  EXPECT_TRUE(throws_error_mentioning([&] { paged_decode_attention(a); }, "kv_heads"));
  a = f.args(out.get()), a.head_dim = 300;
  EXPECT_TRUE(throws_error_mentioning([&] { paged_decode_attention(a); }, "head_dim"));
  a = f.args(out.get()), a.max_length = 1000;
  EXPECT_TRUE(throws_error_mentioning([&] { paged_decode_attention(a); }, "max_length"));
  a = f.args(out.get()), a.q = nullptr;
  EXPECT_TRUE(throws_error_mentioning([&] { paged_decode_attention(a); }, "null"));
  a = f.args(out.get());
  EXPECT_TRUE(throws_error_mentioning([&] { paged_decode_attention_split(a, 0, po.get(), pl.get()); }, "num_splits"));
  EXPECT_TRUE(throws_error_mentioning([&] { paged_decode_attention_split(a, 2, nullptr, pl.get()); }, "null"));
  a.kv_heads = 3;  // the split path checks the batch as the unsplit one does
  EXPECT_TRUE(throws_error_mentioning([&] { paged_decode_attention_split(a, 2, po.get(), pl.get()); }, "kv_heads"));
  a = f.args(out.get()), a.head_dim = 300;
  EXPECT_TRUE(throws_error_mentioning([&] { paged_decode_attention_split(a, 2, po.get(), pl.get()); }, "head_dim"));
  EXPECT_TRUE(throws_error_mentioning([&] { merge_attention_partials(po.get(), pl.get(), out.get(), 0, 2, 8); }, "rows"));
  EXPECT_TRUE(
      throws_error_mentioning([&] { merge_attention_partials(po.get(), pl.get(), out.get(), 4, 0, 8); }, "num_splits"));
  EXPECT_TRUE(
      throws_error_mentioning([&] { merge_attention_partials(po.get(), pl.get(), out.get(), 4, 2, 0); }, "head_dim"));
  EXPECT_TRUE(throws_error_mentioning([&] { merge_attention_partials(po.get(), pl.get(), nullptr, 4, 2, 8); }, "null"));
  EXPECT_TRUE(throws_error_mentioning([&] { write_kv_slots(po.get(), po.get(), po.get(), po.get(), nullptr, 1, 8); },
                                      "null"));
}

GRADED_TEST(Lesson08Kernels, EachCallIsItsLaunchesAndCanBeCapturedInAGraph, 2) {
  // The engine captures its decode step in a CUDA graph (--cuda-graphs), and the contract counts
  // the launches: the whole batch's attention in one, the split version in two (the partials,
  // their merge), the merge in one, the slot write in one. A call that gathers the rows into a
  // fresh copy, or launches per sequence, or copies per row from the host, gives the right numbers
  // and breaks both. Each call is captured alone, replayed, and its result checked.
  REQUIRE_DEVICE();
  PagedFixture f({8, 2, 64}, 16, {1, 30, 70, 5}, 77);
  const Matrix want = f.reference();
  DeviceArray<float> out = poisoned(f.out_size());
  EXPECT_EQ(testing::captured_launches("paged_decode_attention", [&] { paged_decode_attention(f.args(out.get())); }), 1u)
      << "paged_decode_attention: every sequence of the batch in one launch";
  EXPECT_TRUE(testing::all_close(want, f.download(out), 1e-5, 1e-4, "paged_decode_attention, replayed"));
  const size_t rows = static_cast<size_t>(f.batch()) * 8;
  DeviceArray<float> split = poisoned(f.out_size()), po = poisoned(rows * 4 * 64), pl = poisoned(rows * 4);
  EXPECT_EQ(testing::captured_launches("paged_decode_attention_split",
                              [&] { paged_decode_attention_split(f.args(split.get()), 4, po.get(), pl.get()); }),
            2u)
      << "paged_decode_attention_split: one launch for every partial, one for their merge";
  EXPECT_TRUE(testing::all_close(want, f.download(split), 1e-5, 1e-4, "4 splits, replayed"));
  DeviceArray<float> merged = poisoned(f.out_size());
  EXPECT_EQ(testing::captured_launches("merge_attention_partials",
                              [&] { merge_attention_partials(po.get(), pl.get(), merged.get(), rows, 4, 64); }),
            1u);
  EXPECT_TRUE(testing::all_close(want, f.download(merged), 1e-5, 1e-4, "the merge, replayed"));
  const int kvd = 2 * 64, batch = 5;
  const std::vector<int> slots{9, 0, 33, 4, 20};
  const auto k = random_values(static_cast<size_t>(batch) * kvd, 78), v = random_values(k.size(), 79);
  const auto pool0 = random_values(static_cast<size_t>(40) * kvd, 80);
  DeviceArray<float> dk(k), dv(v), kp(pool0), vp(pool0);
  DeviceArray<int> ds(slots);
  EXPECT_EQ(testing::captured_launches("write_kv_slots",
                              [&] { write_kv_slots(dk.get(), dv.get(), kp.get(), vp.get(), ds.get(), batch, kvd); }),
            1u)
      << "write_kv_slots: the whole batch in one launch";
  auto want_k = pool0;
  for (int i = 0; i < batch; ++i)
    std::copy_n(k.begin() + static_cast<long>(i) * kvd, kvd, want_k.begin() + static_cast<long>(slots[i]) * kvd);
  EXPECT_EQ(kp.download(), want_k) << "write_kv_slots, replayed: each row in its slot";
}

// Given code, not graded: the chunk kernel the GPU forward runs for a step's prompt chunks
// (chunk_attention.hpp), on the rows step_kernels() tiles. Each chunk of n tokens after L cached
// positions is n rows sharing its sequence's table, row t seeing L + t + 1 positions; a one-token
// chunk among them is left to the decode kernel, so its row must stay as poisoned. Chunks of 40,
// 9 and 70 tokens leave tiles of every size. `run(a, tile_first, tile_rows, tiles, tensor_cores)`
// is the call under test, on each shape, block size and design (tensor cores where they run).
// The tensor-core design keeps about 16 bits of each operand (chunk_attention.hpp): within
// 1e-4 + 1e-4 |x|, where its largest difference over these shapes, emulated, was 2.6e-5 (the
// float32 design's, 1.4e-6, within lesson 08's 1e-5 + 1e-4 |x|).
template <typename Run>
void expect_chunk_rows_equal_lesson04(std::initializer_list<Shape> shapes, std::initializer_list<int> block_sizes,
                                      Run run, bool misaligned_pools = false) {
  const std::vector<int> cached = {0, 10, 37, 100}, tokens = {40, 1, 9, 70};
  const StepKernels plan = step_kernels(tokens, true);
  for (const Shape s : shapes) {
    for (const int bs : block_sizes) {
      SCOPED_TRACE(cat(s.heads, "/", s.kv_heads, " heads of ", s.head_dim, ", blocks of ", bs));
      std::vector<int> seq_lengths;
      for (size_t i = 0; i < tokens.size(); ++i) seq_lengths.push_back(cached[i] + tokens[i]);
      PagedFixture f(s, bs, seq_lengths, 500 + s.head_dim + bs);
      const int qd = s.heads * s.head_dim, rows = std::accumulate(tokens.begin(), tokens.end(), 0);
      std::vector<int> flat(static_cast<size_t>(rows) * f.max_blocks, -1), lengths;
      std::vector<size_t> owner;  // each row's chunk
      for (size_t i = 0; i < tokens.size(); ++i)
        for (int t = 0; t < tokens[i]; ++t) {
          std::copy(f.tables[i].begin(), f.tables[i].end(), flat.begin() + lengths.size() * f.max_blocks);
          lengths.push_back(cached[i] + t + 1), owner.push_back(i);
        }
      const std::vector<float> q = random_values(static_cast<size_t>(rows) * qd, 600 + bs);
      DeviceArray<float> dq(q);
      DeviceArray<int> dtables(flat), dlengths(lengths), first(plan.tile_first), count(plan.tile_rows);
      DeviceArray<float> dk, dv;  // with misaligned_pools, the pools again one float further on
      if (misaligned_pools) {
        std::vector<float> k = f.dk.download(), v = f.dv.download();
        k.insert(k.begin(), 0.0f), v.insert(v.begin(), 0.0f);
        dk = DeviceArray<float>(k), dv = DeviceArray<float>(v);
      }
      for (const bool tensor_cores : {false, true}) {
        if (tensor_cores && !chunk_tensor_cores_run(s.head_dim)) continue;  // head_dim 24, or no tensor cores
        SCOPED_TRACE(tensor_cores ? "tensor cores" : "CUDA cores");
        DeviceArray<float> out = poisoned(static_cast<size_t>(rows) * qd);
        PagedBatch a = f.args(out.get());
        a.q = dq.get(), a.block_tables = dtables.get(), a.lengths = dlengths.get(), a.batch = rows;
        if (misaligned_pools) a.k_pool = dk.get() + 1, a.v_pool = dv.get() + 1;
        run(a, first.get(), count.get(), static_cast<int>(plan.tile_first.size()), tensor_cores);
        const std::vector<float> got = out.download();
        for (int r = 0; r < rows; ++r) {
          const Matrix row = Eigen::Map<const Matrix>(got.data() + static_cast<size_t>(r) * qd, 1, qd);
          if (tokens[owner[r]] == 1) {
            EXPECT_TRUE(row.array().isNaN().all()) << "row " << r << " is no tile's: the kernel must not write it";
            continue;
          }
          const Matrix qr = Eigen::Map<const Matrix>(q.data() + static_cast<size_t>(r) * qd, 1, qd);
          const Matrix want =
              paged_attention(qr, *f.pool, f.tables[owner[r]], 0, lengths[r], s.heads, s.kv_heads, s.head_dim);
          ASSERT_TRUE(testing::all_close(want, row, tensor_cores ? 1e-4 : 1e-5, 1e-4,
                                         cat("row ", r, " (", lengths[r], " positions)")));
        }
      }
    }
  }
}

// Blocks of 3 and 16 positions; head_dim up to 256.
TEST(GivenChunkKernel, TilesOfChunksEqualLesson04RowByRow) {
  REQUIRE_DEVICE();
  expect_chunk_rows_equal_lesson04(
      {Shape{8, 2, 64}, Shape{12, 1, 64}, Shape{32, 4, 64}, Shape{4, 4, 256}, Shape{6, 2, 24}, Shape{4, 2, 128},
       Shape{2, 1, 16}},
      {3, 16}, [](const PagedBatch& a, const int* first, const int* count, int tiles, bool tensor_cores) {
        paged_chunk_attention(a, first, count, tiles, tensor_cores);
      });
}

// The same rows with each tile's positions split (paged_chunk_attention_split), into 1, 2, 3 and 7
// ranges of whole key tiles: the chunk of 70 after 100 has tiles of up to 170 positions (7 splits
// of 32: the last one empty), and rows that split 4 of 7 reaches (lengths 129 to 132) beside rows
// it does not. The workspace is poisoned with NaN first: a partial the merge reads that no block
// wrote shows. head_dim 18 (not a multiple of 4) takes the staging's one-float loads, and so do
// pools 4 bytes past a 16-byte boundary at head_dim 64 (on a GPU, a 16-byte load there faults; the
// emulator's processor takes it, so only a GPU run tells).
TEST(GivenChunkKernel, SplitOverPositionsEqualsLesson04RowByRow) {
  REQUIRE_DEVICE();
  const auto split = [](int splits) {
    return [=](const PagedBatch& a, const int* first, const int* count, int tiles, bool tensor_cores) {
      const size_t partials = static_cast<size_t>(tiles) * kChunkTileRows * a.heads * splits;
      DeviceArray<float> out = poisoned(partials * a.head_dim), lse = poisoned(partials);
      paged_chunk_attention_split(a, first, count, tiles, splits, out.get(), lse.get(), tensor_cores);
    };
  };
  for (const int splits : {1, 2, 3, 7}) {
    SCOPED_TRACE(cat(splits, " splits"));
    expect_chunk_rows_equal_lesson04({Shape{8, 2, 64}, Shape{6, 2, 18}}, {16}, split(splits));
  }
  SCOPED_TRACE("pools 4 bytes past a 16-byte boundary, 3 splits");
  expect_chunk_rows_equal_lesson04({Shape{8, 2, 64}}, {16}, split(3), true);
  const std::vector<int> tiles = {0}, rows = {1}, lengths = {1};
  DeviceArray<int> first(tiles), count(rows), length(lengths), table(tiles);
  DeviceArray<float> q(64), kv(64), out(64), partial(kChunkTileRows * 64);
  PagedBatch a;
  a.q = q.get(), a.k_pool = kv.get(), a.v_pool = kv.get(), a.block_tables = table.get(), a.lengths = length.get();
  a.out = out.get(), a.batch = 1, a.max_blocks = 1, a.block_size = 1, a.heads = 1, a.kv_heads = 1, a.head_dim = 64;
  a.max_length = 1;
  for (const int splits : {0, 65536})
    EXPECT_TRUE(testing::throws_error_mentioning(
        [&] { paged_chunk_attention_split(a, first.get(), count.get(), 1, splits, partial.get(), partial.get()); },
        "splits must be in [1, 65535]"));
  EXPECT_TRUE(testing::throws_error_mentioning(
      [&] { paged_chunk_attention_split(a, first.get(), count.get(), 1, 2, nullptr, partial.get()); },
      "paged_chunk_attention_split"));
}

}  // namespace
}  // namespace infer::gpu
