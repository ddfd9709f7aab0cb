// Lesson 06, reference solution: exact speculative sampling, two proposers, and the loop.
#include "lessons/06_speculative_decoding/speculative.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

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

void DraftProposer::catch_up(std::span<const int> context) {
  require(!context.empty(), "DraftProposer: an empty context");
  // Keep the cached tokens that agree with the context, short of its last token; run the rest.
  const size_t want = context.size() - 1;
  size_t keep = 0;
  while (keep < cached_.size() && keep < want && cached_[keep] == context[keep]) ++keep;
  rollback(static_cast<int>(keep));
  if (keep == want) return;
  draft_.forward(context.subspan(keep, want - keep), *cache_);
  ++forwards_;
  cached_.assign(context.begin(), context.begin() + static_cast<std::ptrdiff_t>(want));
}

Proposal DraftProposer::propose(std::span<const int> context, int k) {
  catch_up(context);
  Proposal out;
  if (k <= 0) return out;
  const int n = static_cast<int>(context.size()), vocab = draft_.config().vocab_size;
  const int limit = std::min(cache_->max_tokens(), draft_.config().max_position_embeddings);
  out.q.resize(k, vocab);
  Matrix logits = draft_.forward(context.last(1), *cache_);  // its logits give the first guess
  ++forwards_;
  cached_.push_back(context.back());
  for (int i = 0; i < k; ++i) {
    const Vector dist = sampling_distribution(logits.row(logits.rows() - 1).transpose(), params_);
    const int token = params_.temperature == 0.0f ? argmax(dist) : sample_from(dist, rng_.uniform());
    out.q.row(i) = dist.transpose();
    out.tokens.push_back(token);
    if (i + 1 == k || n + i + 1 > limit) break;  // the last guess, or no room to feed this one back
    logits = draft_.forward(std::span(&out.tokens.back(), 1), *cache_);
    ++forwards_;
    cached_.push_back(token);
  }
  out.q.conservativeResize(static_cast<Eigen::Index>(out.tokens.size()), vocab);
  return out;
}

void DraftProposer::rollback(int length) {
  require(length >= 0, "DraftProposer::rollback: length must be >= 0, got ", length);
  if (length >= static_cast<int>(cached_.size())) return;
  cache_->truncate(length);
  cached_.resize(static_cast<size_t>(length));
}

// ------------------------------------------------------------------- trees --

TreeMask tree_mask(const TokenTree& tree) {
  const int N = static_cast<int>(tree.tokens.size());
  require(N >= 1 && tree.parent.size() == tree.tokens.size(), "tree_mask: ", N, " tokens and ", tree.parent.size(),
          " parents; expected the same number, at least one (the root)");
  require(tree.parent[0] == -1, "tree_mask: the root's parent must be -1, got ", tree.parent[0]);
  TreeMask mask = TreeMask::Constant(N, N, false);
  for (int i = 0; i < N; ++i) {
    require(i == 0 || (tree.parent[i] >= 0 && tree.parent[i] < i), "tree_mask: node ", i, " has parent ",
            tree.parent[i], ", expected an earlier node in [0, ", i, ")");
    for (int j = i; j != -1; j = tree.parent[j]) mask(i, j) = true;  // itself and every ancestor
  }
  return mask;
}

TokenTree DraftProposer::propose_tree(std::span<const int> context, int branches, int depth) {
  require(branches >= 1 && depth >= 1, "DraftProposer::propose_tree: branches and depth must be >= 1, got ",
          branches, " and ", depth);
  catch_up(context);
  TokenTree tree{{context.back()}, {-1}};
  const int start = cache_->length();
  size_t level_begin = 0;  // the nodes of the deepest level so far
  for (int d = 0; d < depth; ++d) {
    const Matrix logits = draft_.forward_tree(tree, *cache_);
    ++forwards_;
    cache_->truncate(start);
    const size_t level_end = tree.tokens.size();
    for (size_t node = level_begin; node < level_end; ++node) {
      std::vector<int> order(static_cast<size_t>(logits.cols()));
      std::iota(order.begin(), order.end(), 0);
      const auto row = logits.row(static_cast<Eigen::Index>(node));
      const int b = std::min<int>(branches, static_cast<int>(order.size()));
      std::partial_sort(order.begin(), order.begin() + b, order.end(),
                        [&](int x, int y) { return row[x] > row[y] || (row[x] == row[y] && x < y); });
      for (int c = 0; c < b; ++c) {
        tree.tokens.push_back(order[c]);
        tree.parent.push_back(static_cast<int>(node));
      }
    }
    level_begin = level_end;
  }
  return tree;
}

TreeVerdict verify_tree_greedy(ConstMatrixRef target_logits, const TokenTree& tree) {
  tree_mask(tree);  // validates the tree
  const int N = static_cast<int>(tree.tokens.size());
  require(target_logits.rows() == N, "verify_tree_greedy: ", target_logits.rows(), " rows of logits for ", N,
          " nodes");
  TreeVerdict v;
  int node = 0;
  for (;;) {
    v.next_token = argmax(target_logits.row(node).transpose());
    int next = -1;
    for (int c = node + 1; c < N && next < 0; ++c)
      if (tree.parent[c] == node && tree.tokens[c] == v.next_token) next = c;
    if (next < 0) return v;
    v.path.push_back(next);
    node = next;
  }
}

