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
  struct Waiting {
    int id, arrival;
  };
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
  std::vector<int> busy_slots;      ///< per step from 0: requests that produced a token in that step
};

/// Runs `requests` (any order; sorted by arrival, then id, inside) step by step under `policy`.
/// Throws infer::Error for an output_tokens below 1 or a negative arrival.
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
/// p/100 * (n - 1) between its neighbours (numpy's default). Throws for no values.
double percentile(std::vector<double> values, double p);

/// Summarizes a run.
BatchStats summarize(const SimRun& run);

/// Output lengths for the source's exercise 2: Pareto(shape, scale) by inversion,
/// `scale / u^(1/shape)` for u uniform in (0, 1], rounded down and capped at `cap`.
std::vector<int> pareto_lengths(int n, double shape, double scale, int cap, uint64_t seed);

// ============================================================ the real model ==

/// One decode step for several sequences at once. Sequence i's next token is `tokens[i]`,
/// at position `caches[i]->length()`; each cache belongs to one sequence.
///
/// The projections and the MLP run as one matrix product over the batch (B rows); RoPE uses
/// each row's own position; each row appends its K/V to its own cache and attends over it.
/// Validate everything first (ids, equal counts, room in every cache): a refused call appends
/// nothing. Two rows must not share a cache.
/// @return [B, vocab] logits, row i for sequence i; equal to forward_cached() of each alone.
Matrix forward_batch(const ModelWeights& model, std::span<const int> tokens, std::span<KVStore* const> caches);

/// A generation request for the engine.
struct GenerationRequest {
  int id = 0;                  ///< unique
  std::vector<int> prompt;     ///< token ids, BOS first
  int max_new_tokens = 1;      ///< limit (EOS may end it sooner)
  SamplingParams sampling;     ///< this request's sampler, seeded per request
  int arrival_step = 0;        ///< when it becomes visible to the scheduler
};

/// What the engine returns for a request.
struct GenerationResult {
  int id = 0;                 ///< the request
  std::vector<int> tokens;    ///< generated ids (EOS kept if produced)
  int arrival_step = 0;       ///< as submitted
  int first_token_step = 0;   ///< the step of its prefill
  int finish_step = 0;        ///< the step after its last token (static: after its batch's)
};

/// Per-step record of what the engine did.
struct EngineStepLog {
  int step = 0;      ///< the step
  int prefills = 0;  ///< requests admitted (each prefilled) in this step
  int decodes = 0;   ///< sequences in this step's batched decode
  int occupied = 0;  ///< slots taken during the step (static batches keep finished members' slots)
};

/// The engine: a Scheduler over a model. Each step, it runs one forward_batch over the running
/// sequences and samples each one's next token with its own Sampler; then admits what the
/// scheduler allows (a prefill each, with forward_cached, which yields each newcomer's first
/// token in the same step); then retires sequences that emitted EOS or reached max_new_tokens.
/// Decoding before admitting keeps newcomers out of the decode batch, and gives the same
/// schedule as the simulator (which admits first): decoding frees no slot, so admission sees
/// the same occupancy either way.
///
/// Sequences are independent: a request's tokens are exactly what generate_cached() would
/// produce for it alone, whatever else shares the batch.
class BatchEngine {
 public:
  /// `max_batch` slots; each slot gets a float KV cache of the model's full context.
  BatchEngine(const ModelWeights& model, Policy policy, int max_batch);
  ~BatchEngine();
  BatchEngine(const BatchEngine&) = delete;
  BatchEngine& operator=(const BatchEngine&) = delete;

  /// Queues a request. Throws infer::Error for a duplicate id, an empty prompt, bad ids,
  /// max_new_tokens < 1, a prompt + max_new_tokens beyond the context, or arrivals out of order.
  void submit(GenerationRequest request);
  /// One step (one batched decode, admissions, retirements) and true; or, when nothing runs
  /// and nothing waits, false without doing or logging anything.
  bool step();
  /// Runs steps until every submitted request has finished; returns results in submission order.
  std::vector<GenerationResult> run();
  /// What each step did.
  const std::vector<EngineStepLog>& log() const { return log_; }
  /// Results so far, in submission order (complete once step() has returned false).
  const std::vector<GenerationResult>& results() const { return results_; }

 private:
  /// A sequence in a slot.
  struct Running {
    size_t index;                    ///< into requests_ and results_
    Sampler sampler;                 ///< this request's own sampler
    std::unique_ptr<KVCache> cache;  ///< this sequence's KV cache, taken from free_caches_
    int next_token = 0;              ///< sampled, not yet fed to the model
    bool done = false;               ///< finished; a static batch keeps it until the batch ends
  };

  const ModelWeights& model_;
  Scheduler scheduler_;
  std::vector<GenerationRequest> requests_;     ///< by submission index
  std::vector<GenerationResult> results_;       ///< by submission index
  std::vector<std::unique_ptr<KVCache>> free_caches_;
  std::vector<std::unique_ptr<Running>> running_;
  std::vector<EngineStepLog> log_;
  int now_ = 0;
};

}  // namespace infer
