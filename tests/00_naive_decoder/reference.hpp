// Plain double-precision references for lesson 00's tests: loops a reader can check by eye,
// with no Eigen tricks, so that a mistake in the code under test cannot hide in them too.
#pragma once

#include <cmath>
#include <span>
#include <vector>

#include "common/rng.hpp"
#include "common/tensor.hpp"
#include "common/weights.hpp"

namespace infer::reference {

using Rows = std::vector<std::vector<double>>;  // [T][n]

inline Rows to_rows(const Matrix& m) {
  Rows r(m.rows(), std::vector<double>(m.cols()));
  for (Eigen::Index i = 0; i < m.rows(); ++i)
    for (Eigen::Index j = 0; j < m.cols(); ++j) r[i][j] = m(i, j);
  return r;
}

inline Matrix to_matrix(const Rows& r) {
  Matrix m(static_cast<Eigen::Index>(r.size()), r.empty() ? 0 : static_cast<Eigen::Index>(r[0].size()));
  for (size_t i = 0; i < r.size(); ++i)
    for (size_t j = 0; j < r[i].size(); ++j) m(i, j) = static_cast<float>(r[i][j]);
  return m;
}

inline Matrix random_matrix(long rows, long cols, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  Matrix m(rows, cols);
  for (long i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>(scale * rng.normal());
  return m;
}

// y = x W^T with W [out][in]
inline Rows linear(const Rows& x, const Matrix& w) {
  Rows y(x.size(), std::vector<double>(w.rows(), 0.0));
  for (size_t t = 0; t < x.size(); ++t)
    for (Eigen::Index o = 0; o < w.rows(); ++o)
      for (Eigen::Index i = 0; i < w.cols(); ++i) y[t][o] += x[t][i] * w(o, i);
  return y;
}

inline Rows rms_norm(const Rows& x, const Vector& w, double eps) {
  Rows y = x;
  for (size_t t = 0; t < x.size(); ++t) {
    double ms = 0;
    for (double v : x[t]) ms += v * v;
    ms /= static_cast<double>(x[t].size());
    for (size_t i = 0; i < x[t].size(); ++i) y[t][i] = x[t][i] / std::sqrt(ms + eps) * w[i];
  }
  return y;
}

// Rotate-half RoPE: element i pairs with i + head_dim/2.
inline Rows rope(const Rows& x, int head_dim, int start_pos, double theta) {
  Rows y = x;
  const int half = head_dim / 2;
  for (size_t t = 0; t < x.size(); ++t) {
    const double pos = static_cast<double>(start_pos) + static_cast<double>(t);
    for (size_t h = 0; h < x[t].size() / head_dim; ++h)
      for (int i = 0; i < half; ++i) {
        const double angle = pos * std::pow(theta, -2.0 * i / head_dim);
        const double a = x[t][h * head_dim + i], b = x[t][h * head_dim + i + half];
        y[t][h * head_dim + i] = a * std::cos(angle) - b * std::sin(angle);
        y[t][h * head_dim + i + half] = b * std::cos(angle) + a * std::sin(angle);
      }
  }
  return y;
}

inline Rows attention(const Rows& q, const Rows& k, const Rows& v, int heads, int kv_heads, int hd) {
  const size_t T = q.size(), S = k.size();
  Rows out(T, std::vector<double>(static_cast<size_t>(heads) * hd, 0.0));
  for (int h = 0; h < heads; ++h) {
    const int g = h / (heads / kv_heads);
    for (size_t i = 0; i < T; ++i) {
      const size_t last = S - T + i;
      std::vector<double> s(last + 1);
      double mx = -1e300;
      for (size_t j = 0; j <= last; ++j) {
        double d = 0;
        for (int e = 0; e < hd; ++e) d += q[i][h * hd + e] * k[j][g * hd + e];
        s[j] = d / std::sqrt(static_cast<double>(hd));
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (auto& x : s) sum += (x = std::exp(x - mx));
      for (size_t j = 0; j <= last; ++j)
        for (int e = 0; e < hd; ++e) out[i][h * hd + e] += s[j] / sum * v[j][g * hd + e];
    }
  }
  return out;
}

inline Rows swiglu(const Rows& x, const LayerWeights& w) {
  Rows g = linear(x, w.gate_proj), u = linear(x, w.up_proj);
  for (size_t t = 0; t < g.size(); ++t)
    for (size_t i = 0; i < g[t].size(); ++i) g[t][i] = g[t][i] / (1.0 + std::exp(-g[t][i])) * u[t][i];
  return linear(g, w.down_proj);
}

inline Matrix forward(const ModelWeights& m, std::span<const int> tokens) {
  const ModelConfig& c = m.config;
  Rows x(tokens.size(), std::vector<double>(c.hidden_size));
  for (size_t t = 0; t < tokens.size(); ++t)
    for (int i = 0; i < c.hidden_size; ++i) x[t][i] = m.embed_tokens(tokens[t], i);
  for (const auto& l : m.layers) {
    const Rows h = rms_norm(x, l.input_layernorm, c.rms_norm_eps);
    const Rows q = rope(linear(h, l.q_proj), c.head_dim, 0, c.rope_theta);
    const Rows k = rope(linear(h, l.k_proj), c.head_dim, 0, c.rope_theta);
    const Rows a = linear(attention(q, k, linear(h, l.v_proj), c.num_attention_heads, c.num_key_value_heads,
                                    c.head_dim),
                          l.o_proj);
    for (size_t t = 0; t < x.size(); ++t)
      for (int i = 0; i < c.hidden_size; ++i) x[t][i] += a[t][i];
    const Rows f = swiglu(rms_norm(x, l.post_attention_layernorm, c.rms_norm_eps), l);
    for (size_t t = 0; t < x.size(); ++t)
      for (int i = 0; i < c.hidden_size; ++i) x[t][i] += f[t][i];
  }
  return to_matrix(linear(rms_norm(x, m.norm, c.rms_norm_eps), m.lm_head));
}

}  // namespace infer::reference
