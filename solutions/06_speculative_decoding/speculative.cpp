// Lesson 06, reference solution: exact speculative sampling, two proposers, and the loop.
#include "lessons/06_speculative_decoding/speculative.hpp"

#include <algorithm>
#include <cmath>

namespace infer {

Vector residual_distribution(const Vector& p, const Vector& q) {
  require(p.size() == q.size() && p.size() > 0, "residual_distribution: p has ", p.size(), " entries, q ", q.size());
  for (Eigen::Index i = 0; i < p.size(); ++i)
    require(std::isfinite(p[i]) && std::isfinite(q[i]) && p[i] >= 0 && q[i] >= 0, "residual_distribution: entry ", i,
            " is p ", p[i], ", q ", q[i], "; expected finite probabilities >= 0");
  Vector r = (p - q).cwiseMax(0.0f);
  const double total = r.cast<double>().sum();
  if (total <= 0) return p;
  return (r.cast<double>() / total).cast<float>();
}

Verdict verify_greedy(ConstMatrixRef target_logits, std::span<const int> proposal) {
  const Eigen::Index k = static_cast<Eigen::Index>(proposal.size());
  require(target_logits.rows() == k + 1, "verify_greedy: ", target_logits.rows(), " rows of logits for a proposal of ",
          k, " tokens, expected ", k + 1);
  Verdict v;
  while (v.accepted < k) {
    const int best = argmax(target_logits.row(v.accepted).transpose());
    if (best != proposal[v.accepted]) break;
    ++v.accepted;
  }
  v.next_token = argmax(target_logits.row(v.accepted).transpose());
  return v;
}

Verdict verify_sampled(ConstMatrixRef p, ConstMatrixRef q, std::span<const int> proposal, Rng& rng) {
  const Eigen::Index k = static_cast<Eigen::Index>(proposal.size());
  require(p.rows() == k + 1 && q.rows() == k && p.cols() == q.cols() && p.cols() > 0, "verify_sampled: p is ", p.rows(),
          " x ", p.cols(), " and q ", q.rows(), " x ", q.cols(), " for a proposal of ", k, " tokens; expected p ", k + 1,
          " rows and q ", k, " rows of the same width");
  for (Eigen::Index i = 0; i < k; ++i)
    require(proposal[i] >= 0 && proposal[i] < p.cols(), "verify_sampled: proposed token ", proposal[i], " at index ", i,
            " is outside the vocabulary [0, ", p.cols(), ")");
  Verdict v;
  for (; v.accepted < k; ++v.accepted) {
    const Eigen::Index i = v.accepted;
    const int x = proposal[i];
    if (rng.uniform() * q(i, x) < p(i, x)) continue;  // kept with probability min(1, p/q)
    v.next_token = sample_from(residual_distribution(p.row(i).transpose(), q.row(i).transpose()), rng.uniform());
    return v;
  }
  v.next_token = sample_from(p.row(k).transpose(), rng.uniform());  // every guess kept: the bonus
  return v;
}

// ---------------------------------------------------------------- proposers --

Proposal NgramProposer::propose(std::span<const int> context, int k) {
  const int len = static_cast<int>(context.size());
  Proposal out;
  if (k <= 0) return out;
  for (int n = std::min(max_n_, len - 1); n >= min_n_; --n) {
    const auto pattern = context.last(static_cast<size_t>(n));
    // The most recent earlier occurrence that something follows: it starts at s, s + n < len.
    for (int s = len - n - 1; s >= 0; --s) {
      if (!std::equal(pattern.begin(), pattern.end(), context.begin() + s)) continue;
      const int from = s + n, to = std::min(len, from + k);
      out.tokens.assign(context.begin() + from, context.begin() + to);
      return out;
    }
  }
  return out;
}

Proposal DraftProposer::propose(std::span<const int> context, int k) {
  require(!context.empty(), "DraftProposer::propose: an empty context");
  const int n = static_cast<int>(context.size());
  // Keep the cached tokens that agree with the context, short of its last token.
  size_t keep = 0;
  while (keep < cached_.size() && keep + 1 < context.size() && cached_[keep] == context[keep]) ++keep;
  if (keep < cached_.size()) rollback(static_cast<int>(keep));
  Proposal out;
  if (k <= 0) return out;
  const int vocab = draft_->config.vocab_size;
  out.q.resize(k, vocab);
  // Run what is missing of the context; its last row's logits give the first guess.
  Matrix logits = forward_cached(*draft_, context.subspan(keep), cache_);
  ++forwards_;
  cached_.assign(context.begin(), context.end());
  for (int i = 0; i < k; ++i) {
    const Vector dist = sampling_distribution(logits.row(logits.rows() - 1).transpose(), params_);
    const int token = params_.temperature == 0.0f ? argmax(dist) : sample_from(dist, rng_.uniform());
    out.q.row(i) = dist.transpose();
    out.tokens.push_back(token);
    const int limit = std::min(cache_.max_tokens(), draft_->config.max_position_embeddings);
    if (i + 1 == k || n + i + 1 > limit) break;  // no room to feed this guess back: stop here
    logits = forward_cached(*draft_, std::span(&out.tokens.back(), 1), cache_);
    ++forwards_;
    cached_.push_back(token);
  }
  out.q.conservativeResize(static_cast<Eigen::Index>(out.tokens.size()), vocab);
  return out;
}

void DraftProposer::rollback(int length) {
  require(length >= 0, "DraftProposer::rollback: length must be >= 0, got ", length);
  if (length >= static_cast<int>(cached_.size())) return;
  cache_.truncate(length);
  cached_.resize(static_cast<size_t>(length));
}

// ------------------------------------------------------------------ the loop --

std::vector<int> generate_speculative(TargetModel& target, Proposer& proposer, std::span<const int> prompt,
                                      int max_new_tokens, int k, const SamplingParams& params, KVStore& target_cache,
                                      SpecStats* stats) {
  const ModelConfig& c = target.config();
  check_tokens(c, prompt, "generate_speculative");
  params.validate();
  require(k >= 0, "generate_speculative: k must be >= 0, got ", k);
  require(max_new_tokens >= 0, "generate_speculative: max_new_tokens must be >= 0, got ", max_new_tokens);
  require(prompt.size() + max_new_tokens <= static_cast<size_t>(c.max_position_embeddings),
          "generate_speculative: prompt of ", prompt.size(), " tokens + max_new_tokens ", max_new_tokens,
          " exceeds the context of ", c.max_position_embeddings, " positions");
  require(target_cache.length() == 0, "generate_speculative: the target's cache must start empty, it holds ",
          target_cache.length(), " positions");
  require(prompt.size() + max_new_tokens <= static_cast<size_t>(target_cache.max_tokens()),
          "generate_speculative: the target's cache holds ", target_cache.max_tokens(), " positions, the generation needs ",
          prompt.size() + max_new_tokens);
  SpecStats local;
  SpecStats& st = stats ? *stats : local;
  st = SpecStats{};
  std::vector<int> context(prompt.begin(), prompt.end()), out;
  if (max_new_tokens == 0) return out;
  Rng rng(params.seed);
  if (prompt.size() > 1) {
    target.forward(prompt.first(prompt.size() - 1), target_cache);
    ++st.target_forwards;
  }
  const bool greedy = params.temperature == 0.0f;
  while (static_cast<int>(out.size()) < max_new_tokens) {
    const int want = std::min(k, max_new_tokens - static_cast<int>(out.size()) - 1);
    Proposal prop = want > 0 ? proposer.propose(context, want) : Proposal{};
    const Eigen::Index m = static_cast<Eigen::Index>(prop.tokens.size());
    require(m <= want, "generate_speculative: the proposer returned ", m, " tokens, at most ", want, " were asked for");
    require(prop.q.rows() == 0 || (prop.q.rows() == m && prop.q.cols() == c.vocab_size),
            "generate_speculative: the proposal's q is ", prop.q.rows(), " x ", prop.q.cols(), ", expected 0 rows or ", m,
            " x ", c.vocab_size);
    for (Eigen::Index i = 0; i < m; ++i)
      require(prop.tokens[i] >= 0 && prop.tokens[i] < c.vocab_size, "generate_speculative: proposed token ",
              prop.tokens[i], " is outside the vocabulary [0, ", c.vocab_size, ")");

    std::vector<int> feed{context.back()};
    feed.insert(feed.end(), prop.tokens.begin(), prop.tokens.end());
    const Matrix logits = target.forward(feed, target_cache);  // one forward for the whole round
    ++st.target_forwards;
    Verdict v;
    if (greedy) {
      v = verify_greedy(logits, prop.tokens);
    } else {
      Matrix p(m + 1, c.vocab_size);
      for (Eigen::Index i = 0; i <= m; ++i) p.row(i) = sampling_distribution(logits.row(i).transpose(), params).transpose();
      Matrix q = prop.q;
      if (q.rows() == 0) {
        q = Matrix::Zero(m, c.vocab_size);
        for (Eigen::Index i = 0; i < m; ++i) q(i, prop.tokens[i]) = 1.0f;
      }
      v = verify_sampled(p, q, prop.tokens, rng);
    }
    const int n = static_cast<int>(context.size());
    target_cache.truncate(n + v.accepted);  // the context and the kept guesses; the new token is not fed yet
    proposer.rollback(n + v.accepted);
    ++st.rounds;
    st.proposed += m;
    st.accepted += v.accepted;

    std::vector<int> fresh(prop.tokens.begin(), prop.tokens.begin() + v.accepted);
    fresh.push_back(v.next_token);
    for (int t : fresh) {
      context.push_back(t);
      out.push_back(t);
      if (t == c.eos_token_id || static_cast<int>(out.size()) == max_new_tokens) {
        st.generated = static_cast<long>(out.size());
        return out;
      }
    }
  }
  st.generated = static_cast<long>(out.size());
  return out;
}

}  // namespace infer
