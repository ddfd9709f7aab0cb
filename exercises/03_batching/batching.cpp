// Lesson 03, your turn: one scheduler, a step simulator, and the batched forward.
//
// Replace each `throw NotImplemented(...)`. The contract is lessons/03_batching/batching.hpp; the
// lesson text is lessons/03_batching/README.md. Check your work with `./course check 03`.
// The plumbing (the Scheduler's queue) and the engine that runs your scheduler and your batched
// forward are written for you in lessons/03_batching/given.cpp: read its BatchEngine::step.
#include "lessons/03_batching/batching.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <map>
#include <tuple>

namespace infer {

// --------------------------------------------------------------- scheduling --

std::vector<int> Scheduler::admit(int step, int running) {
  // Continuous: pop arrived requests (front().arrival <= step), oldest first, while
  // running + admitted < max_batch_. Static: nothing unless running == 0; then the next
  // min(max_batch_, queue size) requests together, once the last of them has arrived.
  (void)step, (void)running;
  throw NotImplemented("03", "Scheduler::admit");
}

// ---------------------------------------------------------------- simulator --

SimRun simulate(std::span<const SimRequest> requests, Policy policy, int max_batch) {
  // Sort by (arrival, id), validate, and add every request to a Scheduler (a map from id to
  // index into `requests` finds a request again when admit() returns its id). Then, step by step
  // from 0 until every request has finished:
  //   1. start what scheduler.admit(step, slots taken) returns (start_step = step);
  //   2. every unfinished request holding a slot produces one token: count them in busy_slots;
  //      one that produces its last token finishes at step + 1;
  //   3. free slots: continuous frees a finished request's slot at once; static frees the
  //      whole batch when its last member finishes, and every member's finish_step is then
  //      that moment (a static batch returns its results together).
  (void)requests, (void)policy, (void)max_batch;
  throw NotImplemented("03", "simulate");
}

double percentile(std::vector<double> values, double p) {
  // Sort; rank = p / 100 * (n - 1); interpolate between values[floor(rank)] and the next.
  (void)values, (void)p;
  throw NotImplemented("03", "percentile");
}

BatchStats summarize(const SimRun& run) {
  // Latency of each outcome (finish - arrival); total_steps from the first arrival to the last
  // finish; throughput = output tokens / total_steps; utilization = sum(busy_slots) /
  // (max_batch * total_steps).
  (void)run;
  throw NotImplemented("03", "summarize");
}

std::vector<int> pareto_lengths(int n, double shape, double scale, int cap, uint64_t seed) {
  // Rng rng(seed); for each: u = 1 - rng.uniform() (in (0, 1]), x = floor(scale / u^(1/shape)),
  // capped at `cap`.
  (void)n, (void)shape, (void)scale, (void)cap, (void)seed;
  throw NotImplemented("03", "pareto_lengths");
}

// ----------------------------------------------------------- the real model --

Matrix forward_batch(const ModelWeights& model, std::span<const int> tokens, std::span<KVStore* const> caches) {
  // Like forward_cached with one token per sequence, except that the B rows belong to B
  // different sequences: read each row's position from its own cache before the first layer;
  // do the projections and the MLP on all rows at once; then, per row i, RoPE at pos[i],
  // append k.row(i), v.row(i) to caches[i], and attend with caches[i]->attend(l, q.row(i), ...).
  // (To rotate one row in place: `auto qi = q.row(i); apply_rope(qi, ...)`.)
  (void)model, (void)tokens, (void)caches;
  throw NotImplemented("03", "forward_batch");
}

}  // namespace infer