// ------------------------------------------------------------------ the loop --

namespace {

/// The checks generate_speculative() and generate_tree() share.
void check_generation(const ModelConfig& c, std::span<const int> prompt, int max_new_tokens,
                      const KVStore& target_cache, const char* where) {
  check_tokens(c, prompt, where);
  require(max_new_tokens >= 0, where, ": max_new_tokens must be >= 0, got ", max_new_tokens);
  require(prompt.size() + max_new_tokens <= static_cast<size_t>(c.max_position_embeddings), where, ": prompt of ",
          prompt.size(), " tokens + max_new_tokens ", max_new_tokens, " exceeds the context of ",
          c.max_position_embeddings, " positions");
  require(target_cache.length() == 0, where, ": the target's cache must start empty, it holds ", target_cache.length(),
          " positions");
  require(prompt.size() + max_new_tokens <= static_cast<size_t>(target_cache.max_tokens()), where,
          ": the target's cache holds ", target_cache.max_tokens(), " positions, the generation needs ",
          prompt.size() + max_new_tokens);
}

/// Appends `fresh` to the context and the output, one token at a time; true when the
/// generation is over (EOS, or max_new_tokens reached).
bool emit(std::span<const int> fresh, int eos, int max_new_tokens, std::vector<int>& context, std::vector<int>& out) {
  for (int t : fresh) {
    context.push_back(t);
    out.push_back(t);
    if (t == eos || static_cast<int>(out.size()) == max_new_tokens) return true;
  }
  return false;
}

/// Nodes of a full tree of `branches` children per node, `levels` levels below the root.
long tree_nodes(int branches, int levels) {
  constexpr long kMore = 1L << 40;  // more nodes than any cache holds: no need to count further
  long nodes = 1, level = 1;
  for (int d = 0; d < levels; ++d) {
    if (level > kMore / branches) return kMore;  // (2 branches, 64 levels would overflow a long)
    nodes += level *= branches;
  }
  return nodes;
}

}  // namespace

std::vector<int> generate_speculative(TargetModel& target, Proposer& proposer, std::span<const int> prompt,
                                      int max_new_tokens, int k, const SamplingParams& params, KVStore& target_cache,
                                      SpecStats* stats) {
  const ModelConfig& c = target.config();
  check_generation(c, prompt, max_new_tokens, target_cache, "generate_speculative");
  params.validate();
  require(k >= 0, "generate_speculative: k must be >= 0, got ", k);
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
    if (emit(fresh, c.eos_token_id, max_new_tokens, context, out)) break;
  }
  st.generated = static_cast<long>(out.size());
  return out;
}

std::vector<int> generate_tree(TargetModel& target, DraftProposer& draft, std::span<const int> prompt,
                               int max_new_tokens, int branches, int depth, KVStore& target_cache, SpecStats* stats) {
  const ModelConfig& c = target.config();
  check_generation(c, prompt, max_new_tokens, target_cache, "generate_tree");
  require(branches >= 1 && depth >= 1, "generate_tree: branches and depth must be >= 1, got ", branches, " and ",
          depth);
  SpecStats local;
  SpecStats& st = stats ? *stats : local;
  st = SpecStats{};
  std::vector<int> context(prompt.begin(), prompt.end()), out;
  if (max_new_tokens == 0) return out;
  if (prompt.size() > 1) {
    target.forward(prompt.first(prompt.size() - 1), target_cache);
    ++st.target_forwards;
  }
  while (static_cast<int>(out.size()) < max_new_tokens) {
    const int n = static_cast<int>(context.size());
    // As deep as asked, but no deeper than the tokens still wanted need, and small enough that
    // the whole tree fits in both caches after the context's first n - 1 tokens.
    const int room = std::min(target_cache.max_tokens(), draft.cache().max_tokens()) - (n - 1);
    int levels = std::min(depth, max_new_tokens - static_cast<int>(out.size()) - 1);
    while (levels > 0 && tree_nodes(branches, levels) > room) --levels;
    const TokenTree tree = levels > 0 ? draft.propose_tree(context, branches, levels)
                                      : TokenTree{{context.back()}, {-1}};
    const Matrix logits = target.forward_tree(tree, target_cache);  // one forward for the whole tree
    ++st.target_forwards;
    const TreeVerdict v = verify_tree_greedy(logits, tree);
    std::vector<int> path{0};
    path.insert(path.end(), v.path.begin(), v.path.end());
    keep_tree_path(target_cache, n - 1, path);  // the root and the accepted guesses
    draft.rollback(n + static_cast<int>(v.path.size()));
    ++st.rounds;
    st.proposed += static_cast<long>(tree.tokens.size()) - 1;
    st.accepted += static_cast<long>(v.path.size());
    std::vector<int> fresh;
    for (int node : v.path) fresh.push_back(tree.tokens[node]);
    fresh.push_back(v.next_token);
    if (emit(fresh, c.eos_token_id, max_new_tokens, context, out)) break;
  }
  st.generated = static_cast<long>(out.size());
  return out;
}

}  // namespace infer
