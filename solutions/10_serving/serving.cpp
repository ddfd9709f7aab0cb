// Lesson 10, the reference: the serving engine's schedule and step.
#include "lessons/10_serving/serving.hpp"

namespace infer {

std::vector<ServingEngine::Planned> ServingEngine::schedule() {
  std::vector<Planned> plan;
  int budget = options_.token_budget;
  const int preempted = make_room();
  // Decodes first, one token each: a sequence that is decoding never waits for a prefill.
  for (const auto& s : running_)
    if (!s->done && !s->prefilling()) {
      plan.push_back({s.get(), 1, true});
      --budget;
    }
  // Then the prefills under way, oldest first, each as much as the budget leaves.
  for (const auto& s : running_)
    if (!s->done && s->prefilling() && budget > 0) {
      const int n = std::min(s->prefill_left(), budget);
      plan.push_back({s.get(), n, false});
      budget -= n;
    }
  // Then newcomers, while the budget lasts; none in a step that had to preempt (memory is short).
  while (preempted == 0 && budget > 0) {
    Sequence* s = admit_next();
    if (s == nullptr) break;
    const int n = std::min(s->prefill_left(), budget);
    plan.push_back({s, n, false});
    budget -= n;
  }
  return plan;
}

bool ServingEngine::step() {
  if (idle()) return false;
  const std::vector<Planned> plan = schedule();

  // Run: every chunk in one forward.
  StepInput input;
  std::vector<Chunk>& chunks = input.chunks;
  for (const Planned& p : plan) {
    Sequence& s = *p.seq;
    if (p.decode)
      chunks.push_back({std::span(&s.next_token, 1), s.cache.get()});
    else
      chunks.push_back({std::span(s.prefill).subspan(static_cast<size_t>(s.cache->length()), p.tokens), s.cache.get()});
  }
  Matrix logits;
  if (!chunks.empty()) logits = forward_->forward(input);

  // Postprocess: decodes sample; a prefill that just ended samples its first token, unless it was
  // a resumed sequence's history (its next token is known).
  for (size_t i = 0; i < plan.size(); ++i) {
    Sequence& s = *plan[i].seq;
    if (plan[i].decode || (!s.prefilling() && !s.resumed)) emit(s, s.sampler.next(logits.row(i).transpose()));
    else if (!s.prefilling()) s.resumed = false;  // history restored: it decodes its next token from now on
  }
  end_step(plan, !chunks.empty());
  return true;
}

}  // namespace infer
