/// @file serving.hpp
/// @brief Lesson 10's contract: the serving engine's step, with a token budget that mixes
/// chunked prefills with decodes.
///
/// Lessons 03 to 05 handed you an engine (BatchEngine) that prefills each newcomer's whole
/// prompt in the step it arrives. A 2,000-token prompt then makes that step 2,000 positions
/// long, and every running sequence waits for it: their next token comes late. Here you write the
/// engine's step yourself, in the spirit of nano-vllm's schedule, run, postprocess, with the rule
/// today's servers use:
///
/// - a step feeds at most `token_budget` tokens in all;
/// - every running sequence that is decoding gets its one token first, so decodes never stall;
/// - what is left of the budget goes to prefills, in chunks: a long prompt is spread over several
///   steps, `budget - decodes` tokens at a time;
/// - the whole step is one forward (lesson 03's forward_step): every chunk's rows go through each weight
///   matrix together, decodes and prefill chunks alike.
///
/// The memory (lesson 03's slots, lesson 04's blocks, lesson 05's prefix cache), the sampler and
/// the queue are those of the earlier lessons (`./course check 10` links their reference
/// versions, so a bug left in yours does not block this lesson); the helpers that touch them are
/// given.
#pragma once

#include <algorithm>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "lessons/00_naive_decoder/naive_decoder.hpp"
#include "lessons/02_kv_cache/kv_cache.hpp"
#include "lessons/03_batching/batching.hpp"

namespace infer {

// ================================================================== engine ==

/// The engine's limits.
struct ServingOptions {
  int max_running = 8;    ///< sequences admitted at once (prefilling or decoding)
  int token_budget = 64;  ///< tokens one step feeds, decodes and prefill chunks together; >= max_running
};

/// What one step did.
struct ServingStepLog {
  int step = 0;              ///< the step
  int decodes = 0;           ///< sequences that fed one token and sampled one
  int prefill_chunks = 0;    ///< sequences that fed a piece of their prompt (or, resumed, of their history)
  long prefill_tokens = 0;   ///< tokens those chunks fed
  int admitted = 0;          ///< sequences that entered the batch (new or resumed)
  int preempted = 0;         ///< sequences preempted at the start of the step
  int forwards = 0;          ///< calls to ModelRunner::forward (1, or 0 for an idle step)
  int running = 0;           ///< sequences in the batch after the step
};

/// The serving engine: requests in, tokens out, one step at a time. Sequences are independent: a
/// request's tokens are exactly what generate_cached() would produce for it alone, however its
/// prompt was chunked, whatever shared its steps, and however often it was preempted.
///
/// A step (step(), yours) is:
///
///  1. schedule() (yours): make room (given: make_room()), then plan who feeds how many tokens:
///     each decoding sequence (one whose prefill is all stored: !prefilling()) one token, oldest first; then the sequences still prefilling, oldest
///     first, each a chunk of what remains of its prefill, as much as the budget leaves; then, if
///     the step did not have to preempt, newcomers from the queue (given: admit_next()) while the
///     budget lasts, each with a first chunk.
///  2. run: one ModelRunner::forward over the plan's chunks, as one StepInput.
///  3. postprocess: each sequence that decoded samples its next token from its row of logits; a
///     new sequence whose chunk finished its prompt samples its first token; a resumed sequence
///     whose chunk finished its history samples nothing (its next token was sampled before it was
///     preempted). Tokens go through emit() (given), and end_step() (given) retires what finished
///     and writes the log.
class ServingEngine {
 public:
  /// A sequence in the batch.
  struct Sequence {
    size_t index = 0;                ///< its request, by submission order (results()[index])
    Sampler sampler;                 ///< its own sampler, seeded by its request
    std::unique_ptr<KVStore> cache;  ///< its K/V, from the memory
    std::vector<int> prefill;        ///< what must be stored before it decodes: its prompt or, resumed, its prompt and every generated token but the last
    bool resumed = false;            ///< restarted after a preemption: samples nothing when its prefill ends
    int next_token = 0;              ///< decoding: the token it feeds next (sampled, not yet stored)
    bool done = false;               ///< finished (EOS or max_new_tokens): retired by end_step()

    /// Whether part of `prefill` is not stored yet.
    bool prefilling() const { return cache->length() < static_cast<int>(prefill.size()); }
    /// Prefill tokens not stored yet (0 once decoding).
    int prefill_left() const { return std::max(0, static_cast<int>(prefill.size()) - cache->length()); }
  };

  /// One entry of a step's plan: `seq` feeds `tokens` tokens, one (its next_token) if it decodes.
  struct Planned {
    Sequence* seq = nullptr;  ///< who
    int tokens = 0;           ///< how many: 1 for a decode, 1..prefill_left() for a chunk
    bool decode = false;      ///< a decode (feeds next_token, samples), or a prefill chunk
  };

