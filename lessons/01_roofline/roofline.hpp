/// @file roofline.hpp
/// @brief Lesson 01's contract: counting a step's FLOPs and bytes, the roofline, and
/// KV-cache memory.
///
/// You implement the functions declared here in `exercises/01_roofline/roofline.cpp`.
/// Everything is arithmetic on a model's shape: no model runs. The point is to predict,
/// before running anything, whether a step is limited by compute or by memory bandwidth,
/// and how many users' KV caches fit on a GPU.
///
/// Units: FLOPs (one multiply-add is 2 FLOPs), bytes, seconds. A GiB is 2^30 bytes.
#pragma once

#include <string>
#include <vector>

#include "common/errors.hpp"
#include "common/model_config.hpp"

namespace infer {

/// 2^30: GPU memory sizes and KV-cache totals are quoted in GiB.
inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// ============================================================== data types ==

/// Storage types for weights and the KV cache.
enum class DType {
  F32,   ///< 32-bit float: 4 bytes
  BF16,  ///< bfloat16, float32's exponent and 8 significant bits: 2 bytes
  FP16,  ///< IEEE half precision: 2 bytes
  FP8,   ///< 8-bit float (E4M3 or E5M2): 1 byte
  INT8,  ///< 8-bit integer: 1 byte (the scales beside it not counted)
  INT4,  ///< 4-bit integer: half a byte (the scales not counted)
};

/// Bytes one element occupies: 4, 2, 2, 1, 1, 0.5. (Quantized formats also store scales;
/// this course counts them separately where it matters, in lesson 02.)
inline double bytes_per_element(DType t) {
  switch (t) {
    case DType::F32: return 4.0;
    case DType::BF16: case DType::FP16: return 2.0;
    case DType::FP8: case DType::INT8: return 1.0;
    case DType::INT4: return 0.5;
  }
  throw Error("bytes_per_element: unknown DType");
}

/// "BF16", "INT4", ...
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::FP16: return "FP16";
    case DType::FP8: return "FP8";
    case DType::INT8: return "INT8";
    case DType::INT4: return "INT4";
  }
  return "?";
}

// ============================================================ model shapes ==

/// What the arithmetic needs to know about a Llama-family model.
struct ModelShape {
  std::string name;           ///< for tables
  int num_layers = 0;         ///< decoder layers
  int hidden_size = 0;        ///< residual width
  int num_heads = 0;          ///< query heads
  int num_kv_heads = 0;       ///< K/V heads (== num_heads for multi-head attention)
  int head_dim = 0;           ///< size of one head
  int intermediate_size = 0;  ///< SwiGLU hidden width
  int vocab_size = 0;         ///< vocabulary
  bool tied_embeddings = false;  ///< lm_head shares the embedding matrix
  double parameters = 0;      ///< the published parameter count (what must be loaded)
  bool estimate = false;      ///< true when the shape is a public estimate, not a published config
};

/// Meta's Llama 3 8B: 32 layers, hidden 4096, 32 query / 8 K/V heads of 128, MLP 14336, 128,256 tokens.
inline ModelShape llama3_8b() { return {"Llama-3-8B", 32, 4096, 32, 8, 128, 14336, 128256, false, 8.03e9, false}; }
/// Meta's Llama 3 70B: 80 layers, hidden 8192, 64 query / 8 K/V heads of 128, MLP 28672.
inline ModelShape llama3_70b() { return {"Llama-3-70B", 80, 8192, 64, 8, 128, 28672, 128256, false, 70.6e9, false}; }
/// Meta's Llama 3.1 405B: 126 layers, hidden 16384, 128 query / 8 K/V heads of 128, MLP 53248.
inline ModelShape llama3_405b() {
  return {"Llama-3-405B", 126, 16384, 128, 8, 128, 53248, 128256, false, 405.9e9, false};
}
/// Mistral 7B v0.1: 32 layers, hidden 4096, 32 query / 8 K/V heads of 128, MLP 14336, 32,000 tokens.
inline ModelShape mistral_7b() { return {"Mistral-7B", 32, 4096, 32, 8, 128, 14336, 32000, false, 7.24e9, false}; }
/// A GPT-4-class model as publicly estimated (not published): 120 layers of multi-head
/// attention, 96 heads of 128, about 1.8 trillion parameters in a mixture of experts. Only
/// its KV-cache figures are meaningful; its dense parameter count is not its real one.
inline ModelShape gpt4_class_estimate() {
  return {"GPT-4-class (estimate)", 120, 12288, 96, 96, 128, 49152, 100277, false, 1.8e12, true};
}
/// The five presets above, in that order.
inline std::vector<ModelShape> preset_models() {
  return {llama3_8b(), llama3_70b(), llama3_405b(), mistral_7b(), gpt4_class_estimate()};
}

