// Lesson 06, given: constructors, the CPU target, and the statistics' ratios.
#include "lessons/06_speculative_decoding/speculative.hpp"

namespace infer {

NgramProposer::NgramProposer(int max_n, int min_n) : max_n_(max_n), min_n_(min_n) {
  require(min_n >= 1 && min_n <= max_n, "NgramProposer: expected 1 <= min_n <= max_n, got min_n ", min_n, ", max_n ",
          max_n);
}

DraftProposer::DraftProposer(const ModelWeights& draft, const SamplingParams& params, int max_tokens)
    : draft_(&draft), params_(params), rng_(params.seed), cache_(draft.config, max_tokens) {
  params.validate();
}

Matrix CpuTarget::forward(std::span<const int> tokens, KVStore& cache) { return forward_cached(*model_, tokens, cache); }

double SpecStats::acceptance() const {
  return proposed > 0 ? static_cast<double>(accepted) / static_cast<double>(proposed) : 0.0;
}

double SpecStats::tokens_per_round() const {
  return rounds > 0 ? static_cast<double>(accepted + rounds) / static_cast<double>(rounds) : 0.0;
}

}  // namespace infer
