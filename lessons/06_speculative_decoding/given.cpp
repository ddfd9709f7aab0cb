// Lesson 06, given: constructors, the target over lesson 03's forward seam, the tree's forward,
// and the statistics' ratios.
#include "lessons/06_speculative_decoding/speculative.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "common/linear.hpp"

namespace infer {

NgramProposer::NgramProposer(int max_n, int min_n) : max_n_(max_n), min_n_(min_n) {
  require(min_n >= 1 && min_n <= max_n, "NgramProposer: expected 1 <= min_n <= max_n, got min_n ", min_n, ", max_n ",
          max_n);
}

DraftProposer::DraftProposer(const ModelWeights& draft, const SamplingParams& params, int max_tokens)
    : draft_(draft), params_(params), rng_(params.seed), cache_(std::make_unique<KVCache>(draft.config, max_tokens)) {
  params.validate();
}

DraftProposer::DraftProposer(ModelRunner& draft, std::unique_ptr<KVStore> cache, const SamplingParams& params)
    : draft_(draft), params_(params), rng_(params.seed), cache_(std::move(cache)) {
  params.validate();
  require(cache_ != nullptr, "DraftProposer: no cache");
  require(cache_->length() == 0, "DraftProposer: the cache must start empty, it holds ", cache_->length(), " positions");
}

TargetModel::TargetModel(const ModelWeights& model)
    : owned_(std::make_unique<CpuRunner>(model)), runner_(owned_.get()) {}

Matrix TargetModel::forward(std::span<const int> tokens, KVStore& cache) {
  ++forwards_;
  positions_ += static_cast<long>(tokens.size());
  if (tokens.empty()) return Matrix(0, config().vocab_size);
  const int n = static_cast<int>(tokens.size());
  return runner_->forward({{Chunk{.tokens = tokens, .cache = &cache, .logits = n}}});
}

// ------------------------------------------------------------- the tree forward --

Matrix TargetModel::forward_tree(const TokenTree& tree, KVStore& cache) {
  ++forwards_;
  positions_ += static_cast<long>(tree.tokens.size());
  const TreeMask mask = tree_mask(tree);  // your mask; it validates the tree
  const int n = static_cast<int>(tree.tokens.size());
  return runner_->forward({{Chunk{.tokens = tree.tokens, .cache = &cache, .logits = n, .mask = &mask}}});
}

Matrix forward_tree(const ModelWeights& model, const TokenTree& tree, KVStore& cache) {
  return TargetModel(model).forward_tree(tree, cache);  // a CPU runner for one call
}

void keep_tree_path(KVStore& cache, int start, std::span<const int> path) {
  const int n = static_cast<int>(path.size());
  require(start >= 0 && n >= 1 && path[0] == 0, "keep_tree_path: expected a path from the root (node 0) after ",
          "position >= 0, got ", n, " nodes after ", start);
  for (int j = 0; j < n; ++j)
    require(path[j] >= 0 && start + path[j] < cache.length(), "keep_tree_path: node ", path[j], " at row ",
            start + path[j], " is outside the cache's ", cache.length(), " positions");
  // Copy the path's rows out of every layer first: truncate() may move or drop them.
  const int layers = cache.num_layers();
  std::vector<Matrix> k(static_cast<size_t>(layers)), v(static_cast<size_t>(layers));
  for (int l = 0; l < layers; ++l) {
    const ConstMatrixRef keys = cache.keys(l), values = cache.values(l);
    k[l].resize(n, keys.cols());
    v[l].resize(n, values.cols());
    for (int j = 0; j < n; ++j) {
      k[l].row(j) = keys.row(start + path[j]);
      v[l].row(j) = values.row(start + path[j]);
    }
  }
  cache.truncate(start);
  for (int l = 0; l < layers; ++l) cache.append(l, k[l], v[l]);
}

double SpecStats::acceptance() const {
  return proposed > 0 ? static_cast<double>(accepted) / static_cast<double>(proposed) : 0.0;
}

double SpecStats::tokens_per_round() const {
  return rounds > 0 ? static_cast<double>(accepted + rounds) / static_cast<double>(rounds) : 0.0;
}

// ------------------------------------------------------------------ in the engine --

namespace {

/// A proposer per sequence (made on its first round), its last proposal and its own Rng, kept in
/// the sequence (Sequence::speculation).
class ProposerSpeculator final : public Speculator {
 public:
  using Factory = std::function<std::unique_ptr<Proposer>(const Sequence&)>;
  explicit ProposerSpeculator(Factory make) : make_(std::move(make)) {}

