// Lesson 09, your turn: the online softmax and tiled causal attention.
//
// Replace each `throw NotImplemented(...)`. The contract is
// lessons/09_flash_attention/flash_attention.hpp; the lesson text is
// lessons/09_flash_attention/README.md. `./course check 09` grades this file.
// Stuck on a function? `./course hint 09 NAME` gives a hint, one tier at a time.
#include "lessons/09_flash_attention/flash_attention.hpp"

#include <algorithm>
#include <cmath>

#include "common/errors.hpp"

namespace infer {

void OnlineSoftmax::add(float score) {
  // Keeps max and sum true for every score seen so far, this one included.
  (void)score;
  throw NotImplemented("09", "OnlineSoftmax::add");
}

void OnlineSoftmax::merge(const OnlineSoftmax& other) {
  // Afterwards: the state of one stream of both sets of scores.
  (void)other;
  throw NotImplemented("09", "OnlineSoftmax::merge");
}

Vector online_softmax(const Vector& x) {
  (void)x;
  throw NotImplemented("09", "online_softmax");
}

Matrix tiled_attention(ConstMatrixRef q, ConstMatrixRef k, ConstMatrixRef v, int heads, int kv_heads, int head_dim,
                       int tile_q, int tile_k) {
  // causal_attention's result, tile by tile; scratch sized by the tiles, allocated once.
  (void)q, (void)k, (void)v, (void)heads, (void)kv_heads, (void)head_dim, (void)tile_q, (void)tile_k;
  throw NotImplemented("09", "tiled_attention");
}

}  // namespace infer
