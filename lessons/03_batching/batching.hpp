/// @file batching.hpp
/// @brief Lesson 03's contract: static and continuous batching, first in a step simulator,
/// then driving the real model.
///
/// You implement the functions declared here in `exercises/03_batching/batching.cpp`. One
/// Scheduler decides who runs; the simulator and the real engine both obey it, so what the
/// simulator predicts is what the engine does.
///
/// The cost model, shared by both: time advances in *steps*; one step is one forward over the
/// batch. A request admitted at step s spends step s on its prefill, which also yields its
/// first token; each later step yields one more. A request of k output tokens therefore holds
/// its slot for k steps (the prompt's length does not change the count: prefills are cheap
/// next to decoding here, and lesson 05 revisits them).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/weights.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"
#include "lessons/02_kv_cache/kv_cache.hpp"

namespace infer {

// =============================================================== scheduling ==

/// How free batch slots are refilled.
enum class Policy {
  Static,      ///< wait for a whole batch, run it until its longest member ends, then the next
  Continuous,  ///< refill every free slot at every step (iteration-level scheduling)
};

/// The waiting queue and the admission rule, in arrival order (FIFO).
///
/// - Continuous: at step s, admit waiting requests that have arrived (arrival <= s), oldest
///   first, until the batch is full.
/// - Static: admit only when the batch is empty, and then the next min(max_batch, waiting())
///   queued requests in arrival order, all at once, as soon as the last of them has arrived.
///   waiting() counts every queued request, arrived or not: a static batch waits to be full
///   (or to hold everything that is left) rather than starting with whoever is there.
class Scheduler {
 public:
  /// Throws infer::Error if max_batch is not positive.
  Scheduler(Policy policy, int max_batch);

  /// Queues a request. Requests must be added in non-decreasing arrival order.
  void add(int id, int arrival_step);
  /// Puts a request back at the head of the queue (given): the engine uses it for a request
  /// it took but could not start, or preempted (lesson 04). It keeps its original arrival.
  void push_front(int id, int arrival_step);
  /// The ids to start at `step`, given how many slots are taken (`running`); removes them
  /// from the queue. Never returns more than max_batch - running ids.
  std::vector<int> admit(int step, int running);

  /// Requests still queued.
  int waiting() const { return static_cast<int>(queue_.size()); }
  /// Arrival step of the oldest queued request (queue must not be empty).
  int next_arrival() const { return queue_.front().arrival; }
  /// The policy in use.
  Policy policy() const { return policy_; }
  /// The batch size.
  int max_batch() const { return max_batch_; }

 private:
  /// @cond DETAIL
  struct Waiting {  // (kept from the walkthrough, as Int8KVCache's Quantized is)
    int id, arrival;
  };
  /// @endcond
  Policy policy_;
  int max_batch_;
  std::deque<Waiting> queue_;
};

// ================================================================ simulator ==

/// A request as the simulator sees it: only lengths and an arrival time.
struct SimRequest {
  int id = 0;             ///< unique
  int prompt_tokens = 0;  ///< not used by the step cost model; kept for reports
  int output_tokens = 1;  ///< tokens it will generate (>= 1)
  int arrival_step = 0;   ///< the first step at which it may start
};

/// When a request ran.
struct SimOutcome {
  int id = 0;             ///< the request
  int arrival_step = 0;   ///< as submitted
  int start_step = 0;     ///< the step of its prefill
  int finish_step = 0;    ///< the step after its last token... or, in a static batch, after the
                          ///< batch's last token: a static batch returns all its results together
  int output_tokens = 0;  ///< tokens generated
  /// Steps from arrival to results.
  int latency() const { return finish_step - arrival_step; }
};

/// A whole simulated run.
struct SimRun {
  int max_batch = 0;                ///< the batch size
  std::vector<SimOutcome> outcomes; ///< one per request, in request order
  std::vector<int> busy_slots;      ///< per step from 0: requests that produced a token in that step;
                                    ///< one entry per step up to the last request's finish (its size is
                                    ///< the largest finish_step: no trailing idle step)
};

/// Runs `requests` (any order; sorted by arrival, then id, inside) step by step under `policy`.
/// No requests give an empty run. Throws infer::Error for max_batch < 1 (the given Scheduler's
/// constructor refuses it, requests or not), an output_tokens below 1, a negative arrival or an
/// id that appears twice, its message naming the request's id and the value.
SimRun simulate(std::span<const SimRequest> requests, Policy policy, int max_batch);

/// Latency percentiles and throughput of a run.
struct BatchStats {
  double mean_latency = 0;  ///< steps
  double p50_latency = 0;   ///< steps, linear interpolation between ranks (see percentile())
  double p99_latency = 0;   ///< steps
  int total_steps = 0;      ///< from the first arrival to the last finish
  double throughput = 0;    ///< output tokens per step over total_steps
  double utilization = 0;   ///< busy slot-steps / (max_batch * total_steps)
};

/// The p-th percentile (0..100) of `values` by linear interpolation: sort, then read rank
/// p/100 * (n - 1) between its neighbours (numpy's default). Throws infer::Error for no values
/// or a p outside [0, 100] (naming p).
double percentile(std::vector<double> values, double p);

/// Summarizes a run. Throws infer::Error for a run with no outcomes.
BatchStats summarize(const SimRun& run);

/// Output lengths for the README's exercise (fifty requests of heavy-tailed lengths): Pareto(shape, scale) by inversion,
/// `scale / u^(1/shape)` for u uniform in (0, 1], rounded down and capped at `cap`. Draw u as
/// `1 - Rng(seed).uniform()` (uniform() is in [0, 1)), one draw per length, in order: the same
/// seed then gives everyone the same lengths. Throws infer::Error for n < 0, shape <= 0,
/// scale < 1 or cap < 1, naming the value refused.
std::vector<int> pareto_lengths(int n, double shape, double scale, int cap, uint64_t seed);

// ============================================================ the real model ==

/// One decode step for several sequences at once. Sequence i's next token is `tokens[i]`,
/// at position `caches[i]->length()`; each cache belongs to one sequence.
///
/// The projections and the MLP run as one matrix product over the batch: one linear()
/// (common/linear.hpp) per weight matrix, over all B rows, the output head's included (the test
/// watches linear() to see each matrix read once for the batch; swiglu_mlp() calls it for the
/// MLP's three); RoPE uses each row's own position; each row appends its K/V to its own cache and attends over it
/// (`caches[i]->attend(...)`, lesson 02's KVStore::attend).
/// Validate everything first (at least one token, as many tokens as caches, ids, no two rows
/// sharing one cache, room in every cache and in the model's context): a call that breaks any of
/// these throws and appends nothing, and a bad id's message names it. The caches are the caller's,
/// who keeps them non-null and made for this model (not checked here).
/// @return [B, vocab] logits, row i for sequence i; equal to forward_cached() of each alone.
Matrix forward_batch(const ModelWeights& model, std::span<const int> tokens, std::span<KVStore* const> caches);

}  // namespace infer
