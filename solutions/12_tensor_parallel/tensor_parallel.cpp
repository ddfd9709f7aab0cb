// Lesson 12, the reference: a rank's heads and units, its slice of every matrix read from the
// source, and the all-reduce that completes a row-parallel product.
#include "lessons/12_tensor_parallel/tensor_parallel.hpp"

#include "common/errors.hpp"

namespace infer {

ShardPlan shard_plan(const ModelConfig& config, int rank, int world) {
  require(world >= 1, "shard_plan: a group of ", world, " ranks");
  require(rank >= 0 && rank < world, "shard_plan: rank ", rank, " of a group of ", world);
  const int heads = config.num_attention_heads, kv = config.num_key_value_heads, units = config.intermediate_size;
  require(heads % world == 0, "shard_plan: ", world, " ranks do not divide the ", heads, " query heads");
  require(units % world == 0, "shard_plan: ", world, " ranks do not divide the ", units, " MLP units (intermediate_size)");
  require(kv % world == 0 || world % kv == 0, "shard_plan: ", world, " ranks neither divide the ", kv,
          " K/V heads nor are a multiple of them (each K/V head must live on whole ranks)");
  ShardPlan plan;
  plan.rank = rank, plan.world = world;
  const long per_rank = heads / world;
  plan.heads = {rank * per_rank, (rank + 1) * per_rank};
  // The K/V heads its query heads read: with more ranks than K/V heads, the one they share
  // (held by world / kv ranks); otherwise kv / world of them, its own.
  const long group = config.group_size();
  plan.kv_heads = {plan.heads.begin / group, (plan.heads.end - 1) / group + 1};
  plan.units = {static_cast<long>(rank) * (units / world), static_cast<long>(rank + 1) * (units / world)};
  return plan;
}

ModelWeights load_shard(WeightSource& source, const ShardPlan& plan) {
  const ModelConfig& c = source.config();
  ModelWeights m;
  m.config = rank_config(c, plan);
  const long d = c.head_dim;
  m.embed_tokens = source.matrix("model.embed_tokens.weight");
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = cat("model.layers.", l, ".");
    LayerWeights w;
    w.input_layernorm = source.vector(p + "input_layernorm.weight");
    // Column-parallel: the rows (output features) of this rank's heads and units.
    w.q_proj = source.rows(p + "self_attn.q_proj.weight", plan.heads.begin * d, plan.heads.size() * d);
    w.k_proj = source.rows(p + "self_attn.k_proj.weight", plan.kv_heads.begin * d, plan.kv_heads.size() * d);
    w.v_proj = source.rows(p + "self_attn.v_proj.weight", plan.kv_heads.begin * d, plan.kv_heads.size() * d);
    // Row-parallel: the columns (input features) that read those heads' outputs.
    w.o_proj = source.cols(p + "self_attn.o_proj.weight", plan.heads.begin * d, plan.heads.size() * d);
    w.post_attention_layernorm = source.vector(p + "post_attention_layernorm.weight");
    w.gate_proj = source.rows(p + "mlp.gate_proj.weight", plan.units.begin, plan.units.size());
    w.up_proj = source.rows(p + "mlp.up_proj.weight", plan.units.begin, plan.units.size());
    w.down_proj = source.cols(p + "mlp.down_proj.weight", plan.units.begin, plan.units.size());
    m.layers.push_back(std::move(w));
  }
  m.norm = source.vector("model.norm.weight");
  m.lm_head = source.matrix("lm_head.weight");
  return m;
}

void RowParallelProjection::rows_into(ConstMatrixRef x, MatrixRef y, long first, long count, bool accumulate) const {
  require(y.rows() == x.rows() && y.cols() == rows(), "RowParallelProjection: y is ", y.rows(), " x ", y.cols(),
          ", expected ", x.rows(), " x ", rows());
  require(first >= 0 && count >= 0 && first + count <= rows(), "RowParallelProjection: rows [", first, ", ",
          first + count, ") of W, which has ", rows());
  // This rank's partial sums, alone: y's own values join after the all-reduce, once.
  Matrix partial(x.rows(), rows());
  shard_->rows_into(x, partial, first, count, false);
  Matrix mine = partial.middleCols(first, count);  // contiguous, for the collective
  comm_.all_reduce(mine.data(), mine.size());
  if (accumulate)
    y.middleCols(first, count) += mine;
  else
    y.middleCols(first, count) = mine;
}

ModelProjections tensor_parallel(ModelProjections projections, Communicator& comm) {
  for (auto& layer : projections.layers)
    for (ProjectionIndex i : {kOProj, kDownProj})
      layer[i] = std::make_unique<RowParallelProjection>(std::move(layer[i]), comm);
  return projections;
}

}  // namespace infer