  /// Slot memory (lesson 03: max_running caches of the whole context) on the CPU. Given.
  ServingEngine(const ModelWeights& model, ServingOptions options);
  /// Any forward and memory (lesson 04's blocks, lesson 05's prefix cache). Given. Throws for a
  /// null forward or memory, max_running < 1, or token_budget < max_running.
  ServingEngine(std::unique_ptr<ModelRunner> forward, std::unique_ptr<KVManager> memory, ServingOptions options);
  ~ServingEngine();
  ServingEngine(const ServingEngine&) = delete;
  ServingEngine& operator=(const ServingEngine&) = delete;

  /// Queues a request (BatchEngine::submit's checks). Given.
  void submit(GenerationRequest request);
  /// Withdraws request `id` (a server's client went away): a running sequence leaves the batch
  /// and its memory is freed at once; a waiting one is never admitted. Its result keeps the
  /// tokens it had. Returns false, doing nothing, if it had already finished or was cancelled.
  /// Throws for an id never submitted. Call it between steps. Given.
  bool cancel(int id);

  /// Yours. One step: schedule(), one forward over the plan's chunks (none if the plan is
  /// empty), postprocess, end_step(); true. When nothing runs and nothing waits: false, and
  /// nothing is done or logged.
  bool step();

  /// Yours. The next step's plan, as above. Preempts (make_room) and admits (admit_next) as it
  /// goes; never plans more than token_budget tokens in all, nor a sequence twice, nor a
  /// sequence that is done.
  std::vector<Planned> schedule();

  /// Runs steps until every request has finished; results in submission order. Given.
  std::vector<GenerationResult> run();
  /// What each step did.
  const std::vector<ServingStepLog>& log() const { return log_; }
  /// Results so far, in submission order.
  const std::vector<GenerationResult>& results() const { return results_; }
  /// The KV memory.
  const KVManager& memory() const { return *memory_; }
  /// The limits.
  const ServingOptions& options() const { return options_; }
  /// The sequences in the batch, oldest admitted first.
  const std::vector<std::unique_ptr<Sequence>>& running() const { return running_; }
  /// The forward backend.
  ModelRunner& forward() { return *forward_; }
  /// The step being planned or run (the next log entry's number).
  int now() const { return now_; }
  /// Requests submitted and not yet admitted (or preempted and not yet resumed), cancelled ones aside.
  int waiting() const { return queue_.waiting() - cancelled_waiting_; }
  /// Whether the request at submission index `index` has finished (EOS or max_new_tokens).
  bool finished(size_t index) const { return results_.at(index).finish_step > 0 && !cancelled_.at(index); }
  /// Whether nothing runs and nothing waits.
  bool idle() const { return running_.empty() && waiting() == 0; }

  // Given helpers for step() and schedule().

  /// Step 1 of a step: preempts the newest running sequences until every decoding one can store
  /// one more position (prefilling ones reserved their prefill when admitted); a preempted one
  /// frees its memory and waits at the head of the queue. Returns how many; counts them in the
  /// step's log.
  int make_room();
  /// Admits the oldest request that has arrived, if the batch has a free place (max_running) and
  /// the memory can hold its prefill now without taking what the running sequences need for
  /// their next position; returns its Sequence (now the newest in running()), or nullptr,
  /// leaving the queue as it was. A resumed request keeps its sampler and next token; one
  /// preempted before its first token (in the middle of its prompt) starts over as new.
  /// Throws if the memory cannot hold a request even with nothing running.
  Sequence* admit_next();
  /// Records token `token` sampled by `seq`: appended to its result (its first token sets
  /// first_token_step), fed at its next decode; EOS or max_new_tokens marks it done.
  void emit(Sequence& seq, int token);
  /// Counts the plan and one forward (if `forwarded`) in the step's log, frees and retires the
  /// sequences that are done (finish_step = now() + 1), appends the log entry, advances now().
  void end_step(std::span<const Planned> plan, bool forwarded);

 private:
  std::vector<int> history(size_t index) const;

  std::unique_ptr<ModelRunner> forward_;
  std::unique_ptr<KVManager> memory_;
  ServingOptions options_;
  Scheduler queue_;
  std::vector<GenerationRequest> requests_;
  std::vector<GenerationResult> results_;
  std::vector<std::unique_ptr<Sequence>> running_;  ///< oldest admitted first
  std::vector<std::unique_ptr<Sequence>> paused_;   ///< by submission index: preempted, without memory
  std::vector<ServingStepLog> log_;
  std::unordered_map<int, size_t> index_of_;  ///< request id -> submission index
  std::vector<char> cancelled_;               ///< by submission index
  int cancelled_waiting_ = 0;                 ///< cancelled requests still in queue_, skipped by admit_next()
  ServingStepLog current_;
  int now_ = 0;
};

}  // namespace infer
