// Lesson 12, your turn: one model split over N ranks.
//
// Replace each `throw NotImplemented(...)`. The contract is lessons/12_tensor_parallel/tensor_parallel.hpp;
// the lesson text is lessons/12_tensor_parallel/README.md. Check your work with `./course check 12`.
// What is given (the communicators, the weight sources, rank_config() and the engine's runner over
// the group) is in lessons/12_tensor_parallel/given.cpp.
// Stuck on a function? `./course hint 12 NAME` gives a hint, one tier at a time.
#include "lessons/12_tensor_parallel/tensor_parallel.hpp"

#include "common/errors.hpp"

namespace infer {

ShardPlan shard_plan(const ModelConfig& config, int rank, int world) {
  // Rank `rank`'s query heads, K/V heads and MLP units out of `world` equal contiguous ranges
  // (rank r the r-th). Its K/V heads are the ones its query heads read (query head h reads K/V
  // head h / group_size()): its own when the ranks do not outnumber the K/V heads, one shared
  // with world / num_key_value_heads ranks when they do. Refuses a world below 1, a rank outside
  // [0, world), and a world that does not divide the query heads or the units, or neither divides
  // nor is a multiple of the K/V heads, each with an infer::Error whose message the header states:
  // the world and the count it does not divide; "rank" for a rank outside the group; "K/V" for
  // the K/V heads.
  (void)config, (void)rank, (void)world;
  throw NotImplemented("12", "shard_plan");
}

ModelWeights load_shard(WeightSource& source, const ShardPlan& plan) {
  // The rank's shard, config rank_config(source.config(), plan): q/k/v/gate/up cut to the rows of
  // its heads, K/V heads and units; o/down to the columns of its heads and units; embedding, norms
  // and output head whole. What it keeps true: source.bytes_read() grows by the shard's bytes,
  // never by a whole split matrix.
  (void)source, (void)plan;
  throw NotImplemented("12", "load_shard");
}

void RowParallelProjection::rows_into(ConstMatrixRef x, MatrixRef y, long first, long count, bool accumulate) const {
  // y[:, first + i] = the sum over the ranks of x shard_^T (rows [first, first + count) of W, and
  // only those asked of the shard), i in [0, count); with `accumulate`, added to what y held,
  // which counts once, not once per rank.
  // One all-reduce through comm_ per call, of this call's floats. Refuses a y that is not
  // [x.rows(), rows()] and rows outside W.
  (void)x, (void)y, (void)first, (void)count, (void)accumulate;
  throw NotImplemented("12", "RowParallelProjection::rows_into");
}

ModelProjections tensor_parallel(ModelProjections projections, Communicator& comm) {
  // The same projections, with those whose products this rank only holds part of (a partial sum
  // of every output) wrapped in RowParallelProjection over `comm`; the others unchanged.
  (void)projections, (void)comm;
  throw NotImplemented("12", "tensor_parallel");
}

}  // namespace infer
