/// @file speculative.hpp
/// @brief Lesson 06's contract: speculative decoding. A cheap proposer guesses the next k tokens,
/// the target model scores all of them in one forward, and an exact acceptance rule keeps a
/// prefix of the guesses so that the output has exactly the target's distribution.
///
/// You implement, in `exercises/06_speculative_decoding/speculative.cpp`: residual_distribution(),
/// verify_greedy(), verify_sampled(), NgramProposer::propose(), DraftProposer's catch_up(),
/// propose() and rollback(), generate_speculative(); and for tree speculation tree_mask(),
/// DraftProposer::propose_tree(), verify_tree_greedy() and generate_tree(). Given (in given.cpp):
/// TargetModel, forward_tree(), keep_tree_path(), the constructors, KVStore::truncate() (lesson 02),
/// and SpecStats' ratios.
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
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/rng.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"
#include "lessons/02_kv_cache/kv_cache.hpp"
#include "lessons/03_batching/engine.hpp"

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
/// Throws infer::Error when the sizes differ (the message names the "entries") or an entry is
/// negative or not finite (the message says ">= 0").
Vector residual_distribution(const Vector& p, const Vector& q);

/// Greedy verification, temperature 0's case. `target_logits` has proposal.size() + 1 rows: row
/// i is the target's logits at the position where proposal[i] would go, and the last row the
/// logits after all of them. Tokens are kept while each equals argmax of its row; next_token is
/// argmax of the row after the last kept one. Throws infer::Error for a row count that is not
/// proposal.size() + 1 (the message names the "rows").
Verdict verify_greedy(ConstMatrixRef target_logits, std::span<const int> proposal);

/// Exact speculative sampling (Leviathan et al. 2023, Chen et al. 2023). proposal[i] was drawn
/// from row i of `q`; row i of `p` is the target's distribution at its position, and `p` has one
/// more row, the distribution after the whole proposal. In order, token x = proposal[i] is kept
/// with probability min(1, p_i(x) / q_i(x)): one draw u = rng.uniform() per token tested, kept
/// when u * q_i(x) < p_i(x). At the first rejection, next_token is drawn from
/// residual_distribution(p_i, q_i) and the round stops; if every token is kept, next_token is
/// drawn from the last row of p. The draw of next_token is sample_from(distribution,
/// rng.uniform()). Throws infer::Error when the shapes disagree (p: proposal.size() + 1 rows, q:
/// proposal.size() rows, both as wide as the vocabulary; the message names the "rows") or a
/// token is outside the "vocabulary".
Verdict verify_sampled(ConstMatrixRef p, ConstMatrixRef q, std::span<const int> proposal, Rng& rng);

// ================================================================ proposers ==

/// A tree of guesses. Node 0 is the root: the context's last token, already decided. Every other
/// node is a guess that follows its parent: parent[i] < i (a parent comes before its children),
/// tokens[i] its token. A node's depth is its distance from the root, and the path from the root
/// to a node is a sequence of guesses the target can accept.
///
///     node:   0    1    2    3    4    5    6         depth 0: the root (t)
///     token:  t    a    b    c    d    e    f         depth 1: a, b
///     parent: -1   0    0    1    1    2    2         depth 2: c, d under a; e, f under b
struct TokenTree {
  std::vector<int> tokens;  ///< one per node, the root's first
  std::vector<int> parent;  ///< one per node: -1 for the root, else an earlier node
};

// A tree's attention mask is lesson 03's TreeMask: [nodes, nodes], true where a node may attend
// to another; a chunk of a step that carries one is run as a tree (Chunk::mask).

/// Which nodes each node of `tree` may attend to: mask(i, j) is true exactly when j is i or an
/// ancestor of i. Throws infer::Error for a tree that is empty, whose sizes differ, whose root's
/// parent is not -1, or where a node's parent is not an earlier node (the message names "parent",
/// or "parents" when the sizes differ or the tree is empty).
TreeMask tree_mask(const TokenTree& tree);

/// The model over a tree's nodes after the cache's positions (given): lesson 03's forward_step()
/// over one chunk, the tree's tokens with your tree_mask() as its mask. Node i sits at position
/// cache.length() + depth(i) (its RoPE angle) and attends to every cached position and to the
/// nodes tree_mask() lets it see; so row i of the result is the model's next-token logits after
/// the path from the root to node i, as if that path alone had been run. The nodes' K/V are
/// appended in node order (node i at row cache.length() + i, whatever its depth):
/// keep_tree_path() then keeps those of one path. Returns [nodes, vocab] logits.
Matrix forward_tree(const ModelWeights& model, const TokenTree& tree, KVStore& cache);

