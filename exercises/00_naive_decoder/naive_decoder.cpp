// Lesson 00, your turn: a Llama-family decoder written plainly.
//
// Fill in each function below, replacing the `throw NotImplemented(...)` line. The contract,
// with every shape, is in lessons/00_naive_decoder/naive_decoder.hpp; the lesson text is
// lessons/00_naive_decoder/README.md. Check your work with `./course check 00`.
//
// A suggested order: rms_norm, swiglu_mlp, apply_rope, causal_attention, forward, then the
// sampler (argmax, sampling_distribution, sample_from) and generate.
#include "lessons/00_naive_decoder/naive_decoder.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace infer {

// ------------------------------------------------------------------ the ops --

Matrix rms_norm(ConstMatrixRef x, const Vector& weight, float eps) {
  // For every row t: divide x.row(t) by sqrt(mean of its squares + eps), then multiply
  // element-wise by weight. Eigen: x.row(t).squaredNorm(), .cwiseProduct(weight.transpose()).
  (void)x, (void)weight, (void)eps;
  throw NotImplemented("00", "rms_norm");
}

void apply_rope(MatrixRef x, int head_dim, int start_pos, float theta) {
  // For every row t (position start_pos + t), every pair i in [0, head_dim/2) and every head:
  // rotate (x[h*head_dim + i], x[h*head_dim + i + half]) by angle pos * theta^(-2i/head_dim).
  // Compute the angle in double: positions reach the hundreds of radians.
  (void)x, (void)head_dim, (void)start_pos, (void)theta;
  throw NotImplemented("00", "apply_rope");
}

Matrix causal_attention(ConstMatrixRef q, ConstMatrixRef k, ConstMatrixRef v, int num_heads, int num_kv_heads,
                        int head_dim) {
  // For every query head h (reading K/V head h / (num_heads / num_kv_heads)) and every query
  // row i (position S - T + i): scores over keys 0..S-T+i, scaled by 1/sqrt(head_dim);
  // a softmax that subtracts the maximum first; the weighted sum of the value rows.
  // Head h's slice of a row is row.segment(h * head_dim, head_dim).
  (void)q, (void)k, (void)v, (void)num_heads, (void)num_kv_heads, (void)head_dim;
  throw NotImplemented("00", "causal_attention");
}

Matrix swiglu_mlp(ConstMatrixRef x, const LayerWeights& w) {
  // gate = x W_gate^T, up = x W_up^T; silu(gate) * up element-wise; then times W_down^T.
  (void)x, (void)w;
  throw NotImplemented("00", "swiglu_mlp");
}

Matrix forward(const ModelWeights& model, std::span<const int> tokens) {
  check_tokens(model.config, tokens, "forward");
  // 1. x = the embedding rows of the tokens ([T, hidden]).
  // 2. For each layer: h = rms_norm(x); q, k, v projections; RoPE on q and k (positions from 0);
  //    x += causal_attention(...) * o_proj^T;  x += swiglu_mlp(rms_norm(x, post-attention weight)).
  // 3. Return rms_norm(x, model.norm) * lm_head^T.
  throw NotImplemented("00", "forward");
}

// ----------------------------------------------------------------- sampling --

int argmax(const Vector& logits) {
  // The first index of the largest value.
  (void)logits;
  throw NotImplemented("00", "argmax");
}

Vector sampling_distribution(const Vector& logits, const SamplingParams& params) {
  params.validate();
  // temperature 0 -> one-hot at argmax. Otherwise a stable softmax of logits / temperature,
  // then keep the top_k most likely (if top_k > 0), then the shortest most-likely prefix whose
  // mass reaches top_p (if top_p < 1); zero the rest and renormalize. std::stable_sort over
  // indices gives the "ties by index" order the contract asks for.
  (void)logits;
  throw NotImplemented("00", "sampling_distribution");
}

int sample_from(const Vector& probs, double u) {
  // Walk the cumulative sum; return the first index where it exceeds u.
  (void)probs, (void)u;
  throw NotImplemented("00", "sample_from");
}

// --------------------------------------------------------------- generation --

std::vector<int> generate(const ModelWeights& model, std::span<const int> prompt, int max_new_tokens,
                          Sampler& sampler, const TokenCallback& on_token) {
  // Validate (see the contract), then loop: logits = forward(whole sequence); next =
  // sampler.next(last row of logits, as a Vector); append; call on_token; stop after EOS.
  (void)model, (void)prompt, (void)max_new_tokens, (void)sampler, (void)on_token;
  throw NotImplemented("00", "generate");
}

}  // namespace infer
