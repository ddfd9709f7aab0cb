// Lesson 01, reference solution: counting FLOPs and bytes, the roofline, KV-cache memory.
#include "lessons/01_roofline/roofline.hpp"

#include <algorithm>
#include <cmath>

namespace infer {

// ------------------------------------------------------------ model shapes --

namespace {

/// Parameters of one decoder layer's matrices (no norms).
double layer_matrix_parameters(const ModelShape& s) {
  const double d = s.hidden_size, q = double(s.num_heads) * s.head_dim, kv = double(s.num_kv_heads) * s.head_dim;
  const double attention = d * q + 2 * d * kv + q * d;  // q_proj, k_proj and v_proj, o_proj
  const double mlp = 3 * d * s.intermediate_size;       // gate_proj, up_proj, down_proj
  return attention + mlp;
}

}  // namespace

double dense_parameter_count(const ModelShape& s) {
  const double embed = double(s.vocab_size) * s.hidden_size;
  const double head = s.tied_embeddings ? 0 : embed;
  const double norms_per_layer = 2.0 * s.hidden_size;
  return embed + head + s.num_layers * (layer_matrix_parameters(s) + norms_per_layer) + s.hidden_size;
}

double matmul_parameter_count(const ModelShape& s) {
  return s.num_layers * layer_matrix_parameters(s) + double(s.vocab_size) * s.hidden_size;
}

// ---------------------------------------------------------- work and bytes --

namespace {

/// Attention FLOPs of one query that sees `keys` keys, over all layers and heads:
/// q.k for each key (2 * head_dim) and the weighted sum of values (2 * head_dim).
double attention_flops(const ModelShape& s, double keys) {
  return 4.0 * s.head_dim * keys * s.num_heads * s.num_layers;
}

}  // namespace

StepCost prefill_cost(const ModelShape& s, int T, DType weights, DType kv) {
  require(T > 0, "prefill_cost: T must be positive, got ", T);
  StepCost c;
  const double t = T;
  // Query p (1-based) sees p keys: sum over p = T(T+1)/2.
  c.flops = 2.0 * matmul_parameter_count(s) * t + attention_flops(s, t * (t + 1) / 2);
  c.bytes = s.parameters * bytes_per_element(weights) + kv_bytes(s, t, kv);
  return c;
}

StepCost decode_cost(const ModelShape& s, int context, int batch, DType weights, DType kv) {
  require(context > 0, "decode_cost: context must be positive (it counts the token being decoded), got ", context);
  require(batch > 0, "decode_cost: batch must be positive, got ", batch);
  StepCost c;
  c.flops = batch * (2.0 * matmul_parameter_count(s) + attention_flops(s, context));
  c.bytes = s.parameters * bytes_per_element(weights)              // the weights, once for the batch
            + batch * kv_bytes(s, context - 1.0, kv)                 // each sequence reads its cache
            + batch * kv_bytes_per_token(s, kv);                     // and writes its new token's K/V
  return c;
}

// ------------------------------------------------------------- the roofline --

double ridge_point(const Hardware& hw) { return hw.peak_flops / hw.bandwidth; }

double attainable_flops(const Hardware& hw, double intensity) {
  return std::min(hw.peak_flops, hw.bandwidth * intensity);
}

Bound classify(const Hardware& hw, double intensity) {
  const double ridge = ridge_point(hw);
  if (intensity < ridge / 2) return Bound::Memory;
  if (intensity > ridge * 2) return Bound::Compute;
  return Bound::Transition;
}

// -------------------------------------------------------------------- time --

StepTime step_time(const StepCost& cost, const Hardware& hw, int gpus) {
  require(gpus >= 1, "step_time: gpus must be >= 1, got ", gpus);
  StepTime t;
  t.memory_seconds = cost.bytes / (gpus * hw.bandwidth);
  t.compute_seconds = cost.flops / (gpus * hw.peak_flops);
  return t;
}

double max_tokens_per_second(const StepCost& decode, int batch, const Hardware& hw, int gpus) {
  require(batch >= 1, "max_tokens_per_second: batch must be >= 1, got ", batch);
  return batch / step_time(decode, hw, gpus).seconds();
}

// ---------------------------------------------------------- KV-cache memory --

double kv_bytes_per_token(const ModelShape& s, DType kv) {
  return 2.0 * s.num_layers * s.num_kv_heads * s.head_dim * bytes_per_element(kv);
}

double kv_bytes(const ModelShape& s, double tokens, DType kv) { return kv_bytes_per_token(s, kv) * tokens; }

double gqa_kv_reduction(const ModelShape& s) { return double(s.num_heads) / s.num_kv_heads; }

Capacity capacity(const ModelShape& s, const MemoryBudget& b, DType weights, DType kv) {
  require(b.num_gpus > 0 && b.gpu_bytes > 0, "capacity: need at least one GPU with memory");
  require(b.overhead_fraction >= 0 && b.overhead_fraction < 1, "capacity: overhead_fraction must be in [0, 1), got ",
          b.overhead_fraction);
  Capacity c;
  const double total = b.gpu_bytes * b.num_gpus;
  c.weight_bytes = s.parameters * bytes_per_element(weights);
  c.overhead_bytes = total * b.overhead_fraction;
  const double left = total - c.weight_bytes - c.overhead_bytes;
  c.fits = left > 0;
  c.kv_budget_bytes = c.fits ? left : 0;
  c.max_tokens = static_cast<long>(std::floor(c.kv_budget_bytes / kv_bytes_per_token(s, kv)));
  return c;
}

long max_users(const Capacity& cap, int context) {
  require(context > 0, "max_users: context must be positive, got ", context);
  return cap.max_tokens / context;
}

}  // namespace infer
