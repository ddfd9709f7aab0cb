/// @file naive_decoder.hpp
/// @brief Lesson 00's contract: a Llama-family decoder written plainly, and a sampler.
///
/// You implement every function declared here in `exercises/00_naive_decoder/naive_decoder.cpp`.
/// The shapes follow one rule: a matrix of activations has one row per token. A linear
/// layer with weight W ([out, in], as stored) maps x ([T, in]) to `x * W.transpose()` ([T, out]).
///
/// The data path you are building:
///
///     token ids -> embed_tokens rows -> N x [ RMSNorm -> attention (+ residual)
///                                            RMSNorm -> SwiGLU MLP (+ residual) ]
///               -> RMSNorm -> lm_head -> logits -> sampler -> next id
///
/// "Naive" means forward() recomputes everything for the whole sequence at every step.
/// That is correct and slow; lesson 02 makes it fast without changing a single logit.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "common/errors.hpp"
#include "common/rng.hpp"
#include "common/tensor.hpp"
#include "common/weights.hpp"

namespace infer {

// ================================================================== the ops ==

/// RMSNorm of every row: `out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight`.
///
/// @param x      [T, n] activations
/// @param weight [n] learned scale
/// @param eps    added under the square root (the config's rms_norm_eps)
/// @return       [T, n]
Matrix rms_norm(ConstMatrixRef x, const Vector& weight, float eps);

/// Rotary position embedding, in place, with Hugging Face Llama's "rotate half" pairing.
///
/// Row t of `x` is the token at position `start_pos + t`; its columns are x.cols() / head_dim
/// consecutive heads of `head_dim` values. Within each head, element i is paired with
/// element i + head_dim/2 (not with its neighbour i + 1), and the pair is rotated by the
/// angle `pos * theta^(-2i / head_dim)` for i in [0, head_dim/2):
///
///     x'[i]          = x[i] * cos(angle_i) - x[i + half] * sin(angle_i)
///     x'[i + half]   = x[i + half] * cos(angle_i) + x[i] * sin(angle_i)
///
/// @param x         [T, heads * head_dim] queries or keys, rotated in place
/// @param head_dim  size of one head (even)
/// @param start_pos position of row 0
/// @param theta     the config's rope_theta
void apply_rope(MatrixRef x, int head_dim, int start_pos, float theta);

/// Causal grouped-query attention, softmax(q k^T / sqrt(head_dim)) v, for every head.
///
/// Query head h reads K/V head `h / (num_heads / num_kv_heads)`: with 8 query heads and 2
/// K/V heads, heads 0-3 share K/V head 0 and heads 4-7 share K/V head 1.
///
/// `k` and `v` may hold more rows than `q`: they are the whole sequence so far (S tokens)
/// and `q` is its last T tokens. Query row i is at position S - T + i and attends to key
/// rows 0 .. S - T + i, inclusive. (With S == T this is ordinary causal attention; lesson
/// 02 calls it with T == 1.)
///
/// @param q [T, num_heads * head_dim], already rotated
/// @param k [S, num_kv_heads * head_dim], already rotated, S >= T
/// @param v [S, num_kv_heads * head_dim]
/// @param num_heads    query heads
/// @param num_kv_heads key/value heads; divides num_heads
/// @param head_dim     size of one head
/// @return  [T, num_heads * head_dim], heads side by side like q
Matrix causal_attention(ConstMatrixRef q, ConstMatrixRef k, ConstMatrixRef v, int num_heads, int num_kv_heads,
                        int head_dim);

/// The SwiGLU MLP: `down_proj( silu(gate_proj x) * up_proj x )`, with silu(z) = z / (1 + e^-z)
/// and * element-wise.
///
/// @param x [T, hidden] (already normalized)
/// @param w the layer whose gate_proj, up_proj and down_proj to use
/// @return  [T, hidden]
Matrix swiglu_mlp(ConstMatrixRef x, const LayerWeights& w);

/// The whole model over `tokens`, from scratch: embed, every layer, final norm, lm_head.
///
/// Position p of the sequence is token `tokens[p]`; positions start at 0.
/// @return [tokens.size(), vocab_size] logits; row p scores the token that follows position p.
/// @throws infer::Error for an empty sequence, one longer than max_position_embeddings, or an
///         id outside the vocabulary (check_tokens() does this for you).
Matrix forward(const ModelWeights& model, std::span<const int> tokens);

/// Checks a token sequence before it reaches the model; throws infer::Error naming `where`,
/// the offending index and the valid range. Given to you: call it first in forward().
inline void check_tokens(const ModelConfig& config, std::span<const int> tokens, const char* where) {
  require(!tokens.empty(), where, ": the token sequence is empty (expected at least one token)");
  require(tokens.size() <= static_cast<size_t>(config.max_position_embeddings), where, ": ", tokens.size(),
          " tokens exceed the model's context of ", config.max_position_embeddings, " positions");
  for (size_t i = 0; i < tokens.size(); ++i) {
    require(tokens[i] >= 0 && tokens[i] < config.vocab_size, where, ": token ", tokens[i], " at index ", i,
            " is outside the vocabulary [0, ", config.vocab_size, ")");
  }
}

// ================================================================= sampling ==

/// How to choose the next token. Applied in this order: temperature, top-k, top-p.
struct SamplingParams {
  float temperature = 1.0f;  ///< 0 means greedy; otherwise logits are divided by it
  int top_k = 0;             ///< keep only the k most likely tokens; 0 keeps all
  float top_p = 1.0f;        ///< keep the smallest set of most likely tokens whose mass reaches top_p; in (0, 1]
  uint64_t seed = 0;         ///< seeds the sampler's Rng: the same seed gives the same tokens

