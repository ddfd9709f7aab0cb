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
/// No requests give an empty run. Throws infer::Error for an output_tokens below 1, a negative
/// arrival or an id that appears twice.
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
/// or a p outside [0, 100].
double percentile(std::vector<double> values, double p);

/// Summarizes a run. Throws infer::Error for a run with no outcomes.
BatchStats summarize(const SimRun& run);

/// Output lengths for the source's exercise 2: Pareto(shape, scale) by inversion,
/// `scale / u^(1/shape)` for u uniform in (0, 1], rounded down and capped at `cap`. Draw u as
/// `1 - Rng(seed).uniform()` (uniform() is in [0, 1)), one draw per length, in order: the same
/// seed then gives everyone the same lengths. Throws infer::Error for n < 0, shape <= 0,
/// scale < 1 or cap < 1.
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
  int preemptions = 0;        ///< times it was preempted and resumed (lesson 04)
  int cached_tokens = 0;      ///< prompt positions found in a prefix cache at its first start, not computed (lesson 05)
};

/// Per-step record of what the engine did.
struct EngineStepLog {
  int step = 0;             ///< the step
  int prefills = 0;         ///< requests admitted (each prefilled) in this step
  int decodes = 0;          ///< sequences in this step's batched decode
  int occupied = 0;         ///< slots taken during the step (static batches keep finished members' slots)
  int preempted = 0;        ///< sequences preempted at the start of the step (lesson 04)
  int resumed = 0;          ///< preempted sequences started again (prefill by recompute, lesson 04)
  long prefill_tokens = 0;  ///< positions the step's prefills computed (a prefix cache's hits are not computed, lesson 05)
  long stored_tokens = 0;   ///< K/V positions held by running sequences after the step
  long reserved_tokens = 0; ///< positions of KV memory reserved for them (KVManager::reserved_tokens)
};

/// Where the engine's sequences keep their keys and values. Lesson 03's answer is one
/// contiguous cache per slot (SlotKVManager); lesson 04's is a pool of fixed-size blocks.
///
/// The engine opens a store when a sequence starts, closes it when the sequence ends, and,
/// before each decode, asks how many of the newest running sequences must give their memory
/// back so that the others can each store one more position.
class KVManager {
 public:
  virtual ~KVManager() = default;
  /// A store for a sequence whose first `tokens` positions are about to be stored, with room
  /// for them reserved; or nullptr if the free memory cannot hold them now.
  virtual std::unique_ptr<KVStore> open(int tokens) = 0;
  /// Takes back a store from open(); its memory is free again.
  virtual void close(std::unique_ptr<KVStore> store) = 0;
  /// Before a decode that appends one position to each of `running` (stores from open(),
  /// oldest sequence first): how many of the newest must be preempted, their memory freed, for
  /// the others to fit. 0 when all fit.
  virtual int preemptions_needed(std::span<const KVStore* const> running) const = 0;
  /// The most positions one sequence can ever hold (the engine refuses longer requests).
  virtual int capacity_tokens() const = 0;
  /// Positions of memory reserved by open stores right now.
  virtual long reserved_tokens() const = 0;

  // What the engine calls. The defaults suit memories without a prefix cache; lesson 05's
  // overrides them.

  /// open() for a sequence whose first positions will hold `tokens`. A memory with a prefix cache
  /// may return a store that already holds the K/V of a prefix of them, never all of them: its
  /// length() says how many, and the engine computes only the rest. Default: open(tokens.size()), an empty store.
  virtual std::unique_ptr<KVStore> open_for(std::span<const int> tokens) {
    return open(static_cast<int>(tokens.size()));
  }
  /// close() for a finished sequence's store, which holds the K/V of the first store->length()
  /// of `tokens`: a prefix cache keeps them for later requests. (A preempted sequence's store is
  /// close()d: its memory is needed at once.)
  /// Default: close(store).
  virtual void release(std::unique_ptr<KVStore> store, std::span<const int> tokens) {
    (void)tokens;
    close(std::move(store));
  }
  /// preemptions_needed(), with leave to free memory first (a prefix cache gives back cached
  /// blocks nobody uses before anyone is preempted). Default: preemptions_needed(running).
  virtual int make_room(std::span<const KVStore* const> running) { return preemptions_needed(running); }
};