/// The shape of a model from its Hugging Face config (the bundled models, or any Llama).
/// `parameters` is the dense count of that shape (the config does not state it).
ModelShape shape_from_config(const ModelConfig& config, const std::string& name);

/// Parameters of a dense Llama of this shape: embeddings, every layer's attention
/// projections, SwiGLU MLP and two RMSNorm weights, the final norm, and the lm_head
/// (unless tied to the embeddings).
double dense_parameter_count(const ModelShape& shape);

/// Parameters that a token's forward multiplies by: every matrix except the embedding table
/// (an embedding is a lookup, not a product). The lm_head is counted, tied or not: a tied head
/// is the embedding matrix used once more, as a product this time.
double matmul_parameter_count(const ModelShape& shape);

// ========================================================== work and bytes ==

/// What one forward step does and moves.
struct StepCost {
  double flops = 0;  ///< floating-point operations (a multiply-add is 2)
  double bytes = 0;  ///< bytes moved between memory and the processor

  /// Arithmetic intensity, FLOPs per byte (the "ops:byte ratio").
  double intensity() const { return flops / bytes; }
};

/// Prefill of a T-token prompt, one sequence.
///
/// FLOPs: the matrix products, 2 * matmul_parameter_count * T, plus attention: each layer,
/// each query head, query at position p (1-based) scores p keys and sums p values,
/// 4 * head_dim * p FLOPs; summed over p = 1..T.
/// Bytes: every parameter read once (shape.parameters * weight bytes), plus writing the T
/// tokens' K and V to the cache. A simplification, on the high side: a step reads only its
/// tokens' rows of the embedding table, not all of it (the table is 1.5% of Llama 3 70B's
/// parameters, and 3% of the bundled model's; a tied table is read whole anyway, as lm_head).
/// The weights in `weights`' bytes, the K/V in `kv`'s. Throws infer::Error for T < 1 (the
/// message names T).
StepCost prefill_cost(const ModelShape& shape, int T, DType weights, DType kv);

/// One decode step for a batch of `batch` sequences, each `context` tokens long including
/// the token being decoded.
///
/// FLOPs: 2 * matmul_parameter_count per sequence, plus attention over `context` keys.
/// Bytes: every parameter read once for the whole batch (that is batching's point; the same
/// simplification about the embedding table as prefill_cost), plus, per sequence, reading
/// `context - 1` cached tokens' K and V and writing the new token's. The weights in `weights`'
/// bytes, the K/V in `kv`'s. Throws infer::Error for context < 1 or batch < 1 (the message
/// names the one it refuses: "context" or "batch").
StepCost decode_cost(const ModelShape& shape, int context, int batch, DType weights, DType kv);

// ============================================================= the roofline ==

/// A processor's two roofs.
struct Hardware {
  std::string name;          ///< for tables
  double peak_flops = 0;     ///< FLOP/s at full use of the arithmetic units
  double bandwidth = 0;      ///< bytes/s from main memory (HBM on a GPU, DRAM on a CPU)
  double memory_bytes = 0;   ///< memory per device
};

/// NVIDIA A100 80GB SXM: 312 TFLOP/s dense BF16, about 2 TB/s, 80 GiB.
inline Hardware a100_80gb() { return {"A100-80GB", 312e12, 2.0e12, 80 * kGiB}; }
/// NVIDIA H100 SXM: 989 TFLOP/s dense BF16, 3.35 TB/s, 80 GiB.
inline Hardware h100_sxm() { return {"H100-SXM", 989e12, 3.35e12, 80 * kGiB}; }
/// NVIDIA H200: H100's compute, 4.8 TB/s, 141 GB.
inline Hardware h200() { return {"H200", 989e12, 4.8e12, 141e9}; }

/// The ridge point: the intensity (FLOP/byte) where the two roofs meet, peak / bandwidth.
double ridge_point(const Hardware& hw);

/// Attainable FLOP/s at a given intensity: min(peak, bandwidth * intensity).
double attainable_flops(const Hardware& hw, double intensity);

