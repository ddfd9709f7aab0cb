// Lesson 00, reference solution: a Llama-family decoder written plainly. Its projections call
// linear() (common/linear.hpp): x * W^T, streamed over the cores when x has few rows.
#include "lessons/00_naive_decoder/naive_decoder.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/linear.hpp"

namespace infer {

// ------------------------------------------------------------------ the ops --

Matrix rms_norm(ConstMatrixRef x, const Vector& weight, float eps) {
  require(x.cols() == weight.size(), "rms_norm: x has ", x.cols(), " columns but weight has ", weight.size(),
          " entries (expected equal)");
  Matrix out(x.rows(), x.cols());
  for (Eigen::Index t = 0; t < x.rows(); ++t) {
    const float mean_square = x.row(t).squaredNorm() / static_cast<float>(x.cols());
    const float scale = 1.0f / std::sqrt(mean_square + eps);
    out.row(t) = (x.row(t) * scale).cwiseProduct(weight.transpose());
  }
  return out;
}

void apply_rope(MatrixRef x, int head_dim, int start_pos, float theta) {
  require(head_dim > 0 && head_dim % 2 == 0, "apply_rope: head_dim must be positive and even, got ", head_dim);
  require(x.cols() % head_dim == 0, "apply_rope: ", x.cols(), " columns are not a whole number of heads of ",
          head_dim);
  const int half = head_dim / 2;
  const Eigen::Index heads = x.cols() / head_dim;
  for (Eigen::Index t = 0; t < x.rows(); ++t) {
    const double pos = static_cast<double>(start_pos + t);
    for (int i = 0; i < half; ++i) {
      // Angles in double: at position 100,000 an angle is ~100,000 rad, where float keeps ~0.008.
      const double angle = pos * std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
      const float c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));
      for (Eigen::Index h = 0; h < heads; ++h) {
        float& a = x(t, h * head_dim + i);
        float& b = x(t, h * head_dim + i + half);
        const float a0 = a, b0 = b;
        a = a0 * c - b0 * s;
        b = b0 * c + a0 * s;
      }
    }
  }
}

Matrix causal_attention(ConstMatrixRef q, ConstMatrixRef k, ConstMatrixRef v, int num_heads, int num_kv_heads,
                        int head_dim) {
  require(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0,
          "causal_attention: num_heads (", num_heads, ") must be a positive multiple of num_kv_heads (",
          num_kv_heads, ")");
  require(q.cols() == num_heads * head_dim, "causal_attention: q has ", q.cols(), " columns, expected ",
          num_heads * head_dim);
  require(k.cols() == num_kv_heads * head_dim && v.cols() == k.cols(), "causal_attention: k and v need ",
          num_kv_heads * head_dim, " columns, got ", k.cols(), " and ", v.cols());
  require(k.rows() == v.rows() && k.rows() >= q.rows(), "causal_attention: k and v need the same rows, at least q's ",
          q.rows(), "; got ", k.rows(), " and ", v.rows());

  const Eigen::Index T = q.rows(), S = k.rows();
  const int group = num_heads / num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  Matrix out = Matrix::Zero(T, q.cols());
  Eigen::VectorXf scores(S);

  for (int h = 0; h < num_heads; ++h) {
    const int kv = h / group;  // the K/V head this query head shares
    for (Eigen::Index i = 0; i < T; ++i) {
      const Eigen::Index last = S - T + i;  // the query's own position: it sees keys 0..last
      auto qi = q.row(i).segment(h * head_dim, head_dim);
      for (Eigen::Index j = 0; j <= last; ++j) scores[j] = qi.dot(k.row(j).segment(kv * head_dim, head_dim)) * scale;

      const float max = scores.head(last + 1).maxCoeff();  // subtract the max: exp never overflows
      float sum = 0;
      for (Eigen::Index j = 0; j <= last; ++j) sum += scores[j] = std::exp(scores[j] - max);

      auto oi = out.row(i).segment(h * head_dim, head_dim);
      for (Eigen::Index j = 0; j <= last; ++j) oi += (scores[j] / sum) * v.row(j).segment(kv * head_dim, head_dim);
    }
  }
  return out;
}

Matrix swiglu_mlp(ConstMatrixRef x, const LayerWeights& w) {
  const Matrix gate = linear(x, w.gate_proj);
  const Matrix up = linear(x, w.up_proj);
  const Matrix silu = gate.array() / (1.0f + (-gate.array()).exp());
  return linear(silu.cwiseProduct(up), w.down_proj);
}

