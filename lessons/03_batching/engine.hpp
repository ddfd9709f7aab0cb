/// @file engine.hpp
/// @brief The engine every lesson extends (given): one sequence model, one step input, one forward
/// seam, one loop.
///
/// Lesson 03 introduces it, running your Scheduler; lesson 04 gives it paged memory, lesson 05 a
/// prefix cache, lesson 07 a GPU, lesson 10 a planner that chunks prompts and a server. Programs
/// drive it the same way:
///
///     request -> Engine::submit -> Sequence (tokens, computed())
///     Engine::step():   plan   = Planner::plan()       who feeds how many tokens (1 = decode)
///                       input  = a StepInput           a chunk of tokens per planned sequence
///                       logits = ModelRunner::forward(input)
///                       events = sample + retire       (request id, token, finished and why)
#pragma once

#include <algorithm>
#include <memory>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/projection.hpp"
#include "common/weights.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"
#include "lessons/02_kv_cache/kv_cache.hpp"
#include "lessons/03_batching/batching.hpp"

namespace infer {

// ================================================================ requests ==

/// A generation request for the engine.
struct GenerationRequest {
  int id = 0;                  ///< unique among the requests in the engine
  std::vector<int> prompt;     ///< token ids, BOS first
  int max_new_tokens = 1;      ///< limit (EOS may end it sooner)
  SamplingParams sampling;     ///< this request's sampler, seeded per request
  int arrival_step = 0;        ///< when it becomes visible to the scheduler
  /// Log-probabilities with each token (a server's `logprobs`): -1 none; N >= 0 the sampled
  /// token's and those of the model's N most likely tokens (TokenEvent::logprob and TokenEvent::top).
  int logprobs = -1;
};

/// Why a request left the engine.
enum class FinishReason {
  None,       ///< it has not (yet)
  Stop,       ///< it sampled the end-of-sequence token (kept in its tokens)
  Length,     ///< it reached max_new_tokens
  Cancelled,  ///< Engine::cancel() withdrew it
};

/// The name OpenAI's API gives a reason: "stop", "length", "cancelled" (or "" for None).
const char* finish_reason_name(FinishReason reason);

/// What the engine returns for a request, once it has left the engine.
struct GenerationResult {
  int id = 0;                 ///< the request
  std::vector<int> tokens;    ///< generated ids (EOS kept if produced)
  int arrival_step = 0;       ///< as submitted
  int first_token_step = 0;   ///< the step that sampled its first token (its prefill's last step)
  int finish_step = 0;        ///< the step after its last token (static: after its batch's)
  int preemptions = 0;        ///< times it was preempted and resumed (lesson 04)
  int cached_tokens = 0;      ///< prompt positions found in a prefix cache at its first start, not computed (lesson 05)
  FinishReason finish = FinishReason::None;  ///< why it ended
};

/// One token a step produced: what a server streams.
struct TokenEvent {
  int id = 0;                                ///< the request
  int token = 0;                             ///< the token it sampled
  FinishReason finish = FinishReason::None;  ///< on a request's last token: why it ends there
  /// With GenerationRequest::logprobs >= 0: the token's log-probability under the model (the
  /// log-softmax of its logits, before temperature, top-k or top-p). Otherwise 0.
  float logprob = 0.0f;
  /// With GenerationRequest::logprobs = N >= 0: the model's N most likely tokens with their
  /// log-probabilities, most likely first. Otherwise empty.
  std::vector<std::pair<int, float>> top = {};
};

/// Fills event.logprob and event.top from `logits` ([1, vocab], the row event.token was sampled
/// from) when n >= 0: the log-softmax of the row, and its n largest entries (given).
void fill_logprobs(TokenEvent& event, ConstMatrixRef logits, int n);

/// Per-step record of what the engine did.
struct EngineStepLog {
  int step = 0;             ///< the step
  int decodes = 0;          ///< sequences that fed the one token they had sampled (and sampled the next)
  int prefills = 0;         ///< sequences that fed (a piece of) their prefill: a newcomer's prompt, or a preempted one's tokens (recompute)
  long prefill_tokens = 0;  ///< tokens those prefills fed (a prefix cache's hits are not fed, lesson 05)
  int admitted = 0;         ///< sequences that entered the batch, new or preempted before
  int resumed = 0;          ///< of those, preempted sequences started again (lesson 04)
  int preempted = 0;        ///< sequences preempted at the start of the step (lesson 04)
  int forwards = 0;         ///< ModelRunner::forward calls: 1, or 0 for a step with nothing to feed
  int proposed = 0;         ///< guesses fed for verification by speculative decodes (lesson 06)
  int accepted = 0;         ///< of them, kept
  int occupied = 0;         ///< places in the batch taken during the step (a static batch keeps its finished members')
  long stored_tokens = 0;   ///< K/V positions held by running sequences after the step
  long reserved_tokens = 0; ///< positions of KV memory taken after the step, a prefix cache's included (KVManager::reserved_tokens)
};

// ============================================================== KV memory ==

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
  /// Before a step that appends at least one position to each of `running` (stores from open(),
  /// oldest sequence first): how many of the newest must be preempted, their memory freed, for
  /// the others to fit. 0 when all fit.
  virtual int preemptions_needed(std::span<const KVStore* const> running) const = 0;
  /// The most positions one sequence can ever hold (the engine refuses longer requests).
  virtual int capacity_tokens() const = 0;
  /// Positions of memory taken right now: by open stores, and by what the memory keeps of its own
  /// (a prefix cache's blocks, which it gives back when asked for room).
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

/// Which tokens of a chunk each token of it may attend to: [n, n], mask(i, j) true where token i
/// sees token j. Lesson 06 builds one for a tree of guesses (tree_mask()).
using TreeMask = Eigen::Matrix<bool, Eigen::Dynamic, Eigen::Dynamic>;

/// One sequence's share of a step: its `tokens` are fed after the cache's positions, and their
/// K/V appended to `cache` in order (token i at row cache->length() + i). A decode is a chunk of
/// one token (the one it sampled last); a prompt, or a piece of one, is a chunk of several.
///
/// By default the tokens are a chain: token i sits at position cache->length() + i and sees the
/// cache and tokens 0..i (causal). With a `mask` (lesson 06's tree of guesses) token i sees the
/// cache and the tokens j with mask(i, j), itself included and none after it, and sits at
/// position cache->length() + (tokens it sees in the chunk) - 1: its depth in the tree. The
/// causal chunk is the case of a lower-triangular mask.
struct Chunk {
  std::span<const int> tokens;  ///< at least one token
  KVStore* cache = nullptr;     ///< the sequence's K/V, which the forward extends
  int id = -1;                  ///< the request it belongs to (-1: not said), for whoever watches the forward
  /// How many of its last tokens want their logits: 1 (the next token after the chunk), or, for a
  /// speculative decode (lesson 06), every token of the chunk, one row per guess to verify.
  int logits = 1;
  const TreeMask* mask = nullptr;  ///< null: causal; else [n, n] (not owned; it outlives the forward)
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
/// outside the vocabulary, a chunk that would overflow its cache or the context, a chunk's
/// `logits` outside [1, its tokens], or a mask that is not [n, n], hides a token from itself or
/// shows it a later one (the message names the "mask").
/// @return the rows of logits the step returns: the sum of the chunks' `logits`.
int check_step(const ModelConfig& config, const StepInput& step, const char* who);

/// The engine's forward over a step (given): the rows of every chunk are stacked, so each weight
/// matrix is read once for the whole step; RoPE uses each row's own position; attention runs per
/// chunk over its own cache, causal within the chunk (or as its mask says). Returns a row of logits per wanted position,
/// chunk after chunk: chunk i's last `logits` tokens, in order (one row, after its last token,
/// for an ordinary chunk). Each equals forward_cached() of the chunk alone, within float rounding.
///
/// It runs as one OpenMP parallel region on every core (OMP_NUM_THREADS to choose fewer): each
/// product split by rows of W (linear_rows_into(), each thread streaming its own share), attention
/// a chunk per thread (a step of one chunk: a group of query heads per thread), the threads meeting
/// only where the data needs it (six times a layer). Up to kLinearTileRows rows a step the logits
/// are the same bits on any thread count; above, each thread's slice goes through Eigen's product,
/// equal within float rounding.
///
/// Throws infer::Error, before anything is appended, for a step check_step() refuses.
Matrix forward_step(const ModelWeights& model, const StepInput& step);

/// The same step with the products by `projections` instead of the model's float32 matrices
/// (lesson 11's 8- and 4-bit weights, say; the embeddings and norms still come from `model`).
/// forward_step(model, step) is this with float_projections(model). `projections` must have
/// `model`'s shapes (ModelProjections::check()).
Matrix forward_step(const ModelWeights& model, const ModelProjections& projections, const StepInput& step);

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

/// The CPU runner: forward_step() on `model` (kept by reference), its products by the model's
/// float32 matrices or by the projections it is given (lesson 11's quantized weights).
class CpuRunner final : public ModelRunner {
 public:
  /// Runs on `model`'s float32 weights; `model` must outlive it.
  explicit CpuRunner(const ModelWeights& model) : CpuRunner(model, float_projections(model)) {}
  /// Runs on `model` with its products by `projections` (checked against its shapes: throws
  /// infer::Error naming the first that differs); `model` must outlive it.
  CpuRunner(const ModelWeights& model, ModelProjections projections)
      : model_(model), projections_(std::move(projections)) {
    projections_.check(model.config);
  }
  const ModelConfig& config() const override { return model_.config; }
  Matrix forward(const StepInput& step) override { return forward_step(model_, projections_, step); }
  /// What a decode step reads of the weights, in bytes.
  long weight_bytes() const { return projections_.bytes(); }

