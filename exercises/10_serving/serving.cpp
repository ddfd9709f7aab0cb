// Lesson 10, your turn: the serving engine's schedule and step.
//
// Replace each `throw NotImplemented(...)`. The contract is lessons/10_serving/serving.hpp; the
// lesson text is lessons/10_serving/README.md. Check your work with `./course check 10`.
// The varlen forward (lesson 03's forward_step, behind a ModelRunner) and the engine's helpers (make_room, admit_next, emit,
// end_step) are written for you in lessons/10_serving/given.cpp.
// Stuck on a function? `./course hint 10 NAME` gives a hint, one tier at a time.
#include "lessons/10_serving/serving.hpp"

namespace infer {

std::vector<ServingEngine::Planned> ServingEngine::schedule() {
  throw NotImplemented("10", "ServingEngine::schedule");
}

bool ServingEngine::step() {
  throw NotImplemented("10", "ServingEngine::step");
}

}  // namespace infer
