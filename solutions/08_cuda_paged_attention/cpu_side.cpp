// Lesson 08, the CPU side (reference solution): split ranges, partial attention, the exact merge.
#include <algorithm>
#include <cmath>
#include <limits>

#include "common/errors.hpp"
#include "lessons/08_cuda_paged_attention/flash_decoding.hpp"

namespace infer::gpu {

PositionRange split_range(int length, int num_splits, int split) {
  require(length >= 0, "split_range: length must be >= 0, got ", length);
  require(num_splits >= 1, "split_range: num_splits must be >= 1, got ", num_splits);
  require(split >= 0 && split < num_splits, "split_range: split ", split, " is outside [0, ", num_splits, ")");
  const long chunk = (static_cast<long>(length) + num_splits - 1) / num_splits;
  const int begin = static_cast<int>(std::min<long>(split * chunk, length));
  const int end = static_cast<int>(std::min<long>((split + 1) * chunk, length));
  return {begin, end};
}

AttentionPartial attention_partial(const Vector& q, ConstMatrixRef k, ConstMatrixRef v, PositionRange range, int heads,
                                   int kv_heads, int head_dim) {
  require(heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0, "attention_partial: heads ", heads, " and kv_heads ",
          kv_heads, " (expected both >= 1, heads a multiple of kv_heads)");
  require(head_dim >= 1, "attention_partial: head_dim must be >= 1, got ", head_dim);
  require(q.size() == static_cast<long>(heads) * head_dim, "attention_partial: the query holds ", q.size(),
          " numbers, expected ", heads * head_dim, " (a vector per query head)");
  require(k.cols() == static_cast<long>(kv_heads) * head_dim, "attention_partial: key width ", k.cols(),
          ", expected ", kv_heads * head_dim, " (a vector per K/V head)");
  require(v.cols() == k.cols(), "attention_partial: value width ", v.cols(), ", expected ", k.cols(),
          " (as wide as the keys)");
  require(v.rows() == k.rows(), "attention_partial: k has ", k.rows(), " rows and v ", v.rows(), " (expected equal)");
  require(range.begin >= 0 && range.begin <= range.end && range.end <= k.rows(), "attention_partial: range [",
          range.begin, ", ", range.end, ") is not inside [0, ", k.rows(), "]");
  AttentionPartial p{Matrix::Zero(heads, head_dim), Vector::Constant(heads, -std::numeric_limits<float>::infinity())};
  if (range.begin == range.end) return p;
  const int group = heads / kv_heads, n = range.end - range.begin;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  Vector scores(n);
  for (int h = 0; h < heads; ++h) {
    const long col = static_cast<long>(h / group) * head_dim;
    const auto qh = q.segment(static_cast<long>(h) * head_dim, head_dim);
    for (int j = 0; j < n; ++j) scores[j] = k.row(range.begin + j).segment(col, head_dim).dot(qh.transpose()) * scale;
    const float m = scores.maxCoeff();
    float sum = 0.0f;
    for (int j = 0; j < n; ++j) {
      const float w = std::exp(scores[j] - m);
      sum += w;
      p.out.row(h) += w * v.row(range.begin + j).segment(col, head_dim);
    }
    p.out.row(h) /= sum;
    p.lse[h] = m + std::log(sum);
  }
  return p;
}

AttentionPartial merge_partials(std::span<const AttentionPartial> parts) {
  require(!parts.empty(), "merge_partials: no partials to merge");
  const long heads = parts[0].out.rows(), head_dim = parts[0].out.cols();
  for (size_t s = 0; s < parts.size(); ++s)
    require(parts[s].out.rows() == heads && parts[s].out.cols() == head_dim && parts[s].lse.size() == heads,
            "merge_partials: partial ", s, " is ", parts[s].out.rows(), " x ", parts[s].out.cols(), " with ",
            parts[s].lse.size(), " lse values, partial 0 is ", heads, " x ", head_dim);
  const float inf = std::numeric_limits<float>::infinity();
  AttentionPartial merged{Matrix::Zero(heads, head_dim), Vector::Constant(heads, -inf)};
  for (long h = 0; h < heads; ++h) {
    float m = -inf;
    for (const AttentionPartial& p : parts) m = std::max(m, p.lse[h]);
    if (m == -inf) continue;  // every part empty
    float total = 0.0f;
    for (const AttentionPartial& p : parts) {
      if (p.lse[h] == -inf) continue;
      const float w = std::exp(p.lse[h] - m);
      total += w;
      merged.out.row(h) += w * p.out.row(h);
    }
    merged.out.row(h) /= total;
    merged.lse[h] = m + std::log(total);
  }
  return merged;
}

}  // namespace infer::gpu