 private:
  const ModelWeights& model_;
  ModelProjections projections_;
};

// ================================================================= the engine ==

/// What a Speculator keeps for one sequence between rounds (lesson 06: its proposer, say a draft
/// model with its own KV cache). It lives in the Sequence and leaves with it.
struct SpeculationState {
  virtual ~SpeculationState() = default;
};

/// A request inside the engine: its tokens and how many of them are computed. Everything the
/// engine knows about a request lives here, and leaves with it.
///
/// Its tokens are its prompt, then every token it sampled. The computed ones are those whose K/V
/// are in its store (computed() is the store's length). It feeds the model the tokens not
/// computed yet, and samples its next token once none are left. A decode is a sequence with one
/// uncomputed token, the one it sampled last. Preempted, it loses its store: nothing of it is
/// computed any more, and when it is admitted again it feeds everything it has that its new store
/// does not already hold (recompute; a prefix cache may still hold a prefix of it) and
/// samples where it stopped: there is no other state to restore.
struct Sequence {
  GenerationRequest request;        ///< as submitted (its prompt, limits and sampling)
  long ticket = 0;                  ///< submission order, engine-wide
  std::vector<int> tokens;          ///< its prompt, then every token it sampled
  Sampler sampler;                  ///< its own sampler, seeded by its request
  std::unique_ptr<KVStore> cache;   ///< its computed K/V (null while waiting or once done)
  int prefill_end = 0;              ///< tokens.size() when it was last admitted: it decodes once they are computed
  GenerationResult result;          ///< its record so far (tokens filled in when it leaves; finish set when it ends)
  std::unique_ptr<SpeculationState> speculation;  ///< the Speculator's state for it (null until its first round)

