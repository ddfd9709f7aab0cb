/// @file speculative.hpp
/// @brief Lesson 06's contract: speculative decoding. A cheap proposer guesses the next k tokens,
/// the target model scores all of them in one forward, and an exact acceptance rule keeps a
/// prefix of the guesses so that the output has exactly the target's distribution.
///
/// You implement, in `exercises/06_speculative_decoding/speculative.cpp`: residual_distribution(),
/// verify_greedy(), verify_sampled(), NgramProposer::propose(), DraftProposer::propose() and
/// DraftProposer::rollback(), and generate_speculative(). Given (in given.cpp): CpuTarget, the
/// constructors, KVStore::truncate() (lesson 02), and SpecStats' ratios.
///
/// One round, with the target's cache holding every token of the context but the last:
///
///     context ... t      proposer:  d1 d2 d3          (k = 3 guesses)
///     target forward over [t d1 d2 d3]  ->  4 rows of logits, in one call
///     keep d1 d2, reject d3, and take the target's own token x in its place
///     context ... t d1 d2 x   (3 tokens from one target forward); both caches roll back to
///     ... t d1 d2, and x is the next round's t.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/rng.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"
#include "lessons/02_kv_cache/kv_cache.hpp"

namespace infer {

// ======================================================= exact verification ==

/// What verifying one round's proposal decided.
struct Verdict {
  int accepted = 0;    ///< proposed tokens kept, counted from the first (0 to the proposal's size)
  int next_token = 0;  ///< the target's own token after them: on a rejection the correction, when
                       ///< every token was kept the bonus
};

/// The distribution a rejected position is resampled from: max(0, p - q), normalized to sum to 1.
/// Where p - q has no positive entry (p equals q, so a rejection cannot happen), returns p.
/// Throws infer::Error when the sizes differ or an entry is negative or not finite.
Vector residual_distribution(const Vector& p, const Vector& q);

/// Greedy verification, temperature 0's case. `target_logits` has proposal.size() + 1 rows: row
/// i is the target's logits at the position where proposal[i] would go, and the last row the
/// logits after all of them. Tokens are kept while each equals argmax of its row; next_token is
/// argmax of the row after the last kept one. Throws infer::Error for a row count that is not
/// proposal.size() + 1.
Verdict verify_greedy(ConstMatrixRef target_logits, std::span<const int> proposal);

/// Exact speculative sampling (Leviathan et al. 2023, Chen et al. 2023). proposal[i] was drawn
/// from row i of `q`; row i of `p` is the target's distribution at its position, and `p` has one
/// more row, the distribution after the whole proposal. In order, token x = proposal[i] is kept
/// with probability min(1, p_i(x) / q_i(x)): one draw u = rng.uniform() per token tested, kept
/// when u * q_i(x) < p_i(x). At the first rejection, next_token is drawn from
/// residual_distribution(p_i, q_i) and the round stops; if every token is kept, next_token is
/// drawn from the last row of p. The draw of next_token is sample_from(distribution,
/// rng.uniform()). Throws infer::Error when the shapes disagree (p: proposal.size() + 1 rows, q:
/// proposal.size() rows, both as wide as the vocabulary) or a token is outside it.
Verdict verify_sampled(ConstMatrixRef p, ConstMatrixRef q, std::span<const int> proposal, Rng& rng);

// ================================================================ proposers ==

/// A round's guesses.
struct Proposal {
  std::vector<int> tokens;  ///< up to k tokens that may follow the context
  /// [tokens.size(), vocab]: row i is the distribution tokens[i] was drawn from. Empty (0 rows)
  /// for a proposer whose guesses are certain: each row is then one-hot on its token.
  Matrix q;
};

/// Something that guesses the next tokens: a small draft model, or a lookup in the context.
class Proposer {
 public:
  virtual ~Proposer() = default;
  /// Up to k tokens that may follow `context` (the whole sequence so far, prompt included, at
  /// least one token). Proposing fewer, or none, is allowed.
  virtual Proposal propose(std::span<const int> context, int k) = 0;
  /// The round is over: the first `length` tokens of the context are final and the rest of the
  /// last proposal is gone. A proposer that keeps state (a KV cache) drops what lies past them.
  virtual void rollback(int length) { (void)length; }
};

/// Prompt lookup: the guess is what followed the last time the context's newest tokens appeared.
/// For n from max_n down to min_n, it looks for the most recent earlier occurrence of the last n
/// tokens that something follows, and proposes up to k of the tokens that followed it; the first
/// n that finds one wins. No occurrence: no proposal. Certain guesses (an empty q).
class NgramProposer final : public Proposer {
 public:
  /// Throws infer::Error unless 1 <= min_n <= max_n.
  explicit NgramProposer(int max_n = 3, int min_n = 1);
  Proposal propose(std::span<const int> context, int k) override;

