// Lesson 01, your turn: counting FLOPs and bytes, the roofline, KV-cache memory.
//
// Fill in each function, replacing its `throw NotImplemented(...)`. The contract, with every
// formula, is lessons/01_roofline/roofline.hpp; the lesson text is lessons/01_roofline/README.md.
// Check your work with `./course check 01`.
#include "lessons/01_roofline/roofline.hpp"

#include <algorithm>
#include <cmath>

namespace infer {

// ------------------------------------------------------------ model shapes --

double dense_parameter_count(const ModelShape& s) {
  // Embedding table + lm_head (unless tied) + per layer (q, k, v, o projections, the three MLP
  // matrices, two norm vectors) + the final norm. K and V have num_kv_heads * head_dim rows.
  (void)s;
  throw NotImplemented("01", "dense_parameter_count");
}

double matmul_parameter_count(const ModelShape& s) {
  // Every matrix a token is multiplied by: the layers' matrices and the lm_head, not the
  // embedding table (a lookup) nor the norms (element-wise).
  (void)s;
  throw NotImplemented("01", "matmul_parameter_count");
}

// ---------------------------------------------------------- work and bytes --

StepCost prefill_cost(const ModelShape& s, int T, DType weights, DType kv) {
  // FLOPs: 2 per matmul parameter per token, plus attention: 4 * head_dim FLOPs per (query, key)
  // pair, per head, per layer; query p of T sees p keys. Bytes: weights once + T tokens' K/V written.
  (void)s, (void)T, (void)weights, (void)kv;
  throw NotImplemented("01", "prefill_cost");
}

StepCost decode_cost(const ModelShape& s, int context, int batch, DType weights, DType kv) {
  // Per sequence: one token's matmuls and attention over `context` keys. Bytes: the weights
  // once for the whole batch; per sequence, context - 1 cached tokens read and one written.
  (void)s, (void)context, (void)batch, (void)weights, (void)kv;
  throw NotImplemented("01", "decode_cost");
}

// ------------------------------------------------------------- the roofline --

double ridge_point(const Hardware& hw) {
  (void)hw;
  throw NotImplemented("01", "ridge_point");
}

double attainable_flops(const Hardware& hw, double intensity) {
  (void)hw, (void)intensity;
  throw NotImplemented("01", "attainable_flops");
}

Bound classify(const Hardware& hw, double intensity) {
  // Below ridge / 2: Memory. Above ridge * 2: Compute. In between: Transition.
  (void)hw, (void)intensity;
  throw NotImplemented("01", "classify");
}

// ---------------------------------------------------------- KV-cache memory --

double kv_bytes_per_token(const ModelShape& s, DType kv) {
  // 2 (K and V) * layers * K/V heads * head_dim * bytes_per_element(kv).
  (void)s, (void)kv;
  throw NotImplemented("01", "kv_bytes_per_token");
}

double kv_bytes(const ModelShape& s, double tokens, DType kv) {
  (void)s, (void)tokens, (void)kv;
  throw NotImplemented("01", "kv_bytes");
}

double gqa_kv_reduction(const ModelShape& s) {
  (void)s;
  throw NotImplemented("01", "gqa_kv_reduction");
}

Capacity capacity(const ModelShape& s, const MemoryBudget& b, DType weights, DType kv) {
  // Total = gpu_bytes * num_gpus. Weights = parameters * weight bytes. Overhead = total *
  // overhead_fraction. KV budget = what is left (0 and fits = false if nothing is).
  // max_tokens = whole tokens of KV in the budget.
  (void)s, (void)b, (void)weights, (void)kv;
  throw NotImplemented("01", "capacity");
}

long max_users(const Capacity& cap, int context) {
  (void)cap, (void)context;
  throw NotImplemented("01", "max_users");
}

}  // namespace infer
