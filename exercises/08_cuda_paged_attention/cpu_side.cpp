// Lesson 08, your turn, the CPU side: split ranges, partial attention, the exact merge.
//
// Replace each `throw NotImplemented(...)`. The contract is
// lessons/08_cuda_paged_attention/flash_decoding.hpp; the lesson text is
// lessons/08_cuda_paged_attention/README.md. `./course check 08` grades this file on any machine;
// the kernels (kernels.cu) are graded where a GPU is, or emulated by `./course check 08 --emulate`.
// Stuck on a function? `./course hint 08 NAME` gives a hint, one tier at a time.
#include <cmath>
#include <limits>

#include "common/errors.hpp"
#include "lessons/08_cuda_paged_attention/flash_decoding.hpp"

namespace infer::gpu {

PositionRange split_range(int length, int num_splits, int split) {
  // Split `split` of `num_splits` chunks of ceil(length / num_splits); the ranges tile [0, length).
  (void)length, (void)num_splits, (void)split;
  throw NotImplemented("08", "split_range");
}

AttentionPartial attention_partial(const Vector& q, ConstMatrixRef k, ConstMatrixRef v, PositionRange range, int heads,
                                   int kv_heads, int head_dim) {
  // Per query head: the softmax over the range alone, its weighted values, and its log-sum-exp.
  (void)q, (void)k, (void)v, (void)range, (void)heads, (void)kv_heads, (void)head_dim;
  throw NotImplemented("08", "attention_partial");
}

AttentionPartial merge_partials(std::span<const AttentionPartial> parts) {
  // The partial of the union of the parts' ranges, exactly; empty parts weigh nothing.
  (void)parts;
  throw NotImplemented("08", "merge_partials");
}

}  // namespace infer::gpu