/// Which roof limits a step.
enum class Bound {
  Memory,      ///< intensity below half the ridge point: bandwidth decides
  Transition,  ///< within a factor of 2 of the ridge point: both matter
  Compute,     ///< intensity above twice the ridge point: arithmetic decides
};

/// Classifies an intensity against the ridge point (see Bound for the bands).
Bound classify(const Hardware& hw, double intensity);

/// "memory", "transition", "compute".
inline const char* bound_name(Bound b) {
  return b == Bound::Memory ? "memory" : (b == Bound::Compute ? "compute" : "transition");
}

// ================================================================== time ==

/// The least time a step can take, from each roof: moving its bytes at full bandwidth, and
/// doing its FLOPs at peak. The step takes at least the longer of the two.
///
/// With tensor parallelism over `gpus` devices, each holds 1/gpus of every weight matrix, so
/// each moves 1/gpus of the bytes and does 1/gpus of the FLOPs, side by side (the traffic
/// between them, an all-reduce per layer, is left out: this is a floor).
struct StepTime {
  double memory_seconds = 0;   ///< bytes / (gpus * bandwidth)
  double compute_seconds = 0;  ///< flops / (gpus * peak_flops)
  /// The floor for the step: the slower of the two roofs.
  double seconds() const { return memory_seconds > compute_seconds ? memory_seconds : compute_seconds; }
};

/// The floor of a step's time on `gpus` devices of `hw` splitting it evenly.
/// Throws infer::Error for gpus < 1 (the message says "gpus").
StepTime step_time(const StepCost& cost, const Hardware& hw, int gpus = 1);

/// The most tokens per second a decode step allows: each of its `batch` sequences gets one
/// token per step, and a step takes at least step_time(cost, hw, gpus).seconds(). Per user,
/// divide by batch. Throws infer::Error for batch < 1 or gpus < 1 (the message names which).
double max_tokens_per_second(const StepCost& decode, int batch, const Hardware& hw, int gpus = 1);

// ========================================================= KV-cache memory ==

/// Bytes of K and V one token occupies across all layers:
/// 2 (K and V) * layers * kv_heads * head_dim * bytes per element.
double kv_bytes_per_token(const ModelShape& shape, DType kv);

/// The same for `tokens` tokens.
double kv_bytes(const ModelShape& shape, double tokens, DType kv);

/// How many times smaller the KV cache is with the shape's K/V heads than with one K/V head
/// per query head (full multi-head attention): num_heads / num_kv_heads.
double gqa_kv_reduction(const ModelShape& shape);

/// A deployment: some GPUs holding one copy of the weights (tensor-parallel), an overhead
/// fraction of the memory for activations and the runtime, the rest for the KV cache.
struct MemoryBudget {
  double gpu_bytes = 80 * kGiB;    ///< memory per GPU
  int num_gpus = 1;                ///< GPUs sharing the model
  double overhead_fraction = 0.1;  ///< of the total memory, kept for activations and the runtime
};

/// What fits.
struct Capacity {
  double weight_bytes = 0;     ///< shape.parameters * weight bytes
  double overhead_bytes = 0;   ///< overhead_fraction of the total memory
  double kv_budget_bytes = 0;  ///< what is left for the KV cache (0 if the weights don't fit)
  long max_tokens = 0;         ///< whole tokens of KV that fit in the budget
  bool fits = false;           ///< whether anything (more than 0 bytes) is left for the KV cache after weights and overhead
};

/// Weights, overhead and KV budget of a deployment, and the tokens of KV it can hold. Throws
/// infer::Error for no GPU or no memory (the message says "GPU"), or an overhead_fraction
/// outside [0, 1) (the message names "overhead_fraction").
Capacity capacity(const ModelShape& shape, const MemoryBudget& budget, DType weights, DType kv);

/// Concurrent users, each holding `context` tokens of KV: max_tokens / context, rounded down.
/// Throws infer::Error for context < 1 (the message says "context").
long max_users(const Capacity& cap, int context);

// ================================================== this machine's roofs (given) ==

/// This machine's memory roof, in bytes per second: a streaming read of `bytes` of float32 split
/// over every core (OpenMP), each summing its own contiguous share with Eigen's vectorized sum;
/// the best of 5 reads. Given.
double measure_read_bandwidth(size_t bytes);

/// This machine's compute roof, in float32 FLOP/s: Eigen's n x n matrix product (blocked,
/// vectorized, on every core), 2 n^3 FLOPs, the best of 5. Given.
double measure_matmul_flops(int n);

}  // namespace infer
