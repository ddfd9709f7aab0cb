// Lesson 10, the reference: the planner of a serving engine's step, chunked prefill under a
// token budget.
#include "lessons/10_serving/serving.hpp"

namespace infer {

std::vector<Planned> ChunkedPrefill::plan(Engine& engine) {
  std::vector<Planned> plan;
  int budget = budget_;
  engine.make_room();
  // Decodes first, one token each: a sequence that is decoding never waits for a prefill.
  for (const auto& s : engine.running())
    if (s->decoding()) {
      plan.push_back({s.get(), 1});
      --budget;
    }
  // Then the prefills under way, oldest first, each as much as the budget leaves.
  for (const auto& s : engine.running())
    if (s->prefill_left() > 0 && budget > 0) {
      const int n = std::min(s->prefill_left(), budget);
      plan.push_back({s.get(), n});
      budget -= n;
    }
  // Then newcomers, while the budget lasts (admit_next() lets none in after a preemption).
  while (budget > 0) {
    Sequence* s = engine.admit_next();
    if (s == nullptr) break;
    const int n = std::min(s->prefill_left(), budget);
    plan.push_back({s, n});
    budget -= n;
  }
  return plan;
}

}  // namespace infer
