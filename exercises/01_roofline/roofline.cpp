// Lesson 01, your turn: counting FLOPs and bytes, the roofline, KV-cache memory.
//
// Fill in each function, replacing its `throw NotImplemented(...)`. The contract, with every
// formula, is lessons/01_roofline/roofline.hpp; the lesson text is lessons/01_roofline/README.md.
// Check your work with `./course check 01`.
// Stuck on a function? `./course hint 01 NAME` gives a hint, one tier at a time.
//
// The sections follow the contract header; each names its step of the README, which starts with
// the KV-cache bytes at the end of this file.
#include "lessons/01_roofline/roofline.hpp"

#include <algorithm>
#include <cmath>

namespace infer {

// ------------------------------------------------------------ model shapes --
// Step 2 of the README.

double dense_parameter_count(const ModelShape& s) {
  // Every parameter of a dense Llama of this shape, counted from the shape alone (the contract
  // lists the parts). A tied lm_head is the embedding table itself: it adds nothing.
  (void)s;
  throw NotImplemented("01", "dense_parameter_count");
}

double matmul_parameter_count(const ModelShape& s) {
  // Only what a token is multiplied by: no embedding table (a lookup), no norms (element-wise),
  // but always the lm_head, tied or not.
  (void)s;
  throw NotImplemented("01", "matmul_parameter_count");
}

// ---------------------------------------------------------- work and bytes --
// Step 3.

StepCost prefill_cost(const ModelShape& s, int T, DType weights, DType kv) {
  // The FLOPs and bytes of one T-token prefill, by the contract's formulas: causal, so a query
  // pays only for the keys it sees. Weights are counted from shape.parameters, the published size.
  (void)s, (void)T, (void)weights, (void)kv;
  throw NotImplemented("01", "prefill_cost");
}

StepCost decode_cost(const ModelShape& s, int context, int batch, DType weights, DType kv) {
  // The FLOPs and bytes of one decode step for the whole batch, by the contract's formulas. The
  // weights are read once per step however large the batch: that is batching's whole point.
  (void)s, (void)context, (void)batch, (void)weights, (void)kv;
  throw NotImplemented("01", "decode_cost");
}

// ------------------------------------------------------------- the roofline --
// Step 4.

double ridge_point(const Hardware& hw) {
  (void)hw;
  throw NotImplemented("01", "ridge_point");
}

double attainable_flops(const Hardware& hw, double intensity) {
  (void)hw, (void)intensity;
  throw NotImplemented("01", "attainable_flops");
}

Bound classify(const Hardware& hw, double intensity) {
  // Memory strictly below ridge / 2, Compute strictly above ridge * 2, Transition in between:
  // both edges themselves belong to the Transition band.
  (void)hw, (void)intensity;
  throw NotImplemented("01", "classify");
}

// -------------------------------------------------------------------- time --
// Step 5.

StepTime step_time(const StepCost& cost, const Hardware& hw, int gpus) {
  // Each roof's time on its own (StepTime says which is which), with `gpus` devices sharing
  // both the bytes and the FLOPs evenly. Throws infer::Error mentioning "gpus" for gpus < 1.
  (void)cost, (void)hw, (void)gpus;
  throw NotImplemented("01", "step_time");
}

double max_tokens_per_second(const StepCost& decode, int batch, const Hardware& hw, int gpus) {
  (void)decode, (void)batch, (void)hw, (void)gpus;
  throw NotImplemented("01", "max_tokens_per_second");
}

// ---------------------------------------------------------- KV-cache memory --
// Step 1 (kv_bytes_per_token, kv_bytes, gqa_kv_reduction), then Step 6 (capacity, max_users).

double kv_bytes_per_token(const ModelShape& s, DType kv) {
  // The contract's formula: K and V, in every layer, for the K/V heads only (not the query heads).
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
  // Fills every field of Capacity as its comments in the contract say. Never a negative budget:
  // when weights and overhead take everything, fits is false and the budget and max_tokens are 0.
  (void)s, (void)b, (void)weights, (void)kv;
  throw NotImplemented("01", "capacity");
}

long max_users(const Capacity& cap, int context) {
  (void)cap, (void)context;
  throw NotImplemented("01", "max_users");
}

}  // namespace infer
