// Lesson 03, your turn: one scheduler, a step simulator, and the batched forward.
//
// Replace each `throw NotImplemented(...)`. The contract is lessons/03_batching/batching.hpp; the
// lesson text is lessons/03_batching/README.md. Check your work with `./course check 03`.
// The plumbing (the Scheduler's queue) is written for you in lessons/03_batching/given.cpp, and
// the engine that runs your scheduler in lessons/03_batching/given_engine.cpp: read Engine::step.
// Stuck on a function? `./course hint 03 NAME` gives a hint, one tier at a time.
#include "lessons/03_batching/batching.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <map>
#include <set>
#include <tuple>

#include "common/linear.hpp"

namespace infer {

// --------------------------------------------------------------- scheduling --

std::vector<int> Scheduler::admit(int step, int running) {
  // The ids to start now, removed from the queue, by the rule the contract gives for each
  // policy. Keeps the queue's FIFO order (nobody overtakes an older request), never starts a
  // request before its arrival, never fills more than max_batch - running slots, and a static
  // batch never joins one that is still running.
  (void)step, (void)running;
  throw NotImplemented("03", "Scheduler::admit");
}

// ---------------------------------------------------------------- simulator --

SimRun simulate(std::span<const SimRequest> requests, Policy policy, int max_batch) {
  // Plays the requests step by step under the contract's cost model, with a Scheduler deciding
  // every admission, so that it predicts exactly what the engine will do. Outcomes come back in
  // the order of `requests`; busy_slots has one entry per step from step 0. A static batch
  // keeps its finished members' slots and returns all its results together. Throws
  // infer::Error for an output_tokens below 1 or a negative arrival (and a repeated id).
  (void)requests, (void)policy, (void)max_batch;
  throw NotImplemented("03", "simulate");
}

double percentile(std::vector<double> values, double p) {
  // Linear interpolation between ranks, as numpy does by default (the contract gives the rank):
  // never simply the nearest value. Throws infer::Error for no values (or p outside [0, 100]).
  (void)values, (void)p;
  throw NotImplemented("03", "percentile");
}

BatchStats summarize(const SimRun& run) {
  // Every field of BatchStats, as its comments in the contract define it. The run is measured
  // from the first arrival, not from step 0: idle steps before anyone arrives do not count.
  (void)run;
  throw NotImplemented("03", "summarize");
}

std::vector<int> pareto_lengths(int n, double shape, double scale, int cap, uint64_t seed) {
  // n draws by inversion, as the contract says, from an Rng seeded with `seed`: the same seed
  // gives the same lengths. Every length is at least floor(scale) and at most cap.
  (void)n, (void)shape, (void)scale, (void)cap, (void)seed;
  throw NotImplemented("03", "pareto_lengths");
}

// ----------------------------------------------------------- the real model --

Matrix forward_batch(const ModelWeights& model, std::span<const int> tokens, std::span<KVStore* const> caches) {
  // One decode step for B sequences, as the contract describes: row i equals forward_cached() of
  // sequence i alone. Each layer runs once over the whole batch (every sequence's layer l before
  // any sequence's layer l + 1; each weight matrix in one linear() over all B rows), while each
  // row keeps its own position and its own cache. All or
  // nothing: bad ids, unequal counts, a shared cache or a full cache throw before any append.
  (void)model, (void)tokens, (void)caches;
  throw NotImplemented("03", "forward_batch");
}

}  // namespace infer