/// After forward_tree() appended a tree's K/V at rows start, start + 1, ...: keeps rows
/// start + path[0], start + path[1], ... as positions start, start + 1, ... and drops the rest
/// (given). `path` is a root-to-node path (node 0 first), so each kept row was computed at the
/// position it ends up in. Throws infer::Error for a path that does not fit the cache.
void keep_tree_path(KVStore& cache, int start, std::span<const int> path);

/// What greedy verification of a tree decided.
struct TreeVerdict {
  std::vector<int> path;  ///< accepted nodes, root excluded, from the root down
  int next_token = 0;     ///< the target's token after the last accepted node
};

/// Greedy verification of a tree: from the root, while the target's argmax at the current node
/// (row `node` of `target_logits`) is the token of one of its children, descend to that child
/// (the first such child in node order). next_token is the argmax at the node where it stops.
/// Throws infer::Error unless target_logits has one row per node (the message names the "rows")
/// of a well-formed tree.
TreeVerdict verify_tree_greedy(ConstMatrixRef target_logits, const TokenTree& tree);

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
/// n that finds one wins. An occurrence may overlap the last n tokens themselves, and what follows
/// it may run into them (up to the context's end). No occurrence: no proposal. Certain guesses (an
/// empty q).
class NgramProposer final : public Proposer {
 public:
  /// Throws infer::Error unless 1 <= min_n <= max_n (the message names min_n).
  explicit NgramProposer(int max_n = 3, int min_n = 1);
  Proposal propose(std::span<const int> context, int k) override;

 private:
  int max_n_, min_n_;
};

/// A model as the engine runs it: lesson 03's forward seam (a ModelRunner: CpuRunner on the CPU,
/// lesson 07's CudaForward on a GPU) fed one chunk of one sequence per call (given). The target
/// of the loops below, and the draft inside DraftProposer. It counts the forwards it is asked
/// for, which is how the tests check "one forward per round".
class TargetModel {
 public:
  /// Runs `model` on the CPU (a CpuRunner; `model` must outlive this).
  explicit TargetModel(const ModelWeights& model);
  /// Runs through `runner` (not owned: it must outlive this).
  explicit TargetModel(ModelRunner& runner) : runner_(&runner) {}
  /// The target's shape.
  const ModelConfig& config() const { return runner_->config(); }
  /// Logits of every one of `tokens` ([tokens.size(), vocab]), placed at positions
  /// cache.length() onward; their K/V are appended to `cache`. One chunk of one step: every row's
  /// logits. No tokens: no forward, 0 rows (still counted).
  Matrix forward(std::span<const int> tokens, KVStore& cache);
  /// forward_tree() of the target: one step whose one chunk is the tree, masked by tree_mask().
  Matrix forward_tree(const TokenTree& tree, KVStore& cache);
  /// forward() and forward_tree() calls so far.
  long forwards() const { return forwards_; }
  /// Tokens or tree nodes those calls computed.
  long positions() const { return positions_; }

 private:
  std::unique_ptr<ModelRunner> owned_;  // the CpuRunner of the first constructor
  ModelRunner* runner_;
  long forwards_ = 0, positions_ = 0;
};