 private:
  int max_n_, min_n_;
};

/// A small model of the same vocabulary proposes by sampling from itself, one token at a time
/// (greedy at temperature 0), keeping its own KV cache.
///
/// What it keeps true: its cache holds the K/V of cached_tokens(), a prefix of the context it was
/// last given. propose() first makes the cache hold the context up to its last token (dropping
/// whatever disagrees with the context, running what is missing), then draws k tokens, feeding
/// each but the last back to get the next one's distribution: its cache then also holds the
/// first k - 1 guesses. q's rows are sampling_distribution() of the draft's logits with the
/// proposer's params. rollback(length) keeps at most the first `length` cached tokens.
class DraftProposer final : public Proposer {
 public:
  /// Samples with `params` (its Rng seeded with params.seed); a cache of max_tokens positions.
  /// Throws infer::Error for bad params or max_tokens below 1.
  DraftProposer(const ModelWeights& draft, const SamplingParams& params, int max_tokens);
  Proposal propose(std::span<const int> context, int k) override;
  void rollback(int length) override;

  /// The draft's KV cache (for tests).
  const KVStore& cache() const { return cache_; }
  /// The tokens whose K/V the cache holds, in order.
  const std::vector<int>& cached_tokens() const { return cached_; }
  /// Draft forward calls so far (each over one or more tokens).
  long forwards() const { return forwards_; }

 private:
  const ModelWeights* draft_;   ///< the draft model (not owned)
  SamplingParams params_;       ///< how it samples its guesses
  Rng rng_;                     ///< its draws, seeded with params.seed
  KVCache cache_;               ///< the draft's K/V
  std::vector<int> cached_;     ///< the tokens in cache_
  long forwards_ = 0;           ///< what forwards() reports
};

// ================================================================= the loop ==

/// What runs the target model: the seam through which tests count target forwards (given:
/// CpuTarget, lesson 02's forward_cached()).
class TargetModel {
 public:
  virtual ~TargetModel() = default;
  /// The target's shape.
  virtual const ModelConfig& config() const = 0;
  /// Logits of every one of `tokens` ([tokens.size(), vocab]), placed at positions
  /// cache.length() onward; their K/V are appended to `cache`.
  virtual Matrix forward(std::span<const int> tokens, KVStore& cache) = 0;
};

/// The target on the CPU: forward_cached() (given).
class CpuTarget final : public TargetModel {
 public:
  /// Runs `model` (not owned: it must outlive this).
  explicit CpuTarget(const ModelWeights& model) : model_(&model) {}
  const ModelConfig& config() const override { return model_->config; }
  Matrix forward(std::span<const int> tokens, KVStore& cache) override;

 private:
  const ModelWeights* model_;
};

/// What a speculative generation did.
struct SpecStats {
  int rounds = 0;            ///< verification rounds: target forwards after the prefill
  long proposed = 0;         ///< tokens proposed, over all rounds
  long accepted = 0;         ///< of them, kept
  long generated = 0;        ///< tokens returned
  long target_forwards = 0;  ///< target forward calls, the prefill included
  /// accepted / proposed (0 when nothing was proposed).
  double acceptance() const;
  /// Tokens per round: (accepted + one target token per round) / rounds, before any cut at
  /// EOS or max_new_tokens (0 without rounds).
  double tokens_per_round() const;
};

/// Generates up to max_new_tokens tokens after `prompt` with the target's distribution, k guesses
/// per round (k = 0: one token per target forward, plain decoding through the same loop).
///
/// - The target's cache starts empty; a prefill of all the prompt but its last token fills it.
///   At the start of every round it holds every token of the context but the last.
/// - A round: the proposer guesses up to min(k, tokens still wanted - 1) tokens; ONE target
///   forward over [last token, guesses...]; verify_greedy() at temperature 0, otherwise
///   verify_sampled() with p = sampling_distribution() of each row of the target's logits and
///   q from the proposal (one-hot rows when it is empty), drawing from an Rng seeded with
///   params.seed; the kept guesses and the target's token join the context; the target's cache
///   is truncated to the context minus its new last token, and the proposer rolls back to the
///   same length.
/// - Stops after max_new_tokens tokens, or right after EOS (kept); guesses after an EOS are
///   dropped.
///
/// At temperature 0 the output equals generate_cached()'s, token for token.
/// @throws infer::Error for an empty prompt or bad ids, a negative k or max_new_tokens, a prompt
///         plus max_new_tokens past the context, a target_cache that is not empty or holds
///         fewer than prompt.size() + max_new_tokens positions, or a proposal that is too long,
///         holds ids outside the vocabulary, or whose q has the wrong shape.
std::vector<int> generate_speculative(TargetModel& target, Proposer& proposer, std::span<const int> prompt,
                                      int max_new_tokens, int k, const SamplingParams& params, KVStore& target_cache,
                                      SpecStats* stats = nullptr);

}  // namespace infer
