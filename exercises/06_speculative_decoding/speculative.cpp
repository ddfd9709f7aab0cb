// Lesson 06, your turn: exact speculative sampling, two proposers (prompt lookup and a draft
// model), and the draft-target loop with its rollback.
//
// Replace each `throw NotImplemented(...)`. The contract is
// lessons/06_speculative_decoding/speculative.hpp; the lesson text is
// lessons/06_speculative_decoding/README.md. Check your work with `./course check 06`.
// The constructors, CpuTarget and KVStore::truncate() are written for you (given.cpp, and
// lesson 02's given.cpp).
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

Proposal DraftProposer::propose(std::span<const int> context, int k) {
  // Bring the draft's cache to the context (all but its last token cached before the forward),
  // then draw up to k guesses one at a time, recording each one's distribution in q.
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

}  // namespace infer
