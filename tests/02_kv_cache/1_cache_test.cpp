// Lesson 02: the caches on their own, before any model uses them.
#include "common/testing/compare.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/throws.hpp"
#include "lessons/02_kv_cache/kv_cache.hpp"
#include "common/weights.hpp"

namespace infer {
namespace {

ModelConfig tiny_config() {  // 3 layers, 2 K/V heads of 4: kv_dim 8
  ModelConfig c;
  c.vocab_size = 20, c.hidden_size = 16, c.intermediate_size = 24, c.num_hidden_layers = 3;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 4, c.max_position_embeddings = 32;
  return c;
}

Matrix rows(int n, int cols, float base) {
  Matrix m(n, cols);
  for (int i = 0; i < m.size(); ++i) m.data()[i] = base + 0.25f * static_cast<float>(i) - 3.0f;
  return m;
}

GRADED_TEST(Lesson02Cache, AppendsAndReadsBackEveryRow, 2) {
  KVCache cache(tiny_config(), 8);
  const Matrix k1 = rows(3, 8, 1), v1 = rows(3, 8, 2), k2 = rows(2, 8, 3), v2 = rows(2, 8, 4);
  for (int l = 0; l < 3; ++l) cache.append(l, k1, v1);
  for (int l = 0; l < 3; ++l) cache.append(l, k2, v2);
  EXPECT_EQ(cache.length(), 5);
  EXPECT_EQ(cache.length(1), 5);
  Matrix k(5, 8), v(5, 8);
  k << k1, k2;
  v << v1, v2;
  EXPECT_TRUE(testing::all_close(k, cache.keys(1), 0, 0, "layer 1's keys after appending 3 then 2 rows"));
  EXPECT_TRUE(testing::all_close(v, cache.values(2), 0, 0, "layer 2's values after appending 3 then 2 rows"));
  // keys() is a view of the cache's own rows: it stays what it was when another layer is read.
  KVCache two(tiny_config(), 4);
  two.append(0, rows(2, 8, 1), rows(2, 8, 2));
  two.append(1, rows(2, 8, 5), rows(2, 8, 6));
  const ConstMatrixRef layer0 = two.keys(0);
  (void)two.keys(1);
  EXPECT_TRUE(testing::all_close(rows(2, 8, 1), layer0, 0, 0,
                                 "layer 0's keys, read before layer 1's were (a view of the cache, not a copy)"));
}

GRADED_TEST(Lesson02Cache, AppendingPastMaxTokensThrowsAndWritesNothing, 2) {
  KVCache cache(tiny_config(), 4);
  cache.append(0, rows(3, 8, 1), rows(3, 8, 2));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { cache.append(0, rows(2, 8, 5), rows(2, 8, 6)); }, "max_tokens"))
      << "3 stored + 2 new > max_tokens 4";
  EXPECT_EQ(cache.length(0), 3) << "a refused append must not change the length";
  EXPECT_TRUE(testing::all_close(rows(3, 8, 1), cache.keys(0), 0, 0, "keys after a refused append"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { cache.append(0, rows(1, 7, 1), rows(1, 7, 1)); }, "kv_dim"));
}

GRADED_TEST(Lesson02Cache, ResetForgetsPositionsButKeepsTheReservation, 1) {
  KVCache cache(tiny_config(), 4);
  for (int l = 0; l < 3; ++l) cache.append(l, rows(2, 8, 1), rows(2, 8, 2));
  const size_t reserved = cache.bytes_reserved();
  cache.reset();
  EXPECT_EQ(cache.length(), 0);
  EXPECT_EQ(cache.keys(0).rows(), 0);
  EXPECT_EQ(cache.bytes_reserved(), reserved);
  cache.append(0, rows(4, 8, 7), rows(4, 8, 8));  // the whole reservation is usable again
  EXPECT_EQ(cache.length(0), 4);
}

GRADED_TEST(Lesson02Cache, CountsBytesUsedAndReserved, 1) {
  // The bundled model: 4 layers, 2 K/V heads of 24: 4 x 2 x 48 x 4 bytes = 1,536 bytes a token.
  const ModelConfig c = load_config(bundled_model_dir("tiny-fortunes") + "/config.json");
  KVCache cache(c, 256);
  EXPECT_EQ(cache.bytes_reserved(), 256u * 1536u);
  for (int l = 0; l < 4; ++l) cache.append(l, Matrix::Zero(10, 48), Matrix::Zero(10, 48));
  EXPECT_EQ(cache.bytes_used(), 10u * 1536u);
}

