// Lesson 12: a rank's slice of every matrix, the bytes it reads for it, and the row-parallel
// product that completes a sum over the ranks.
#include <vector>

#include "common/rng.hpp"
#include "common/testing/compare.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "common/testing/throws.hpp"
#include "common/weights.hpp"
#include "lessons/12_tensor_parallel/tensor_parallel.hpp"

namespace infer {
namespace {

/// A model with grouped-query attention whose heads split over 1, 2 and 4 ranks.
const ModelWeights& gqa_model() {
  static const ModelWeights m = [] {
    ModelConfig c = testing::bundled_model().config;
    c.hidden_size = 64, c.num_attention_heads = 8, c.num_key_value_heads = 2, c.head_dim = 8;
    c.intermediate_size = 96, c.num_hidden_layers = 2;
    return random_model(c, 12);
  }();
  return m;
}

/// Bytes of float32 a rank's shard of `m` holds: every split matrix's share, the rest whole.
long shard_bytes(const ModelWeights& m, const ShardPlan& p) {
  const ModelConfig& c = m.config;
  const long d = c.head_dim, h = c.hidden_size;
  long floats = m.embed_tokens.size() + m.lm_head.size() + m.norm.size();
  floats += c.num_hidden_layers * (2 * h                                  // the two norms
                                   + 2 * p.heads.size() * d * h          // q and o
                                   + 2 * p.kv_heads.size() * d * h       // k and v
                                   + 3 * p.units.size() * h);            // gate, up and down
  return floats * static_cast<long>(sizeof(float));
}

GRADED_TEST(Lesson12Shard, AShardHoldsItsRowsOfQkvGateUpAndItsColumnsOfOAndDown, 3) {
  const ModelWeights& m = gqa_model();
  const long d = m.config.head_dim;
  for (int world : {1, 2, 4}) {
    for (int r = 0; r < world; ++r) {
      const ShardPlan p = shard_plan(m.config, r, world);
      auto source = memory_weights(m);
      const ModelWeights s = load_shard(*source, p);
      const std::string where = cat("rank ", r, " of ", world);
      const ModelConfig want = rank_config(m.config, p);
      EXPECT_EQ(s.config.num_attention_heads, want.num_attention_heads) << where;
      EXPECT_EQ(s.config.num_key_value_heads, want.num_key_value_heads) << where;
      EXPECT_EQ(s.config.intermediate_size, want.intermediate_size) << where;
      ASSERT_EQ(s.layers.size(), m.layers.size()) << where;
      for (size_t l = 0; l < m.layers.size(); ++l) {
        const LayerWeights &a = m.layers[l], &b = s.layers[l];
        EXPECT_EQ(b.q_proj, a.q_proj.middleRows(p.heads.begin * d, p.heads.size() * d)) << where << ", q_proj";
        EXPECT_EQ(b.k_proj, a.k_proj.middleRows(p.kv_heads.begin * d, p.kv_heads.size() * d)) << where << ", k_proj";
        EXPECT_EQ(b.v_proj, a.v_proj.middleRows(p.kv_heads.begin * d, p.kv_heads.size() * d)) << where << ", v_proj";
        EXPECT_EQ(b.o_proj, a.o_proj.middleCols(p.heads.begin * d, p.heads.size() * d)) << where << ", o_proj";
        EXPECT_EQ(b.gate_proj, a.gate_proj.middleRows(p.units.begin, p.units.size())) << where << ", gate_proj";
        EXPECT_EQ(b.up_proj, a.up_proj.middleRows(p.units.begin, p.units.size())) << where << ", up_proj";
        EXPECT_EQ(b.down_proj, a.down_proj.middleCols(p.units.begin, p.units.size())) << where << ", down_proj";
        EXPECT_EQ(b.input_layernorm, a.input_layernorm) << where;
        EXPECT_EQ(b.post_attention_layernorm, a.post_attention_layernorm) << where;
      }
      EXPECT_EQ(s.embed_tokens, m.embed_tokens) << where;
      EXPECT_EQ(s.norm, m.norm) << where;
      EXPECT_EQ(s.lm_head, m.lm_head) << where;
    }
  }
}

GRADED_TEST(Lesson12Shard, EachRankReadsOnlyItsOwnBytesFromTheFile, 2) {
  // The bundled model's file, read in parts: a rank reads its share of every split matrix and
  // the replicated tensors, nothing else (shard_bytes() counts them from the plan). At 2 ranks
  // that is about half the file.
  const ModelWeights& whole = testing::bundled_model();
  for (int world : {1, 2, 4}) {
    for (int r = 0; r < world; ++r) {
      const ShardPlan p = shard_plan(whole.config, r, world);
      auto file = file_weights(bundled_model_dir("tiny-fortunes"));
      const ModelWeights s = load_shard(*file, p);
      EXPECT_EQ(file->bytes_read(), shard_bytes(whole, p)) << "rank " << r << " of " << world;
      EXPECT_EQ(s.layers[0].q_proj, whole.layers[0].q_proj.middleRows(p.heads.begin * whole.config.head_dim,
                                                                         p.heads.size() * whole.config.head_dim));
    }
  }
}

/// A FloatProjection that counts the rows of W its products compute: what a wrapper asks of it.
class CountingProjection final : public Projection {
 public:
  explicit CountingProjection(Matrix w) : w_(std::move(w)), inner_(w_) {}
  long rows() const override { return inner_.rows(); }
  long cols() const override { return inner_.cols(); }
  long bytes() const override { return inner_.bytes(); }
  void rows_into(ConstMatrixRef x, MatrixRef y, long first, long count, bool accumulate) const override {
    rows_computed_ += count;
    inner_.rows_into(x, y, first, count, accumulate);
  }
  Matrix to_float() const override { return inner_.to_float(); }
  long rows_computed() const { return rows_computed_; }