/// Lesson 03's memory (given): `slots` contiguous KVCache objects, each reserved for the model's
/// whole context. open() hands out a free one (nullptr when all are taken); nothing is ever
/// preempted.
class SlotKVManager final : public KVManager {
 public:
  /// `slots` caches of config.max_position_embeddings positions. Throws for slots < 1.
  SlotKVManager(const ModelConfig& config, int slots);
  /// The given stores as the slots (lesson 07 passes caches in device memory), each holding
  /// their common max_tokens(). Throws for no stores, a null one, or unequal max_tokens().
  explicit SlotKVManager(std::vector<std::unique_ptr<KVStore>> stores);
  std::unique_ptr<KVStore> open(int tokens) override;
  void close(std::unique_ptr<KVStore> store) override;
  int preemptions_needed(std::span<const KVStore* const> running) const override;
  int capacity_tokens() const override;
  long reserved_tokens() const override;

 private:
  int context_ = 0, slots_ = 0;
  std::vector<std::unique_ptr<KVStore>> free_;
};

// ============================================================ the forward seam ==

/// One sequence's share of a step: its `tokens` are fed at positions cache->length() onwards,
/// and their K/V appended to `cache`. A decode is a chunk of one token (the one it sampled last);
/// a prompt, or a piece of one, is a chunk of several.
struct Chunk {
  std::span<const int> tokens;  ///< at least one token
  KVStore* cache = nullptr;     ///< the sequence's K/V, which the forward extends
  int id = -1;                  ///< the request it belongs to (-1: not said), for whoever watches the forward
};

/// What one step feeds the model: a flat, variable-length batch. Every sequence in the step
/// advances by its own chunk; lesson 03's batched decode (every chunk one token), a newcomer's
/// whole prompt and lesson 10's prompt pieces are step inputs of different shapes, run by the
/// same forward.
struct StepInput {
  std::vector<Chunk> chunks;  ///< one per sequence, in the order of the logits' rows
};

/// Checks a step before any of it runs (given; every ModelRunner calls it): throws infer::Error,
/// naming `who`, for no chunks, an empty chunk, a null cache, two chunks on one cache, token ids
/// outside the vocabulary, or a chunk that would overflow its cache or the context.
void check_step(const ModelConfig& config, const StepInput& step, const char* who);

/// The engine's forward over a step (given): the rows of every chunk are stacked, so each weight
/// matrix is read once for the whole step; RoPE uses each row's own position; attention runs per
/// chunk over its own cache, causal within the chunk. Returns [chunks, vocab]: row i holds the
/// logits after chunk i's last token (equal to forward_cached() of each chunk alone, within float
/// rounding).
///
/// Throws infer::Error, before anything is appended, for a step check_step() refuses.
Matrix forward_step(const ModelWeights& model, const StepInput& step);

/// The forward seam: what the engine calls once per step, with every sequence's chunk. It never
/// touches the weights or the memory itself. CpuRunner runs forward_step() on the CPU; lesson
/// 07's CudaForward runs the same step on a GPU, over caches that live in device memory (its own
/// KVManager hands them out).
class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  /// The model's shape.
  virtual const ModelConfig& config() const = 0;
  /// Runs one step: forward_step()'s contract.
  virtual Matrix forward(const StepInput& step) = 0;
};

/// The CPU runner: forward_step() on `model` (kept by reference).
class CpuRunner final : public ModelRunner {
 public:
  /// Runs on `model`, which must outlive it.
  explicit CpuRunner(const ModelWeights& model) : model_(model) {}
  const ModelConfig& config() const override { return model_.config; }
  Matrix forward(const StepInput& step) override { return forward_step(model_, step); }

 private:
  const ModelWeights& model_;
};