GRADED_TEST(Lesson02Int8, RoundTripErrorIsAtMostHalfAStep, 2) {
  // Each (token, head) has its own scale max|x| / 127; rounding errs by at most half of it.
  Int8KVCache cache(tiny_config(), 8);
  Rng rng(5);
  Matrix k(6, 8), v(6, 8);
  for (int i = 0; i < k.size(); ++i) k.data()[i] = static_cast<float>(rng.normal() * (1 + i % 5));
  for (int i = 0; i < v.size(); ++i) v.data()[i] = static_cast<float>(rng.normal() * 0.01);
  v.row(2).setZero();  // an all-zero row must come back as zeros, not NaN
  cache.append(0, k, v);
  const Matrix got_k = cache.keys(0), got_v = cache.values(0);
  for (int r = 0; r < 6; ++r)
    for (int h = 0; h < 2; ++h) {
      const float step_k = k.row(r).segment(h * 4, 4).cwiseAbs().maxCoeff() / 127.0f;
      const float step_v = v.row(r).segment(h * 4, 4).cwiseAbs().maxCoeff() / 127.0f;
      for (int i = 0; i < 4; ++i) {
        EXPECT_LE(std::abs(got_k(r, h * 4 + i) - k(r, h * 4 + i)), step_k / 2 * 1.0001f) << "key row " << r << " head " << h;
        EXPECT_LE(std::abs(got_v(r, h * 4 + i) - v(r, h * 4 + i)), step_v / 2 * 1.0001f + 1e-12f)
            << "value row " << r << " head " << h;
      }
    }
}

GRADED_TEST(Lesson02Int8, ResetAndTruncateLeaveNoStaleRows, 1) {
  // What a reset or a truncate dropped is gone from every layer: the cache then reads back what a
  // fresh one holding the same rows does (speculative decoding truncates after every round).
  const Matrix a = rows(3, 8, 1), b = rows(2, 8, 9);
  Int8KVCache reused(tiny_config(), 8), fresh(tiny_config(), 8);
  for (int l = 0; l < 3; ++l) reused.append(l, a, a), fresh.append(l, b, b);
  for (int l = 0; l < 3; ++l) (void)reused.keys(l);  // read once, so a cache of the read may keep it
  reused.reset();
  for (int l = 0; l < 3; ++l) reused.append(l, b, b);
  for (int l = 0; l < 3; ++l) {
    EXPECT_EQ(reused.length(l), 2) << "layer " << l << " after reset() and 2 new rows";
    EXPECT_TRUE(testing::all_close(fresh.keys(l), reused.keys(l), 0, 0, cat("layer ", l, "'s keys after reset()")));
    EXPECT_TRUE(testing::all_close(fresh.values(l), reused.values(l), 0, 0, cat("layer ", l, "'s values after reset()")));
  }
  Int8KVCache cut(tiny_config(), 8), want(tiny_config(), 8);
  Matrix kept(3, 8);
  kept << a.topRows(1), b;
  for (int l = 0; l < 3; ++l) cut.append(l, a, a), want.append(l, kept, kept);
  for (int l = 0; l < 3; ++l) (void)cut.keys(l);
  cut.truncate(1);
  for (int l = 0; l < 3; ++l) cut.append(l, b, b);
  for (int l = 0; l < 3; ++l)
    EXPECT_TRUE(testing::all_close(want.keys(l), cut.keys(l), 0, 0, cat("layer ", l, "'s keys after truncate(1) and 2 new rows")));
}

GRADED_TEST(Lesson02Int8, UsesAQuarterOfTheBytesPlusScales, 1) {
  const ModelConfig c = load_config(bundled_model_dir("tiny-fortunes") + "/config.json");
  KVCache f32(c, 256);
  Int8KVCache i8(c, 256);
  // Per token and layer: K and V, 48 int8 values each plus 2 float scales (one per K/V head).
  EXPECT_EQ(i8.bytes_reserved(), 256u * 4u * 2u * (48u + 2u * 4u));
  EXPECT_LT(static_cast<double>(i8.bytes_reserved()) / f32.bytes_reserved(), 0.3);
  for (int l = 0; l < 4; ++l) i8.append(l, Matrix::Ones(3, 48), Matrix::Ones(3, 48));
  EXPECT_EQ(i8.bytes_used(), 3u * 4u * 2u * (48u + 8u));
}

}  // namespace
}  // namespace infer
