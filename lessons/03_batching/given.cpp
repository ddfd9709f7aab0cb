// Lesson 03: what is given to students for the Scheduler (its queue), compiled with your
// exercises/ and with the reference. The engine that runs it is lessons/03_batching/given_engine.cpp.
#include "lessons/03_batching/batching.hpp"


namespace infer {

Scheduler::Scheduler(Policy policy, int max_batch) : policy_(policy), max_batch_(max_batch) {
  require(max_batch > 0, "Scheduler: max_batch must be positive, got ", max_batch);
}

void Scheduler::add(int id, int arrival_step) {
  // (Not one require(): its message arguments are evaluated even when the condition holds.)
  if (!queue_.empty() && arrival_step < queue_.back().arrival)
    throw Error(cat("Scheduler::add: request ", id, " arrives at step ", arrival_step, ", before the last queued one (",
                    queue_.back().arrival, "): add requests in arrival order"));
  queue_.push_back({id, arrival_step});
}

void Scheduler::push_front(int id, int arrival_step) { queue_.push_front({id, arrival_step}); }

}  // namespace infer
