// Lesson 10, your turn: the planner of a serving engine's step, chunked prefill under a token
// budget.
//
// Replace the `throw NotImplemented(...)`. The contract is lessons/10_serving/serving.hpp; the
// engine it plans for is lessons/03_batching/engine.hpp (read Engine::make_room, admit_next and
// Sequence); the lesson text is lessons/10_serving/README.md. Check your work with
// `./course check 10`. The engine's loop, and lesson 03's WholePrompts planner, are in
// lessons/03_batching/given_engine.cpp.
// Stuck? `./course hint 10 ChunkedPrefill::plan` gives a hint, one tier at a time.
#include "lessons/10_serving/serving.hpp"

namespace infer {

std::vector<Planned> ChunkedPrefill::plan(Engine& engine) {
  (void)engine;
  throw NotImplemented("10", "ChunkedPrefill::plan");
}

}  // namespace infer