 private:
  Matrix w_;
  FloatProjection inner_;  // over w_, kept by reference
  mutable long rows_computed_ = 0;
};

GRADED_TEST(Lesson12Shard, RowParallelProductIsTheWholeProductOnEveryRank, 3) {
  // W [24, 40] split by columns over the ranks, x [3, 40] likewise: each rank's product by its
  // slice, all-reduced, is x W^T (1e-5 + 1e-5 |y|: float32 sums in another order), on every rank;
  // y's own values are added once; rows [first, first + count) alone leave the others as they were.
  Rng rng(5);
  Matrix w(24, 40), x(3, 40), y0(3, 24);
  for (Matrix* m : {&w, &x, &y0})
    for (float& v : m->reshaped()) v = rng.normal();
  const Matrix want = x * w.transpose();
  for (int world : {1, 2, 4}) {
    const long cols = 40 / world;
    std::vector<Matrix> got(world), added(world), part(world);
    std::vector<long> reduces(world), floats(world), computed(world);
    run_ranks(world, [&](Communicator& comm) {
      const int r = comm.rank();
      const Matrix mine = w.middleCols(r * cols, cols), xr = x.middleCols(r * cols, cols);
      auto counting = std::make_unique<CountingProjection>(mine);
      const CountingProjection& shard = *counting;
      const RowParallelProjection p(std::move(counting), comm);
      got[r] = Matrix::Constant(3, 24, NAN);
      p.rows_into(xr, got[r], 0, 24, false);
      added[r] = y0;
      p.rows_into(xr, added[r], 0, 24, true);
      part[r] = y0;
      p.rows_into(xr, part[r], 8, 4, true);
      reduces[r] = comm.stats().all_reduces;
      floats[r] = comm.stats().floats_reduced;
      computed[r] = shard.rows_computed();
      Matrix wrong(3, 30);
      EXPECT_TRUE(testing::throws_error_mentioning([&] { p.rows_into(xr, wrong, 0, 24, false); }, ""))
          << "y of [3, 30] for a W of 24 rows: refused";
    });
    for (int r = 0; r < world; ++r) {
      const std::string where = cat("rank ", r, " of ", world);
      EXPECT_TRUE(testing::all_close(want, got[r], 1e-5, 1e-5, where + ": y = x W^T"));
      EXPECT_TRUE(testing::all_close(Matrix(y0 + want), added[r], 1e-5, 1e-5, where + ": y += x W^T (y's own values added once, not once per rank?)"));
      Matrix want_part = y0;
      want_part.middleCols(8, 4) += want.middleCols(8, 4);
      EXPECT_TRUE(testing::all_close(want_part, part[r], 1e-5, 1e-5, where + ": rows 8..11 of W only"));
      EXPECT_EQ(reduces[r], 3) << where << ": one all-reduce per product";
      EXPECT_EQ(floats[r], 3 * 24 + 3 * 24 + 3 * 4) << where << ": each all-reduce of x.rows * count floats (the "
                                                       "rows asked for, not the whole partial product)";
      EXPECT_EQ(got[r], got[0]) << where << ": every rank holds the same sums";
      EXPECT_EQ(computed[r], 24 + 24 + 4) << where << ": rows of W the shard's products computed; a product asked "
                                             "for rows [first, first + count) asks its shard for those rows alone";
    }
  }
}

GRADED_TEST(Lesson12Shard, OnlyOAndDownAreRowParallel, 1) {
  // q, k, v, gate and up are split by rows: each rank computes whole outputs of its own, and an
  // all-reduce after them would add other ranks' unrelated heads into them.
  const ModelWeights& m = gqa_model();
  run_ranks(2, [&](Communicator& comm) {
    auto source = memory_weights(m);
    const ModelWeights s = load_shard(*source, shard_plan(m.config, comm.rank(), 2));
    const ModelProjections p = tensor_parallel(float_projections(s), comm);
    for (const auto& layer : p.layers)
      for (int i = 0; i < kLayerProjections; ++i) {
        const bool row_parallel = dynamic_cast<const RowParallelProjection*>(layer[i].get()) != nullptr;
        EXPECT_EQ(row_parallel, i == kOProj || i == kDownProj) << "projection " << i;
      }
    EXPECT_EQ(dynamic_cast<const RowParallelProjection*>(p.lm_head.get()), nullptr) << "the head is replicated";
  });
}

}  // namespace
}  // namespace infer
