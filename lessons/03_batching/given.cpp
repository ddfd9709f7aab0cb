// Lesson 03: the plumbing given to students (the Scheduler's queue, the engine's constructor,
// submit and run), compiled with your exercises/ and with the reference.
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

BatchEngine::BatchEngine(const ModelWeights& model, Policy policy, int max_batch)
    : model_(model), scheduler_(policy, max_batch) {
  for (int i = 0; i < max_batch; ++i)
    free_caches_.push_back(std::make_unique<KVCache>(model.config, model.config.max_position_embeddings));
}

BatchEngine::~BatchEngine() = default;

void BatchEngine::submit(GenerationRequest r) {
  const ModelConfig& c = model_.config;
  check_tokens(c, r.prompt, "BatchEngine::submit");
  r.sampling.validate();
  require(r.max_new_tokens >= 1, "BatchEngine::submit: request ", r.id, " asks for ", r.max_new_tokens,
          " new tokens, expected >= 1");
  require(r.prompt.size() + r.max_new_tokens <= static_cast<size_t>(c.max_position_embeddings),
          "BatchEngine::submit: request ", r.id, ": prompt of ", r.prompt.size(), " tokens + max_new_tokens ",
          r.max_new_tokens, " exceeds the context of ", c.max_position_embeddings, " positions");
  for (const auto& q : requests_) require(q.id != r.id, "BatchEngine::submit: request id ", r.id, " was already submitted");
  scheduler_.add(static_cast<int>(requests_.size()), r.arrival_step);  // the scheduler sees submission indices
  results_.push_back({r.id, {}, r.arrival_step, 0, 0});
  requests_.push_back(std::move(r));
}

std::vector<GenerationResult> BatchEngine::run() {
  while (step()) {
  }
  return results_;
}

}  // namespace infer
