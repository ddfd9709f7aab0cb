/// @file serving.hpp
/// @brief Lesson 10's contract: the plan of a serving engine's step, with a token budget that
/// mixes pieces of prompts with decodes.
///
/// Lessons 03 to 05 ran the engine (lesson 03's Engine) with WholePrompts, which feeds each
/// newcomer's whole prompt in the step it is admitted. A 2,000-token prompt then makes that step
/// 2,000 positions long, and every running sequence waits for it: their next token comes late.
/// Here you write the planner today's servers use (vLLM's chunked prefill, in the spirit of
/// nano-vllm's schedule):
///
/// - a step feeds at most `token_budget` tokens in all;
/// - every running sequence that is decoding gets its one token first, so decodes never stall;
/// - what is left of the budget goes to prefills, in pieces ("chunks"): a long prompt is spread
///   over several steps, `budget - decodes` tokens at a time, the sequences already part-way
///   through theirs first, then newcomers.
///
/// The engine does the rest, as it did for WholePrompts: it runs your plan as one StepInput
/// through the model (every chunk's rows through each weight matrix together), samples for the
/// sequences whose tokens are all computed (a chunk that leaves part of a prompt unfed samples
/// nothing), and retires what finished. The memory (lesson 03's slots, lesson 04's blocks, lesson
/// 05's prefix cache), the sampler and the queue are those of the earlier lessons (`./course
/// check 10` links their reference versions, so a bug left in yours does not block this lesson).
#pragma once

#include <memory>

#include "lessons/03_batching/engine.hpp"

namespace infer {

/// Lesson 10's planner: chunked prefill under a token budget. Yours: plan().
class ChunkedPrefill final : public Planner {
 public:
  /// At most `token_budget` tokens a step. Throws infer::Error for a budget below 1. Given.
  explicit ChunkedPrefill(int token_budget);
  /// Yours. The next step's plan: make room (Engine::make_room()), then three passes that share
  /// the budget:
  ///
  ///  1. every running sequence that is decoding (Sequence::decoding(), false once done): 1 token,
  ///     oldest first;
  ///  2. every running sequence still prefilling (prefill_left() > 0, 0 once done):
  ///     min(prefill_left(), what the budget leaves), oldest first, while anything is left;
  ///  3. then newcomers from Engine::admit_next(), one at a time while some budget is left (it
  ///     admits nobody in a step that had to preempt), each a first chunk the same way. Admit
  ///     only whom the step feeds: a newcomer takes memory and a place in the batch, and the
  ///     engine refuses a plan that admits a sequence and feeds it nothing.
  ///
  /// Never plans more than token_budget() tokens in all (serving_engine() refuses a max_running
  /// above the budget, so the decodes always fit), a sequence twice, or a sequence that is done.
  std::vector<Planned> plan(Engine& engine) override;
  /// The budget.
  int token_budget() const { return budget_; }

 private:
  int budget_;
};

/// The serving engine's limits.
struct ServingOptions {
  int max_running = 8;    ///< sequences admitted at once (prefilling or decoding)
  int token_budget = 64;  ///< tokens one step feeds, decodes and prefill chunks together; >= max_running
  bool keep_log = true;   ///< keep every step's log (a long-running server keeps only the last)
  /// Guesses per decode with a Speculator (lesson 06); they ride on top of the token budget.
  int speculative_tokens = 0;
};

/// Lesson 03's Engine planned by ChunkedPrefill, continuous batching, over `runner` and `memory`
/// (given), speculating with `speculator` when options.speculative_tokens > 0. Throws for a null
/// runner or memory, max_running < 1, token_budget < max_running, or speculative tokens without a
/// speculator.
std::unique_ptr<Engine> serving_engine(std::unique_ptr<ModelRunner> runner, std::unique_ptr<KVManager> memory,
                                       ServingOptions options, std::unique_ptr<Speculator> speculator = nullptr);
/// The same on the CPU over lesson 03's slots (max_running caches of the whole context). Given.
std::unique_ptr<Engine> serving_engine(const ModelWeights& model, ServingOptions options);

}  // namespace infer