/// The engine (given): a Scheduler and a KVManager over a model, and one forward per step.
///
/// A sequence is its tokens (its prompt, then every token it sampled) and how many of them have
/// been computed, which is its store's length(): the K/V of those positions are in memory. It
/// feeds the model the tokens not computed yet, and samples its next token once none are left.
/// Each step
///
///  1. makes room: asks the memory how many of the newest running sequences must make way for
///     the others to store one more position, and preempts them (never, with slot caches): a
///     preempted sequence gives its memory back (nothing of it is computed any more) and goes
///     to the head of the queue, keeping its tokens and its Sampler;
///  2. plans: every running sequence feeds its one uncomputed token (the one it sampled last: a
///     decode); then, in a step that did not have to preempt (memory is short), the scheduler's
///     admissions, in queue order, while the memory holds each one's tokens without taking what
///     the decodes need (what does not fit goes back to the queue): each feeds every token it has
///     that its new store does not already hold (a prefix cache's match, lesson 05), its whole
///     prompt if it is new, or, preempted, its prompt and everything it had generated
///     (recompute);
///  3. runs the plan as one StepInput through the ModelRunner: one forward for the whole step;
///  4. samples: each sequence whose tokens are now all computed samples its next token with its
///     own Sampler (a newcomer's first token comes in the step it was admitted);
///  5. retires sequences that emitted EOS or reached max_new_tokens (their memory at once;
///     their slot at once, or with the whole batch under the static policy).
///
/// Admitting in the step gives the simulator's schedule: a newcomer spends its first step on its
/// prefill, which also yields its first token.
///
/// Sequences are independent: a request's tokens are exactly what generate_cached() would
/// produce for it alone, whatever else shares the batch, and however often it was preempted.
class BatchEngine {
 public:
  /// `max_batch` slots; each slot gets a float KV cache of the model's full context.
  BatchEngine(const ModelWeights& model, Policy policy, int max_batch);
  /// `max_batch` slots over the given memory (lesson 04 passes a paged pool).
  BatchEngine(const ModelWeights& model, Policy policy, int max_batch, std::unique_ptr<KVManager> memory);
  /// `max_batch` slots, forwards run by `runner` over `memory`, whose stores `runner` must be
  /// able to use (lesson 07 passes a CUDA runner and its device memory).
  BatchEngine(std::unique_ptr<ModelRunner> runner, Policy policy, int max_batch, std::unique_ptr<KVManager> memory);
  ~BatchEngine();
  BatchEngine(const BatchEngine&) = delete;
  BatchEngine& operator=(const BatchEngine&) = delete;

  /// Queues a request. Throws infer::Error for a duplicate id, an empty prompt, bad ids,
  /// max_new_tokens < 1, a prompt + max_new_tokens beyond the context or the memory's
  /// capacity_tokens(), or arrivals out of order.
  void submit(GenerationRequest request);
  /// One step (room, plan, one forward, sampling, retirements) and true; or, when nothing runs
  /// and nothing waits, false without doing or logging anything.
  bool step();
  /// Runs steps until every submitted request has finished; returns results in submission order.
  std::vector<GenerationResult> run();
  /// What each step did.
  const std::vector<EngineStepLog>& log() const { return log_; }
  /// Results so far, in submission order (complete once step() has returned false).
  const std::vector<GenerationResult>& results() const { return results_; }
  /// The KV memory.
  const KVManager& memory() const { return *memory_; }

 private:
  /// A sequence in a slot.
  struct Running {
    size_t index;                    ///< into requests_ and results_
    Sampler sampler;                 ///< this request's own sampler
    std::unique_ptr<KVStore> cache;  ///< its computed K/V, from memory_ (null once done, or while preempted)
    std::vector<int> tokens;         ///< its prompt, then every token it sampled
    bool done = false;               ///< finished; a static batch keeps it until the batch ends

    /// Tokens whose K/V are in memory.
    int computed() const { return cache ? cache->length() : 0; }
  };
  /// Frees a running sequence's memory and queues it again (step 1).
  void preempt(std::unique_ptr<Running> r);
  /// Takes the scheduler's admissions into running_ while the memory holds them (step 2); the
  /// rest go back to the queue. Counts them in `entry`.
  void admit(EngineStepLog& entry);

  std::unique_ptr<ModelRunner> runner_;
  Scheduler scheduler_;
  std::unique_ptr<KVManager> memory_;
  std::vector<GenerationRequest> requests_;     ///< by submission index
  std::vector<GenerationResult> results_;       ///< by submission index
  std::vector<std::unique_ptr<Running>> running_;  ///< oldest first
  std::vector<std::unique_ptr<Running>> paused_;   ///< by submission index: a preempted sequence, without memory
  std::vector<EngineStepLog> log_;
  int now_ = 0;
};

}  // namespace infer