  std::vector<int> propose(Sequence& seq, int k) override {
    State& st = state(seq);
    st.last = st.proposer->propose(seq.tokens, k);
    return st.last.tokens;
  }

  std::vector<int> verify(Sequence& seq, ConstMatrixRef logits, std::span<const int> guesses) override {
    State& st = state(seq);
    require(std::equal(guesses.begin(), guesses.end(), st.last.tokens.begin(), st.last.tokens.end()),
            "ProposerSpeculator::verify: the guesses are not the ones request ", seq.request.id, " was last proposed");
    const SamplingParams& params = seq.request.sampling;
    Verdict v;
    if (params.temperature == 0.0f) {
      v = verify_greedy(logits, guesses);
    } else {
      const Eigen::Index m = static_cast<Eigen::Index>(guesses.size()), vocab = logits.cols();
      Matrix p(m + 1, vocab);
      for (Eigen::Index i = 0; i <= m; ++i) p.row(i) = sampling_distribution(logits.row(i).transpose(), params).transpose();
      Matrix q = st.last.q;
      if (q.rows() == 0) {  // certain guesses: one-hot rows
        q = Matrix::Zero(m, vocab);
        for (Eigen::Index i = 0; i < m; ++i) q(i, guesses[static_cast<size_t>(i)]) = 1.0f;
      }
      v = verify_sampled(p, q, guesses, st.rng);
    }
    st.proposer->rollback(static_cast<int>(seq.tokens.size()) + v.accepted);
    std::vector<int> kept(guesses.begin(), guesses.begin() + v.accepted);
    kept.push_back(v.next_token);
    return kept;
  }

 private:
  struct State final : SpeculationState {
    State(std::unique_ptr<Proposer> p, uint64_t seed) : proposer(std::move(p)), rng(seed) {}
    std::unique_ptr<Proposer> proposer;
    Proposal last;  ///< its last proposal (q: the distributions its guesses were drawn from)
    Rng rng;        ///< verification's draws, apart from the sequence's Sampler
  };
  State& state(Sequence& seq) {
    if (!seq.speculation)
      seq.speculation = std::make_unique<State>(make_(seq), seq.request.sampling.seed ^ 0x9e3779b97f4a7c15ull);
    return static_cast<State&>(*seq.speculation);  // a sequence's state is only ever this speculator's
  }

  Factory make_;
};

}  // namespace

std::unique_ptr<Speculator> prompt_lookup_speculator(int max_n, int min_n) {
  NgramProposer check(max_n, min_n);  // refuses bad sizes now, not at the first round
  (void)check;
  return std::make_unique<ProposerSpeculator>(
      [=](const Sequence&) { return std::make_unique<NgramProposer>(max_n, min_n); });
}

std::unique_ptr<Speculator> draft_speculator(const ModelWeights& draft, int vocab_size) {
  require(draft.config.vocab_size == vocab_size, "draft_speculator: the draft's vocabulary has ",
          draft.config.vocab_size, " tokens, the target's ", vocab_size);
  return std::make_unique<ProposerSpeculator>([&draft](const Sequence& seq) {
    SamplingParams params = seq.request.sampling;
    params.seed ^= 0x5bd1e995u;  // the draft's own draws
    return std::make_unique<DraftProposer>(draft, params, draft.config.max_position_embeddings);
  });
}

std::unique_ptr<Speculator> draft_speculator(ModelRunner& draft, std::function<std::unique_ptr<KVStore>()> new_cache,
                                             int vocab_size) {
  require(draft.config().vocab_size == vocab_size, "draft_speculator: the draft's vocabulary has ",
          draft.config().vocab_size, " tokens, the target's ", vocab_size);
  require(new_cache != nullptr, "draft_speculator: no way to make the draft's caches");
  return std::make_unique<ProposerSpeculator>([&draft, new_cache](const Sequence& seq) {
    SamplingParams params = seq.request.sampling;
    params.seed ^= 0x5bd1e995u;  // the draft's own draws
    return std::make_unique<DraftProposer>(draft, new_cache(), params);
  });
}

}  // namespace infer
