// Lesson 00, your turn: a Llama-family decoder written plainly.
//
// Fill in each function below, replacing the `throw NotImplemented(...)` line. The contract,
// with every shape, is in lessons/00_naive_decoder/naive_decoder.hpp; the lesson text is
// lessons/00_naive_decoder/README.md. Check your work with `./course check 00`.
// Stuck on a function? `./course hint 00 NAME` gives a hint, one tier at a time.
//
// A suggested order, the README's Steps 1 to 5: rms_norm, swiglu_mlp, apply_rope,
// causal_attention, the sampler (argmax, sampling_distribution, sample_from), then forward and
// generate.
#include "lessons/00_naive_decoder/naive_decoder.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace infer {

// ------------------------------------------------------------------ the ops --

Matrix rms_norm(ConstMatrixRef x, const Vector& weight, float eps) {
  // RMSNorm of each row on its own, as the contract's formula says: eps belongs under the
  // square root, so a row of zeros comes out as zeros, never NaN. Returns a new matrix; x is
  // left untouched.
  (void)x, (void)weight, (void)eps;
  throw NotImplemented("00", "rms_norm");
}

void apply_rope(MatrixRef x, int head_dim, int start_pos, float theta) {
  // Rotates every head of every row in place, row t being position start_pos + t, with the
  // "rotate half" pairing of the contract (element i with i + head_dim/2, never with i + 1).
  // Must stay accurate at positions near 100,000, where an angle is about 100,000 radians.
  (void)x, (void)head_dim, (void)start_pos, (void)theta;
  throw NotImplemented("00", "apply_rope");
}

Matrix causal_attention(ConstMatrixRef q, ConstMatrixRef k, ConstMatrixRef v, int num_heads, int num_kv_heads,
                        int head_dim) {
  // softmax(q k^T / sqrt(head_dim)) v for every query head, as the contract describes: query
  // head h shares its K/V head with its group, and query row i (position S - T + i) never sees
  // a key after its own position. Must stay finite when scores are huge (in the thousands).
  (void)q, (void)k, (void)v, (void)num_heads, (void)num_kv_heads, (void)head_dim;
  throw NotImplemented("00", "causal_attention");
}

Matrix swiglu_mlp(ConstMatrixRef x, const LayerWeights& w) {
  // The SwiGLU MLP of the contract, on every row: [T, hidden] in, [T, hidden] out.
  (void)x, (void)w;
  throw NotImplemented("00", "swiglu_mlp");
}

Matrix forward(const ModelWeights& model, std::span<const int> tokens) {
  check_tokens(model.config, tokens, "forward");
  // Logits [T, vocab] for the whole sequence, computed from scratch with the ops above and the
  // data path drawn at the top of the contract header; positions start at 0. Must match the
  // PyTorch model's logits within about 1e-3, so every norm, residual and projection counts.
  throw NotImplemented("00", "forward");
}

// ----------------------------------------------------------------- sampling --

int argmax(const Vector& logits) {
  // The index of the largest logit; of equal maxima, the first (smallest index) wins.
  (void)logits;
  throw NotImplemented("00", "argmax");
}

Vector sampling_distribution(const Vector& logits, const SamplingParams& params) {
  params.validate();
  // A probability per token (non-negative, summing to 1) after temperature, then top-k, then
  // top-p, in that order. Temperature 0 is one-hot at argmax. Ties between equal
  // probabilities go to the smaller index, so top_k keeps exactly min(k, vocab) tokens; top_p
  // measures the mass of what top-k left. Must not overflow on large logits.
  (void)logits;
  throw NotImplemented("00", "sampling_distribution");
}

int sample_from(const Vector& probs, double u) {
  // The first index whose cumulative probability is strictly greater than u: a u exactly on a
  // boundary belongs to the next token. A zero-probability token is never returned, even when
  // rounding leaves the total a hair below u.
  (void)probs, (void)u;
  throw NotImplemented("00", "sample_from");
}

// --------------------------------------------------------------- generation --

std::vector<int> generate(const ModelWeights& model, std::span<const int> prompt, int max_new_tokens,
                          Sampler& sampler, const TokenCallback& on_token) {
  // The generated ids only (not the prompt), at most max_new_tokens of them, stopping right
  // after EOS (model.config.eos_token_id, which is kept). Each new token goes to on_token, if set, as soon as it is chosen.
  // Throws infer::Error before generating anything for an empty prompt or one with an id outside
  // the "vocabulary", a negative max_new_tokens, or a prompt.size() + max_new_tokens that does not
  // fit in the "context" (never silently cut).
  (void)model, (void)prompt, (void)max_new_tokens, (void)sampler, (void)on_token;
  throw NotImplemented("00", "generate");
}

}  // namespace infer