/// A small model of the same vocabulary proposes by sampling from itself, one token at a time
/// (greedy at temperature 0), keeping its own KV cache.
///
/// What it keeps true: its cache holds the K/V of cached_tokens(), a prefix of the context it was
/// last given followed, after propose(), by the guesses it fed back. catch_up(context) makes the cache hold exactly the context but its last token:
/// it drops whatever disagrees with the context and runs what is missing. propose() catches up,
/// runs the context's last token, then draws k tokens (each `sample_from(q row, rng_.uniform())`,
/// rng_ seeded with params.seed when the proposer is made), feeding each but the last back to get
/// the next one's distribution: its cache then also holds the last token and the first k - 1
/// guesses (fewer where the draft's cache, or its model's context, has no room to feed the next
/// guess). The context itself must fit that room (the caller sizes the draft's cache as the
/// target's): its last token is run whatever k, and one that does not fit throws, as the forward
/// does. q's rows are
/// sampling_distribution() of the draft's logits with the proposer's params; at temperature 0
/// the guess is the argmax and the Rng is not drawn from. With k = 0 it only catches up.
/// rollback(length) keeps at most the first `length` cached tokens, in the cache and in
/// cached_tokens(); the loop relies on it, so do not leave it to the next catch_up().
class DraftProposer final : public Proposer {
 public:
  /// Samples with `params` (its Rng seeded with params.seed); on the CPU, a cache of max_tokens
  /// positions. Throws infer::Error for bad params or max_tokens below 1.
  DraftProposer(const ModelWeights& draft, const SamplingParams& params, int max_tokens);
  /// The same over any forward seam: `draft` (not owned: it must outlive this; a GPU's CudaForward,
  /// say) with `cache`, an empty store that runner reads (its max_tokens() is the room). Given.
  DraftProposer(ModelRunner& draft, std::unique_ptr<KVStore> cache, const SamplingParams& params);
  Proposal propose(std::span<const int> context, int k) override;
  void rollback(int length) override;
  /// Makes the cache hold exactly context[0 .. size - 1): keeps the cached tokens that agree
  /// with it, drops the rest, runs what is missing (one forward, none if nothing is). Throws
  /// infer::Error for an empty context.
  void catch_up(std::span<const int> context);

  /// A tree of guesses after `context`, greedy: the root is the context's last token; each
  /// node of depth below `depth` gets `branches` children, the draft's most likely tokens after
  /// the path to it (ranked by its logits, ties to the lower id), in rank order. Built level by
  /// level, one forward_tree() of the draft per level over the tree so far; the draft's cache is
  /// caught up first and holds the context but its last token again at the end. Nodes are
  /// numbered level by level, so the first child of every node lies on the first branch: the
  /// draft's greedy chain. The caller makes sure the tree fits in the draft's cache (generate_tree()
  /// sizes it so). Throws infer::Error for branches or depth below 1.
  TokenTree propose_tree(std::span<const int> context, int branches, int depth);

  /// The draft's KV cache (for tests).
  const KVStore& cache() const { return *cache_; }
  /// The tokens whose K/V the cache holds, in order.
  const std::vector<int>& cached_tokens() const { return cached_; }
  /// Draft forward calls so far (each over one or more tokens): one for a catch_up() that runs
  /// something; then propose(k >= 1) one per token it feeds (the context's last token and every
  /// guess but the last: k, fewer when the room runs out), propose_tree() one per level (depth).
  long forwards() const { return forwards_; }

 private:
  TargetModel draft_;              ///< the draft model through the forward seam: draft_.forward(tokens, *cache_)
  SamplingParams params_;          ///< how it samples its guesses
  Rng rng_;                        ///< its draws, seeded with params.seed
  std::unique_ptr<KVStore> cache_; ///< the draft's K/V (a KVCache on the CPU)
  std::vector<int> cached_;        ///< the tokens in *cache_
  long forwards_ = 0;              ///< what forwards() reports
};

// ================================================================= the loop ==

/// What a speculative generation did: generate_speculative() fills every field.
struct SpecStats {
  int rounds = 0;            ///< verification rounds: target forwards after the prefill
  long proposed = 0;         ///< tokens proposed, over all rounds
  long accepted = 0;         ///< of them, kept
  long generated = 0;        ///< tokens returned
  long target_forwards = 0;  ///< target forward calls made by this generation, its prefill included
  /// accepted / proposed (0 when nothing was proposed).
  double acceptance() const;
  /// Tokens per round: (accepted + one target token per round) / rounds, before any cut at
  /// EOS or max_new_tokens (0 without rounds).
  double tokens_per_round() const;
};