  /// Finished (EOS or max_new_tokens): it leaves at the end of the step (static: with its batch).
  bool done() const { return result.finish != FinishReason::None; }

  /// Tokens whose K/V are in memory.
  int computed() const { return cache ? cache->length() : 0; }
  /// Tokens still to feed before it samples.
  int uncomputed() const { return static_cast<int>(tokens.size()) - computed(); }
  /// Whether its prefill is stored, so that what it feeds is what it samples (false once done).
  bool decoding() const { return !done() && cache != nullptr && computed() >= prefill_end; }
  /// Prefill tokens not stored yet (0 once decoding, and once done).
  int prefill_left() const { return done() || cache == nullptr ? 0 : std::max(0, prefill_end - computed()); }
  /// Tokens it generated so far.
  int generated() const { return static_cast<int>(tokens.size()) - static_cast<int>(request.prompt.size()); }
};

/// One entry of a step's plan: `seq` feeds its next `tokens` uncomputed tokens.
struct Planned {
  Sequence* seq = nullptr;  ///< who (a running sequence that is not done)
  int tokens = 0;           ///< how many: 1 for a decode, 1..prefill_left() for a piece of its prefill
};

class Planner;

/// Speculative decoding inside the engine (lesson 06 plugs its proposers and verification in):
/// a decoding sequence feeds the token it sampled and up to k guesses of what follows, all in the
/// step's one forward, with logits at every one of them; it keeps the guesses the target model
/// agrees with (exactly its distribution: greedy gives the tokens plain decoding gives) and one
/// token of the target's own; the store is rolled back past the rest.
class Speculator {
 public:
  virtual ~Speculator() = default;
  /// Up to k tokens that may follow seq.tokens (fewer, or none, is allowed). Whatever it keeps
  /// for the sequence between rounds goes in seq.speculation.
  virtual std::vector<int> propose(Sequence& seq, int k) = 0;
  /// One round's verdict over the guesses propose() just gave: `logits` has guesses.size() + 1
  /// rows (row i: the target's logits where guesses[i] would go; the last: after all of them),
  /// sampled with seq's parameters. Returns the guesses kept (a prefix of them) followed by the
  /// target's own next token.
  virtual std::vector<int> verify(Sequence& seq, ConstMatrixRef logits, std::span<const int> guesses) = 0;
};

/// What the engine holds, container by container: how a long-running server checks that finished
/// requests leave nothing behind.
struct EngineFootprint {
  size_t requests = 0;  ///< requests in the engine (running or waiting), by id
  size_t running = 0;   ///< sequences in the batch
  size_t waiting = 0;   ///< sequences waiting for admission
  size_t queued = 0;    ///< entries in the Scheduler's queue (cancelled ones linger until they reach its head)
  size_t finished = 0;  ///< results not yet taken by take_finished()
  size_t log = 0;       ///< step log entries (1 at most without keep_log)
};

/// The engine's limits.
struct EngineOptions {
  Policy policy = Policy::Continuous;  ///< lesson 03's scheduling
  int max_running = 8;                 ///< sequences in the batch at once (the batch size)
  bool keep_log = true;                ///< keep every step's EngineStepLog (a server keeps only the last)
  int speculative_tokens = 0;          ///< guesses per speculative decode (needs a Speculator; 0: none)
};

/// The engine (given): requests in, token events out, one step at a time. It is driven the same
/// way by every program (`generate`, `serve-offline`, `serve`) and every lesson plugs into it:
/// your Scheduler (03) admits, a KVManager (03's slots, 04's blocks, 05's prefix cache) holds the
/// K/V, a Planner (03's WholePrompts, 10's ChunkedPrefill) plans, a ModelRunner (the CPU's
/// forward_step, 07's CUDA) runs.
///
/// step():
///
///  1. plan: the Planner's plan, which preempts (make_room) and admits (admit_next) as it goes;
///     then each planned sequence's store reserves the positions it is about to feed
///     (KVStore::reserve: a paged store takes its blocks here), so the forward never allocates;
///  2. run: the plan as one StepInput through the ModelRunner, one forward for the whole step;
///  3. sample: each planned sequence whose tokens are all computed now samples its next token
///     with its own Sampler (a newcomer's first token comes at the end of its prompt; a piece of
///     a prompt that leaves some unfed samples nothing); with a Speculator, a decode fed its
///     guesses too keeps those the model agrees with and one token of its own, and its store is
///     rolled back (KVStore::truncate) past the rest;
///  4. retire: a sequence that sampled EOS or reached max_new_tokens frees its memory
///     (KVManager::release, which a prefix cache keeps) and leaves the batch: at once
///     (continuous), or with the whole batch (static, whose members all finish then). A request
///     that leaves is forgotten: its GenerationResult waits in take_finished().
///
/// Sequences are independent: a request's tokens are what generate_cached() would produce for it
/// alone, however its prompt was planned, whatever shared its steps, and however often it was
/// preempted (the forward equals forward_cached() within float rounding; the tests check the
/// tokens are identical).
class Engine {
 public:
  /// `model` on the CPU (CpuRunner), planned by WholePrompts, over `memory` (null: lesson 03's
  /// slots, max_running whole-context caches).
  Engine(const ModelWeights& model, Policy policy, int max_running, std::unique_ptr<KVManager> memory = nullptr);
  /// Any runner, memory and planner (null: WholePrompts), and, for speculative decoding, a
  /// speculator that proposes up to options.speculative_tokens guesses per decode. The runner
  /// must be able to use the memory's stores (lesson 07 passes a CUDA runner and its device
  /// memory). Throws for a null runner or memory, max_running < 1, speculative_tokens < 0, or
  /// speculative_tokens > 0 without a speculator.
  Engine(std::unique_ptr<ModelRunner> runner, std::unique_ptr<KVManager> memory, EngineOptions options,
         std::unique_ptr<Planner> planner = nullptr, std::unique_ptr<Speculator> speculator = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Queues a request. Throws infer::Error for an id already in the engine, an empty prompt, bad
  /// ids, bad sampling, max_new_tokens < 1, a prompt + max_new_tokens beyond the context or the
  /// memory's capacity_tokens(), or an arrival before the previous request's.
  void submit(GenerationRequest request);
  /// Withdraws request `id` (a server's client went away): a running sequence leaves the batch
  /// and its memory is freed at once; a waiting one is never admitted. Its result (the tokens it
  /// had, FinishReason::Cancelled, finish_step now()) goes to take_finished(). Returns false,
  /// doing nothing, when request `id` has finished (static: also while it waits for its batch),
  /// was cancelled, or was never submitted. Call it between steps.
  bool cancel(int id);
  /// One step (plan, one forward, sampling, retirement); the tokens it sampled, in plan order.
  /// Idle (nothing runs, nothing waits): nothing is done or logged, and no events.
  std::vector<TokenEvent> step();
  /// The results of the requests that left the engine since the last call, in the order they
  /// left; the engine keeps nothing of them.
  std::vector<GenerationResult> take_finished();
  /// Steps until idle; the results of every request that left meanwhile (or before, not yet
  /// taken), in submission order.
  std::vector<GenerationResult> run();

  /// Whether nothing runs and nothing waits.
  bool idle() const { return running_.empty() && waiting_.empty(); }
  /// What each step did (only the last step's, when options().keep_log is false).
  const std::vector<EngineStepLog>& log() const { return log_; }
  /// The KV memory.
  const KVManager& memory() const { return *memory_; }
  /// The model runner.
  ModelRunner& runner() { return *runner_; }
  /// The limits.
  const EngineOptions& options() const { return options_; }
  /// The sequences in the batch, oldest admitted first.
  const std::vector<std::unique_ptr<Sequence>>& running() const { return running_; }
  /// Requests submitted and not yet admitted (or preempted and not yet admitted again).
  int waiting() const { return static_cast<int>(waiting_.size()); }
  /// The step being planned or run (the next log entry's number).
  int now() const { return now_; }
  /// What it holds now.
  EngineFootprint footprint() const {
    return {live_.size(), running_.size(), waiting_.size(), static_cast<size_t>(queue_.waiting()), finished_.size(),
            log_.size()};
  }

  // For planners.

  /// Preempts the newest running sequences until every decoding one can store one more position
  /// (the others reserved their prefill when admitted): each frees its memory and waits at the
  /// head of the queue, keeping its tokens and its sampler. Returns how many; counts them in the
  /// step's log.
  int make_room();
  /// Admits the next request your Scheduler lets in (queue order: arrived, and a free place in
  /// the batch; static: a whole batch at once, handed out one per call), if the memory can hold
  /// its tokens now without taking what the running sequences need for their next position;
  /// returns it (now the newest in running()), or nullptr, leaving the queue as it was. Nobody
  /// in a step whose make_room() preempted: memory is short, and what it freed is for the
  /// decodes (admitted now, the victim or a newcomer would only be preempted again). Throws if
  /// the memory cannot hold a request even with nothing running.
  Sequence* admit_next();

 private:
  /// A ticket's id in the Scheduler's queue (tickets count on; the queue's ids wrap at 2^31).
  static int queue_id(long ticket) { return static_cast<int>(ticket & 0x7fffffff); }
  /// Puts back at the head of the queue what the Scheduler let in and admit_next() did not start.
  void give_back_admitted();
  /// Frees what a leaving sequence holds and files its result (its finish already set).
  void leave(std::unique_ptr<Sequence> seq, int finish_step);
  /// After `seq` sampled `token`: appends it, sets its finish when it ends there (EOS or
  /// max_new_tokens) and releases its memory then; the event to stream.
  TokenEvent take_token(Sequence& seq, int token, ConstMatrixRef logits);
  /// The guesses a decoding `seq` feeds this step (none without a speculator): at most
  /// speculative_tokens, no more than it may still generate after the token its forward gives or
  /// than its store and the context hold, and only when the memory can hold them now (reserved
  /// here).
  std::vector<int> guesses(Sequence& seq);
  /// The speculator's verdict over `seq`'s rows of logits, checked and cut at EOS; rolls its store
  /// back to the tokens it keeps. Returns the tokens it takes.
  std::vector<int> verify(Sequence& seq, ConstMatrixRef logits, std::span<const int> guesses);

  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<KVManager> memory_;
  EngineOptions options_;
  std::unique_ptr<Planner> planner_;
  std::unique_ptr<Speculator> speculator_;                 ///< null: no speculative decoding
  Scheduler queue_;                                        ///< tickets, in arrival order
  std::unordered_map<int, std::unique_ptr<Sequence>> waiting_;  ///< by queue id: queued, not running
  std::unordered_map<int, long> live_;                     ///< request id -> ticket, for every request in the engine
  std::vector<std::unique_ptr<Sequence>> running_;         ///< oldest admitted first
  std::vector<int> admitted_;                              ///< queue ids the Scheduler let in, not started yet (the oldest last)
  std::vector<const Sequence*> started_;                   ///< sequences admit_next() started in this step
  std::vector<std::pair<long, GenerationResult>> finished_;  ///< (ticket, result), until taken
  std::vector<EngineStepLog> log_;
  EngineStepLog current_;
  long next_ticket_ = 0;
  int last_arrival_ = 0;
  int now_ = 0;
};

/// What decides each step's plan: who feeds how many tokens. It makes room (Engine::make_room())
/// and admits (Engine::admit_next()) as it plans. Lesson 03's WholePrompts feeds every newcomer's
/// whole prompt in the step it is admitted; lesson 10's ChunkedPrefill spreads prompts over steps
/// under a token budget. The engine runs whatever the planner returns as one forward.
class Planner {
 public:
  virtual ~Planner() = default;
  /// The next step's plan: at most one entry per sequence, each for a running sequence that is
  /// not done, feeding 1 to uncomputed() tokens; every sequence admitted while planning must be
  /// in it (admission takes memory and a place in the batch: admit only whom the step feeds).
  virtual std::vector<Planned> plan(Engine& engine) = 0;
};

/// Lesson 03's plan (given): make room; every decoding sequence feeds its one token; then every
/// admission feeds all it has, its whole prompt (less a prefix cache's match) or, preempted
/// before, everything it had (less what a prefix cache still holds).
class WholePrompts final : public Planner {
 public:
  std::vector<Planned> plan(Engine& engine) override;
};

}  // namespace infer
