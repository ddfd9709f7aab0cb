// Lesson 06, your turn: exact speculative sampling, two proposers (prompt lookup and a draft
// model), the draft-target loop with its rollback, and tree speculation.
//
// Replace each `throw NotImplemented(...)`. The contract is
// lessons/06_speculative_decoding/speculative.hpp; the lesson text is
// lessons/06_speculative_decoding/README.md. Check your work with `./course check 06`.
// The constructors, TargetModel, forward_tree(), keep_tree_path() and KVStore::truncate() are
// written for you (given.cpp, and lesson 02's given.cpp).
// Stuck on a function? `./course hint 06 NAME` gives a hint, one tier at a time.
#include "lessons/06_speculative_decoding/speculative.hpp"

#include <algorithm>
#include <cmath>

namespace infer {

Vector residual_distribution(const Vector& p, const Vector& q) {
  // max(0, p - q), normalized; p itself when nothing is left. Refuses mismatched sizes and
  // entries that are negative or not finite.
  (void)p, (void)q;
  throw NotImplemented("06", "residual_distribution");
}

Verdict verify_greedy(ConstMatrixRef target_logits, std::span<const int> proposal) {
  // Keep guesses while each is its row's argmax; the next token is the argmax of the row after
  // the last one kept.
  (void)target_logits, (void)proposal;
  throw NotImplemented("06", "verify_greedy");
}

Verdict verify_sampled(ConstMatrixRef p, ConstMatrixRef q, std::span<const int> proposal, Rng& rng) {
  // Keep guess x with probability min(1, p(x) / q(x)); at the first rejection, the next token
  // comes from the residual; with every guess kept, from the last row of p. The draws and their
  // order are in the header: tests replay them.
  (void)p, (void)q, (void)proposal, (void)rng;
  throw NotImplemented("06", "verify_sampled");
}

Proposal NgramProposer::propose(std::span<const int> context, int k) {
  // The tokens that followed the most recent earlier occurrence of the context's last n tokens,
  // n from max_n_ down to min_n_; certain guesses (no q).
  (void)context, (void)k;
  throw NotImplemented("06", "NgramProposer::propose");
}

void DraftProposer::catch_up(std::span<const int> context) {
  // Make the cache (and cached_) hold exactly the context but its last token: keep what agrees,
  // drop the rest, run what is missing.
  (void)context;
  throw NotImplemented("06", "DraftProposer::catch_up");
}

Proposal DraftProposer::propose(std::span<const int> context, int k) {
  // Catch up, run the context's last token, then draw up to k guesses one at a time, recording
  // each one's distribution in q.
  (void)context, (void)k;
  throw NotImplemented("06", "DraftProposer::propose");
}

void DraftProposer::rollback(int length) {
  // Keep at most the first `length` cached tokens, in the cache and in cached_.
  (void)length;
  throw NotImplemented("06", "DraftProposer::rollback");
}

std::vector<int> generate_speculative(TargetModel& target, Proposer& proposer, std::span<const int> prompt,
                                      int max_new_tokens, int k, const SamplingParams& params, KVStore& target_cache,
                                      SpecStats* stats) {
  // Prefill all of the prompt but its last token; then rounds of propose, ONE target forward,
  // verify, roll both caches back, until max_new_tokens or EOS.
  (void)target, (void)proposer, (void)prompt, (void)max_new_tokens, (void)k, (void)params, (void)target_cache,
      (void)stats;
  throw NotImplemented("06", "generate_speculative");
}

TreeMask tree_mask(const TokenTree& tree) {
  // True where j is i or an ancestor of i. Refuses malformed trees.
  (void)tree;
  throw NotImplemented("06", "tree_mask");
}

TokenTree DraftProposer::propose_tree(std::span<const int> context, int branches, int depth) {
  // Catch up; the root is the context's last token; level by level, one forward_tree() of the
  // draft over the tree so far, `branches` most likely children for each node of the deepest
  // level. The cache ends as it started: the context but its last token.
  (void)context, (void)branches, (void)depth;
  throw NotImplemented("06", "DraftProposer::propose_tree");
}

TreeVerdict verify_tree_greedy(ConstMatrixRef target_logits, const TokenTree& tree) {
  // From the root, descend to the child whose token is the target's argmax at the current node;
  // the argmax where that fails is the next token.
  (void)target_logits, (void)tree;
  throw NotImplemented("06", "verify_tree_greedy");
}

std::vector<int> generate_tree(TargetModel& target, DraftProposer& draft, std::span<const int> prompt,
                               int max_new_tokens, int branches, int depth, KVStore& target_cache,
                               SpecStats* stats) {
  // generate_speculative()'s loop with a tree: one target forward_tree() per round, then
  // keep_tree_path() for the root and the accepted path.
  (void)target, (void)draft, (void)prompt, (void)max_new_tokens, (void)branches, (void)depth, (void)target_cache,
      (void)stats;
  throw NotImplemented("06", "generate_tree");
}

}  // namespace infer