/// Generates up to max_new_tokens tokens after `prompt` with the target's distribution, k guesses
/// per round (k = 0: one token per target forward, plain decoding through the same loop).
///
/// - The target's cache starts empty; a prefill of all the prompt but its last token fills it
///   (no prefill for a one-token prompt, nor for max_new_tokens = 0, which returns nothing and
///   runs nothing). At the start of every round it holds every token of the context but the last.
/// - A round: the proposer guesses up to min(k, tokens still wanted - 1) tokens (it is not
///   asked when that is 0); ONE target
///   forward over [last token, guesses...]; verify_greedy() at temperature 0, otherwise
///   verify_sampled() with p = sampling_distribution() of each row of the target's logits and
///   q from the proposal (one-hot rows when it is empty), drawing from an Rng seeded with
///   params.seed; the kept guesses and the target's token join the context; the target's cache
///   is truncated to the context minus its new last token, and the proposer rolls back to the
///   same length.
/// - Stops after max_new_tokens tokens, or right after EOS (kept); guesses after an EOS are
///   dropped from the output. The last round ends like the others: the target's cache holds its
///   context and every guess it kept (those past the EOS too), and the proposer is rolled back
///   to the same length.
///
/// At temperature 0 the output equals generate_cached()'s, token for token. `stats`, where given,
/// is reset at the start and counts this run alone.
/// @throws infer::Error, with the words in quotes in its message, for an "empty" prompt (or bad
///         ids: check_tokens()), "k must be" >= 0, a negative "max_new_tokens", a prompt plus
///         max_new_tokens that "exceeds the context", a target cache that is not empty ("must
///         start empty") or too small (the "cache holds" N positions, where it must hold
///         prompt.size() + max_new_tokens), or a proposal with more
///         tokens than asked ("at most"), ids outside the "vocabulary", or a q of the wrong shape.
std::vector<int> generate_speculative(TargetModel& target, Proposer& proposer, std::span<const int> prompt,
                                      int max_new_tokens, int k, const SamplingParams& params, KVStore& target_cache,
                                      SpecStats* stats = nullptr);

/// Greedy tree speculation: generate_speculative()'s loop with a tree in place of a chain. Each
/// round the draft proposes a tree of `branches` children per node, min(depth, tokens still
/// wanted - 1) levels deep, fewer if the whole tree would not fit in both caches after all the
/// context's tokens but its last (the tree's nodes, root included, sit there until the round
/// ends); when that leaves 0 levels, the draft is not asked and the tree is the root alone (the
/// context's last token: the round is a plain decode step); ONE target forward_tree()
/// scores every node; verify_tree_greedy() picks the accepted path; keep_tree_path() leaves the
/// target's cache holding the context, the accepted guesses and nothing else of the tree (the
/// new token is not fed yet). Stops after max_new_tokens or right after EOS, like
/// generate_speculative(), and gives the same tokens as greedy generate_cached(). Statistics:
/// proposed counts every guess of every tree (nodes but the root), accepted the path lengths.
/// @throws infer::Error as generate_speculative() does, and for "branches" or depth below 1.
std::vector<int> generate_tree(TargetModel& target, DraftProposer& draft, std::span<const int> prompt,
                               int max_new_tokens, int branches, int depth, KVStore& target_cache,
                               SpecStats* stats = nullptr);

// =========================================================== in the engine ==

/// Your proposers and verification as the engine's Speculator (given): lesson 03's engine then
/// runs speculative decoding for every request it serves, in the same step as everyone else's
/// decodes and prefills (EngineOptions::speculative_tokens guesses per decode). Each sequence gets
/// its own proposer; a round is verified with verify_greedy() at temperature 0 and with
/// verify_sampled() otherwise (p from the sequence's sampling parameters, q from the proposal,
/// one-hot rows when it has none, drawn with an Rng of the sequence's own), and the proposer rolls
/// back to what was kept. The proposer, its last proposal and that Rng are the sequence's
/// Sequence::speculation: they leave the engine with it.

/// Prompt lookup (NgramProposer(max_n, min_n)) for every sequence.
std::unique_ptr<Speculator> prompt_lookup_speculator(int max_n = 3, int min_n = 1);
/// A DraftProposer over `draft` for every sequence, sampling with the sequence's own parameters
/// (its seed mixed), with a cache of the draft's context. `draft` must outlive the speculator.
/// Throws infer::Error unless the draft's vocabulary is `vocab_size`, the target's.
std::unique_ptr<Speculator> draft_speculator(const ModelWeights& draft, int vocab_size);
/// The same with the draft run through `draft` (a GPU's CudaForward, say; not owned, it must outlive
/// the speculator), each sequence's proposer with a store from `new_cache` (an empty store that
/// runner reads), freed when the sequence leaves.
std::unique_ptr<Speculator> draft_speculator(ModelRunner& draft, std::function<std::unique_ptr<KVStore>()> new_cache,
                                             int vocab_size);

}  // namespace infer