  /// Throws infer::Error for a negative temperature or top_k, or top_p outside (0, 1].
  void validate() const {
    require(temperature >= 0.0f, "SamplingParams: temperature must be >= 0 (0 means greedy), got ", temperature);
    require(top_k >= 0, "SamplingParams: top_k must be >= 0 (0 keeps every token), got ", top_k);
    require(top_p > 0.0f && top_p <= 1.0f, "SamplingParams: top_p must be in (0, 1], got ", top_p);
  }
};

/// Index of the largest logit; on a tie, the smallest such index.
int argmax(const Vector& logits);

/// The distribution the sampler draws from, after temperature, top-k and top-p.
///
/// - temperature 0: all mass on argmax(logits).
/// - otherwise: softmax(logits / temperature), computed stably (subtract the max first).
/// - top_k > 0: zero every token outside the k largest (ranked by probability, which orders
///   tokens exactly as the logits do; ties broken towards the smaller index, so exactly
///   min(k, vocab) tokens stay), then renormalize.
/// - top_p < 1: sort the remaining tokens by probability (largest first, ties by index),
///   keep the shortest prefix whose total reaches top_p (total >= top_p), zero the rest,
///   renormalize.
///
/// @return a probability for every token: non-negative, summing to 1.
Vector sampling_distribution(const Vector& logits, const SamplingParams& params);

/// Inverse-CDF sampling: the first index i where probs[0] + ... + probs[i] > u.
/// @param probs a distribution (non-negative, sums to 1)
/// @param u     a uniform number in [0, 1)
/// If rounding leaves the total just below u, return the last index with non-zero probability.
int sample_from(const Vector& probs, double u);

/// Draws tokens with SamplingParams and a seeded Rng. Given to you: it is the plumbing around
/// the two functions above.
class Sampler {
 public:
  /// Validates `params` and seeds the generator with params.seed.
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) { params_.validate(); }

  /// The next token for one row of logits. One uniform draw per call (none when greedy).
  int next(const Vector& logits) {
    if (params_.temperature == 0.0f) return argmax(logits);
    return sample_from(sampling_distribution(logits, params_), rng_.uniform());
  }

  /// The parameters in use.
  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  Rng rng_;
};

// =============================================================== generation ==

/// Called with each new token as soon as it is chosen (to stream text).
using TokenCallback = std::function<void(int token)>;

/// The naive generation loop: run forward() over the whole sequence, pick the next token
/// from the last row of logits, append it, repeat.
///
/// Stops after `max_new_tokens` tokens, or right after the model emits EOS, the model's own
/// `model.config.eos_token_id` (EOS is kept in the result).
/// @return the generated ids only, not the prompt
/// @throws infer::Error if the prompt is empty or holds an id outside the vocabulary (the
///         message mentions the "vocabulary"; check_tokens() says it for you), if
///         max_new_tokens is negative, or if prompt.size() + max_new_tokens exceeds the context
///         (the message mentions the "context"; nothing is silently cut).
std::vector<int> generate(const ModelWeights& model, std::span<const int> prompt, int max_new_tokens,
                          Sampler& sampler, const TokenCallback& on_token = {});

}  // namespace infer
