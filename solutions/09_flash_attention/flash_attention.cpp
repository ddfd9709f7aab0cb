// Lesson 09, reference solution: the online softmax and tiled causal attention.
#include "lessons/09_flash_attention/flash_attention.hpp"

#include <algorithm>
#include <cmath>

#include "common/errors.hpp"

namespace infer {

void OnlineSoftmax::add(float score) {
  if (score == -std::numeric_limits<float>::infinity()) return;
  if (score > max) {
    sum = sum * std::exp(max - score) + 1.0f;  // exp(-inf) = 0 when this is the first score
    max = score;
  } else {
    sum += std::exp(score - max);
  }
}

void OnlineSoftmax::merge(const OnlineSoftmax& other) {
  if (other.max == -std::numeric_limits<float>::infinity()) return;
  if (max == -std::numeric_limits<float>::infinity()) {
    *this = other;
    return;
  }
  const float m = std::max(max, other.max);
  sum = sum * std::exp(max - m) + other.sum * std::exp(other.max - m);
  max = m;
}

Vector online_softmax(const Vector& x) {
  require(x.size() > 0, "online_softmax: an empty row has no softmax");
  OnlineSoftmax state;
  for (float v : x) state.add(v);
  Vector out(x.size());
  for (Eigen::Index i = 0; i < x.size(); ++i) out[i] = std::exp(x[i] - state.max) / state.sum;
  return out;
}

Matrix tiled_attention(ConstMatrixRef q, ConstMatrixRef k, ConstMatrixRef v, int heads, int kv_heads, int head_dim,
                       int tile_q, int tile_k) {
  require(tile_q >= 1 && tile_k >= 1, "tiled_attention: tile_q and tile_k must be >= 1, got ", tile_q, " and ", tile_k);
  require(heads > 0 && kv_heads > 0 && head_dim > 0 && heads % kv_heads == 0, "tiled_attention: heads (", heads,
          ") must be a positive multiple of kv_heads (", kv_heads, "), head_dim ", head_dim, " positive");
  require(q.cols() == static_cast<long>(heads) * head_dim, "tiled_attention: query width ", q.cols(), ", expected ",
          heads * head_dim, " (a vector per query head)");
  require(k.cols() == static_cast<long>(kv_heads) * head_dim, "tiled_attention: key width ", k.cols(), ", expected ",
          kv_heads * head_dim, " (a vector per K/V head)");
  require(v.cols() == k.cols(), "tiled_attention: value width ", v.cols(), ", expected ", k.cols(),
          " (as wide as the keys)");
  require(k.rows() == v.rows() && k.rows() >= q.rows(), "tiled_attention: k and v need the same rows, at least ",
          q.rows(), " (one per query); got ", k.rows(), " and ", v.rows());
  const int T = static_cast<int>(q.rows()), S = static_cast<int>(k.rows()), group = heads / kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  Matrix out(T, static_cast<long>(heads) * head_dim);
  // The scratch, sized by the tiles alone and reused for every tile.
  Matrix scores(tile_q, tile_k), acc(tile_q, head_dim);
  Vector m(tile_q), l(tile_q);
  for (int h = 0; h < heads; ++h) {
    const long qc = static_cast<long>(h) * head_dim, kc = static_cast<long>(h / group) * head_dim;
    for (int i0 = 0; i0 < T; i0 += tile_q) {
      const int nq = std::min(tile_q, T - i0);
      const int last = S - T + i0 + nq - 1;  // the tile's last query position: no key after it is seen
      m.head(nq).setConstant(-std::numeric_limits<float>::infinity());
      l.head(nq).setZero();
      acc.topRows(nq).setZero();
      for (int j0 = 0; j0 <= last; j0 += tile_k) {
        const int nk = std::min(tile_k, S - j0);
        auto s = scores.topLeftCorner(nq, nk);
        s.noalias() = q.block(i0, qc, nq, head_dim) * k.block(j0, kc, nk, head_dim).transpose();
        for (int r = 0; r < nq; ++r) {
          const int pos = S - T + i0 + r;  // this query's position: keys after it are masked
          const int seen = std::clamp(pos - j0 + 1, 0, nk);  // this tile's keys at or before it
          auto row = s.row(r).array();
          row.tail(nk - seen).setZero();  // a masked key's weight: exp(-inf) = 0
          if (seen == 0) continue;        // nothing visible in this tile: adds nothing
          auto visible = row.head(seen);
          visible *= scale;
          const float m_new = std::max(m[r], visible.maxCoeff());
          const float correction = std::exp(m[r] - m_new);  // 0 on the first tile a row sees (m = -inf)
          visible = (visible - m_new).exp();  // the whole row at once: Eigen's exp runs in SIMD lanes
          l[r] = l[r] * correction + visible.sum();
          acc.row(r) *= correction;
          m[r] = m_new;
        }
        acc.topRows(nq).noalias() += s * v.block(j0, kc, nk, head_dim);
      }
      for (int r = 0; r < nq; ++r) out.row(i0 + r).segment(qc, head_dim) = acc.row(r) / l[r];
    }
  }
  return out;
}

}  // namespace infer
