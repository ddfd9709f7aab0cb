/// @file flash_decoding.hpp
/// @brief Lesson 08's contract, the part every machine checks: decode attention over a range of
/// positions as a *partial* (an output and a log-sum-exp), and the exact merge of partials. The
/// CUDA kernels (paged_kernels.hpp) compute the same thing on a device, one block per piece.
///
/// You implement these in `exercises/08_cuda_paged_attention/cpu_side.cpp`.
///
/// Why partials. One query against L cached positions is a softmax over L scores. Split the L
/// positions into S ranges; over range s alone, the softmax gives an output o_s (the values
/// weighted by that range's own softmax) and a normalizer, kept as its logarithm
/// lse_s = log(sum over the range of exp(score)). The whole softmax is recovered exactly:
///
///     M = max_s lse_s,   w_s = exp(lse_s - M),   o = sum_s w_s o_s / sum_s w_s,
///     lse = M + log(sum_s w_s)
///
/// so the ranges can be computed in parallel (by different thread blocks: split-K, or "flash
/// decoding") and merged afterwards. Subtracting M keeps every exp() at most 1, whatever the
/// scores' size.
///
/// Scores are scaled as everywhere in this course: score = q . k / sqrt(head_dim). A range with no
/// positions has lse = -infinity and an output of zeros; the merge gives it weight 0.
#pragma once

#include <span>

#include "common/tensor.hpp"

namespace infer::gpu {

/// Positions [begin, end) of one sequence.
struct PositionRange {
  int begin = 0;  ///< first position
  int end = 0;    ///< one past the last; end == begin for an empty range
};

/// Range `split` of `num_splits` over a sequence of `length` positions: with chunk =
/// ceil(length / num_splits), split s is [min(s * chunk, length), min((s + 1) * chunk, length)).
/// So the first splits hold chunk positions each, one may hold fewer, and the splits after it are
/// empty (begin = end = length): 5 positions in 4 splits are [0, 2), [2, 4), [4, 5), [5, 5). The
/// ranges are disjoint and, in order, cover [0, length) exactly. (The kernels use the same rule,
/// so the CPU can check them split by split.)
/// @throws infer::Error for length < 0, num_splits < 1, or split outside [0, num_splits)
///         (the message names the value).
PositionRange split_range(int length, int num_splits, int split);

/// Decode attention of one query over part of a sequence.
struct AttentionPartial {
  /// [heads, head_dim]: per query head, sum over the range of softmax-within-the-range weight
  /// times value. Zeros for an empty range.
  Matrix out;
  /// [heads]: per query head, log(sum over the range of exp(score)), computed stably (largest
  /// score subtracted before exp, added back after the log). -infinity for an empty range.
  Vector lse;
};

/// The partial of query q [heads * head_dim] (one position's query heads, already rotated) over
/// the positions `range` of k and v [length, kv_heads * head_dim] (a sequence's cached keys and
/// values). Grouped-query: query head h reads K/V head h / (heads / kv_heads).
/// @throws infer::Error, whatever the order of the checks, with a message containing the word given
///         here: "heads" when heads or kv_heads is below 1 or heads is not a multiple of kv_heads;
///         "head_dim" when head_dim is below 1; "query" when q does not hold heads * head_dim
///         values; "key width" when k is not kv_heads * head_dim wide, "value width" when v is
///         not; "rows" when k and v differ in rows; "range" when the range is not inside
///         [0, k.rows()] with begin <= end. The test checks only that each message holds its
///         word; a message that holds no other check's word too is easier to read (a single
///         letter such as "k" would be in every message).
AttentionPartial attention_partial(const Vector& q, ConstMatrixRef k, ConstMatrixRef v, PositionRange range,
                                   int heads, int kv_heads, int head_dim);

/// The exact merge of partials over disjoint ranges of one sequence (the formula above, per query
/// head): the partial of their union. Empty partials (lse = -infinity) count for nothing; if every
/// one is empty the result is empty too (zeros, -infinity), never NaN. Stable for any finite lse:
/// a partial whose lse is 10,000 merges as well as one whose lse is 1.
/// @throws infer::Error for no partials ("no partials"), or partials of different shapes: the
///         message names the first that differs from part 0, counting from 0 ("partial 1" for
///         the second).
AttentionPartial merge_partials(std::span<const AttentionPartial> parts);

/// The shortest range choose_splits() gives a split: below it, the merge would cost about what the
/// split saves (a guess until a GPU report's rows: lesson 10's bench times batch 1's decode by
/// split count at 100 and 400 positions, and the report picks it from them).
inline constexpr int kMinSplitPositions = 64;

/// The number of splits the paged engine uses for a step (given): enough (batch x K/V heads x
/// splits) thread blocks to give each of the device's `multiprocessors` about two, but no split
/// shorter than kMinSplitPositions positions, and 1 when the batch alone fills the device. Throws
/// for values below 1.
int choose_splits(int batch, int kv_heads, int max_length, int multiprocessors);

}  // namespace infer::gpu
