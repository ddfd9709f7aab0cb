/// @file flash_attention.hpp
/// @brief Lesson 09's contract: the online softmax, and causal attention computed in tiles so that
/// the matrix of scores never exists in memory (FlashAttention's idea, on the CPU first).
///
/// You implement these in `exercises/09_flash_attention/flash_attention.cpp`.
///
/// A prefill of T tokens against S cached positions (S >= T; the queries are the last T of them)
/// computes, per query head, T x S scores. Lesson 00 computed them a row at a time; a plain GPU
/// kernel writes all of them to memory, softmaxes them and reads them back. FlashAttention walks
/// the scores in tiles of tile_q queries by tile_k keys, keeping for each query row only a running
/// max m, a running sum l and an unnormalized output acc [head_dim]:
///
///     for each tile of keys j0 .. j0 + tile_k - 1 (those a query may see: j <= its position):
///       s = q . k_j / sqrt(head_dim)                       (tile_q x tile_k scores, in scratch)
///       m' = max(m, max_j s);  c = exp(m - m')
///       l = l c + sum_j exp(s_j - m');  acc = acc c + sum_j exp(s_j - m') v_j;  m = m'
///     out = acc / l
///
/// The result equals the plain softmax attention exactly in real arithmetic; in float it differs
/// by rounding only (the tests allow 1e-5 + 1e-4 |ref|).
#pragma once

#include <limits>

#include "common/tensor.hpp"

namespace infer {

/// The running state of a softmax over a stream of scores: the largest score seen and the sum of
/// exp(score - max) over all of them.
struct OnlineSoftmax {
  float max = -std::numeric_limits<float>::infinity();  ///< the largest score so far (-inf: none)
  float sum = 0.0f;                                     ///< sum of exp(score - max) so far

  /// Folds one score in. When it raises the max, the sum so far is first rescaled by
  /// exp(old max - new max); the new score then adds exp(score - max). Never computes exp of a
  /// positive number, so no score overflows, whatever its size. -infinity adds nothing.
  void add(float score);
  /// Folds in another state over other scores: afterwards this state is the one a single stream
  /// of both sets of scores would have given. An empty state (max = -inf) changes nothing, and
  /// merging into an empty state copies the other.
  void merge(const OnlineSoftmax& other);
};

/// softmax(x) computed with an OnlineSoftmax: one pass over x to find max and sum together (add
/// each value), one pass to write exp(x_i - max) / sum. Equal to the two-pass softmax within
/// 1e-6 + 1e-5 |ref| for any finite x, huge, tiny or all equal.
/// @throws infer::Error for an empty x (the message contains "empty")
Vector online_softmax(const Vector& x);

/// Causal grouped-query attention, exactly lesson 00's causal_attention(q, k, v, heads, kv_heads,
/// head_dim) (query row i is position S - T + i and sees keys 0 .. S - T + i), computed in tiles
/// of tile_q query rows by tile_k keys with the online softmax.
///
/// The lesson's point, which the tests measure: besides the returned [T, heads * head_dim]
/// matrix, the call's heap allocations are scratch whose size depends on tile_q, tile_k and
/// head_dim only, never on T or S (the scores of one tile, each tile row's m and l and its
/// accumulator; a tile larger than the sequence may be cut to it). Allocate that scratch once per
/// call (not per head) and reuse it for every tile: an Eigen
/// product with a fresh result allocates, so write products into the scratch
/// (`scores.noalias() = ...`). The tests count every byte the call allocates, freed or not.
///
/// A key tile that lies wholly after a query tile's last position must be skipped, not computed
/// and masked: that halves the work of a causal prefill. (No output shows the difference: the
/// tests count the reads of K instead, and `./course bench 09` times it.)
/// @throws infer::Error for tile_q or tile_k below 1 (the message names "tile_q" or "tile_k"), and
///         for the shapes causal_attention refuses: heads not a positive multiple of kv_heads
///         ("kv_heads"), q not heads * head_dim wide ("query width"), k not kv_heads * head_dim
///         wide ("key width"), v not as wide as k ("value width"), k and v of different rows or
///         fewer keys than queries ("rows"). Each word appears in its own message only.
Matrix tiled_attention(ConstMatrixRef q, ConstMatrixRef k, ConstMatrixRef v, int heads, int kv_heads, int head_dim,
                       int tile_q, int tile_k);

}  // namespace infer