Matrix forward(const ModelWeights& model, std::span<const int> tokens) {
  const ModelConfig& c = model.config;
  check_tokens(c, tokens, "forward");
  const Eigen::Index T = static_cast<Eigen::Index>(tokens.size());

  Matrix x(T, c.hidden_size);  // the residual stream: one row per token
  for (Eigen::Index t = 0; t < T; ++t) x.row(t) = model.embed_tokens.row(tokens[t]);

  for (const LayerWeights& layer : model.layers) {
    // Attention block: every position's K and V are recomputed here at every step.
    const Matrix h = rms_norm(x, layer.input_layernorm, c.rms_norm_eps);
    Matrix q = linear(h, layer.q_proj);
    Matrix k = linear(h, layer.k_proj);
    const Matrix v = linear(h, layer.v_proj);
    apply_rope(q, c.head_dim, 0, c.rope_theta);
    apply_rope(k, c.head_dim, 0, c.rope_theta);
    const Matrix attn = causal_attention(q, k, v, c.num_attention_heads, c.num_key_value_heads, c.head_dim);
    x += linear(attn, layer.o_proj);

    // MLP block.
    x += swiglu_mlp(rms_norm(x, layer.post_attention_layernorm, c.rms_norm_eps), layer);
  }
  return linear(rms_norm(x, model.norm, c.rms_norm_eps), model.lm_head);
}

// ----------------------------------------------------------------- sampling --

int argmax(const Vector& logits) {
  require(logits.size() > 0, "argmax: empty logits");
  Eigen::Index best = 0;
  for (Eigen::Index i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;  // strict: the first of equal maxima wins
  return static_cast<int>(best);
}

Vector sampling_distribution(const Vector& logits, const SamplingParams& params) {
  params.validate();
  require(logits.size() > 0, "sampling_distribution: empty logits");
  const Eigen::Index n = logits.size();
  Vector probs = Vector::Zero(n);
  if (params.temperature == 0.0f) {
    probs[argmax(logits)] = 1.0f;
    return probs;
  }

  // Softmax at the given temperature, in double so tiny probabilities keep their digits.
  const double max = logits.maxCoeff();
  Eigen::VectorXd p(n);
  for (Eigen::Index i = 0; i < n; ++i) p[i] = std::exp((logits[i] - max) / params.temperature);

  // Token order, most likely first; ties go to the smaller index.
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });

  Eigen::Index keep = n;
  if (params.top_k > 0) keep = std::min<Eigen::Index>(keep, params.top_k);
  if (params.top_p < 1.0f) {
    double total = 0;
    for (Eigen::Index r = 0; r < keep; ++r) total += p[order[r]];
    double mass = 0;
    for (Eigen::Index r = 0; r < keep; ++r) {
      mass += p[order[r]] / total;
      if (mass >= params.top_p) {
        keep = r + 1;
        break;
      }
    }
  }

  double kept_total = 0;
  for (Eigen::Index r = 0; r < keep; ++r) kept_total += p[order[r]];
  for (Eigen::Index r = 0; r < keep; ++r) probs[order[r]] = static_cast<float>(p[order[r]] / kept_total);
  return probs;
}

int sample_from(const Vector& probs, double u) {
  require(probs.size() > 0, "sample_from: empty distribution");
  require(u >= 0.0 && u < 1.0, "sample_from: u must be in [0, 1), got ", u);
  double cumulative = 0;
  int last_nonzero = -1;
  for (Eigen::Index i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0) continue;
    last_nonzero = static_cast<int>(i);
    cumulative += probs[i];
    if (cumulative > u) return last_nonzero;
  }
  require(last_nonzero >= 0, "sample_from: the distribution has no positive entry");
  return last_nonzero;  // rounding left the total a hair below u
}

// --------------------------------------------------------------- generation --

std::vector<int> generate(const ModelWeights& model, std::span<const int> prompt, int max_new_tokens,
                          Sampler& sampler, const TokenCallback& on_token) {
  const ModelConfig& c = model.config;
  check_tokens(c, prompt, "generate");
  require(max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got ", max_new_tokens);
  require(prompt.size() + max_new_tokens <= static_cast<size_t>(c.max_position_embeddings), "generate: prompt of ",
          prompt.size(), " tokens + max_new_tokens ", max_new_tokens, " exceeds the context of ",
          c.max_position_embeddings, " positions");

  std::vector<int> sequence(prompt.begin(), prompt.end());
  std::vector<int> generated;
  for (int step = 0; step < max_new_tokens; ++step) {
    const Matrix logits = forward(model, sequence);  // the whole sequence, every time
    const int next = sampler.next(logits.row(logits.rows() - 1).transpose());
    sequence.push_back(next);
    generated.push_back(next);
    if (on_token) on_token(next);
    if (next == c.eos_token_id) break;
  }
  return generated;
}

}  // namespace infer
